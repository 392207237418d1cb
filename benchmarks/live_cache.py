"""Benchmark of the live tiered cache against llama.cpp's own f16, q8_0 and q4_0 caches.

For each logical context and cache: prefill that many tokens of WikiText-2 in batches,
then decode tokens one at a time, and record the KV bytes held (kv_memory(): llama.cpp's
buffers plus the store's encoded rows), the process's RSS growth, and tokens/s.
Each configuration runs in its own process so RSS figures do not mix. With --repeats N every
configuration runs N times, round-robin (so a slow spell of the machine hits all of them alike),
and each speed is the median of its runs; the JSON keeps every run.

Every ratio compares with stock f16 at its best, phase by phase: the faster of flash attention
on (`f16`) and off (`f16:fa0`; llama.cpp's one-token CPU flash attention is its slow path).

    .venv/bin/python benchmarks/live_cache.py --contexts 4096,8192,32768
    .venv/bin/python benchmarks/live_cache.py --model llama-3.2-1b   # a real shape (benchmarks/shapes.py)
    python3 benchmarks/live_cache.py --gpu --text random --model llama-3.2-3b --contexts 8192,32768 \
        --caches f16,q8_0,q4_0,tiered      # every layer on the GPU (a CUDA build; issue 44's table)

writes benchmarks/results/speed/live_cache.json and .md.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from common import (
    add_out_option,
    add_threads_option,
    busy_cpus,
    command,
    markdown_table,
    progress,
    rss_bytes,
    write_result,
)

HERE = Path(__file__).resolve().parent


def run_one(
    model: str,
    n_ctx: int,
    cache: str,
    n_decode: int,
    threads: int,
    batch: int,
    gpu: bool = False,
    text: str = "wikitext",
    phases: bool = False,
) -> dict:
    import kvgguf
    from kvgguf.evaluation import harness
    from kvgguf.policy import kv_codec

    path = str(model_path(model))
    import llama_cpp

    vocab = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    if text == "random":  # a shape model's text is gibberish anyway; no text package needed (a GPU machine)
        import numpy as np

        tokens = [int(t) for t in np.random.default_rng(0).integers(10, min(vocab.n_vocab(), 40000), n_ctx)]
    else:
        from kvgguf.evaluation.text import wikitext2_test

        tokens = vocab.tokenize(wikitext2_test().encode("utf-8"))
    del vocab
    n_prefill = n_ctx - n_decode
    if len(tokens) < n_ctx:
        raise SystemExit(f"the text has {len(tokens)} tokens, fewer than n_ctx={n_ctx}")
    flash_attn = not cache.endswith(":fa0")
    cache = cache.removesuffix(":fa0")
    kw = dict(
        n_ctx=n_ctx,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=flash_attn,
        verbose=False,
    )
    free0 = None
    if gpu:  # every layer on the GPU, stock and kvgguf alike
        kw["n_gpu_layers"] = -1
        from kvgguf.bindings import cuda_store

        free0 = cuda_store.mem_info(0)[0]  # before the model and the context
    rss0 = rss_bytes()
    if cache in ("f16", "q8_0", "q4_0"):
        llm = kvgguf.Llama(path, type_k=cache, type_v=cache, **kw)
    else:  # a kvgguf codec; "<codec>:expand" expands cold rows to f16 for every ubatch;
        # "<codec>@H/U": hot window H, U tokens per llama_decode (default: the config's)
        spec, attention = cache, "fused"
        for mode in ("fused", "expand"):
            if cache.endswith(":" + mode):
                spec, attention = cache[: -len(mode) - 1], mode
        codec, _, sizes = spec.partition("@")
        config = kv_codec.parse(codec)[0]  # ":hot=TYPE" / ":window=TYPE" suffixes too
        if sizes:
            hot, ubatch = (int(x) for x in sizes.split("/"))
            config = dataclasses.replace(config, hot=hot, ubatch=ubatch)
            kw["n_batch"] = kw["n_ubatch"] = min(batch, config.ubatch)
        else:  # kvgguf's own batch: a preset's ubatch follows the model's size (policy.tiered.sized_for_model)
            del kw["n_batch"]
        llm = kvgguf.Llama(path, kv_codec=config if sizes else codec, kv_attention=attention, **kw)
        kw["n_batch"] = llm.n_batch
    clock = PhaseClock(llm) if phases else None
    ops = GpuOps(llm)
    t0 = time.perf_counter()
    llm.eval(tokens[:n_prefill])
    t1 = time.perf_counter()
    prefill_phases = clock.take() if clock else None
    prefill_ops = ops.take()
    for tok in tokens[n_prefill:n_ctx]:
        llm.eval([tok])
    t2 = time.perf_counter()
    decode_phases = clock.take() if clock else None
    decode_ops = ops.take()
    mem = llm.kv_memory()
    vram_used = free0 - cuda_store.mem_info(0)[0] if free0 is not None else None
    return {
        "model": model,
        "n_ctx": n_ctx,
        "cache": harness.row_name(cache, cache, llm) + ("" if flash_attn else " (flash attention off)"),
        "flash_attn": flash_attn,
        "n_batch": kw["n_batch"],
        "hot": llm.kv_config.hot if llm.kv_config else None,
        "n_prefill": n_prefill,
        "n_decode": n_decode,
        "prefill_tok_s": n_prefill / (t1 - t0),
        "decode_tok_s": n_decode / (t2 - t1),
        "kv_bytes": mem.total_bytes,
        "gpu": gpu,
        "vram_kv_bytes": mem.vram_bytes,  # llama.cpp's cells in VRAM and the store's copy there
        # measured: the device's free memory before the model against after the run (weights,
        # cells, the store's copy, compute buffers, scratch: compare rows of the same model)
        "vram_used_bytes": vram_used,
        "kv_tiers": {t.name: [t.codec, t.bytes] for t in mem.tiers},
        "bits_per_value": mem.bits_per_value,
        "kv_memory": str(mem),
        "compute_bytes": mem.compute_bytes,
        "rss_growth_bytes": rss_bytes() - rss0,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        **({"phases": {"prefill": prefill_phases, "decode": decode_phases}} if clock else {}),
        **({"gpu_ops": {"prefill": prefill_ops, "decode": decode_ops}} if ops.on else {}),
    }


class GpuOps:
    """A kvgguf cache on a GPU: how often llama.cpp called kvgguf's attention op there (the device
    copy's hook calls; a layer whose op fell back to the CPU path does not count, and neither does
    a replay of a CUDA graph that holds the op), against the calls that every layer of every
    llama_decode would make, and the rows coded on the GPU. take() returns the counts since the
    last take."""

    def __init__(self, llm):
        import llama_cpp.llama_cpp as C

        kv = getattr(llm, "_kv", None)
        self.kv = kv
        self.on = kv is not None and kv.device_store is not None
        self.n_layers = len(kv.gpu[1]) if self.on else 0
        self.decodes = 0
        if self.on:
            fn = C.llama_decode

            def counted(*a, **k):
                self.decodes += 1
                return fn(*a, **k)

            C.llama_decode = counted
        self._last = self._now()

    def _now(self) -> tuple[int, int, int, int]:
        if not self.on:
            return (0, 0, 0, 0)
        attend, finish = self.kv.device_store.calls()
        return attend, finish, self.decodes, self.kv.rows_coded_on_gpu

    def take(self) -> dict:
        now = self._now()
        attend, finish, decodes, coded = (a - b for a, b in zip(now, self._last))
        self._last = now
        # llama_decode splits a batch into ubatches; each runs every layer's op once where cold rows exist
        return {
            "attend_calls": attend,
            "finish_calls": finish,
            "llama_decode_calls": decodes,
            "gpu_layers": self.n_layers,
            "rows_coded_on_gpu": coded,
        }


class PhaseClock:
    """--phases: seconds spent in llama_decode (graph build and launch; on a GPU its kernels finish
    later, when the logits are read) and, for a kvgguf cache, in LiveCache's steps between batches
    (before_batch: eviction, the device copy's sync; _age: aging, after the batch or beside it on
    the GPU; _settle: the waits for aging beside the GPU), by wrapping them; take() returns the sums
    since the last take and starts again."""

    def __init__(self, llm):
        import llama_cpp.llama_cpp as C

        self.sums: dict[str, float] = {}
        self._wrap(C, "llama_decode", "llama_decode")
        kv = getattr(llm, "_kv", None)
        if kv is not None:
            for name in ("before_batch", "after_batch", "_evict", "_age", "_settle"):
                self._wrap(kv, name, name)
            if kv.device_store is not None:
                self._wrap(kv.device_store, "sync", "device sync")

    def _wrap(self, owner, attr: str, key: str) -> None:
        fn = getattr(owner, attr)

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.sums[key] = self.sums.get(key, 0.0) + time.perf_counter() - t

        setattr(owner, attr, timed)

    def take(self) -> dict[str, float]:
        out, self.sums = self.sums, {}
        return out


def gpu_name() -> str:
    """The GPU and its driver, as nvidia-smi names them (every GPU figure names its card)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"], capture_output=True, text=True
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown GPU"
    except OSError:
        return "no nvidia-smi"


