"""Entropy of rotq's Lloyd-Max codes on Gaussian coordinates: the bound on what an entropy coder
(zstd on session files) can save on them.

    .venv/bin/python benchmarks/code_entropy.py

After the random-sign Hadamard rotation a head vector's coordinates are close to Gaussian;
rotq quantizes them with a Lloyd-Max codebook, so code i occurs with the Gaussian mass of its
cell (between the midpoints to its neighbours).
"""

from __future__ import annotations

import math

import numpy as np


def entropy_bits(bits: int, head_dim: int = 64) -> float:
    from kvgguf import codecs

    c = codecs.rotq_codebook(bits, head_dim)  # centroids for unit-variance coordinates
    edges = np.concatenate([[-np.inf], (c[1:] + c[:-1]) / 2, [np.inf]])
    cdf = np.array([0.5 * (1 + math.erf(e / math.sqrt(2))) if np.isfinite(e) else float(e > 0) for e in edges])
    p = np.diff(cdf)
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def main() -> None:
    for bits in (1, 2, 3, 4):
        print(f"rotq{bits}: {bits} bits stored per code, entropy {entropy_bits(bits):.2f} bits")


if __name__ == "__main__":
    main()
