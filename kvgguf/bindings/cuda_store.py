"""A store's coded blocks in GPU memory (libkvgguf's native/cuda/kvg_cuda_store.c), for the fused
path's ops that the patched llama.cpp runs on the GPU where a layer's cells live there.

The host :class:`~kvgguf.bindings.store.KVStore` stays the store: every change goes through it,
then :meth:`DeviceStore.sync` copies in the blocks the device lacks and frees the ones the store
dropped. Only a CUDA build of libkvgguf (``CMAKE_ARGS="-DGGML_CUDA=ON"``) has these calls; its
header ``kvgguf/include/kvg_cuda.h`` marks the declarations cffi reads.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from .binding import KvgLoadError, check, library_path, marked_regions
from ..files import installed_file

_BEGIN, _END = "// cffi-cuda-begin", "// cffi-cuda-end"
# types the marked regions name but do not define (kvgguf.h's store; the finish hook's argument)
_PREAMBLE = "typedef struct kvg_store kvg_store;\ntypedef struct kvg_cuda_finish_args kvg_cuda_finish_args;\n"
CUDA_HEADER_ENV = "KVGGUF_CUDA_HEADER"

# What the GPU attends over in a layer's store (kvg_cuda_store_hook_attend, kvg_cuda_attend): f16,
# kivi and rotq blocks, K and V in any mix. Any other codec in a GPU layer is refused before the
# first token (gpu_refuses).
GPU_CODECS = ("f16", "kivi2", "kivi3", "kivi4", "kivi8", "rotq1", "rotq2", "rotq3", "rotq4")
GPU_MAX_HEAD_DIM = 512  # kvg_cuda_attend's (KA_MAX_DIM in native/cuda/kvg_cuda_attend.cu)

_lock = threading.Lock()
_loaded = None  # (ffi, lib), or the reason they are not there


def header_path() -> Path:
    override = os.environ.get(CUDA_HEADER_ENV)
    return Path(override) if override else installed_file("include", "kvg_cuda.h")


def cdef_source(text: str) -> str:
    """The regions between ``// cffi-cuda-begin`` and ``// cffi-cuda-end``, without KVG_CUDA_API."""
    return _PREAMBLE + "".join(marked_regions(text, _BEGIN, _END, "kvg_cuda.h")).replace("KVG_CUDA_API", "")


def _load():
    """(ffi, lib) of libkvgguf's CUDA calls, or a string saying why there are none."""
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = header_path()
        if not path.exists():
            _loaded = 'this kvgguf was built without CUDA (reinstall with CMAKE_ARGS="-DGGML_CUDA=ON")'
            return _loaded
        from cffi import FFI

        ffi = FFI()
        ffi.cdef(cdef_source(path.read_text(encoding="utf-8")))
        lib = ffi.dlopen(str(library_path()))
        try:
            lib.kvg_cuda_device_count
        except AttributeError:
            _loaded = f"{library_path()} has no CUDA kernels, though {path} is installed: reinstall kvgguf"
            return _loaded
        _loaded = (ffi, lib)
        return _loaded


def unavailable() -> str | None:
    """None where libkvgguf can put a store on a GPU, else why it cannot."""
    loaded = _load()
    if isinstance(loaded, str):
        return loaded
    ffi, lib = loaded
    n = ffi.new("int *")
    check(lib.kvg_cuda_device_count(n), "kvg_cuda_device_count")
    return None if n[0] > 0 else "the CUDA runtime sees no device"


def gpu_refuses(codec: str, n_head_kv: int, head_dim: int) -> str | None:
    """Why a GPU layer cannot attend over rows of ``codec`` with n_head_kv heads of head_dim
    values (one side, K or V), None where it can: a codec not in GPU_CODECS, a head dim past the
    GPU attention's, or rows that are not whole bytes of codes (the device copy lays a run's rows
    end to end: kvg_cuda_store.c's row_layout)."""
    from . import codecs

    if codec not in GPU_CODECS:
        return f"the GPU attends over {', '.join(GPU_CODECS)}, not {codec}"
    if head_dim > GPU_MAX_HEAD_DIM:
        return f"the GPU attends over head dims up to {GPU_MAX_HEAD_DIM}, not {head_dim}"
    if n_head_kv * head_dim * codecs.info(codec).bits % 8:
        return f"a row of {n_head_kv} x {head_dim} {codec} codes is not whole bytes, which the GPU's copy needs"
    return None


def run_breaks(k_codecs, block: int, group_size: int) -> str | None:
    """Why a GPU store would keep every evicted block as a run of its own, None where it would not:
    kivi keys (k_codecs: the GPU layers' K codecs, every tier) in groups of group_size tokens,
    evicted in blocks of ``block`` tokens that are not whole groups. The device copy lays a run's
    kivi K groups end to end (kvg_cuda_store.c), so a run breaks after a block that is not, and
    each run is one attention call a layer."""
    if block % group_size and any(c.startswith("kivi") for c in k_codecs):
        return (
            f"kivi keys are grouped by {group_size} tokens and evicted in blocks of {block}, so on the GPU every "
            f"block is a run of its own, one attention call each (slow at long contexts); choose a block that is "
            f"a multiple of group_size"
        )
    return None


