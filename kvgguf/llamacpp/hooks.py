"""ctypes bindings for the functions kvgguf adds to llama.cpp (native/llama/include/llama-kvgguf.h)."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C

LLAMA_KVGGUF_K = 0
LLAMA_KVGGUF_V = 1


class llama_kvgguf_hooks(ctypes.Structure):
    """struct llama_kvgguf_hooks: llama.cpp copies it, so it need not outlive the call."""

    _fields_ = [
        ("user", ctypes.c_void_p),
        ("n_cold", ctypes.c_void_p),  # int32_t (*)(void * user, int32_t il)
        ("decode", ctypes.c_void_p),  # int32_t (*)(void * user, int32_t il, int32_t kind, ...)
        ("n_threads", ctypes.c_int32),  # max concurrent decode() calls; <= 0: all threads
        ("max_rows_per_call", ctypes.c_int32),
        ("shifts", ctypes.c_void_p),  # int32_t (*)(void * user, int32_t il, int32_t cap, ...): shifted runs
    ]


def _bind(name, argtypes, restype):
    fn = getattr(C._lib, name)
    fn.argtypes = argtypes
    fn.restype = restype
    return fn


set_hooks = _bind(
    "llama_kvgguf_set_hooks", [C.llama_context_p_ctypes, ctypes.POINTER(llama_kvgguf_hooks)], ctypes.c_int32
)
layer_info = _bind(
    "llama_kvgguf_layer_info",
    [C.llama_context_p_ctypes, ctypes.c_int32, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)],
    ctypes.c_int32,
)
# Which cells a call reads: (ctx, seq_id, il, kind, p0, p1), as read_rows and view_cells take them.
_CELLS_OF = [
    C.llama_context_p_ctypes,
    ctypes.c_int32,  # seq_id
    ctypes.c_int32,  # il
    ctypes.c_int32,  # kind
    ctypes.c_int32,  # p0
    ctypes.c_int32,  # p1
]
read_rows = _bind(
    "llama_kvgguf_read_rows",
    [*_CELLS_OF, ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int32)],
    ctypes.c_int64,
)
# read_rows as f32 (patch 18), converted as ggml converts the cells' type: exactly p1 - p0 rows
# in position order, else -2 (-1 bad arguments, -3 a type ggml cannot convert, -4 dst too small).
read_rows_f32 = _bind(
    "llama_kvgguf_read_rows_f32", [*_CELLS_OF, ctypes.POINTER(ctypes.c_float), ctypes.c_size_t], ctypes.c_int64
)
# The sequence state of positions [p0, p1) only, in llama_state_seq_get_data's layout (patch 19):
# (ctx, seq_id, p0, p1, dst, size) -> its size, whole in dst when it fits (-1 bad arguments).
state_range = _bind(
    "llama_kvgguf_state_range",
    [C.llama_context_p_ctypes, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_size_t],
    ctypes.c_int64,
)
compact = _bind("llama_kvgguf_compact", [C.llama_context_p_ctypes], ctypes.c_int32)
# (version 20) a context shift of llama.cpp's cells: [p0, p1) removed, compacted, later positions
# moved back by p1 - p0 and their keys rotated now. 0; -1 bad arguments or a memory that cannot
# shift; -2 a step failed.
can_shift = _bind("llama_kvgguf_can_shift", [C.llama_context_p_ctypes], ctypes.c_bool)
shift = _bind(
    "llama_kvgguf_shift", [C.llama_context_p_ctypes, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32], ctypes.c_int32
)
kv_bytes = _bind("llama_kvgguf_kv_bytes", [C.llama_context_p_ctypes], ctypes.c_int64)
# The scheduler's compute buffers: peak transient scratch (cold rows expanded for attention included).
compute_bytes = _bind("llama_kvgguf_compute_bytes", [C.llama_context_p_ctypes], ctypes.c_int64)
n_errors = _bind("llama_kvgguf_n_errors", [C.llama_context_p_ctypes], ctypes.c_int64)
# Fused attention over the store's rows for ubatches of <= max_tokens tokens (attend: a C function
# address, llama_kvgguf_attend_fn; 0 or max_tokens <= 0: off, every ubatch expands cold rows to f16).
set_attend = _bind(
    "llama_kvgguf_set_attend", [C.llama_context_p_ctypes, ctypes.c_void_p, ctypes.c_int32], ctypes.c_int32
)
# The fused path's hot cells through libkvgguf's SIMD kernels (attend_f16: a C function address,
# llama_kvgguf_attend_f16_fn; 0: llama.cpp's own loop, built without the CPU's vector extensions).
set_attend_f16 = _bind("llama_kvgguf_set_attend_f16", [C.llama_context_p_ctypes, ctypes.c_void_p], ctypes.c_int32)
# The fused path's final softmax max and sum per query, once per layer and ubatch (mass: a C function
# address, llama_kvgguf_mass_fn; 0: off), from which the store counts each cold granule's attention mass.
set_mass = _bind("llama_kvgguf_set_mass", [C.llama_context_p_ctypes, ctypes.c_void_p], ctypes.c_int32)
# The context the application holds (0: llama.cpp's own), for what depends on the context size:
# LongRoPE's long or short rope factors.
set_n_ctx = _bind("llama_kvgguf_set_n_ctx", [C.llama_context_p_ctypes, ctypes.c_uint32], ctypes.c_int32)
# How each layer's attention was built, recorded by every graph llama.cpp builds (the context
# reserves its graphs when it is created): 0 when not through the hooked KV-cache build_attn,
# else PATH_KV and any of the others; -1 for a bad layer.
attention_path = _bind("llama_kvgguf_attention_path", [C.llama_context_p_ctypes, ctypes.c_int32], ctypes.c_int32)
PATH_KV, PATH_SWA, PATH_EXPAND, PATH_SHARED = 1, 2, 4, 8

# The cache types of the sliding-window cells of the contexts this thread creates next (ggml
# numbers; GGML_TYPE_COUNT: the context's type_k / type_v). llama.cpp keeps the context's types
# where the asked ones cannot serve; layer_cells tells what each layer's cells hold.
set_window_types = _bind("llama_kvgguf_set_window_types", [ctypes.c_int, ctypes.c_int], ctypes.c_int32)
GGML_TYPE_COUNT = C.GGML_TYPE_COUNT  # "no window type of its own"
# The cells of the sliding-window cache of the contexts this thread creates next (0: llama.cpp's
# choice); llama.cpp raises it to the ring's n_swa + n_ubatch and lowers it to the full cache's.
set_window_cells = _bind("llama_kvgguf_set_window_cells", [ctypes.c_uint32], None)
# Whether the full-attention cells of the contexts this thread creates next may hold quantized rows
# rotated (llama.cpp's Hadamard rotation): kvgguf's store codes rows in their own domain.
set_full_rotation = _bind("llama_kvgguf_set_full_rotation", [ctypes.c_bool], None)
layer_cells = _bind(
    "llama_kvgguf_layer_cells",
    [
        C.llama_context_p_ctypes,
        ctypes.c_int32,
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_int32),
        ctypes.POINTER(ctypes.c_int64),
    ],
    ctypes.c_int32,
)


def cells_of(ctx, il: int):
    """(K type, V type, bytes) of layer il's cells, or None for a layer without cells of its own."""
    k, v, n = ctypes.c_int32(), ctypes.c_int32(), ctypes.c_int64()
    if layer_cells(ctx, il, ctypes.byref(k), ctypes.byref(v), ctypes.byref(n)) != 0:
        return None
    return k.value, v.value, n.value


