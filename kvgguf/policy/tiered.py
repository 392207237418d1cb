"""Policy of the live cache: which token lives in which tier (Python decides, C computes)."""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace
from typing import Optional, Union

from ..bindings import codecs
from ..enums import Tier
from . import codec_spec
from .codec_spec import CodecSpec


KEEP_SIGNALS = (None, "surprisal", "mass", "random")
CODEBOOKS = ("sequence", "calibration")
DROP_RULES = ("mass", "oldest")  # TieredConfig.drop
# llama.cpp's cache types by name, as ggml numbers.
CACHE_TYPES = {"f32": 0, "f16": 1, "bf16": 30, "q8_0": 8, "q5_1": 7, "q5_0": 6, "q4_1": 3, "q4_0": 2, "iq4_nl": 20}


def type_name(value: Union[str, int]) -> Union[str, int]:
    """A cache type as the user knows it: its name where a ggml number has one in CACHE_TYPES."""
    names = {number: name for name, number in CACHE_TYPES.items()}
    return names.get(value, value) if isinstance(value, int) else value


# llama.cpp's cells unless a config names a type: the sliding-window layers' (Gemma 2/3, gpt-oss,
# ...), which keep their last n_swa tokens, most of the bytes on such models, and the hot
# window's. q8_0 halves them for a KL within the measurement's floor (docs/results/quality.md, "Every
# cell counted").
PRESET_WINDOW = PRESET_HOT_CELLS = "q8_0"
# The hot cells' types the patched attention reads besides f16 (native/llama/src/llama-kvgguf-graph.cpp).
HOT_CELL_TYPES = ("f16", "q8_0")


