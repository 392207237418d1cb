"""What one eviction's aging costs on the host: the preset's warm blocks into the archive tier.

    .venv/bin/python benchmarks/aging_cost.py [--rows 256] [--rounds 15] [--threads 1,2] [--out DIR]

The tiered preset ages each evicted block (K: rotq4 warm to rotq4 archive, V: rotq4 to rotq2) in
one store call over every layer (KVStore.retier_lists). This times that call at the 1B and 3B
shapes (best and median of --rounds) on each count of --threads (KVStore.set_threads: the lists
coded on that many threads at once), against coding the same blocks again from their decoded rows
on one thread (kvg_store_decode then kvg_encode per list, K and V), which is what aging did before
K kept its bytes and rotq aged from its codes. On a GPU the host does this between ubatches,
while the GPU waits. Writes DIR/aging_cost.md and .json.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np

from kvgguf import codecs
from kvgguf.bindings.store import KVStore
from kvgguf.enums import Kind, Tier

from common import markdown_table, write_json

# name: (layers, KV heads, head dim)
SHAPES = {"Llama-3.2-1B shape": (16, 8, 64), "Llama-3.2-3B shape": (28, 8, 128)}
ARCHIVE = {Kind.K: "rotq4", Kind.V: "rotq2"}


def filled(layers: int, heads: int, dim: int, rows: np.ndarray) -> KVStore:
    s = KVStore(layers, heads, dim, dim)
    for il in range(layers):
        for kind in Kind:
            s.append(il, kind, Tier.WARM, "rotq4", rows)
    return s


def time_shape(layers: int, heads: int, dim: int, n_rows: int, rounds: int, threads: list[int]) -> dict:
    rows = np.random.default_rng(0).standard_normal((n_rows, heads * dim)).astype(np.float32)
    table = {(il, kind): ARCHIVE[kind] for il in range(layers) for kind in Kind}
    now: dict[int, list[float]] = {t: [] for t in threads}
    before = []
    for _ in range(rounds):
        for n in threads:
            s = filled(layers, heads, dim, rows)
            s.set_threads(n)
            t = time.perf_counter()
            s.retier_lists(0, n_rows, Tier.ARCHIVE, table)
            now[n].append(time.perf_counter() - t)
        s = filled(layers, heads, dim, rows)
        t = time.perf_counter()
        for il in range(layers):
            for kind in Kind:
                x = s.decode(il, kind, 0, n_rows).reshape(n_rows, heads, dim)
                codecs.encode(ARCHIVE[kind], x, "kv"[kind])
        before.append(time.perf_counter() - t)
    return {
        "retier_ms_best": {n: 1e3 * min(v) for n, v in now.items()},
        "retier_ms_median": {n: 1e3 * float(np.median(v)) for n, v in now.items()},
        "recode_ms_best": 1e3 * min(before),
        "recode_ms_median": 1e3 * float(np.median(before)),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=256, help="rows of the evicted block (the 1-3B presets' ubatch)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "speed" / "aging_cost")
    p.add_argument("--threads", default="1,2", help="thread counts of retier_lists, comma-separated")
    a = p.parse_args(argv)
    threads = [int(t) for t in a.threads.split(",")]
    results = {name: time_shape(*shape, a.rows, a.rounds, threads) for name, shape in SHAPES.items()}

    def ms(best: float, median: float) -> str:
        return f"{best:.1f} ({median:.1f})"

    rows = [
        [name, ms(r["recode_ms_best"], r["recode_ms_median"])]
        + [ms(r["retier_ms_best"][n], r["retier_ms_median"][n]) for n in threads]
        + [f"{r['recode_ms_best'] / r['retier_ms_best'][threads[0]]:.1f}x"]
        + [f"{r['retier_ms_best'][threads[0]] / r['retier_ms_best'][n]:.1f}x" for n in threads[1:]]
        for name, r in results.items()
    ]
    header = (
        ["shape", "coding again (before), 1 thread"]
        + [f"retier_lists, {n} thread{'s' if n > 1 else ''}" for n in threads]
        + [f"retier_lists on {threads[0]} against coding again"]
        + [f"{n} threads against {threads[0]}" for n in threads[1:]]
    )
    md = (
        f"`benchmarks/aging_cost.py --rows {a.rows} --rounds {a.rounds} --threads {a.threads}` ({platform.machine()}, "
        f"{os.cpu_count()} cores; ms, best of {a.rounds} and median in brackets): one eviction of {a.rows} rows aged, "
        "every layer, K rotq4 warm to rotq4 archive and V rotq4 to rotq2\n\n" + markdown_table(header, rows) + "\n"
    )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text(md)
    write_json(
        a.out.with_suffix(".json"),
        {"rows": a.rows, "rounds": a.rounds, "threads": threads, "results": results},
        threads=max(threads),
    )
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
