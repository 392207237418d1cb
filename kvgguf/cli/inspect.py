"""`kvgguf inspect`: a GGUF model's attention shape and the KV bytes each cache would hold.

Reads only the metadata (kvgguf.model), never the weights, and predicts what ``kv_memory()``
of a live context reports, with kvgguf/policy/held.py's byte model (llama.cpp's padding, its cells'
block layouts, kvgguf's hot window and store).

tests/model/test_inspect.py holds the predictions against live contexts of both models.
"""

from __future__ import annotations

import json
import os
import textwrap
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from ..model.shape import KVShape
from ..bindings import codecs
from ..policy.held import (  # noqa: F401  (inspect.llama_cache_bytes & co., as before)
    LLAMA_BLOCK_BYTES,
    LLAMA_PAD,
    N_UBATCH,
    context_bytes,
    llama_cache_bytes,
    llama_cells_bytes,
    pad,
    store_bytes,
)
from ..policy.resolve import cell_types, near_exact, tiered_preset_for
from ..policy.tiered import TieredConfig, sized_for_model

CONTEXTS = (4096, 32768)


def fitted_config(shape: KVShape, config: TieredConfig, model_bytes: Optional[int] = None) -> TieredConfig:
    """The preset as kvgguf.Llama fits it: its hot window and batch follow the model's size (given
    its file's bytes), and the hot window covers a sliding window plus a block."""
    if model_bytes:
        config = sized_for_model(config, 2 * shape.values_per_token, model_bytes)
    return cell_types(config.fit_window(shape.n_swa, strict=False), shape)


def kvgguf_bytes(
    shape: KVShape,
    n_ctx: int,
    config: TieredConfig,
    *,
    n_batch: Optional[int] = None,
    n_ubatch: int = N_UBATCH,
    n_tokens: Optional[int] = None,
) -> dict:
    """policy.held.context_bytes for the config as kvgguf.Llama fits it to the model
    (fitted_config): what kv_memory() holds after n_tokens (default n_ctx)."""
    return context_bytes(
        shape,
        n_ctx,
        fitted_config(shape, config),
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_tokens=n_tokens,
    )


def llama_label(shape: KVShape, cache: str, swa_full: bool) -> str:
    return cache + ("" if not shape.n_swa else " (swa full)" if swa_full else " (swa window)")


def kv_table(
    shape: KVShape,
    contexts=CONTEXTS,
    *,
    n_batch: Optional[int] = None,
    n_ubatch: int = N_UBATCH,
    tiered: Optional[TieredConfig] = None,
    model_bytes: Optional[int] = None,
) -> list[dict]:
    """One row per cache: bytes held with n tokens in context, for each n of contexts.
    tiered: the model's calibrated preset (None: the fixed one). model_bytes: the model file's
    size, which sizes the presets' hot window and batch as kvgguf.Llama does (None: the defaults).
    llama.cpp's types as llama-cpp-python builds them with n_ctx=n, n_ubatch; both swa_full
    settings where the model has sliding-window layers. kvgguf's codecs as kvgguf.Llama builds
    them with kv_codec=<name>, n_ctx=n, n_batch (default: the config's ubatch)."""
    rows = []
    settings = (True, False) if shape.n_swa else (True,)
    for cache in ("f16", "q8_0", "q4_0"):
        for swa_full in settings:
            rows.append(
                {
                    "cache": llama_label(shape, cache, swa_full),
                    "from": "llama.cpp",
                    "swa_full": swa_full if shape.n_swa else None,
                    "bits_per_value": LLAMA_BLOCK_BYTES[cache] / 4,
                    "bytes": {
                        n: llama_cache_bytes(shape, n, cache, swa_full=swa_full, n_ubatch=n_ubatch) for n in contexts
                    },
                }
            )
    for name in ["tiered"] + codecs.names():
        config = tiered_preset_for(shape, tiered or TieredConfig()) if name == "tiered" else TieredConfig.parse(name)
        if model_bytes:
            config = sized_for_model(config, 2 * shape.values_per_token, model_bytes)
        label = "tiered (calibrated)" if name == "tiered" and tiered and not near_exact(shape) else name
        if shape.uneven_full_layers:  # Llama(kv_codec=...) refuses it (kvgguf.llamacpp.support)
            rows.append({"cache": label, "from": "kvgguf", "unavailable": shape.uneven_full_layers})
            continue
        try:
            sizes = {n: kvgguf_bytes(shape, n, config, n_batch=n_batch, n_ubatch=n_ubatch) for n in contexts}
        except ValueError as e:  # a head dim the codec cannot take
            rows.append({"cache": label, "from": "kvgguf", "unavailable": str(e)})
            continue
        rows.append(
            {
                "cache": label,
                "from": "kvgguf",
                "swa_full": None,
                "bits_per_value": None,
                "bytes": {n: s["hot"] + s["window"] + s["store"] + s["reuse"] for n, s in sizes.items()},
            }
        )
    for r in rows:
        if "bytes" in r:
            r["bits_held"] = {n: b * 8 / (n * shape.values_per_token) for n, b in r["bytes"].items()}
    return rows


