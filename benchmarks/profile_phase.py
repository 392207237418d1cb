"""Where a phase's time goes: `perf record` over the prefill or the decode of one cache.

The speed targets of the live cache are ratios against stock llama.cpp; where one is missed,
this says which functions the time went to, for stock and for kvgguf in the same run. Each
configuration runs in its own process (as in live_cache.py): it prefills, and perf samples the
process (cpu-clock, all threads) during the phase asked for only. The report groups symbols:
llama.cpp's attention, its weight matmuls and other ops, kvgguf's store and attention
(libkvgguf), threads waiting for each other, and the rest (llama.cpp's graph code, Python, libc, the kernel).

    .venv/bin/python benchmarks/profile_phase.py --model llama-3.2-3b --ctx 4096 --phase decode \\
        --caches f16:fa0,tiered --out benchmarks/results/speed/profile/llama-3.2-3b_4k_decode

Needs Linux perf (Debian's linux-perf). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import add_out_option, add_threads_option, busy_cpus, command, markdown_table, write_result  # noqa: E402
from live_cache import model_path  # noqa: E402

# Symbol -> group, first match wins. llama.cpp's CPU library is stripped of its static functions
# (the repacked Q4_0 matmul kernels among them): its unnamed addresses count as "weights and other
# ops", its named attention functions apart. OpenMP's library is where ggml's threads wait for
# each other at the end of every op.
GROUPS = (
    ("kvgguf (store, fused attention)", lambda dso, sym: "kvgguf" in dso),
    ("threads waiting (OpenMP)", lambda dso, sym: "libgomp" in dso),
    (
        "llama.cpp attention",
        lambda dso, sym: re.search(r"flash_attn|soft_max|vec_dot_f16|vec_mad_f16|fp16_to_fp32", sym) is not None,
    ),
    ("llama.cpp weights and other ops", lambda dso, sym: "ggml" in dso),
)


ATTENTION, WEIGHTS = GROUPS[2][0], GROUPS[3][0]


def group_of(dso: str, symbol: str) -> str:
    for name, test in GROUPS:
        if test(dso, symbol):
            return name
    return "other"


def run_one(model: str, n_ctx: int, cache: str, phase: str, n_decode: int, threads: int) -> dict:
    """Prefill n_ctx - n_decode tokens, decode n_decode, perf sampling only the phase asked for."""
    import kvgguf
    import llama_cpp
    from kvgguf.evaluation.text import wikitext2_test

    path = str(model_path(model))
    vocab = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    tokens = vocab.tokenize(wikitext2_test().encode("utf-8"))[:n_ctx]
    del vocab
    flash_attn = not cache.endswith(":fa0")
    name = cache.removesuffix(":fa0")
    kw = dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=flash_attn, verbose=False)
    if name in ("f16", "q8_0", "q4_0"):
        llm = kvgguf.Llama(path, type_k=name, type_v=name, n_batch=512, n_ubatch=512, **kw)
    else:
        llm = kvgguf.Llama(path, kv_codec=name, **kw)
    n_prefill = n_ctx - n_decode
    data = tempfile.NamedTemporaryFile(suffix=".perf", delete=False).name

    def start():
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-e", "cpu-clock", "-F", "499", "-o", data, "-p", str(os.getpid())],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(1.0)  # perf attaches to every thread before the phase starts
        return perf

    def stop(perf):
        perf.send_signal(signal.SIGINT)
        perf.wait()

    perf = start() if phase == "prefill" else None
    t0 = time.perf_counter()
    llm.eval(tokens[:n_prefill])
    t1 = time.perf_counter()
    if phase == "prefill":
        stop(perf)
    else:
        perf = start()
    t2 = time.perf_counter()
    for tok in tokens[n_prefill:]:
        llm.eval([tok])
    t3 = time.perf_counter()
    if phase == "decode":
        stop(perf)

    def report(sort: str, cut: str) -> str:
        argv = ["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", sort, "--percent-limit", cut]
        return subprocess.run(argv, capture_output=True, text=True, check=True).stdout

    # Whole libraries first (nothing cut away: a library's many small unnamed functions add up),
    # then llama.cpp's named attention functions, taken out of its libraries' share.
    by_dso = {}
    for line in report("dso", "0").splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s*$", line)
        if m:
            by_dso[m.group(2)] = by_dso.get(m.group(2), 0.0) + float(m.group(1))
    symbols = []
    for line in report("dso,symbol", "0.05").splitlines():
        m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.+?)\s*$", line)
        if m:
            symbols.append((float(m.group(1)), m.group(2), m.group(3).split("  ")[0].strip()))
    os.unlink(data)
    groups: dict[str, float] = {}
    for dso, pct in by_dso.items():
        g = group_of(dso, "")
        groups[g] = groups.get(g, 0.0) + pct
    for pct, dso, sym in symbols:
        if group_of(dso, sym) == ATTENTION and "ggml" in dso:
            groups[ATTENTION] = groups.get(ATTENTION, 0.0) + pct
            groups[WEIGHTS] = groups.get(WEIGHTS, 0.0) - pct
    return {
        "model": model,
        "n_ctx": n_ctx,
        "cache": cache,
        "phase": phase,
        "tok_s": n_prefill / (t1 - t0) if phase == "prefill" else n_decode / (t3 - t2),
        "groups": dict(sorted(groups.items(), key=lambda kv: -kv[1])),
        "by_dso": by_dso,
        "symbols": [{"pct": p, "dso": d, "symbol": s} for p, d, s in symbols if p >= 0.3],
    }


def table(rows: list[dict]) -> str:
    names = [g for g, _ in GROUPS] + ["other"]
    return markdown_table(
        ["cache", "tok/s", *names],
        [[r["cache"], f"{r['tok_s']:.2f}", *(f"{r['groups'].get(g, 0.0):.1f}%" for g in names)] for r in rows],
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.2-1b")
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--phase", choices=("prefill", "decode"), default="decode")
    ap.add_argument("--caches", default="f16,f16:fa0,tiered")
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded one at a time")
    add_threads_option(ap)
    add_out_option(ap, HERE / "results" / "speed" / "profile" / "profile")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a child: run this cache, print JSON
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.model, args.ctx, args.one, args.phase, args.decode, args.threads)))
        return 0
    rows = []
    for cache in args.caches.split(","):
        busy = busy_cpus()
        if busy > 0.3:
            print(f"warning: {busy:.1f} CPUs busy with other work; the profile will show it", file=sys.stderr)
        cmd = [sys.executable, __file__, "--one", cache] + [a for a in (argv or sys.argv[1:])]
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode:
            sys.stderr.write(out.stderr)
            return out.returncode
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"{cache}: {rows[-1]['tok_s']:.2f} tok/s, {rows[-1]['groups']}", file=sys.stderr)
    run = command(__file__, argv)
    md = (
        f"`{run}`\n\n{args.phase} at {args.ctx} tokens on {args.model}, {args.threads} threads; "
        f"share of perf's cpu-clock samples (all threads) per group\n\n{table(rows)}\n"
    )
    write_result(args.out, {"command": run, "rows": rows}, md, args.threads)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