def store_items(ffi, items):
    """kvg_cuda_store_item[] of items (il, kind, tier, codec name, src address, row_stride,
    col_stride, n_rows), f16 rows, for kvg_cuda_store_encode_many."""
    from . import codecs

    items = list(items)
    arr = ffi.new("kvg_cuda_store_item[]", len(items))
    for a, (il, kind, tier, codec, src, row_stride, col_stride, n_rows) in zip(arr, items):
        a.il, a.kind, a.tier, a.codec = il, kind, tier, codecs.get(codec).type
        a.src_dev = ffi.cast("const void *", src)
        a.src_type = ffi.typeof("enum kvg_cuda_type").relements["KVG_CUDA_F16"]
        a.row_stride, a.col_stride, a.n_rows = row_stride, col_stride, n_rows
    return arr


def mem_info(device: int = 0) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device's memory, as cudaMemGetInfo reports them."""
    loaded = _load()
    if isinstance(loaded, str):
        raise KvgLoadError(loaded)
    ffi, lib = loaded
    free, total = ffi.new("size_t *"), ffi.new("size_t *")
    check(lib.kvg_cuda_mem_info(device, free, total), f"the memory of CUDA device {device}")
    return int(free[0]), int(total[0])


class DeviceStore:
    """The blocks of ``store`` (a KVStore, kept alive by this object) on CUDA device ``device``."""

    def __init__(self, store, device: int):
        loaded = _load()
        if isinstance(loaded, str):
            raise KvgLoadError(loaded)
        self._ffi, self._lib = ffi, lib = loaded
        self.store, self.device = store, device
        ctx = ffi.new("kvg_cuda_ctx **")
        check(lib.kvg_cuda_ctx_init(device, ffi.NULL, ctx), f"a CUDA context on device {device}")
        out = ffi.new("kvg_cuda_store **")
        status = lib.kvg_cuda_store_init(ctx[0], ffi.cast("kvg_store *", store.address), out)
        if status != 0:
            lib.kvg_cuda_ctx_free(ctx[0])
            check(status, "the store's device copy")
        self._ptr = ffi.gc(out[0], lib.kvg_cuda_store_free)  # frees the context too

    @property
    def address(self) -> int:
        return int(self._ffi.cast("uintptr_t", self._ptr))

    def set_layer(self, il: int, on: bool) -> None:
        check(self._lib.kvg_cuda_store_set_layer(self._ptr, il, int(on)), f"layer {il}")

    def sync(self) -> None:
        """Copies in what the store holds and the device does not (all or nothing)."""
        check(self._lib.kvg_cuda_store_sync(self._ptr), "copying the store's blocks to the GPU")

    def encode(
        self, il: int, kind: int, tier: int, codec: str, src: int, row_stride: int, col_stride: int, n_rows: int
    ):
        """Codes n_rows f16 rows that lie in this device's memory at address src (element i of head h
        of row t at src + 2 * (t * row_stride + (h * head_dim + i) * col_stride)) and appends their
        codes to list (il, kind) of the store: the bytes its CPU encoder writes, while the rows stay
        on the GPU. The next sync takes the block from the device. All or nothing."""
        from . import codecs

        check(
            self._lib.kvg_cuda_store_encode(
                self._ptr,
                il,
                kind,
                tier,
                codecs.get(codec).type,
                self._ffi.cast("const void *", src),
                self._lib.KVG_CUDA_F16,
                row_stride,
                col_stride,
                n_rows,
            ),
            f"coding {n_rows} rows of layer {il} {'KV'[kind]} as {codec} on the GPU",
        )

    def encode_many(self, items) -> None:
        """encode() for several lists at once, items (il, kind, tier, codec, src, row_stride, col_stride,
        n_rows) in order, with one wait for the device: an eviction's lists. On a failure the items
        before the failing one stay appended (the caller cuts the store back)."""
        arr = store_items(self._ffi, items)
        if len(arr) == 0:
            return
        check(
            self._lib.kvg_cuda_store_encode_many(self._ptr, arr, len(arr)),
            f"coding {len(arr)} lists of evicted rows on the GPU",
        )

    def bytes(self) -> tuple[int, int]:
        """(device bytes of the segments holding the blocks, with their room to grow; of the scratch)."""
        blocks, scratch = self._ffi.new("uint64_t *"), self._ffi.new("uint64_t *")
        check(self._lib.kvg_cuda_store_bytes(self._ptr, blocks, scratch))
        return int(blocks[0]), int(scratch[0])

    def calls(self) -> tuple[int, int]:
        """How often llama.cpp ran a layer's (attention, output) op on the GPU through this copy."""
        attend, finish = self._ffi.new("uint64_t *"), self._ffi.new("uint64_t *")
        check(self._lib.kvg_cuda_store_calls(self._ptr, attend, finish))
        return int(attend[0]), int(finish[0])

    def hook_functions(self) -> tuple[int, int, int, int]:
        """Addresses of the attend, finish, supports and generation hooks (struct llama_kvgguf_cuda)."""
        ffi, lib = self._ffi, self._lib
        hooks = (
            lib.kvg_cuda_store_hook_attend,
            lib.kvg_cuda_store_hook_finish,
            lib.kvg_cuda_store_hook_supports,
            lib.kvg_cuda_store_hook_generation,
        )
        return tuple(int(ffi.cast("uintptr_t", fn)) for fn in hooks)

    def generation(self) -> int:
        """What llama.cpp's CUDA graphs compare before replaying the ops (0: they are never captured)."""
        return int(self._lib.kvg_cuda_store_hook_generation(self._ptr))
