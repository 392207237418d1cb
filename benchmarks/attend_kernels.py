"""Single-thread speed of the store's fused attention (kvg_store_hook_attend) per codec.

    .venv/bin/python benchmarks/attend_kernels.py [--rows 8192] [--repeat 20] [--rounds 5] [--codecs f16,rotq4,rotq2]
        [--tokens 1] [--out FILE.json]

One layer of SmolLM2-135M's shape (head_dim 64, 3 KV heads, 9 query heads), `--tokens` query
tokens (1: a decode step; 32: the SmolLM2 preset's prefill ubatch, 96 queries per KV head, which
take the dense tiles), K and V both in the codec, one block of `--rows` rows, the attention mass noted and
brought in as in the live cache. Reports, at each SIMD level,
the time of one call and the encoded K+V bytes it reads per second on one core; for reference,
the time of expanding the same rows to f16 (kvg_store_decode_f16 on K and V, the path the
fused kernel replaces, which still leaves the attention itself to do).
"""

from __future__ import annotations

import argparse
import platform
from pathlib import Path

import numpy as np

from kvgguf import codecs
from kvgguf.bindings.binding import get_ffi, get_lib
from kvgguf.enums import Kind, Tier
from kvgguf.bindings.store import KVStore

from common import best_of, write_json

HEAD_DIM, N_HEAD_KV, N_HEAD = 64, 3, 9
CODECS = ("f16", "rotq4", "rotq2")


def measure(codec: str, n_rows: int, repeat: int, level: int, n_tokens: int) -> dict:
    rng = np.random.default_rng(0)
    store = KVStore(1, N_HEAD_KV, HEAD_DIM, HEAD_DIM)
    width = N_HEAD_KV * HEAD_DIM
    for kind in Kind:
        store.append(0, kind, Tier.WARM, codec, rng.standard_normal((n_rows, width)).astype(np.float32))
    encoded = store.held().bytes

    ffi, lib = get_ffi(), get_lib()
    q = rng.standard_normal((n_tokens, N_HEAD, HEAD_DIM)).astype(np.float32)
    m = np.empty(n_tokens * N_HEAD, np.float32)
    l = np.empty_like(m)
    acc = np.empty(n_tokens * N_HEAD * HEAD_DIM, np.float32)
    pq, pm, pl, pacc = (ffi.from_buffer("float[]", x) for x in (q, m, l, acc))
    scale = 1.0 / np.sqrt(HEAD_DIM)
    store.set_mass(True)  # as in the live cache: the call also notes the attention mass

    def attend():
        m.fill(-np.inf)
        l.fill(0.0)
        acc.fill(0.0)
        st = lib.kvg_store_hook_attend(store._ptr, 0, 0, n_rows, pq, n_tokens, N_HEAD, scale, pm, pl, pacc)
        assert st == 0, st
        st = lib.kvg_store_hook_mass(store._ptr, 0, n_tokens, N_HEAD, pm, pl)  # what the merge op calls
        assert st == 0, st

    f16 = np.empty((n_rows, width), np.float16)
    pf16 = ffi.from_buffer("uint16_t[]", f16)

    def expand():
        for kind in Kind:
            st = lib.kvg_store_decode_f16(store._ptr, 0, kind, 0, n_rows, pf16, f16.size)
            assert st == 0, st

    with codecs.force_simd(level):
        t_attend = best_of(attend, repeat)
        t_expand = best_of(expand, repeat)
    return {
        "codec": codec,
        "simd": ("scalar", "avx2", "neon")[level],
        "rows": n_rows,
        "tokens": n_tokens,
        "encoded_bytes": encoded,
        "attend_us": t_attend * 1e6,
        "attend_gb_s": encoded / t_attend / 1e9,
        "ns_per_row": t_attend / n_rows * 1e9,
        "expand_f16_us": t_expand * 1e6,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="rounds over every configuration, keeping each one's best: this machine's speed drifts "
        "by tens of percent over minutes, and interleaving gives every configuration the fast phases",
    )
    ap.add_argument("--codecs", default=",".join(CODECS), help="codecs to time, comma-separated (default: %(default)s)")
    ap.add_argument("--tokens", type=int, default=1, help="query tokens per call (default: %(default)s)")
    ap.add_argument("--out", help="also write the figures to this JSON file")
    args = ap.parse_args()
    names = [c for c in args.codecs.split(",") if c]
    for c in names:
        codecs.get(c)  # an unknown name fails here, before any timing

    levels = codecs.simd_levels()
    results = []
    for _ in range(args.rounds):
        this = [measure(c, args.rows, args.repeat, lvl, args.tokens) for c in names for lvl in levels]
        results = this if not results else [a if a["attend_us"] <= b["attend_us"] else b for a, b in zip(results, this)]
    print(
        f"head_dim {HEAD_DIM}, {N_HEAD_KV} KV heads, {N_HEAD} query heads, {args.tokens} query tokens, "
        f"{args.rows} rows of K and V, one thread ({platform.processor() or platform.machine()})"
    )
    print(
        f"{'codec':<7} {'simd':<7} {'K+V bytes':>10} {'attend us':>10} {'GB/s':>7} {'ns/row':>7} {'expand f16 us':>14}"
    )
    for r in results:
        print(
            f"{r['codec']:<7} {r['simd']:<7} {r['encoded_bytes']:>10} {r['attend_us']:>10.1f} "
            f"{r['attend_gb_s']:>7.2f} {r['ns_per_row']:>7.1f} {r['expand_f16_us']:>14.1f}"
        )
    if levels == [0]:
        print("(no SIMD kernels for this CPU or build: scalar only)")
    if args.out:
        shape = {"head_dim": HEAD_DIM, "n_head_kv": N_HEAD_KV, "n_head": N_HEAD, "n_tokens": args.tokens}
        write_json(Path(args.out), {"shape": shape, "results": results}, threads=1, indent=2)


if __name__ == "__main__":
    main()
