"""One sequence's cells as llama.cpp writes and reads them (llama_state_seq_get/set_data)."""

from __future__ import annotations

import ctypes

import llama_cpp.llama_cpp as C

from . import hooks

SEQ = 0  # kvgguf contexts hold one sequence


def read(ctx) -> bytes:
    """The sequence's state: its cells' positions and every layer's rows (state_format parses it)."""
    n = C.llama_state_seq_get_size(ctx, SEQ)
    buf = (ctypes.c_uint8 * n)()
    got = C.llama_state_seq_get_data(ctx, buf, n, SEQ)
    if got != n:
        raise RuntimeError(f"llama.cpp wrote {got} bytes of sequence state, announced {n}")
    return bytes(buf)


class RangeReader:
    """The sequence's state restricted to its cells at positions [p0, p1), in read()'s layout: a
    few rows, where read() writes every cell's (llama_kvgguf_state_range). It keeps its buffer,
    so an eviction of the usual size takes one call."""

    def __init__(self, ctx):
        self.ctx = ctx
        self._buf = (ctypes.c_uint8 * 0)()

    def __call__(self, p0: int, p1: int) -> bytes:
        for _ in range(2):
            n = hooks.state_range(self.ctx, SEQ, p0, p1, ctypes.addressof(self._buf), len(self._buf))
            if n < 0:
                raise RuntimeError(f"kvgguf: llama.cpp could not write the state of positions [{p0}, {p1})")
            if n <= len(self._buf):
                return bytes(memoryview(self._buf)[:n])
            self._buf = (ctypes.c_uint8 * n)()
        raise RuntimeError(f"kvgguf: the state of positions [{p0}, {p1}) grew while llama.cpp wrote it")


def write(ctx, state: bytes) -> bool:
    """Replaces the sequence's cells by state's; False where llama.cpp refuses it (the sequence
    is then empty). The cells are compacted into position order after."""
    C.llama_memory_seq_rm(C.llama_get_memory(ctx), SEQ, -1, -1)
    buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
    if C.llama_state_seq_set_data(ctx, buf, len(state), SEQ) != len(state):
        return False
    if hooks.compact(ctx) != 0:
        raise RuntimeError("kvgguf: llama.cpp could not compact its KV cache after a restore")
    return True
