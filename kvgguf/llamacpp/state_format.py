"""llama.cpp's sequence state (llama_state_seq_get_data), split into cells and K/V rows.

For the llama.cpp that kvgguf pins (llama-cpp-python 0.3.36), a sequence's state is one record
per KV cache (two for sliding-window models: full-attention layers, then sliding ones),
after a u32 magic and the i32 sequence id:

    u32 n_stream; per stream: u32 cell_count, and if cells:
      per cell  i32 pos | u32 n_seq_id | i32 seq_id * n_seq_id
      u32 v_trans | u32 n_layer
      per layer i32 k_type | u64 k_row_bytes | K rows (cell_count x k_row_bytes)
      v_trans = 0: per layer i32 v_type | u64 v_row_bytes | V rows
      v_trans = 1: per layer i32 v_type | u32 v_el_bytes | u32 n_embd_v | V (n_embd_v x cell_count)

Session files keep the cell records as they are and replace the K/V bytes by encoded rows;
rebuilding writes the same layout back, V transposed again where llama.cpp keeps it so.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from ..errors import SessionCorruptError, SessionMismatchError

GGML_F32, GGML_F16 = 0, 1
_IO_MAGIC = 0xAF143CD8  # llama-context.cpp's io_magic
_EL_BYTES = {GGML_F32: 4, GGML_F16: 2}


@dataclass
class LayerRows:
    il: int  # the model's layer index
    k_type: int
    k: np.ndarray  # uint8 [cells, k_row_bytes]
    v_type: int
    v: np.ndarray  # uint8 [cells, v_row_bytes], rows even where llama.cpp stores V transposed


@dataclass
class CacheState:
    cells: bytes = b""  # the cell records, verbatim
    n_cells: int = 0
    v_trans: bool = False
    layers: list[LayerRows] = field(default_factory=list)


class _Reader:
    def __init__(self, data: bytes):
        self.view, self.off = memoryview(data), 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.off + n > len(self.view):
            raise SessionCorruptError("llama.cpp state ends early")
        out = self.view[self.off : self.off + n]
        self.off += n
        return out

    def unpack(self, fmt: str):
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))


def cell_records(cells: bytes) -> np.ndarray:
    """The cell records of a single-sequence state as rows of (pos, n_seq_id, seq_id)."""
    return np.frombuffer(cells, dtype="<i4").reshape(-1, 3)


def cache_layers(llm_ctx, n_layer: int, layer_info) -> list[list[int]]:
    """The model layers of each cache record, in record order (full-attention layers first)."""
    full, swa = [], []
    for il in range(n_layer):
        kind = layer_info(llm_ctx, il, None, None)
        (full if kind == 1 else swa if kind == 0 else []).append(il)
    return [full, swa] if swa else [full]


def parse(blob: bytes, layers_of_cache: list[list[int]]) -> list[CacheState]:
    """Splits a single-sequence state into cells and per-layer rows."""
    r = _Reader(blob)
    if r.unpack("<Ii") != (_IO_MAGIC, 0):
        raise SessionMismatchError("llama.cpp's sequence state starts with another magic (another llama.cpp?)")
    caches = []
    for layers in layers_of_cache:
        (n_stream,) = r.unpack("<I")
        if n_stream != 1:
            raise SessionMismatchError(f"a KV cache with {n_stream} streams; kvgguf sessions hold one sequence")
        (n_cells,) = r.unpack("<I")
        cache = CacheState(n_cells=n_cells)
        caches.append(cache)
        if n_cells == 0:
            continue
        start = r.off
        if not _one_sequence(r.view[start : start + 12 * n_cells], n_cells):
            for _ in range(n_cells):  # says what is wrong where
                _pos, n_seq = r.unpack("<iI")
                if n_seq != 1 or r.unpack("<i")[0] != 0:
                    raise SessionMismatchError("a cell shared between sequences; kvgguf sessions hold sequence 0 alone")
        r.off = start + 12 * n_cells
        cache.cells = bytes(r.view[start : r.off])
        v_trans, n_layer = r.unpack("<II")
        if n_layer != len(layers) or v_trans > 1:
            raise SessionMismatchError(f"llama.cpp wrote {n_layer} layers for a cache of {len(layers)}")
        cache.v_trans = bool(v_trans)
        ks = []
        for _ in layers:
            k_type, k_row = r.unpack("<iQ")
            ks.append((k_type, _rows(r, n_cells, k_row)))
        for il, (k_type, k) in zip(layers, ks):
            if not v_trans:
                v_type, v_row = r.unpack("<iQ")
                v = _rows(r, n_cells, v_row)
            else:
                v_type, el, n_embd = r.unpack("<iII")
                if n_cells * el * n_embd > len(r.view):
                    raise SessionCorruptError("llama.cpp state ends early")
                cols = np.frombuffer(r.take(n_cells * el * n_embd), dtype=np.uint8).reshape(n_embd, n_cells, el)
                v = np.ascontiguousarray(cols.transpose(1, 0, 2)).reshape(n_cells, n_embd * el)
            cache.layers.append(LayerRows(il, k_type, k, v_type, v))
    if r.off != len(r.view):
        raise SessionMismatchError("llama.cpp's state has records kvgguf does not know (another cache layout)")
    return caches


def _one_sequence(records: memoryview, n_cells: int) -> bool:
    """Whether n_cells records (pos, n_seq_id 1, seq_id 0) of 12 bytes each are all there."""
    if len(records) != 12 * n_cells:
        return False
    rec = np.frombuffer(records, dtype="<i4").reshape(n_cells, 3)
    return bool((rec[:, 1] == 1).all() and (rec[:, 2] == 0).all())


def _rows(r: _Reader, n: int, row_bytes: int) -> np.ndarray:
    if n * row_bytes > len(r.view):
        raise SessionCorruptError("llama.cpp state ends early")
    return np.frombuffer(r.take(n * row_bytes), dtype=np.uint8).reshape(n, row_bytes).copy()


def build(caches: list[CacheState]) -> bytes:
    """The state bytes llama_state_seq_set_data takes, from parsed (or restored) caches."""
    out = [struct.pack("<Ii", _IO_MAGIC, 0)]
    for c in caches:
        out.append(struct.pack("<II", 1, c.n_cells))
        if c.n_cells == 0:
            continue
        out.append(c.cells)
        out.append(struct.pack("<II", int(c.v_trans), len(c.layers)))
        for layer in c.layers:
            out.append(struct.pack("<iQ", layer.k_type, layer.k.shape[1]))
            out.append(layer.k.tobytes())
        for layer in c.layers:
            if not c.v_trans:
                out.append(struct.pack("<iQ", layer.v_type, layer.v.shape[1]))
                out.append(layer.v.tobytes())
                continue
            el = _EL_BYTES.get(layer.v_type)
            if el is None:
                raise SessionMismatchError(f"transposed V of ggml type {layer.v_type} (only f16/f32 are)")
            n_embd = layer.v.shape[1] // el
            cols = layer.v.reshape(c.n_cells, n_embd, el).transpose(1, 0, 2)
            out.append(struct.pack("<iII", layer.v_type, el, n_embd))
            out.append(np.ascontiguousarray(cols).tobytes())
    return b"".join(out)
