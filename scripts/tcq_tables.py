"""Writes native/src/codecs/tcq_tables.h: the level tables of the tcq codecs (bitshift trellis codes).

A tcq code of B bits per value reads value i from the L = 8 bits of its stream that end with
value i's own B bits (codes packed from bit 0 up; bits before the vector's first are 0), and
looks that window up in a table of 256 levels. The table is what this script trains: Gaussian
quantiles in a fixed random order, then rounds of Viterbi assignment of unit-variance Gaussian
rows of 64 values (as rotated, normalized head vectors look) and each level moved to the mean
of the values it coded (Lloyd's step). Deterministic: the same seed writes the same file.

    python scripts/tcq_tables.py            # rewrites native/src/codecs/tcq_tables.h
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

L = 8  # window bits (KVG_TCQ_WINDOW): 256 levels, 2^(8-B) trellis groups per step
BITS = (2, 3, 4)
ROWS, DIM, ROUNDS, SEED = 16384, 64, 16, 20261126


def viterbi(x: np.ndarray, table: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Levels and table indices of the best path through the trellis for each row of x."""
    R, n = x.shape
    S, G = 1 << L, 1 << (L - k)
    top = np.arange(S) & (G - 1)  # window s' keeps the predecessor's top L-k bits as its low bits
    m = np.full((R, G), np.inf)
    m[:, 0] = 0.0  # the bits before a vector's first are 0
    back = np.zeros((n, R, G), dtype=np.int64)
    cost = None
    for i in range(n):
        if i:
            c = cost.reshape(R, G, 1 << k)  # predecessor s = g * 2^k + h: grouped by its top bits g
            back[i] = c.argmin(axis=2)
            m = np.take_along_axis(c, back[i][:, :, None], 2)[:, :, 0]
        cost = m[:, top] + (x[:, i : i + 1] - table[None, :]) ** 2
    s = cost.argmin(axis=1)
    states = np.empty((R, n), dtype=np.int64)
    for i in range(n - 1, -1, -1):
        states[:, i] = s
        if i:
            g = s & (G - 1)
            s = g * (1 << k) + back[i][np.arange(R), g]
    return table[states], states


def train(k: int) -> np.ndarray:
    from statistics import NormalDist

    rng = np.random.default_rng(SEED + k)
    q = np.array([NormalDist().inv_cdf((i + 0.5) / (1 << L)) for i in range(1 << L)])
    table = q[rng.permutation(1 << L)]
    for _ in range(ROUNDS):
        x = rng.standard_normal((ROWS, DIM))
        _, st = viterbi(x, table, k)
        sums = np.bincount(st.ravel(), weights=x.ravel(), minlength=1 << L)
        cnt = np.bincount(st.ravel(), minlength=1 << L)
        table = np.where(cnt > 0, sums / np.maximum(cnt, 1), table)
    x = rng.standard_normal((ROWS, DIM))
    y, _ = viterbi(x, table, k)
    print(f"tcq{k}: mse {((x - y) ** 2).mean():.5f} on unit-variance Gaussian rows of {DIM}", file=sys.stderr)
    return table.astype(np.float32)


def main() -> None:
    out = Path(__file__).resolve().parents[1] / "native" / "src" / "codecs" / "tcq_tables.h"
    lines = [
        "// tcq_tables.h: written by scripts/tcq_tables.py (trained bitshift-trellis levels); do not edit.",
        "#pragma once",
        "",
        f"static const float k_tcq_levels[{len(BITS)}][{1 << L}] = {{",
    ]
    for k in BITS:
        t = train(k)
        lines.append(f"    {{  // {k} bits per value")
        for r in range(0, len(t), 8):
            lines.append("        " + " ".join(f"{float(v):.9g}f," for v in t[r : r + 8]))
        lines.append("    },")
    lines += ["};", ""]
    out.write_text("\n".join(lines))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()
