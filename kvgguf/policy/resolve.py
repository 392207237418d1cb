"""From what a user passes to `kvgguf.Llama` (kv_codec, n_ctx, n_batch, cache types) to the
TieredConfig its cache runs, decided from the GGUF's metadata and the model's calibration before
llama.cpp loads anything: `resolve`. The facade (kvgguf/llama.py) calls it and builds the
context; install() shares its refusals (`unsupported_setting`)."""

from __future__ import annotations

import os
import sys
import warnings
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Optional, Union

from ..bindings import codecs
from ..errors import CalibrationError, UnsupportedModelError
from ..model.gguf_file import read_metadata
from ..model.registry import calibration_path
from ..model.shape import MAX_LAYERS, KVShape
from . import calibration_plan, codec_spec, held
from .kv_codec import Request, parse as parse_kv_codec
from .tiered import CACHE_TYPES, PRESET_HOT_CELLS, PRESET_WINDOW, TieredConfig, sized_for_model, type_name

# llama.cpp's own cache types, by the names its CLI uses (-ctk/-ctv), and their ggml numbers
# (ggml.h's enum ggml_type, append-only).
F16 = CACHE_TYPES["f16"]
# The preset where rotations cannot take the head dim (not a power of two: 80, 96, 100, 112):
# KIVI's integer codes take any head dim, at the preset's bits (warm 4, archive V 2).
KIVI_PRESET = {"warm": "kivi4", "archive": ("kivi4", "kivi2")}
# Where few layers attend to the whole context (Gemma 3: 3 of 18; the others keep a window in
# llama.cpp's q8_0 cells), their cold rows are a small share of what a context holds at the
# lengths people run, and the 4-bit plan saves few bytes for its loss: there the presets keep
# them near exact, kivi8 in groups of 64 (8.5 bits, q8_0's), and hold fewer bits than
# llama.cpp's q8_0 at its KL (docs/results/quality.md, "Gemma-3: where kvgguf meets q8_0's KL").
NEAR_EXACT_SHARE = 0.2  # the most full-attention layers, as a share of all, that get it
NEAR_EXACT_PRESET = {"warm": "kivi8", "warm_tokens": 0, "archive": None, "group_size": 64}

# Measures a model's calibration ("auto" on first use): evaluation.calibration.calibrate, passed
# in by the facade, which may import the evaluation layer (tests/project/test_layers.py).
Calibrate = Callable[[str, Callable[[int, int], None]], calibration_plan.Calibration]


