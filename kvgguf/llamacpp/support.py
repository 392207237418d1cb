"""Which models kvgguf's cache can hold, decided from what llama.cpp built, not from names.

Patch 0007 records, for every layer, how llama.cpp built its attention while the context reserved
its graphs (before any token). kvgguf holds a model when every layer that has a KV cache attends
through the KV-cache `build_attn` that the patches hook (native/llama/src/llama-kvgguf-graph.cpp), with K and V of its own, in a
`llama_kv_cache` (or its sliding-window pair). That is the whole llama class (llama, qwen2/3,
phi3, gemma 1-3, mistral, olmo, granite, starcoder2, smollm3, cohere2, exaone, glm4, ...).
It refuses MLA's latent caches (deepseek2, kimi), sparse attention, recurrent and hybrid
memories, KV shared between layers, encoder-decoder models and multi-axis positions (M-RoPE).
"""

from __future__ import annotations

import contextlib
import ctypes
from dataclasses import dataclass
from typing import Optional

import llama_cpp.llama_cpp as C

from ..model.shape import KVShape
from . import hooks

# Tested: tiny random-weight models of each reproduce stock logits with an exact cold store and
# run the preset (tests/model/test_archs.py). Any other architecture is held when its layers qualify.
TESTED_ARCHS = (
    "llama",
    "gemma3",
    "qwen2",
    "qwen3",
    "qwen3moe",
    "phi3",
    "mistral3",
    "granite",
    "smollm3",
    "olmo",
    "olmo2",
    "starcoder2",
    "cohere2",
    "gemma",
    "gemma2",
    "gemma4",
    "granite_swa",
    "exaone",
    "exaone4",
    "glm4",
    "internlm2",
    "stablelm",
    "command-r",
    "gpt-oss",
)
_MULTI_AXIS_ROPE = {8: "M-RoPE", 40: "interleaved M-RoPE", 24: "vision RoPE"}  # llama_rope_type


@dataclass(frozen=True)
class AttentionLayers:
    """What llama.cpp built, per layer: the layers kvgguf gives cold rows, and those of them the
    fused path cannot take (a KQ bias, ALiBi, Grok's capping: they expand cold rows to f16)."""

    full: tuple[int, ...]
    expanding: tuple[int, ...]


def why_not(model, ctx, shape: KVShape) -> Optional[str]:
    """Why kvgguf cannot hold this context's cache, or None when it can."""
    if C.llama_model_has_encoder(model):
        return "it is an encoder-decoder model"
    if C.llama_model_is_recurrent(model):
        return "it is a recurrent model: its memory is a state, not a KV cache"
    if C.llama_model_is_hybrid(model):
        return "it is a hybrid recurrent model: its attention layers share a memory kvgguf does not hold"
    rope = _MULTI_AXIS_ROPE.get(C.llama_model_rope_type(model))
    if rope:
        return f"its positions have several axes ({rope}), which kvgguf's store does not track"
    full = []
    for il in range(shape.n_layer):
        n_k, n_v = ctypes.c_int32(), ctypes.c_int32()
        kind = hooks.layer_info(ctx, il, ctypes.byref(n_k), ctypes.byref(n_v))
        if kind < 0:
            continue  # no KV cache on this layer
        path = hooks.attention_path(ctx, il)
        if not path & hooks.PATH_KV:
            return (
                f"layer {il}'s attention does not read llama.cpp's KV cache through the path kvgguf extends "
                "(an MLA latent cache, sparse attention or another memory)"
            )
        if path & hooks.PATH_SHARED:
            return f"layer {il} reads another layer's KV cache (KV sharing)"
        if (n_k.value, n_v.value) != (shape.width(il, 0), shape.width(il, 1)):
            return (
                f"layer {il} holds {n_k.value}/{n_v.value} K/V values per token in llama.cpp, where its GGUF "
                f"reads as {shape.width(il, 0)}/{shape.width(il, 1)}"
            )
        if kind == 1:
            full.append(il)
    if not full:
        return "no layer attends to the whole context: llama.cpp's own cache already holds only the window"
    if tuple(full) != tuple(shape.full_layers):
        return f"llama.cpp gives full attention to layers {full}, where kvgguf read {shape.full_layers} from its GGUF"
    return shape.uneven_full_layers


def attention_layers(ctx, shape: KVShape) -> AttentionLayers:
    """The full-attention layers and which of them take the expanding path (after why_not passed)."""
    full = [il for il in range(shape.n_layer) if hooks.layer_info(ctx, il, None, None) == 1]
    expanding = [il for il in full if hooks.attention_path(ctx, il) & hooks.PATH_EXPAND]
    return AttentionLayers(tuple(full), tuple(expanding))


@contextlib.contextmanager
def cell_settings(window_type: int, window_cells: int):
    """The contexts this thread creates inside hold their sliding-window cells in window_type (K
    and V), window_cells of them (raised to the ring's window plus a ubatch), and their
    full-attention cells unrotated (llama.cpp rotates quantized cells; the store's codecs and
    calibrations work on rows as the model makes them); every later context as llama.cpp
    decides again."""
    if hooks.set_window_types(window_type, window_type) != 0:
        raise ValueError(f"llama.cpp has no cache type {window_type}")
    hooks.set_window_cells(window_cells)
    hooks.set_full_rotation(False)
    try:
        yield
    finally:
        hooks.set_window_types(hooks.GGML_TYPE_COUNT, hooks.GGML_TYPE_COUNT)
        hooks.set_window_cells(0)
        hooks.set_full_rotation(True)


def window_type(ctx, shape: KVShape) -> Optional[int]:
    """The ggml type of the sliding-window cells (K and V alike), -1 where K and V differ, or
    None on a model without sliding-window cells of their own."""
    for il in range(shape.n_layer):
        if il in shape.full_layers:
            continue
        cells = hooks.cells_of(ctx, il)
        if cells is not None:
            k, v, _ = cells
            return k if k == v else -1
    return None
