"""`kvgguf inspect`: a GGUF model's attention shape and what its KV cache costs, per cache type.

Reads only the metadata (with the `gguf` package), never the weights.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ..native import codecs
from ..policy.tiered import TieredConfig

# llama.cpp's cache types: bits per value from ggml's block layouts (bytes per block of 32 values).
LLAMA_TYPES = {"f16": 16.0, "q8_0": 34 * 8 / 32, "q4_0": 18 * 8 / 32}
# Sliding-window layer patterns llama.cpp applies when the GGUF does not state one: every
# n-th layer attends to the whole context (src/llama-model.cpp, LLM_ARCH_GEMMA3: 6).
DEFAULT_SWA_PATTERN = {"gemma3": 6, "gemma2": 2}
CONTEXTS = (4096, 32768)


@dataclass(frozen=True)
class ModelCard:
    path: str
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    sliding_window: int  # 0: none
    swa_pattern: int  # every n-th layer is full attention; 0 when there is no window

    @property
    def full_layers(self) -> list[int]:
        if not self.sliding_window:
            return list(range(self.n_layer))
        return [il for il in range(self.n_layer) if (il + 1) % self.swa_pattern == 0]

    @property
    def values_per_token_layer(self) -> int:
        return self.n_head_kv * (self.head_dim_k + self.head_dim_v)


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    value = f.contents()
    return value[0] if isinstance(value, list) and value and not isinstance(value[0], str) else value


def read_card(path) -> ModelCard:
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError/struct errors on a non-GGUF file
        raise ValueError(f"{path} is not a readable GGUF file: {e}") from None
    arch = _field(reader, "general.architecture")
    if not arch:
        raise ValueError(f"{path} has no general.architecture")
    n_head = int(_field(reader, f"{arch}.attention.head_count"))
    head_dim = int(_field(reader, f"{arch}.embedding_length")) // n_head
    window = int(_field(reader, f"{arch}.attention.sliding_window", 0) or 0)
    pattern = _field(reader, f"{arch}.attention.sliding_window_pattern")
    pattern = int(pattern) if pattern else (DEFAULT_SWA_PATTERN.get(arch, 1) if window else 0)
    return ModelCard(
        path=str(path),
        arch=arch,
        n_layer=int(_field(reader, f"{arch}.block_count")),
        n_head=n_head,
        n_head_kv=int(_field(reader, f"{arch}.attention.head_count_kv", n_head)),
        head_dim_k=int(_field(reader, f"{arch}.attention.key_length", head_dim)),
        head_dim_v=int(_field(reader, f"{arch}.attention.value_length", head_dim)),
        n_ctx_train=int(_field(reader, f"{arch}.context_length", 0)),
        sliding_window=window,
        swa_pattern=pattern,
    )


def kv_bytes(card: ModelCard, n_tokens: int, bits_per_value: float, swa_bits_per_value: float = 16.0) -> float:
    """Bytes of K and V: full-attention layers hold every token at `bits_per_value`,
    sliding-window layers their window at `swa_bits_per_value` (kvgguf leaves them to
    llama.cpp's f16 cache; a llama.cpp cache type applies to them too)."""
    per_layer = card.values_per_token_layer
    full = len(card.full_layers)
    swa = card.n_layer - full
    window = min(n_tokens, card.sliding_window)
    return (full * n_tokens * bits_per_value + swa * window * swa_bits_per_value) * per_layer / 8


def codec_bits(card: ModelCard, name: str) -> float:
    """Stated bits per value of a kvgguf codec for this model's head dims (K and V averaged
    by their share of values)."""
    c = codecs.get(name)
    k = c.nominal_bits_per_value(card.head_dim_k, "key")
    v = c.nominal_bits_per_value(card.head_dim_v, "value")
    return (k * card.head_dim_k + v * card.head_dim_v) / (card.head_dim_k + card.head_dim_v)


def tiered_bytes(card: ModelCard, n_tokens: int, config: TieredConfig = TieredConfig(), n_batch: int = 256) -> float:
    """The tiered preset at n_tokens: llama.cpp's f16 hot buffer (hot + one batch), sinks in
    f16, the newest warm_tokens compressed tokens in the warm codec, the rest in archive."""
    hot = min(n_tokens, config.hot + n_batch)
    cold = n_tokens - min(n_tokens, config.hot)
    sinks = min(cold, config.sinks)
    warm = min(cold - sinks, config.warm_tokens) if config.archive else cold - sinks
    archive = cold - sinks - warm
    full = len(card.full_layers)
    per_layer = card.values_per_token_layer
    bits = hot * 16 + sinks * 16 + warm * codec_bits(card, config.warm)
    if archive:
        bits += archive * codec_bits(card, config.archive)
    swa = card.n_layer - full
    return (full * per_layer * bits + swa * min(n_tokens, card.sliding_window) * per_layer * 16) / 8


def kv_table(card: ModelCard, contexts=None) -> list[dict]:
    contexts = set(contexts or CONTEXTS)
    if card.n_ctx_train:
        contexts.add(card.n_ctx_train)
    contexts = sorted(contexts)
    rows = []
    for name, bpv in LLAMA_TYPES.items():
        rows.append({"cache": name, "from": "llama.cpp", "bits_per_value": bpv,
                     "bytes": {n: kv_bytes(card, n, bpv, bpv) for n in contexts}})
    for name in codecs.names():
        try:
            bpv = codec_bits(card, name)  # ValueError for a head dim the codec cannot take
        except ValueError as e:
            rows.append({"cache": name, "from": "kvgguf", "unavailable": str(e)})
            continue
        rows.append({"cache": name, "from": "kvgguf", "bits_per_value": bpv,
                     "bytes": {n: kv_bytes(card, n, bpv) for n in contexts}})
    rows.append({"cache": "tiered", "from": "kvgguf", "bits_per_value": None,
                 "bytes": {n: tiered_bytes(card, n) for n in contexts}})
    return rows


def as_json(card: ModelCard) -> dict:
    d = asdict(card)
    d["full_attention_layers"] = card.full_layers
    d["kv_table"] = kv_table(card)
    return d


def format_card(card: ModelCard) -> str:
    swa = (f"sliding window {card.sliding_window} tokens, every {card.swa_pattern}th layer full "
           f"({len(card.full_layers)} of {card.n_layer})" if card.sliding_window else "no sliding window")
    lines = [
        f"model:        {card.path}",
        f"architecture: {card.arch}",
        f"layers:       {card.n_layer}",
        f"heads:        {card.n_head} (KV heads {card.n_head_kv})",
        f"head dims:    K {card.head_dim_k}, V {card.head_dim_v}",
        f"attention:    {swa}",
        "(sliding-window layers are counted at their window, as llama.cpp holds them with swa_full off)",
        f"context:      {card.n_ctx_train} tokens (trained)",
        "",
    ]
    rows = kv_table(card)
    contexts = list(rows[0]["bytes"])
    head = ["cache", "from", "bits/value"] + [f"KV @ {n // 1024}K" for n in contexts]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "unavailable" in r:
            cells = [r["cache"], r["from"], "n/a"] + ["n/a"] * len(contexts)
        else:
            bpv = "mixed" if r["bits_per_value"] is None else f"{r['bits_per_value']:.3f}"
            cells = [r["cache"], r["from"], bpv] + [f"{r['bytes'][n] / 2**20:,.1f} MiB" for n in contexts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
