"""Decode speed after context shifts: a context of --ctx that shifted 1, 4 and 16 times against the
same context unshifted, at the same fill (--fill positions), in one run. A shifted context's cold
blocks carry shifts, and the fused attention rotates the queries once per distinct shift.

--budget-evals: contexts under a budget of what the unshifted one's store holds, after that many
tokens evaluated, so they hold about --fill positions with many distinct offsets (each drop moves
the later blocks by another); their decode drops blocks as it goes, as a user's does.

Each row decodes --tokens tokens one at a time, --repeats times, the contexts taking turns in each
repeat, and reports the median seconds per token and its ratio to the unshifted context's. Run it
on an otherwise idle machine.

    .venv/bin/python benchmarks/shift_speed.py --out benchmarks/results/speed/context_shift/speed_smollm2_2k

writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from common import add_out_option, add_threads_option, busy_cpus, command, markdown_table, progress, write_result
from live_cache import model_path

HERE = Path(__file__).resolve().parent


def open_llama(model: str, kv_codec: str, n_ctx: int, threads: int, **kw):
    import kvgguf

    return kvgguf.Llama(
        str(model_path(model)),
        kv_codec=kv_codec,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
        **kw,
    )


def context(model: str, kv_codec: str, n_ctx: int, fill: int, shifts: int, tokens: list[int], threads: int):
    """A Llama whose context shifted `shifts` times and holds `fill` positions."""
    llm = open_llama(model, kv_codec, n_ctx, threads, context_shift=True)
    i, step = 0, 256
    while llm.context_shifts < shifts or llm.n_tokens < fill:
        n = min(step, fill - llm.n_tokens) if llm.context_shifts >= shifts else step
        if i + n > len(tokens):
            raise ValueError(f"{len(tokens)} tokens of text are too few for {shifts} shifts")
        llm.eval(tokens[i : i + n])
        i += n
    return llm, i


def budget_context(model: str, kv_codec: str, n_ctx: int, evaluated: int, tokens: list[int], threads: int):
    """A Llama under kv_codec (a budget) after `evaluated` tokens, in batches of 256."""
    if evaluated > len(tokens):
        raise ValueError(f"{len(tokens)} tokens of text are too few for {evaluated}")
    llm = open_llama(model, kv_codec, n_ctx, threads)
    for i in range(0, evaluated, 256):
        llm.eval(tokens[i : min(i + 256, evaluated)])
    return llm, evaluated


def decode_seconds(contexts: list, n: int, repeats: int) -> list[list[float]]:
    """Seconds per token over n single-token evals for each (llm, tokens) of contexts, each repeat
    going on from the last (every row's context grows alike, and none shifts again), after a few
    untimed. The contexts take turns within each repeat, so a machine whose speed drifts slows
    them alike."""
    warm = 4
    for llm, tokens in contexts:
        for t in tokens[:warm]:  # the first single-token batch builds its graph and buffers
            llm.eval([t])
    out: list[list[float]] = [[] for _ in contexts]
    for r in range(repeats):
        for (llm, tokens), secs in zip(contexts, out):
            t0 = time.perf_counter()
            for t in tokens[warm + r * n : warm + (r + 1) * n]:
                llm.eval([t])
            secs.append((time.perf_counter() - t0) / n)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name, real shape (benchmarks/shapes.py) or GGUF path (default: %(default)s)",
    )
    p.add_argument("--ctx", type=int, default=2048, help="n_ctx (default: %(default)s)")
    p.add_argument("--fill", type=int, default=1536, help="positions held when decoding (default: %(default)s)")
    p.add_argument("--shifts", default="0,1,4,16", help="shift counts, comma-separated (default: %(default)s)")
    p.add_argument("--kv-codec", default="tiered:fixed", help="kv_codec (default: %(default)s)")
    p.add_argument(
        "--budget-evals",
        default="",
        help="tokens evaluated under a budget of the unshifted store's bytes, comma-separated (e.g. 3072,6144)",
    )
    p.add_argument("--tokens", type=int, default=32, help="tokens decoded per repeat (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="repeats (default: %(default)s)")
    add_threads_option(p)
    add_out_option(p)
    a = p.parse_args(argv)

    import llama_cpp

    from kvgguf.evaluation.text import wikitext2_test

    vocab = llama_cpp.Llama(str(model_path(a.model)), vocab_only=True, verbose=False)
    text = vocab.tokenize(wikitext2_test().encode("utf-8"))
    busy = busy_cpus()
    rows = []

    contexts = []  # (llm, the text after what it evaluated)

    def add(what: str, llm, used: int) -> None:
        runs = {s for il in llm.kv_cache.layers for _, _, s in llm.kv_cache.store.shifts(il)}
        rows.append(
            {
                "context": what,
                "shifts": llm.context_shifts,
                "distinct_offsets": len(runs),
                "n_cold": llm.kv_cache.n_cold,
                "positions": llm.n_tokens,
                "cold_bytes": llm.kv_memory().cold_bytes,
            }
        )
        contexts.append((llm, text[used:]))

    for k in (int(x) for x in a.shifts.split(",")):
        progress(f"shift_speed: {a.kv_codec}, {k} shifts, fill {a.fill} of n_ctx {a.ctx}")
        add(f"{k} shifts" if k else "unshifted", *context(a.model, a.kv_codec, a.ctx, a.fill, k, text, a.threads))
    for n in (int(x) for x in a.budget_evals.split(",") if x):
        spec = f"{a.kv_codec}:budget={rows[0]['cold_bytes']}"
        progress(f"shift_speed: {spec}, {n} tokens evaluated")
        add(f"budget, {n} evaluated", *budget_context(a.model, spec, a.ctx, n, text, a.threads))
    progress(f"shift_speed: decoding, {len(contexts)} contexts in turn")
    for row, secs, (llm, _) in zip(rows, decode_seconds(contexts, a.tokens, a.repeats), contexts):
        row["seconds"] = secs
        row["tokens_dropped"] = llm.tokens_dropped
        llm.close()
    base = statistics.median(rows[0]["seconds"])
    for r in rows:
        r["median"] = statistics.median(r["seconds"])
        r["ratio"] = base / r["median"]
    result = {"model": a.model, "n_ctx": a.ctx, "fill": a.fill, "kv_codec": a.kv_codec, "busy_cpus_before": busy}
    result.update(runs=rows, command=command(__file__, argv))
    table = markdown_table(
        ["context", "positions held", "distinct offsets", "cold rows", "ms / token (median)", "speed vs unshifted"],
        [
            [
                r["context"],
                r["positions"],
                r["distinct_offsets"],
                r["n_cold"],
                f"{1000 * r['median']:.2f}",
                f"{r['ratio']:.3f}",
            ]
            for r in rows
        ],
    )
    md = (
        f"# Decode after context shifts: {a.model}, `{a.kv_codec}`, n_ctx {a.ctx}, {a.fill} positions held\n\n"
        f"`{result['command']}`\n\n{a.tokens} tokens decoded one at a time, median of {a.repeats} repeats, "
        f"{a.threads} threads (busy CPUs before the run: {busy:.2f}).\n\n{table}\n"
    )
    write_result(a.out, result, md, a.threads)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
