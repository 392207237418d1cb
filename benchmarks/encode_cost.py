"""What coding evicted rows costs per token, per codec, at the shapes of the models measured.

    .venv/bin/python benchmarks/encode_cost.py [--codecs rotq3,tcq3,...] [--rounds 5] [--out DIR]

The live cache codes rows when it evicts them from the hot window (blocks of 64 tokens, every
layer, K and V): this times kvgguf.codecs' encode of one such block (Gaussian rows with a few
strong channels, one thread, this build's best SIMD level, best of --rounds) and scales it to
one token of each model (layers x 2 lists x KV heads x head dim values). Writes DIR/encode_cost.md
and .json.
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np

from kvgguf import codecs

from common import best_of, markdown_table, write_json

# name: (layers, KV heads, head dim)
SHAPES = {"SmolLM2-135M": (30, 3, 64), "Gemma-3-270M": (18, 1, 256), "Llama-3.2-1B shape": (16, 8, 64)}
CODECS = ("rotq3", "tcq2", "tcq3", "tcq4", "wfq3", "kivi4")
BLOCK = 64


def time_block(name: str, heads: int, dim: int, rounds: int) -> float:
    """Seconds to encode one block of BLOCK rows (best of rounds), K and V alike."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BLOCK, heads, dim)).astype(np.float32)
    x[:, :, :: max(1, dim // 8)] *= 6.0
    book = codecs.train_book(name, x) if name in codecs.BOOK_CODECS else None
    c = codecs.get(name, book=book)
    c.encode(x)

    def eight():
        for _ in range(8):
            c.encode(x)

    return best_of(eight, rounds, warm_up=False) / 8


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codecs", default=",".join(CODECS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/quality/tcq", help="folder for encode_cost.json and .md")
    args = ap.parse_args()
    names = [n for n in args.codecs.split(",") if n]
    rows = []
    for model, (layers, heads, dim) in SHAPES.items():
        for name in names:
            if not codecs.fits(name, dim):
                continue
            s = time_block(name, heads, dim, args.rounds)
            values = BLOCK * heads * dim
            rows.append(
                {
                    "model": model,
                    "codec": name,
                    "ns_per_value": s / values * 1e9,
                    "ms_per_token": s / BLOCK * layers * 2 * 1e3,
                }
            )
    level = ["scalar", "avx2", "neon"][codecs.simd_max_level()]
    cmd = f"benchmarks/encode_cost.py --codecs {','.join(names)} --rounds {args.rounds} --out {args.out}"
    lines = [
        f"`.venv/bin/python {cmd}`",
        "",
        f"One thread, {level}, {platform.machine()}; a block of {BLOCK} rows coded, scaled to one token "
        "(every layer, K and V).",
        "",
        markdown_table(
            ["model", "codec", "ns per value", "ms per evicted token"],
            [[r["model"], r["codec"], f"{r['ns_per_value']:.1f}", f"{r['ms_per_token']:.2f}"] for r in rows],
        ),
    ]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "encode_cost.md").write_text("\n".join(lines) + "\n")
    write_json(out / "encode_cost.json", {"command": cmd, "simd": level, "rows": rows}, threads=1)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