@dataclass(frozen=True)
class TieredConfig:
    """Where each token of a sequence is held.

    hot: the newest tokens llama.cpp's own cache keeps (in hot_cells) between batches: before a
        batch, whole blocks of the oldest are moved out until at most ``hot`` remain, so
        between ``hot - block + 1`` and ``hot`` are exact (plus the batch being decoded).
        llama.cpp's buffer holds hot + one batch, rounded up to a multiple of 256 cells.
    ubatch: tokens per llama_decode call (kvgguf.Llama's default n_batch): an application's
        longer batches are split into these, so the f16 buffer is hot + ubatch, not hot + the
        application's batch. hot + ubatch = 256 fills exactly one padding unit.
    sinks: the first tokens of the sequence, kept exact in the store (attention sinks).
    warm: codec for tokens that left the hot window: a name, a (K, V) pair of names, or a
        mapping per layer over a default (``codec_spec``).
    warm_tokens: how many compressed tokens stay warm before the oldest move to archive.
    archive: codec for the oldest tokens, in the same forms; None keeps everything warm.
    block: tokens evicted from llama.cpp at a time (the store's re-encoding unit).
    group_size: kivi's group size G.
    keep: which signal decides the blocks that stay warm instead of aging to archive (None:
        none stay). "surprisal": the blocks whose tokens the model found least predictable
        (mean -log p of each token, noted from the logits of every position);
        "mass": the blocks that received the most attention per query while cold (H2O's
        heavy hitters, counted by the fused attention); "random": a control that keeps as many
        blocks, chosen without looking, for comparisons at equal bits.
    keep_fraction: the share of blocks that stay warm: a block that ages is kept when its
        score is among the top keep_fraction of the compressed blocks' scores.
    codebooks: where pq2/vq8/vq8f's codebooks come from: "sequence" (trained on the first block
        each sequence encodes with that codec) or "calibration" (the model's, trained by
        ``kvgguf calibrate``; a model without them falls back to "sequence" with a warning).
        Measured on SmolLM2 and WikiText-2, the sequence's own codebooks lose less (docs/results/literature.md).
    window: llama.cpp's cache type for the cells of sliding-window layers (Gemma 2/3, gpt-oss,
        ...), which keep their own window and never get cold rows: one of CACHE_TYPES ("f16"
        exact; a quantized type needs flash attention and head dims that its blocks of 32
        divide), or None: PRESET_WINDOW where llama.cpp can hold it, else f16. Ignored on models
        without sliding-window layers.
    hot_cells: llama.cpp's cache type for the hot window's cells (the full-attention layers'):
        "f16" (exact), "q8_0" (8.5 bits per value, half the bytes; both attention paths read
        them as f16 rows, eviction dequantizes them; needs flash attention and head dims that
        blocks of 32 divide), or None: "q8_0" where llama.cpp can hold it, else "f16".
    reuse: how far back (in positions) a context can be cut and still be reused as it is.
        A prompt that shares only a prefix with what the context holds cuts it back there; a
        fresh context would hold that prefix's newest tokens exact and its younger blocks warm,
        where this one has evicted and aged them since. So llama.cpp's own bytes of the rows
        evicted within the newest ``reuse`` compressed positions (every layer, sliding windows
        too) and the warm codes of the blocks aged within as many are kept, counted in
        kv_memory() as "reuse", and a cut within that reach puts them back; a deeper cut
        evaluates the prefix again. Either way the cut context holds what a fresh one would.
        0 keeps nothing (every cut into evicted rows evaluates again).
    gpu_encode: where a layer's cells live in a GPU's memory, its evicted rows are coded there,
        where they lie (True), or read out and coded on the CPU (False: the same codes, slower;
        a comparison for the GPU path). Ignored on the CPU.
    budget: bytes the store's tiers may hold (its codes and codebooks: kv_memory().cold_bytes),
        None for no bound. Before an eviction would take them past it, kvgguf.Llama drops whole
        cold blocks (never the sinks' or the hot window's) as a context shift drops positions:
        the later rows move back with their codes and are scored with rotated queries, so the
        context's positions stay as few as the tokens it holds (docs/data-path.md, "Bounded
        memory"). kv_memory() and Llama.tokens_dropped report what went.
    drop: which blocks a budget drops first: "mass" (H2O's rule: the least attention per query
        while cold, as the fused attention counts it; blocks not yet seen go oldest first) or
        "oldest" (StreamingLLM's: the oldest after the sinks; the comparison).
    age_beside: whether aging runs on a thread of its own during the next batch. None: where
        every attended layer reads the GPU's copy of the store, so the batch reads nothing of the
        host store. False: never. True: on the CPU too, where the batch reads the store while
        aging swaps its blocks (safe: the store's lock orders them, but which codes a layer reads
        then depends on timing, so it is for tests). Never with a keep signal: the batch's
        logits feed it.
    """

    hot: int = 224
    ubatch: int = 32
    sinks: int = 4
    warm: CodecSpec = "rotq4"
    warm_tokens: int = 2048
    archive: Optional[CodecSpec] = ("rotq4", "rotq2")  # K, V: recall needs the keys (docs/results/recall.md)
    block: int = 64
    group_size: int = 32
    keep: Optional[str] = None
    keep_fraction: float = 0.25
    codebooks: str = "sequence"
    window: Optional[str] = None
    hot_cells: Optional[str] = None
    reuse: int = 128
    gpu_encode: bool = True
    budget: Optional[int] = None
    drop: str = "mass"
    age_beside: Optional[bool] = None

    def __post_init__(self):
        for name in ("hot", "ubatch", "block", "group_size", "sinks", "warm_tokens", "reuse"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"TieredConfig.{name} must be an int, got {value!r}")
        if self.warm is None:
            raise TypeError("TieredConfig.warm must be a codec spec (a name, a (K, V) pair or a per-layer mapping)")
        for name in ("hot", "ubatch", "block", "group_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"TieredConfig.{name} must be > 0, got {getattr(self, name)}")
        for name in ("sinks", "warm_tokens", "reuse"):
            if getattr(self, name) < 0:
                raise ValueError(f"TieredConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not isinstance(self.gpu_encode, bool):
            raise TypeError(f"TieredConfig.gpu_encode must be True or False, got {self.gpu_encode!r}")
        if self.age_beside is not None and not isinstance(self.age_beside, bool):
            raise TypeError(f"TieredConfig.age_beside must be None, True or False, got {self.age_beside!r}")
        if self.codebooks not in CODEBOOKS:
            raise ValueError(f"TieredConfig.codebooks must be one of {CODEBOOKS}, got {self.codebooks!r}")
        if self.window is not None and self.window not in CACHE_TYPES:
            raise ValueError(
                f"TieredConfig.window must be one of llama.cpp's cache types ({', '.join(CACHE_TYPES)}), got {self.window!r}"
            )
        if self.hot_cells is not None and self.hot_cells not in HOT_CELL_TYPES:
            raise ValueError(f"TieredConfig.hot_cells must be one of {HOT_CELL_TYPES}, got {self.hot_cells!r}")
        if self.budget is not None and (
            isinstance(self.budget, bool) or not isinstance(self.budget, numbers.Integral) or self.budget <= 0
        ):
            raise ValueError(f"TieredConfig.budget must be None or a positive number of bytes, got {self.budget!r}")
        if self.drop not in DROP_RULES:
            raise ValueError(f"TieredConfig.drop must be one of {DROP_RULES}, got {self.drop!r}")
        if self.keep not in KEEP_SIGNALS:
            raise ValueError(f"TieredConfig.keep must be one of {KEEP_SIGNALS}, got {self.keep!r}")
        if (
            isinstance(self.keep_fraction, bool)
            or not isinstance(self.keep_fraction, numbers.Real)
            or not 0.0 <= self.keep_fraction <= 1.0
        ):
            raise ValueError(f"TieredConfig.keep_fraction must be a number in [0, 1], got {self.keep_fraction!r}")
        if self.hot <= self.block:
            raise ValueError(f"TieredConfig.hot ({self.hot}) must exceed block ({self.block})")
        if self.ubatch > self.hot:  # a batch lands in the hot window whole (kvgguf.Llama's n_batch)
            raise ValueError(
                f"TieredConfig.ubatch ({self.ubatch}) must not exceed hot ({self.hot}): lower ubatch or raise hot"
            )
        for name in ("warm", "archive"):
            value = getattr(self, name)
            if value is not None:
                try:  # ValueError naming the codecs that exist
                    codec_spec.check(value)
                except TypeError as e:
                    raise TypeError(f"TieredConfig.{name}: {e}") from None

    def table(self, tier: int, n_layer: int) -> dict[tuple[int, int], str]:
        """{(layer, kind): codec} of a tier on a model of n_layer layers (sinks: f16)."""
        if tier == Tier.SINK:
            return {(il, kind): "f16" for il in range(n_layer) for kind in (0, 1)}
        spec = self.warm if tier == Tier.WARM else self.archive
        if tier not in (Tier.WARM, Tier.ARCHIVE) or spec is None:
            raise ValueError(f"tier {tier} holds no rows in this config")
        return codec_spec.choice(spec, n_layer)

    @classmethod
    def parse(cls, spec: Union[str, "TieredConfig"]) -> "TieredConfig":
        """``"tiered"`` or ``"tiered:fixed"`` (the fixed preset), ``"tiered:keep=SIGNAL[:FRACTION]"`` (the preset keeping
        the blocks a signal ranks highest warm), a codec name (every token outside the hot
        window uses it, no sinks, no archive; "f16" holds llama.cpp's cells in f16 too: the
        exact cache), ``"k:NAME,v:NAME"`` (the same with K and V
        apart), or a TieredConfig (kv_codec.parse reads ":window=TYPE" and ":hot=TYPE" suffixes
        on any of them)."""
        if isinstance(spec, TieredConfig):
            return spec
        if not isinstance(spec, str):
            raise TypeError(f"kv_codec must be a str or TieredConfig, got {type(spec).__name__}")
        if spec in ("tiered", "tiered:fixed"):  # kvgguf.Llama: "tiered" follows a model's calibration
            return cls()
        if spec.startswith("tiered:"):
            return cls._parse_keep(spec)
        if spec.startswith("k:"):
            return cls(sinks=0, warm=codec_spec.parse_kv(spec), warm_tokens=0, archive=None)
        if spec == "f16":  # the exact cache: llama.cpp's cells in f16 too
            return cls(sinks=0, warm="f16", warm_tokens=0, archive=None, window="f16", hot_cells="f16")
        if spec not in codecs.names():
            raise ValueError(
                f"kv_codec {spec!r} is unknown; choose 'tiered', 'tiered:fixed', 'auto', 'auto:BITS', 'auto:held=BITS', 'k:NAME,v:NAME' or one of: {', '.join(codecs.names())}"
            )
        return cls(sinks=0, warm=spec, warm_tokens=0, archive=None)

    @classmethod
    def _parse_keep(cls, spec: str) -> "TieredConfig":
        signal, _, fraction = spec[len("tiered:keep=") :].partition(":")
        if not spec.startswith("tiered:keep=") or signal not in KEEP_SIGNALS[1:]:
            raise ValueError(
                f"kv_codec {spec!r}: write 'tiered', 'tiered:fixed', 'tiered:keep=SIGNAL' or 'tiered:keep=SIGNAL:FRACTION' "
                f"with SIGNAL one of {', '.join(KEEP_SIGNALS[1:])}"
            )
        try:
            share = float(fraction) if fraction else cls.keep_fraction
        except ValueError:
            raise ValueError(f"kv_codec {spec!r}: FRACTION must be a number in [0, 1]") from None
        return cls(keep=signal, keep_fraction=share)

    def fit_window(self, n_swa: int, *, strict: bool) -> "TieredConfig":
        """This config on a model whose sliding-window layers hold n_swa tokens (0: none).
        Evicting a position removes it from those layers too, so the hot window must cover
        their window plus a block: raised to that, or ValueError when strict."""
        need = n_swa + self.block if n_swa else 0
        if self.hot >= need:
            return self
        if strict:
            raise ValueError(
                f"the model has sliding-window layers of {n_swa} tokens: TieredConfig.hot must be "
                f">= {need} (window + block), got {self.hot}"
            )
        return replace(self, hot=need)


# The presets' hot window and batch where a model's weights dominate its KV cache: llama_decode
# runs the weight matmuls of 256 tokens far better than of 32 (benchmarks/results/speed/shapes/: the
# Llama-3.2-1B shape at 4K prefilled at 1.07x of stock f16's best with 256/256 against 0.70x
# with 224/32, decode 1.20x against 1.15x; the Llama-3.2-3B shape at 0.92x against 0.72x).
# Taken where llama.cpp's f16 buffer of hot + ubatch cells then adds at most WIDE_SHARE to the
# bytes of the model's file: 2.4% on the 1B shapes, 3.2% on the 3B one; SmolLM2-135M (12%) and
# Gemma-3-270M (3.7%), whose caches dwarf or rival their weights, keep 224/32 and the bytes it
# saves. On a GPU every model takes them: each ubatch is a graph launch and a sync there (stock
# prefills in ubatches of 512), and the buffer's few MiB more (5.6 on SmolLM2) are small in VRAM.
WIDE_HOT, WIDE_UBATCH, WIDE_SHARE = 256, 256, 0.035


def sized_for_model(
    config: TieredConfig, f16_bytes_per_token: int, model_bytes: int, gpu: bool = False
) -> TieredConfig:
    """A preset's config with the wide hot window and batch where the model's weights dominate,
    or where its layers run on a GPU."""
    if not gpu and (WIDE_HOT + WIDE_UBATCH) * f16_bytes_per_token > WIDE_SHARE * model_bytes:
        return config
    return replace(config, hot=max(config.hot, WIDE_HOT), ubatch=max(config.ubatch, WIDE_UBATCH))
