"""llama.cpp's q8_0 rows (the cells' type with TieredConfig.hot_cells="q8_0") in a saved sequence
state: blocks of 32 values, each an f16 scale and 32 int8 codes, 34 bytes, as ggml's
quantize_row_q8_0_ref and dequantize_row_q8_0 compute them. A session codes their values and
quantizes them back when restored; evictions never come here (llama.cpp converts the rows)."""

from __future__ import annotations

import numpy as np

GGML_Q8_0 = 8
BLOCK, BLOCK_BYTES = 32, 34


def row_bytes(width: int) -> int:
    return width // BLOCK * BLOCK_BYTES


def dequantize(rows: np.ndarray, width: int) -> np.ndarray:
    """float32 [n, width] of raw uint8 rows [n, row_bytes(width)] (exact in float32)."""
    blocks = rows.reshape(len(rows), width // BLOCK, BLOCK_BYTES)
    scale = np.ascontiguousarray(blocks[:, :, :2]).view(np.float16).astype(np.float32)
    codes = np.ascontiguousarray(blocks[:, :, 2:]).view(np.int8).astype(np.float32)
    return (codes * scale).reshape(len(rows), width)


def quantize(x: np.ndarray) -> np.ndarray:
    """Raw uint8 rows [n, row_bytes(width)] of float32 x [n, width]: per block d = max|x| / 127,
    codes round(x / d) half away from zero, d stored as f16 (the codes use d unrounded)."""
    x = np.asarray(x, dtype=np.float32)
    n, width = x.shape
    b = x.reshape(n, width // BLOCK, BLOCK)
    d = np.abs(b).max(axis=2, keepdims=True) / np.float32(127)
    inv = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    y = b * inv
    codes = (np.sign(y) * np.floor(np.abs(y) + np.float32(0.5))).astype(np.int8)
    out = np.empty((n, width // BLOCK, BLOCK_BYTES), dtype=np.uint8)
    out[:, :, :2] = d.astype(np.float16).view(np.uint8).reshape(n, width // BLOCK, 2)
    out[:, :, 2:] = codes.view(np.uint8)
    return out.reshape(n, row_bytes(width))