def model_path(model: str):
    """A model name of kvgguf's registry, a real shape of benchmarks/shapes.py, or a GGUF path."""
    import kvgguf

    import shapes

    return shapes.path(model) if model in shapes.SHAPES else kvgguf.models.path(model)


def stock_best(rows: list[dict], model: str, n_ctx: int) -> Optional[dict]:
    """Stock f16's best prefill and decode speed of this model and context (flash attention on or
    off, the faster for each phase) and its KV bytes, or None without an f16 row."""
    f16 = [r for r in rows if (r["model"], r["n_ctx"]) == (model, n_ctx) and r["cache"].startswith("f16")]
    if not f16:
        return None
    return {
        "prefill_tok_s": max(r["prefill_tok_s"] for r in f16),
        "decode_tok_s": max(r["decode_tok_s"] for r in f16),
        "kv_bytes": f16[0]["kv_bytes"],
    }


def median_rows(runs: list[dict]) -> list[dict]:
    """One row per (context, cache), in first-seen order: its speeds are the median of its runs
    (their range beside them); memory and the other fields are its first run's."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["n_ctx"], r["cache"]), []).append(r)
    rows = []
    for group in groups.values():
        row = dict(group[0], runs=len(group))
        for key in ("prefill_tok_s", "decode_tok_s"):
            values = sorted(r[key] for r in group)
            row[key] = statistics.median(values)
            row[key + "_range"] = [values[0], values[-1]]
        rows.append(row)
    return rows


def spread(row: dict, key: str, digits: int) -> str:
    """A speed, with the range of its runs after it where there were several."""
    text = f"{row[key]:.{digits}f}"
    if row.get("runs", 1) > 1:
        lo, hi = row[key + "_range"]
        text += f" ({lo:.{digits}f}-{hi:.{digits}f})"
    return text


def table(rows: list[dict]) -> str:
    header = [
        "context",
        "cache",
        "KV held (kv_memory)",
        "bits/value",
        "vs f16",
        "compute scratch (peak)",
        "RSS growth",
        "prefill tok/s",
        "prefill vs f16 best",
        "decode tok/s",
        "decode vs f16 best",
    ]
    gpu = any(r.get("gpu") for r in rows)
    if gpu:  # where the bytes are: llama.cpp's cells and the store's copy in VRAM, and all the run used
        header[3:3] = ["KV in VRAM", "VRAM used (measured)"]
    body = []
    for r in rows:
        base = stock_best(rows, r["model"], r["n_ctx"])
        ratio = f"1/{base['kv_bytes'] / r['kv_bytes']:.1f}" if base else "n/a"
        speed = f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x" if base else "n/a"
        prefill = f"{r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x" if base else "n/a"
        used = r.get("vram_used_bytes")
        vram = (
            [f"{r.get('vram_kv_bytes', 0) / 2**20:.1f} MiB", f"{used / 2**20:.0f} MiB" if used else "n/a"]
            if gpu
            else []
        )
        body.append(
            [
                f"{r['n_ctx'] // 1024}K",
                r["cache"],
                f"{r['kv_bytes'] / 2**20:.1f} MiB",
                *vram,
                f"{r['bits_per_value']:.2f}",
                ratio,
                f"{r.get('compute_bytes', 0) / 2**20:.1f} MiB",
                f"{r['rss_growth_bytes'] / 2**20:.0f} MiB",
                spread(r, "prefill_tok_s", 0),
                prefill,
                spread(r, "decode_tok_s", 1),
                speed,
            ]
        )
    return markdown_table(header, body)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name, real shape (benchmarks/shapes.py: llama-3.2-1b, ...) or GGUF path",
    )
    p.add_argument("--contexts", default="4096,8192,32768", help="logical contexts, comma-separated")
    p.add_argument(
        "--caches",
        default="f16,f16:fa0,q8_0,q4_0,tiered",
        help="llama.cpp types and kvgguf codecs (<codec>:expand: without the fused attention; "
        "<codec>@H/U: hot window H, U tokens per llama_decode; any:fa0: flash attention off)",
    )
    p.add_argument("--decode", type=int, default=32, help="tokens decoded one at a time after prefill")
    p.add_argument(
        "--batch",
        type=int,
        default=256,
        help="prefill batch (n_batch = n_ubatch); kvgguf splits it into its config's ubatch",
    )
    add_threads_option(p)
    p.add_argument("--repeats", type=int, default=1, help="runs of each configuration (speeds: their median)")
    add_out_option(p, HERE / "results" / "speed" / "live_cache")
    p.add_argument(
        "--gpu",
        action="store_true",
        help="every layer on the GPU (n_gpu_layers=-1), stock and kvgguf alike: needs a CUDA build",
    )
    p.add_argument(
        "--text",
        default="wikitext",
        choices=("wikitext", "random"),
        help="the tokens: WikiText-2, or random ids (shape models, where no text package is installed)",
    )
    p.add_argument(
        "--keep-going",
        action="store_true",
        help="a configuration that fails or runs out of time is reported and left out of the table, "
        "and the others still run (exit status 1 at the end)",
    )
    p.add_argument("--run-timeout", type=float, default=None, help="seconds each configuration may run")
    p.add_argument(
        "--phases",
        action="store_true",
        help="also time llama_decode and kvgguf's steps between batches (in the JSON, per phase)",
    )
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    contexts = [int(c) for c in args.contexts.split(",")]
    caches = args.caches.split(",")
    if args.one:
        import faulthandler
        import os

        # where a native crash happened, on a copy of stderr (llama-cpp-python silences fd 2 while loading)
        faulthandler.enable(file=os.fdopen(os.dup(2), "w"), all_threads=True)
        print(
            json.dumps(
                run_one(
                    args.model,
                    contexts[0],
                    caches[0],
                    args.decode,
                    args.threads,
                    args.batch,
                    args.gpu,
                    args.text,
                    args.phases,
                )
            )
        )
        return 0
    if args.gpu and gpu_name() in ("no nvidia-smi", "unknown GPU"):
        raise SystemExit("--gpu: nvidia-smi finds no NVIDIA GPU here")
    model_path(args.model)  # a real shape is written here, not inside a timed process
    runs, failed = [], []
    for n_ctx, cache in [(n, c) for _ in range(args.repeats) for n in contexts for c in caches]:
        cmd = (
            [
                sys.executable,
                __file__,
                "--one",
                "--model",
                args.model,
                "--contexts",
                str(n_ctx),
                "--caches",
                cache,
                "--decode",
                str(args.decode),
                "--threads",
                str(args.threads),
                "--batch",
                str(args.batch),
                "--text",
                args.text,
            ]
            + (["--gpu"] if args.gpu else [])
            + (["--phases"] if args.phases else [])
        )
        busy = busy_cpus()
        # llama.cpp's threads spin: anything else running makes decode several times slower.
        note = f" ({busy:.2f} CPUs busy: the machine is not idle, speed figures are unreliable)" if busy > 0.2 else ""
        progress(f"{n_ctx} {cache} ...{note}")
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, cwd=HERE, timeout=args.run_timeout)
            why = None if out.returncode == 0 else f"exit {out.returncode}:\n{out.stderr[-3000:]}"
        except subprocess.TimeoutExpired:
            why = f"still running after {args.run_timeout:g} s"
        if why:
            if not args.keep_going:
                raise SystemExit(f"{n_ctx} {cache} failed: {why}")
            progress(f"{n_ctx} {cache} FAILED: {why}")
            failed.append(f"{n_ctx} {cache}: {why.splitlines()[0]}")
            continue
        runs.append(dict(json.loads(out.stdout.strip().splitlines()[-1]), busy_cpus_before=busy))
        print(table(runs[-1:]).splitlines()[-1], file=sys.stderr, flush=True)
        if "phases" in runs[-1]:
            print(f"  phases (s): {json.dumps(runs[-1]['phases'])}", file=sys.stderr, flush=True)
        if "gpu_ops" in runs[-1]:
            print(f"  kvgguf's ops on the GPU: {json.dumps(runs[-1]['gpu_ops'])}", file=sys.stderr, flush=True)
    if not runs:
        raise SystemExit("no configuration ran: " + "; ".join(failed))
    rows = median_rows(runs)
    result = {
        "command": command(__file__, argv),
        "threads": args.threads,
        "repeats": args.repeats,
        "gpu": gpu_name() if args.gpu else None,
        "rows": rows,
        "runs": runs,
        "failed": failed,
    }
    md = (
        f"`{result['command']}` ({args.model}, {args.threads} threads"
        + (f", every layer on the GPU: {result['gpu']}" if args.gpu else "")
        + "; flash attention on unless the row says "
        "off; ratios against stock f16 at its best, per phase"
        + (f"; speeds are medians of {args.repeats} runs, their range in brackets" if args.repeats > 1 else "")
        + f")\n\n{table(rows)}\n"
        + "".join(f"\nFailed: {f}\n" for f in failed)
    )
    write_result(args.out, result, md, args.threads, indent=2)
    print(md)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
