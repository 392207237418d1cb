"""The KV-cache shape of a model, from its GGUF metadata: what every byte count in kvgguf is
computed from (the live cache, sessions, inspect)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

from .gguf_file import GGUFError, read_metadata

# How llama.cpp 0c1e570 lays out sliding-window attention, per architecture (src/models/<arch>.cpp):
# (the window when the GGUF states none, every n-th layer full when it states no pattern), or None
# where llama.cpp gives the architecture no sliding window whatever its GGUF says (phi3: its
# converter writes one into every file, and llama.cpp ignores it).
SLIDING_WINDOW: dict[str, Optional[tuple[int, int]]] = {
    "llama": None,
    "phi3": None,
    "gemma2": (4096, 2),
    "gemma3": (0, 6),
    "cohere2": (0, 4),
    "olmo2": (0, 4),  # OLMo 3: a window only where the GGUF states one
    "granite_swa": (0, 0),  # window and per-layer pattern both stated (its loader requires them)
    "gpt-oss": (0, 2),
    "gemma4": (0, 0),  # window and per-layer pattern both stated (its loader requires them)
    "exaone4": (4096, 4),  # only at 64 layers (EXAONE 4.0 32B): WINDOW_ONLY_AT_LAYERS
}
# Architectures that llama.cpp gives a sliding window only at one layer count, ignoring a stated
# window otherwise (its converter writes one into every EXAONE 4.0 file, 1.2B included)
WINDOW_ONLY_AT_LAYERS = {"exaone4": 64}
# The architectures whose loader reads attention.sliding_window at all (grep of src/models/*.cpp,
# by the names llama-arch.cpp gives them):
# any other ignores a stated window, and one of these missing from SLIDING_WINDOW is refused when
# its GGUF states a window, since its layout would be a guess.
READS_SLIDING_WINDOW = frozenset(
    (
        "afmoe",
        "cohere2",
        "cohere2moe",
        "deepseek4",
        "dflash",
        "dots3note",
        "exaone-moe",
        "exaone4",
        "gemma-embedding",
        "gemma2",
        "gemma3",
        "gemma3n",
        "gemma4-assistant",
        "gemma4",
        "granite_swa",
        "laguna",
        "lfm2",
        "llama4",
        "maple",
        "mellum",
        "mimo2",
        "modern-bert",
        "muse-glimmer",
        "olmo2",
        "gpt-oss",
        "phi3",
        "plamo3",
        "smallthinker",
        "spark2_5",
        "step35",
    )
)
MAX_LAYERS = 4096  # a per-layer array longer than this is no per-layer setting


@dataclass(frozen=True)
class KVShape:
    arch: str
    n_layer: int
    n_head: int
    # KV heads and head dims of the full-attention layers: the rows kvgguf's store holds (where
    # every layer has the same shape, every layer's)
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_swa: int  # sliding-window size; 0 when every layer attends to the whole context
    swa_pattern: int  # every n-th layer attends to the whole context; 0 without a window or when
    # the GGUF lists the layers one by one
    full_attention_layers: tuple[int, ...]  # layers that attend to the whole context
    n_ctx_train: int = 0
    # per layer (llama.cpp's n_head_kv(il), n_embd_head_k(il), n_embd_head_v(il)): GGUFs may state
    # head_count_kv per layer, and sliding-window layers may have head dims of their own
    # (attention.key_length_swa, as Gemma 4's do); empty: n_head_kv/head_dim_k/head_dim_v on every layer
    layer_kv_heads: tuple[int, ...] = ()
    layer_head_dims: tuple[tuple[int, int], ...] = ()  # (K, V)

    def kv_heads(self, il: int) -> int:
        return self.layer_kv_heads[il] if self.layer_kv_heads else self.n_head_kv

    def head_dim(self, il: int, kind: int) -> int:
        """Layer il's head dim of K (kind 0) or V (kind 1)."""
        dims = self.layer_head_dims[il] if self.layer_head_dims else (self.head_dim_k, self.head_dim_v)
        return dims[kind]

    def width(self, il: int, kind: int) -> int:
        """Values per token of layer il's K (kind 0) or V (kind 1) rows."""
        return self.kv_heads(il) * self.head_dim(il, kind)

    @property
    def values_per_token(self) -> int:
        """K and V values one token adds to the cache, all layers."""
        return sum(self.width(il, 0) + self.width(il, 1) for il in range(self.n_layer))

    @property
    def full_layers(self) -> list[int]:
        """Layers that attend to the whole context (all of them without a sliding window)."""
        return list(self.full_attention_layers)

    @property
    def uneven_full_layers(self) -> Optional[str]:
        """Why the full-attention layers do not share one shape (kvgguf's store holds one), or None."""
        shapes = {(self.kv_heads(il), self.head_dim(il, 0), self.head_dim(il, 1)) for il in self.full_layers}
        if len(shapes) <= 1:
            return None
        return (
            "its full-attention layers differ in KV heads or head dims ("
            + ", ".join(f"{h} x {k}/{v}" for h, k, v in sorted(shapes))
            + "); kvgguf's store holds one shape"
        )

    @classmethod
    def from_metadata(cls, meta: dict, source: str = "the model") -> "KVShape":
        """The shape as llama.cpp derives it: head dims from key_length/value_length (their _swa
        forms on sliding layers), else embedding_length / head_count of layer 0; KV heads per layer
        from head_count_kv (one number or one per layer); the sliding window and which layers have
        it from the GGUF, else llama.cpp's default for the architecture (SLIDING_WINDOW)."""
        arch = meta.get("general.architecture")
        if not arch:
            raise GGUFError(f"{source} has no general.architecture")

        def get(key, default=None, *, per_layer: bool = False):
            value = meta.get(f"{arch}.{key}", default)
            if isinstance(value, list):
                if not value or any(isinstance(v, (str, list)) for v in value):
                    raise GGUFError(f"{source} ({arch}) has no number in {arch}.{key}")
                if per_layer:
                    if len(value) != n_layer:
                        raise GGUFError(f"{source} ({arch}): {arch}.{key} lists {len(value)} layers of {n_layer}")
                    return tuple(int(v) for v in value)
                value = value[0]  # llama.cpp reads layer 0's where it takes one number
            if value is None or isinstance(value, str):
                raise GGUFError(f"{source} ({arch}) has no scalar {arch}.{key}")
            return (int(value),) * n_layer if per_layer else int(value)

        n_layer = get("block_count")
        n_head = get("attention.head_count") if f"{arch}.attention.head_count" in meta else 0
        if n_head <= 0:  # a recurrent model (mamba, rwkv): llama.cpp gives it a state, not a KV cache
            raise GGUFError(f"{source} ({arch}) has no attention heads: it keeps a recurrent state, not a KV cache")
        head_dim_k = get("attention.key_length", get("embedding_length") // n_head)
        head_dim_v = get("attention.value_length", head_dim_k)
        swa_dims = (get("attention.key_length_swa", head_dim_k), get("attention.value_length_swa", head_dim_v))
        kv_heads = get("attention.head_count_kv", n_head, per_layer=True)
        n_swa, pattern, full = _sliding_window(arch, meta, n_layer, source)
        dims = tuple((head_dim_k, head_dim_v) if il in full or not n_swa else swa_dims for il in range(n_layer))
        first_full = full[0] if full else 0
        uniform = len(set(kv_heads)) == 1 and len(set(dims)) == 1
        return cls(
            arch=arch,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=kv_heads[first_full],
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_swa=n_swa,
            swa_pattern=pattern,
            full_attention_layers=full,
            n_ctx_train=get("context_length", 0),
            layer_kv_heads=() if uniform else kv_heads,
            layer_head_dims=() if uniform else dims,
        )

    @classmethod
    def from_gguf(cls, path: Union[str, Path]) -> "KVShape":
        return cls.from_metadata(read_metadata(path, max_array=MAX_LAYERS), str(path))

    @classmethod
    def of(cls, llm) -> "KVShape":
        """The shape of a Llama's model: a kvgguf.Llama's own (``kv_shape``); for llama-cpp-python's
        Llama read from its GGUF once and kept here, beside it (nothing is set on it)."""
        own = getattr(llm, "kv_shape", None)
        if isinstance(own, KVShape):
            return own
        shape = _SHAPES.get(llm)
        if shape is None:
            shape = _SHAPES[llm] = cls.from_gguf(llm.model_path)
        return shape


_SHAPES: "weakref.WeakKeyDictionary[object, KVShape]" = weakref.WeakKeyDictionary()


def _sliding_window(arch: str, meta: dict, n_layer: int, source: str) -> tuple[int, int, tuple[int, ...]]:
    """(window, every n-th layer full or 0, full-attention layers), as llama.cpp's load_swa_pattern
    reads them: the pattern is an array of per-layer flags (true: sliding) or a scalar n."""
    stated = meta.get(f"{arch}.attention.sliding_window")
    if WINDOW_ONLY_AT_LAYERS.get(arch, n_layer) != n_layer:
        return 0, 0, tuple(range(n_layer))
    if (arch in SLIDING_WINDOW and SLIDING_WINDOW[arch] is None) or (
        arch not in SLIDING_WINDOW and (not stated or arch not in READS_SLIDING_WINDOW)
    ):
        return 0, 0, tuple(range(n_layer))
    if arch not in SLIDING_WINDOW:
        raise GGUFError(
            f"{source} ({arch}) states a sliding window of {stated} tokens, but kvgguf does not know which "
            f"layers llama.cpp gives it for this architecture (known: "
            f"{', '.join(a for a, v in SLIDING_WINDOW.items() if v)})"
        )
    default_window, default_pattern = SLIDING_WINDOW[arch]
    n_swa = int(stated if stated is not None else default_window)
    if not n_swa:
        return 0, 0, tuple(range(n_layer))
    pattern = meta.get(f"{arch}.attention.sliding_window_pattern", default_pattern)
    if isinstance(pattern, list):
        if len(pattern) != n_layer:
            raise GGUFError(f"{source} ({arch}): sliding_window_pattern lists {len(pattern)} layers of {n_layer}")
        return n_swa, 0, tuple(il for il, sliding in enumerate(pattern) if not sliding)
    pattern = int(pattern)
    # llama_hparams::set_swa_pattern: layer il slides unless pattern > 0 and il % pattern == pattern - 1
    full = tuple(il for il in range(n_layer) if pattern and il % pattern == pattern - 1)
    return n_swa, pattern, full