def cache_type(value: Union[str, int, None], name: str) -> Optional[int]:
    """A llama.cpp cache type from its name ("q8_0") or its ggml type number."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value in CACHE_TYPES:
        return CACHE_TYPES[value]
    raise ValueError(f"{name} {value!r} is unknown; choose one of: {', '.join(CACHE_TYPES)}")


def unsupported_setting(
    *, n_ctx: int = 512, type_k=None, type_v=None, vocab_only: bool = False, **_other
) -> Optional[str]:
    """Why llama_cpp.Llama settings cannot take a kv_codec, or None: the one rule that the facade
    (which refuses them) and install() (which falls back to stock) share."""
    if vocab_only:
        return "vocab_only loads no KV cache to compress"
    if n_ctx <= 0:
        return f"n_ctx={n_ctx} holds no logical context (a kv_codec needs n_ctx > 0)"
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        if cache_type(t, name) not in (None, F16):
            return (
                f"kv_codec chooses the type of llama.cpp's cells itself ('...:hot=q8_0'); {name} must be f16 "
                f"or None (got {type_name(t)!r})"
            )
    return None


def refusal(model_path: str, arch: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"kv_codec cannot hold the cache of {model_path} ('{arch}'): {why}. "
        "Use kv_codec=None for llama.cpp's own cache."
    )


def decode_batch(n_batch: Optional[int], n_ctx: int, config: TieredConfig, verbose: bool = False) -> int:
    """Tokens per llama_decode call with a kv_codec: the caller's n_batch where it fits the hot
    window, else the config's ubatch. A longer batch (llama-cpp-python's default is 512) is
    split, never refused: llama.cpp's f16 cells hold the hot window plus one decode batch, so
    decoding 512 at a time would make them hot + 512."""
    ubatch = min(config.ubatch, n_ctx)
    if n_batch is None:
        return ubatch
    if n_batch <= config.hot:
        return n_batch
    if verbose:
        print(
            f"kvgguf: n_batch={n_batch} is longer than the hot window ({config.hot} tokens): evaluations "
            f"reach llama.cpp in batches of {ubatch} tokens",
            file=sys.stderr,
        )
    return ubatch


@dataclass(frozen=True)
class Resolved:
    """What a Llama with a kv_codec runs: its config, the model's KV shape, the calibration file
    the config follows (None: none), the batch llama.cpp gets, and the types of
    llama.cpp's cells (the config's, None in it decided for this model: cell_types)."""

    config: TieredConfig
    shape: KVShape
    calibrated: Optional[Path]
    n_batch: int
    hot_cells: str = "f16"
    window: Optional[str] = None  # None: the model has no sliding-window layers


# The codec families a GPU layer attends over (kvgguf.bindings.cuda_store.GPU_CODECS), K and V in
# any mix: a calibrated plan for a context on a GPU leaves the others out.
GPU_FAMILIES = ("f16", "kivi", "rotq")


def gpu_request(request: Optional[Request]) -> Optional[Request]:
    """The request with every codec family the GPU does not attend over left out of its plan."""
    if request is None:
        return None
    others = {codecs.family(name) for name in codecs.names()} - set(GPU_FAMILIES)
    return replace(request, exclude=tuple(sorted(set(request.exclude) | others)))


def resolve(
    model_path: str,
    kv_codec: Union[str, TieredConfig],
    *,
    n_ctx: int,
    n_batch: Optional[int],
    verbose: bool,
    calibrate: Calibrate,
    flash_attn: bool = True,
    gpu: bool = False,
) -> Resolved:
    """The cache a kv_codec asks for on this model, checked against its shape and head dims;
    "auto" and "tiered" are allocated from its calibration (measured by `calibrate` for "auto"
    when it has none). gpu: the context's layers will be on a GPU, so a calibrated plan takes only
    the codecs it attends over (GPU_FAMILIES)."""
    preset = isinstance(kv_codec, str)
    config, request = parse_kv_codec(kv_codec)  # request: "auto[:BITS]" or "tiered", calibration decides
    if gpu:
        request = gpu_request(request)
    config, shape = _config_for_model(config, preset, model_path)
    cells = _fit_cell_types(config, shape, model_path, flash_attn=flash_attn, verbose=verbose, gpu=gpu)
    if preset:  # the presets' hot window and batch follow the model's size (policy.tiered.WIDE_SHARE)
        config = sized_for_model(config, 2 * shape.values_per_token, os.path.getsize(model_path), gpu=gpu)
    tiered_preset = preset and kv_codec.split(":")[0] == "tiered"  # "tiered", "tiered:fixed", "tiered:keep=..."
    config, request = _fit_codecs(
        config, shape, model_path, tiered_preset=tiered_preset, request=request, verbose=verbose
    )
    if tiered_preset and config.keep is None and near_exact(shape):
        config, request = _near_exact(config, shape, model_path, verbose)
    n_batch = decode_batch(n_batch, n_ctx, config, verbose)
    calibrated = None
    if request is not None:
        progress = calibration_progress(model_path, verbose)

        def with_cells(c: TieredConfig) -> TieredConfig:
            return replace(c, hot_cells=cells.hot_cells, window=cells.window)

        def held_of(c: TieredConfig) -> float:  # what a full context holds with c's codecs
            return held.bits_held(shape, n_ctx, with_cells(c), n_batch)

        config, calibrated = calibrated_config(
            model_path,
            request,
            base=config,
            progress=progress,
            context=n_ctx,
            calibrate=calibrate,
            held_of=held_of if request.held else None,
        )
        if request.held and verbose:
            print(
                f"kvgguf: kv_codec='auto:held={request.budget:g}': the compressed rows hold "
                f"{held.compressed_bits(shape, n_ctx, with_cells(config), n_batch):.2f} "
                f"bits per value; a full context of {n_ctx} tokens holds {held_of(config):.2f} in all, with "
                f"llama.cpp's cells (hot {cells.hot_cells}"
                + (f", sliding window {cells.window}" if shape.n_swa else "")
                + ")",
                file=sys.stderr,
            )
        if not request.required and verbose:
            said = (
                f"follows this model's calibration ({calibrated})"
                if calibrated
                else "holds the fixed preset (no calibration for this model: `kvgguf calibrate` measures one)"
            )
            print(f"kvgguf: kv_codec='tiered' {said}", file=sys.stderr)
    if not preset and config.hot >= n_ctx:
        warnings.warn(
            f"kvgguf: the hot window ({config.hot} tokens) covers the whole context (n_ctx={n_ctx}): every "
            f"token stays f16 in llama.cpp's cells and nothing is compressed; lower TieredConfig.hot, or "
            f"use kv_codec=None for llama.cpp's own cache",
            stacklevel=3,
        )
    return Resolved(config, shape, calibrated, n_batch, cells.hot_cells, cells.window if shape.n_swa else None)


def _config_for_model(config: TieredConfig, preset: bool, model_path: str) -> tuple[TieredConfig, KVShape]:
    """The config fitted to the model's sliding window, and the model's KV shape (one read of
    the GGUF's metadata for both)."""
    meta = read_metadata(model_path, max_array=MAX_LAYERS)
    try:
        shape = KVShape.from_metadata(meta, model_path)
    # keys an attention model has are missing (a recurrent model), or a layout kvgguf cannot read
    except ValueError as e:
        raise refusal(model_path, meta.get("general.architecture", "?"), str(e)) from None
    try:
        return config.fit_window(shape.n_swa, strict=not preset), shape
    except ValueError as e:
        raise ValueError(f"{model_path}: {e}") from None


UNQUANTIZED = ("f32", "f16", "bf16")


def window_refusal(window: str, shape: KVShape, flash_attn: bool = True, *, sliding: bool = True) -> Optional[str]:
    """Why llama.cpp cannot hold this model's sliding-window cells (sliding=False: the hot
    cells) in `window`, or None: a quantized type needs flash
    attention (llama.cpp reads quantized V only there) and head dims that its blocks of 32
    divide (llama_init_from_model's check, which the patch repeats for the window cells)."""
    if window in UNQUANTIZED:
        return None
    if not flash_attn:
        return "need flash attention (llama.cpp reads quantized V only there)"
    # the hot cells' type is the context's type_k / type_v, which llama_init_from_model checks
    # against every layer's head dims, the sliding ones' too (Gemma 4: 16 there, 32 elsewhere)
    layers = [il for il in range(shape.n_layer) if not sliding or il not in shape.full_layers]
    dims = sorted({shape.head_dim(il, kind) for il in layers for kind in (0, 1)})
    if any(d % 32 for d in dims):
        which = "window" if sliding else "model's"
        return f"need head dims that blocks of 32 divide (the {which} layers' are {', '.join(map(str, dims))})"
    return None


def cell_types(config: TieredConfig, shape: KVShape, flash_attn: bool = True, gpu: bool = False) -> TieredConfig:
    """The config with the types llama.cpp's cells get on this model: a window or hot_cells of
    None becomes q8_0 (PRESET_WINDOW, PRESET_HOT_CELLS) where llama.cpp can hold it, else f16.
    A model without sliding-window layers keeps window as it is. On a GPU the hot cells default to
    f16: the GPU codes evicted cells where they lie from f16 only (q8_0 cells are read out to the
    host and coded there), and a few hundred cells are little of the VRAM."""
    if config.hot_cells is None and gpu:
        config = replace(config, hot_cells="f16")
    if config.hot_cells is None:
        fits = window_refusal(PRESET_HOT_CELLS, shape, flash_attn, sliding=False) is None
        config = replace(config, hot_cells=PRESET_HOT_CELLS if fits else "f16")
    if shape.n_swa and config.window is None:
        fits = window_refusal(PRESET_WINDOW, shape, flash_attn) is None
        config = replace(config, window=PRESET_WINDOW if fits else "f16")
    return config


def _fit_cell_types(
    config: TieredConfig, shape: KVShape, model_path: str, *, flash_attn: bool, verbose: bool, gpu: bool = False
) -> TieredConfig:
    """cell_types, and a type the config names that llama.cpp cannot hold here refused."""
    if config.hot_cells is not None:
        why = window_refusal(config.hot_cells, shape, flash_attn, sliding=False)
        if why:
            raise ValueError(f"{model_path}: hot cells in {config.hot_cells} {why}; use ':hot=f16'")
    if shape.n_swa and config.window is not None:
        why = window_refusal(config.window, shape, flash_attn)
        if why:
            raise ValueError(f"{model_path}: sliding-window cells in {config.window} {why}; use ':window=f16'")
    fitted = cell_types(config, shape, flash_attn, gpu)
    for what, asked, got, default, sliding in (
        ("sliding-window", config.window, fitted.window, PRESET_WINDOW, True),
        ("hot", config.hot_cells, fitted.hot_cells, PRESET_HOT_CELLS, False),
    ):
        if verbose and asked is None and got == "f16" and (sliding is False or shape.n_swa):
            why = window_refusal(default, shape, flash_attn, sliding=sliding)
            if why:  # else chosen (hot cells on a GPU)
                print(f"kvgguf: the {what} cells stay f16 ({default} cells {why})", file=sys.stderr)
    return fitted


def _unfit(shape: KVShape, *specs) -> dict[str, str]:
    """The codecs of these specs that this model's head dims cannot take ({codec: why})."""
    out = {}
    for spec in specs:
        if spec is not None:
            out.update(codec_spec.unfit(spec, shape.n_layer, shape.full_layers, shape.head_dim))
    return out


def _fit_codecs(
    config: TieredConfig, shape: KVShape, model_path: str, *, tiered_preset: bool, request, verbose: bool
) -> tuple[TieredConfig, Optional[Request]]:
    """Config and calibration request as this model's head dims allow, decided before any token:
    the presets switch to KIVI_PRESET (a calibration measures rotations, so "tiered" skips it and
    "auto" is refused); a codec the user named that cannot take them is refused, naming why."""
    unfit = _unfit(shape, config.warm, config.archive)
    if request is not None and request.required and _unfit(shape, "rotq4"):
        raise ValueError(
            f"{model_path}: kv_codec='auto' calibrates codecs that rotate rows, and this model's head dims "
            f"(K {shape.head_dim_k}, V {shape.head_dim_v}) are not powers of two; use 'tiered' "
            f"(KIVI on this model) or a kivi codec"
        )
    if not unfit:
        return config, request
    if not tiered_preset:
        fitting = [name for name in codecs.names() if not _unfit(shape, name)]
        raise ValueError(
            f"{model_path}: {'; '.join(unfit.values())}. Codecs this model's head dims take: {', '.join(fitting)}"
        )
    if verbose:
        print(
            f"kvgguf: {os.path.basename(model_path)} has head dims K {shape.head_dim_k} / V {shape.head_dim_v}, "
            f"which rotations cannot take: the tiered preset holds warm {KIVI_PRESET['warm']}, archive "
            f"K {KIVI_PRESET['archive'][0]} / V {KIVI_PRESET['archive'][1]} on this model",
            file=sys.stderr,
        )
    return replace(config, **KIVI_PRESET), None


def near_exact(shape: KVShape) -> bool:
    """Whether the "tiered" preset keeps this model's cold rows near exact (NEAR_EXACT_PRESET)."""
    return bool(shape.n_swa) and len(shape.full_layers) <= NEAR_EXACT_SHARE * shape.n_layer


def tiered_preset_for(shape: KVShape, config: TieredConfig) -> TieredConfig:
    """The "tiered" preset's codecs on this model: config (the fixed or calibrated preset), or
    NEAR_EXACT_PRESET where near_exact says so (`kvgguf inspect` predicts with it)."""
    return replace(config, **NEAR_EXACT_PRESET) if near_exact(shape) else config


def _near_exact(config: TieredConfig, shape: KVShape, model_path: str, verbose: bool) -> tuple[TieredConfig, None]:
    """The preset on a model with few full-attention layers: tiered_preset_for's, no calibration."""
    if verbose:
        print(
            f"kvgguf: {os.path.basename(model_path)} attends to the whole context in {len(shape.full_layers)} of "
            f"{shape.n_layer} layers: the tiered preset keeps their older rows near exact "
            f"({NEAR_EXACT_PRESET['warm']}, groups of {NEAR_EXACT_PRESET['group_size']}); "
            f"'auto:BITS' plans fewer bits",
            file=sys.stderr,
        )
    return tiered_preset_for(shape, config), None


def calibrated_config(
    model_path: str,
    request: Union[Request, float],
    *,
    base: Optional[TieredConfig] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    context: Optional[int] = None,
    calibrate: Optional[Calibrate] = None,
    held_of: Optional[Callable[[TieredConfig], float]] = None,
) -> tuple[TieredConfig, Optional[Path]]:
    """The config a Request (or a budget: "auto:BITS") gets on this model, and the calibration
    file it follows (None: base, the fixed preset, as it is). The model's calibration from the
    cache folder is allocated for the budget, codecs with a plan paying for it over `context`
    tokens (the Llama's n_ctx; None: calibration_plan.PLAN_CONTEXT); a required request
    ("auto") measures the model with `calibrate` when it has none and keeps the result;
    "tiered" never measures, and keeps base with a warning when the model's file cannot be used.
    A held request ("auto:held=BITS") needs held_of, the bits per value a config holds in all
    (cells included): its plan gets the largest budget whose config holds at most BITS."""
    if not isinstance(request, Request):
        request = Request(float(request))
    if request.held and held_of is None:
        raise ValueError("'auto:held=BITS' needs a context (the cells it counts): pass held_of")
    base = base or TieredConfig()
    path = calibration_path(model_path)  # hashes the GGUF's metadata: once per call
    try:
        cal = calibration_plan.load_for(model_path, path)
    except CalibrationError as e:
        if request.required:
            raise
        warnings.warn(f"kv_codec='tiered' keeps the fixed preset: {e}", stacklevel=3)
        return base, None
    if cal is None:
        if not request.required:
            return base, None
        if calibrate is None:
            raise CalibrationError(f"{model_path} has no calibration yet: `kvgguf calibrate {model_path}` measures one")
        cal = calibrate(model_path, progress or (lambda done, total: None))
        cal.save(path)
    note = cal.unmeasured_note(model_path)
    if note:  # a file kept from an older kvgguf: it loads, but its plans miss newer codecs
        warnings.warn(f"kvgguf: the calibration {path} was {note}", stacklevel=3)
    budget = request.budget
    if request.held:

        def config_for(b: float) -> TieredConfig:
            return cal.config(b, base, context, request.exclude, request.key_bits)

        budget = held.budget_for_held(request.budget, config_for, held_of, f"kv_codec 'auto:held={request.budget:g}'")
    return cal.config(budget, base, context, request.exclude, request.key_bits), path


def calibration_progress(model_path: str, verbose: bool) -> Callable[[int, int], None]:
    """A progress callback for the first use of "auto" on a model (minutes): a bar on a terminal,
    and where stderr is not one (a server's log, a notebook) a line at every tenth of the lists."""
    bar, said = None, -1

    def progress(done: int, total: int) -> None:
        nonlocal bar, said
        if not verbose:
            return
        if bar is None and said < 0:
            print(
                f"kvgguf: calibrating {os.path.basename(model_path)} for kv_codec='auto' (once; kept in "
                f"{calibration_path(model_path)})",
                file=sys.stderr,
                flush=True,
            )
            said = 0
            if sys.stderr.isatty():
                from tqdm import tqdm

                bar = tqdm(total=total, desc="calibrating", unit="list", leave=False)
        if bar is not None:
            bar.update(done - bar.n)
            if done >= total:
                bar.close()
            return
        tenth = 10 * done // max(total, 1)
        if tenth > said:
            said = tenth
            print(f"kvgguf: calibrating: {done}/{total} lists measured ({10 * tenth}%)", file=sys.stderr, flush=True)

    return progress