def tokens(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _per_layer(values: tuple) -> str:
    """'2, 2, 1' for values that differ from layer to layer, '' where one number holds."""
    return ", ".join(map(str, values)) + " by layer" if len(set(values)) > 1 else ""


def _sliding_dims(shape: KVShape) -> str:
    """The head dims of sliding-window layers where they differ (Gemma 4's key_length_swa)."""
    swa = (
        {shape.layer_head_dims[il] for il in range(shape.n_layer) if il not in shape.full_attention_layers}
        if shape.layer_head_dims
        else set()
    )
    other = swa - {(shape.head_dim_k, shape.head_dim_v)}
    return "".join(f" (sliding layers K {k}, V {v})" for k, v in sorted(other))


def format_card(
    path,
    shape: KVShape,
    contexts=CONTEXTS,
    *,
    n_batch: Optional[int] = None,
    n_ubatch: int = N_UBATCH,
    tiered: Optional[TieredConfig] = None,
    model_bytes: Optional[int] = None,
) -> str:
    full = shape.full_layers
    if not shape.n_swa:
        swa = "no sliding window"
    elif shape.swa_pattern:
        swa = (
            f"sliding window {shape.n_swa} tokens, every {shape.swa_pattern}th layer full "
            f"({len(full)} of {shape.n_layer}: {', '.join(map(str, full))})"
        )
    else:
        swa = (
            f"sliding window {shape.n_swa} tokens, layers {', '.join(map(str, full))} full "
            f"({len(full)} of {shape.n_layer})"
        )
    preset = fitted_config(shape, TieredConfig(), model_bytes)
    hot = preset.hot
    batch = f"n_batch={n_batch}" if n_batch else f"n_batch=ubatch ({preset.ubatch})"
    notes = [
        "KV bytes a live context holds with n_ctx tokens in it, as its kv_memory() reports them.",
        f"llama.cpp rows: Llama(n_ctx=n_ctx, type_k=type_v=cache, n_ubatch={n_ubatch}); llama.cpp pads n_ctx "
        f"to a multiple of {LLAMA_PAD} cells.",
    ]
    if shape.n_swa:
        notes.append(
            f"'(swa full)': swa_full=True (llama.cpp's default), sliding-window layers hold n_ctx cells; "
            f"'(swa window)': swa_full=False, they hold min(n_ctx, {shape.n_swa} + n_ubatch) cells, "
            "padded."
        )
    notes += [
        f"kvgguf rows: Llama(kv_codec=name, n_ctx=n_ctx, {batch}, n_ubatch={n_ubatch}), presets fitted to "
        f"this model (tiered: hot={hot}): llama.cpp holds min(n_ctx, hot + n_batch) cells on every "
        f"layer{' (the sliding-window layers unpadded, whatever swa_full says)' if shape.n_swa else ''}, in {preset.hot_cells}"
        f"{f' (the sliding-window layers in {preset.window})' if shape.n_swa else ''}, the store every older token of the full-attention "
        "layers, encoded.",
        "bits = bytes x 8 / (n_ctx x layers x K+V values per token).",
    ]
    if shape.uneven_full_layers:
        notes.append(
            f"kvgguf rows n/a: kv_codec refuses this model, {shape.uneven_full_layers}; kv_codec=None "
            "runs it on llama.cpp's own cache."
        )
    lines = [
        f"model:        {path}",
        f"architecture: {shape.arch}",
        f"layers:       {shape.n_layer}",
        f"heads:        {shape.n_head} (KV heads {_per_layer(shape.layer_kv_heads) or shape.n_head_kv})",
        f"head dims:    K {shape.head_dim_k}, V {shape.head_dim_v}" + _sliding_dims(shape),
        f"attention:    {swa}",
        f"context:      {shape.n_ctx_train} tokens (trained)",
        "",
        *(textwrap.fill(n, 100, subsequent_indent="  ") for n in notes),
        "",
    ]
    head = ["cache", "from"] + [f"KV @ {tokens(n)}" for n in contexts] + [f"bits @ {tokens(n)}" for n in contexts]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in kv_table(shape, contexts, n_batch=n_batch, n_ubatch=n_ubatch, tiered=tiered, model_bytes=model_bytes):
        if "unavailable" in r:
            cells = [r["cache"], r["from"]] + ["n/a"] * (2 * len(contexts))
        else:
            cells = (
                [r["cache"], r["from"]]
                + [f"{r['bytes'][n] / 2**20:,.1f} MiB" for n in contexts]
                + [f"{r['bits_held'][n]:.2f}" for n in contexts]
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calibration_lines(path) -> tuple[list[str], Optional[dict]]:
    """What kv_codec='auto' and 'tiered' would use on this model: its calibration file and the
    plans."""
    from ..errors import CalibrationError
    from ..model.registry import calibration_path
    from ..policy.calibration_plan import Calibration
    from .calibrate import plan_table

    file = calibration_path(path)
    if not file.exists():
        return [f"calibration:  none yet (`kvgguf calibrate {path}` or the first kv_codec='auto' measures it)"], None
    try:
        cal = Calibration.load(file)
        cal.require_model(str(path))
    except CalibrationError as e:
        return [f"calibration:  {file} cannot be used: {e}"], None
    text = cal.text
    lines = [
        f"calibration:  {file} ({text.get('tokens')} tokens of "
        f"{'self-written text' if text.get('source') == 'self' else text.get('source')})"
    ]
    note = cal.unmeasured_note(path)
    if note:
        lines.append("  " + note)
    lines += ["  " + row for row in plan_table(cal)]
    return lines, cal.to_json()


def run(args) -> int:
    from ..model.registry import path as model_path

    path = model_path(args.model)
    shape = KVShape.from_gguf(path)
    contexts = tuple(args.ctx) if args.ctx else CONTEXTS
    size = os.path.getsize(path)
    lines, cal = calibration_lines(path)
    tiered = None
    if cal is not None:  # kv_codec="tiered" follows it (a file that cannot be used: the fixed preset)
        from ..policy.resolve import calibrated_config
        from ..policy import kv_codec

        preset, request = kv_codec.parse("tiered")
        tiered = calibrated_config(str(path), request, base=preset)[0]
    if args.json:
        print(
            json.dumps(
                {
                    "path": str(path),
                    **asdict(shape),
                    "n_ubatch": N_UBATCH,
                    "kv_table": kv_table(shape, contexts, tiered=tiered, model_bytes=size),
                    "calibration": cal,
                },
                indent=2,
            )
        )
    else:
        print(format_card(Path(path), shape, contexts, tiered=tiered, model_bytes=size))
        print()
        print("\n".join(lines))
    return 0
