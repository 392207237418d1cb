"""The `kv_codec` grammar: what a string (or a TieredConfig) passed as kv_codec asks for.

"auto[:BITS]" and "tiered" are decided by the model's calibration once the model is known
(evaluation/calibration.py measures it, policy/calibration_plan.py reads it); every other form is a TieredConfig here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from .tiered import CACHE_TYPES, HOT_CELL_TYPES, TieredConfig

# Suffixes any kv_codec string may end in, in any order: the types of llama.cpp's own cells
# ("tiered:window=f16", "rotq4:hot=q8_0", "auto:3.5:hot=q8_0:window=q8_0"), the store's bound
# and its rule ("tiered:budget=64MiB", "tiered:budget=16MiB:drop=oldest").
CELL_OPTIONS = {
    "window": ("the sliding-window cells", CACHE_TYPES),  # TieredConfig.window
    "hot": ("the hot cells", HOT_CELL_TYPES),  # TieredConfig.hot_cells
}
MEMORY_OPTIONS = ("budget", "drop")  # TieredConfig.budget (SIZE), .drop
UNITS = {"": 1, "B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_size(text: str) -> int:
    """Bytes of a size written as a number with an optional unit: "64MiB", "1.5GiB", "65536"."""
    number = text.rstrip("KMGiB")
    unit = text[len(number) :]
    try:
        value = float(number) * UNITS[unit]
    except (KeyError, ValueError):
        value = float("nan")
    if not value >= 1 or value != value:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with KiB, MiB or GiB (e.g. '64MiB')")
    return int(value)


DEFAULT_BUDGET = 3.0  # bits per value over the compressed rows (docs/results/calibration.md: what the budgets measured)
PRESET_BUDGET = (
    4.0  # "tiered" on a calibrated model: recall like f16's at 5K where 3.5 lost it (docs/results/recall.md)
)
# Codec families the calibrated "tiered" leaves out: their fused decode reads a table per value
# (tcq) or per set (wfq), 0.65-0.8x rotq's speed; with tcq keys the preset decoded SmolLM2 at 8K
# at 0.92x of stock f16's best, the fixed preset at 1.26x (benchmarks/results/quality/preset/
# live_cache_8k_tcq). "auto:BITS" weighs quality per bit alone and keeps them. A measured speed,
# not a codec fact: codecs.info has SIMD kernels for both (simd_ops) and no field for this.
PRESET_SLOW_FAMILIES = ("tcq", "wfq")
# Bits per value the calibrated "tiered" gives every key at least, taking them from the values:
# recall lives in the keys. On SmolLM2 at 5K (benchmarks/retrieval.py, 20 facts, docs/results/recall.md)
# exact keys found what f16 found (15) with the values at 3-4 bits, and at equal bits held (4.34)
# 4-bit keys everywhere found 14 where the KL-optimal plan, 3-bit keys on 10 layers, found 11:
# the calibration's KL, measured on 512 tokens, does not see a fact lost among thousands of keys.
PRESET_KEY_BITS = 4


HELD = "held="  # "auto:held=BITS": BITS per value of everything the context holds, its cells too


def parse_auto(kv_codec, *, held: bool = False) -> Optional[float]:
    """The budget of "auto" / "auto:BITS" (held: also of "auto:held=BITS"), or None for any other
    kv_codec."""
    if not isinstance(kv_codec, str) or kv_codec.split(":", 1)[0] != "auto":
        return None
    if kv_codec == "auto":
        return DEFAULT_BUDGET
    rest = kv_codec[len("auto:") :]
    if held and rest.startswith(HELD):
        rest = rest[len(HELD) :]
    try:
        budget = float(rest)
    except ValueError:
        budget = float("nan")
    if not 1.0 <= budget <= 16.0:
        forms = "'auto', 'auto:BITS' or 'auto:held=BITS'" if held else "'auto' or 'auto:BITS'"
        raise ValueError(f"kv_codec {kv_codec!r}: write {forms} with BITS in [1, 16], e.g. 'auto:3.0'")
    return budget


@dataclass(frozen=True)
class Request:
    """A kv_codec that a model's calibration decides: the plan for budget among the codecs not
    in exclude; required: measure the model when it has no calibration ("auto"), else keep the
    fixed preset ("tiered")."""

    budget: float
    required: bool = True
    exclude: tuple[str, ...] = ()  # codec families (codecs.family) the plan may not use
    # "auto:held=BITS": budget counts every value the context holds at its n_ctx, llama.cpp's hot
    # and sliding-window cells too (policy/held.py), not only the compressed rows
    held: bool = False
    key_bits: int = 0  # keys at no fewer bits per value, where the budget holds them (Calibration.plan)


def parse(kv_codec) -> tuple[TieredConfig, Optional[Request]]:
    """(config, request) of any kv_codec a user may pass, with optional ":window=TYPE" and
    ":hot=TYPE" suffixes (TieredConfig.window, .hot_cells): "auto[:BITS]", "auto:held=BITS" and "tiered" give the
    fixed preset's config (whose codecs a calibration replaces once the model is known) and a
    Request; anything else TieredConfig.parse's config and None ("tiered:fixed": the fixed
    preset whatever the cache folder holds)."""
    kv_codec, cells = split_cells(kv_codec)
    budget = parse_auto(kv_codec, held=True)
    if budget is not None:
        config, request = TieredConfig(), Request(budget, held=kv_codec.startswith("auto:" + HELD))
    elif kv_codec == "tiered":
        config, request = (
            TieredConfig(),
            Request(PRESET_BUDGET, required=False, exclude=PRESET_SLOW_FAMILIES, key_bits=PRESET_KEY_BITS),
        )
    else:
        config, request = TieredConfig.parse(kv_codec), None
    if "window" in cells:
        config = replace(config, window=cells["window"])
    if "hot" in cells:
        config = replace(config, hot_cells=cells["hot"])
    if "budget" in cells:
        config = replace(config, budget=parse_size(cells["budget"]))
    if "drop" in cells:
        config = replace(config, drop=cells["drop"])
    return config, request


def split_cells(kv_codec):
    """(kv_codec without its ":window=TYPE" / ":hot=TYPE" / ":budget=SIZE" / ":drop=RULE"
    suffixes, {option: value}); any other kv_codec as it is."""
    cells: dict[str, str] = {}
    given = kv_codec
    while isinstance(kv_codec, str):
        head, _, tail = kv_codec.rpartition(":")
        option, eq, value = tail.partition("=")
        if not head or not eq or option not in (*CELL_OPTIONS, *MEMORY_OPTIONS):
            break
        if option in cells:  # read from the end: the later one is in cells already
            raise ValueError(
                f"kv_codec {given!r}: ':{option}=' is given twice ({value!r} and {cells[option]!r}); give it once"
            )
        if option in MEMORY_OPTIONS:
            cells[option] = value
            kv_codec = head
            continue
        what, types = CELL_OPTIONS[option]
        if value not in types:
            raise ValueError(f"kv_codec {given!r}: {what}' type must be one of {', '.join(types)}; got {value!r}")
        cells[option] = value
        kv_codec = head
    return kv_codec, cells


def is_kv_codec(spec) -> bool:
    """Whether kvgguf.Llama takes spec as a kv_codec (what parse accepts)."""
    try:
        parse(spec)
    except (TypeError, ValueError):
        return False
    return True