# Where layer il's cells live (patch 15): 1 host memory, 0 a device's, -1 no cells of its own; the
# buffer type's name ("CPU", "CUDA0", ...) into the buffer.
layer_buffer = _bind(
    "llama_kvgguf_layer_buffer",
    [C.llama_context_p_ctypes, ctypes.c_int32, ctypes.c_char_p, ctypes.c_size_t],
    ctypes.c_int32,
)


def device_cells(ctx, layers) -> dict[int, str]:
    """{layer: buffer type ("CUDA0", ...)} of those of `layers` whose cells live in a device's
    memory, not the host's."""
    out = {}
    name = ctypes.create_string_buffer(64)
    for il in layers:
        if layer_buffer(ctx, il, name, len(name)) == 0:
            out[il] = name.value.decode(errors="replace")
    return out


class llama_kvgguf_cells_view(ctypes.Structure):
    """struct llama_kvgguf_cells_view (patch 16): where an eviction's cells lie, read in place."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("type", ctypes.c_int32),  # enum ggml_type
        ("row_stride", ctypes.c_int64),  # elements between consecutive rows
        ("col_stride", ctypes.c_int64),  # elements between a row's consecutive values
        ("n_rows", ctypes.c_int64),
        ("is_host", ctypes.c_int32),
        ("device", ctypes.c_char * 32),
    ]


# The cells of positions [p0, p1) of one layer and kind, when they are one run of an unquantized
# type: the number of rows, or -1 bad arguments, -3 quantized cells, -4 not one run.
_view_cells = _bind("llama_kvgguf_view_cells", [*_CELLS_OF, ctypes.POINTER(llama_kvgguf_cells_view)], ctypes.c_int64)


def view_cells(ctx, seq: int, il: int, kind: int, p0: int, p1: int) -> "llama_kvgguf_cells_view | None":
    """Where the cells of [p0, p1) lie, or None where llama_kvgguf_read_rows must copy them
    (quantized cells, cells not in one run)."""
    view = llama_kvgguf_cells_view()
    n = _view_cells(ctx, seq, il, kind, p0, p1, ctypes.byref(view))
    if n == -1:
        raise ValueError(f"kvgguf: no cells to view for layer {il} kind {kind} [{p0}, {p1})")
    return view if n >= 0 else None


class llama_kvgguf_cuda(ctypes.Structure):
    """struct llama_kvgguf_cuda (patch 15; generation since 17): the fused path's ops on a GPU. llama.cpp
    copies it."""

    _fields_ = [
        ("user", ctypes.c_void_p),
        ("attend", ctypes.c_void_p),  # int32_t (*)(void *, const struct llama_kvgguf_cuda_attn *, int32_t, void *)
        ("finish", ctypes.c_void_p),  # int32_t (*)(void *, const struct llama_kvgguf_cuda_finish *, int32_t, void *)
        ("supports", ctypes.c_void_p),  # int32_t (*)(void *, int32_t il, int32_t device)
        ("generation", ctypes.c_void_p),  # uint64_t (*)(void *): CUDA graphs captured again when it changes; NULL: none
    ]


# 0; -1 a bad context or a hook missing; -2 no CUDA backend in this libllama that takes custom ops.
set_cuda = _bind("llama_kvgguf_set_cuda", [C.llama_context_p_ctypes, ctypes.POINTER(llama_kvgguf_cuda)], ctypes.c_int32)


# One eviction in one call (patch 18): the rows of [p0, p1) of each layer in `layers` (int32
# array, n) and of K and V go to append(user, ...) as f32 (llama_kvgguf_append_fn, a C address),
# then the positions are removed and the cells compacted. 0; -1 bad arguments, -2 rows not as
# expected, -3 a cell type ggml cannot convert, -4 append failed, -5 the removal failed (the
# cells unchanged for all of these); -6 the compaction failed (the positions removed).
evict = _bind(
    "llama_kvgguf_evict",
    [
        C.llama_context_p_ctypes,
        ctypes.c_int32,  # seq_id
        ctypes.c_int32,  # p0
        ctypes.c_int32,  # p1
        ctypes.POINTER(ctypes.c_int32),  # layers
        ctypes.c_int32,  # n_layers
        ctypes.c_void_p,  # append
        ctypes.c_void_p,  # user
    ],
    ctypes.c_int32,
)
EVICT_APPEND_FAILED, EVICT_COMPACT_FAILED = -4, -6
