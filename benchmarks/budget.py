"""Bounded memory against its alternatives at equal bytes: the preset under a budget that drops
the least-attended blocks (H2O's rule, "tiered:fixed:budget=B"), the same budget dropping the
oldest blocks (StreamingLLM's, ":drop=oldest"), and the preset with lower-bit codecs holding
every token in about as many bytes (the pair of the most bits at most the retention's share).

B is a share (--retention) of what the preset's store holds at the end of --ctx tokens of
WikiText-2 without a budget. Every row is scored against stock llama.cpp with an f16 cache on the
same tokens: KL(stock || row) and top-1 agreement per token over the second half of the text,
where the dropped blocks are missed. "x f16" is the f16 bytes of the tokens evaluated over every
byte the row's cache holds at the end (llama.cpp's cells included).

    .venv/bin/python benchmarks/budget.py --ctx 4096 --out benchmarks/results/quality/budget/smollm2_4k

writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from common import add_out_option, add_threads_option, command, markdown_table, progress, write_result

HERE = Path(__file__).resolve().parent
REFERENCE_BATCH = 256
# (K, V) codecs the lower-bit rows choose from: for each retention, the pair of the most bits per
# value at most that share of the preset store's (every compressed token in it, no archive)
LOWER_BITS = [
    ("kivi8", "kivi8"),
    ("rotq4", "rotq4"),
    ("rotq4", "rotq2"),
    ("rotq3", "rotq2"),
    ("rotq2", "rotq2"),
    ("rotq2", "rotq1"),
    ("rotq1", "rotq1"),
    ("vq8f", "vq8f"),
]


def pair_bits(pair: tuple[str, str]) -> float:
    from kvgguf.bindings import codecs

    return sum(codecs.get(c).bits_per_value((64, 4, 64), role) for c, role in zip(pair, "kv")) / 2


def lower_bits(preset_bits: float, retention: float) -> tuple[str, str]:
    fits = [p for p in LOWER_BITS if pair_bits(p) <= retention * preset_bits]
    return max(fits, key=pair_bits) if fits else LOWER_BITS[-1]


def open_llama(model: str, kv_codec, ctx: int, threads: int):
    import kvgguf

    kw = dict(n_ctx=ctx, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False)
    if kv_codec is None:
        return kvgguf.Llama(str(kvgguf.models.path(model)), n_batch=REFERENCE_BATCH, n_ubatch=REFERENCE_BATCH, **kw)
    return kvgguf.Llama(str(kvgguf.models.path(model)), kv_codec=kv_codec, **kw)


def scored(llm, tokens: list[int], half: int):
    """The logits of tokens [half, n) as llm evaluates them, batch by batch (by count: a drop
    moves the positions back)."""
    i = 0
    for _, logits in llm.eval_logits(tokens):
        lo = max(i, half)
        if lo < i + len(logits):
            yield lo - half, logits[lo - i :]
        i += len(logits)


def run(model: str, kv_codec, tokens: list[int], threads: int, ref: np.ndarray) -> dict:
    from kvgguf.evaluation.harness import score

    ctx = len(tokens) + 64
    llm = open_llama(model, kv_codec, ctx, threads)
    t0 = time.perf_counter()
    kl, top1 = np.zeros(len(ref)), np.zeros(len(ref))
    for at, logits in scored(llm, tokens, len(tokens) - len(ref)):
        k, a, _, _ = score(ref[at : at + len(logits)], logits, np.full(len(logits), -1))
        kl[at : at + len(logits)], top1[at : at + len(logits)] = k, a
    mem = llm.kv_memory()
    f16 = len(tokens) * mem.values_per_token * 2
    config = llm.kv_config
    out = {
        "kv_codec": kv_codec if isinstance(kv_codec, str) else repr(kv_codec),
        "kl": float(kl.mean()),
        "top1": float(top1.mean()),
        "cold_bytes": mem.cold_bytes,
        "total_bytes": mem.total_bytes,
        "x_f16": f16 / mem.total_bytes,
        "tokens_held": llm.n_tokens,
        "tokens_dropped": llm.tokens_dropped,
        "kv": str(mem),
        "bits": mem.cold_bits_per_value,
        "seconds": time.perf_counter() - t0,
    }
    llm.close()
    return out, config


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="model name (default: %(default)s)")
    p.add_argument("--ctx", type=int, default=4096, help="tokens of WikiText-2 (default: %(default)s)")
    p.add_argument(
        "--retention",
        default="0.75,0.5,0.25",
        help="budgets as shares of the preset's store bytes, comma-separated (default: %(default)s)",
    )
    add_threads_option(p)
    add_out_option(p)
    a = p.parse_args(argv)

    from kvgguf.evaluation.text import wikitext2_test

    llm = open_llama(a.model, None, a.ctx + 64, a.threads)
    tokens = llm.tokenize(wikitext2_test().encode("utf-8"))[: a.ctx]
    half = len(tokens) // 2
    progress(f"budget: {a.model}, stock f16 reference over {len(tokens)} tokens")
    ref = np.empty((len(tokens) - half, llm.n_vocab()), dtype=np.float32)
    for at, logits in scored(llm, tokens, half):
        ref[at : at + len(logits)] = logits
    llm.close()

    rows = []
    progress("budget: tiered:fixed, no budget")
    full, preset = run(a.model, "tiered:fixed", tokens, a.threads, ref)
    rows.append({"retention": 1.0, "rule": "none", "cache": "`tiered:fixed`", **full})
    for r in (float(x) for x in a.retention.split(",")):
        budget = int(r * full["cold_bytes"])
        for rule in ("mass", "oldest"):
            spec = f"tiered:fixed:budget={budget}" + (":drop=oldest" if rule == "oldest" else "")
            progress(f"budget: {spec}")
            rows.append(
                {"retention": r, "rule": rule, "cache": f"`{spec}`", **run(a.model, spec, tokens, a.threads, ref)[0]}
            )
        pair = lower_bits(full["bits"], r)
        config = dataclasses.replace(preset, warm=pair, archive=None)  # the preset's windows and cells
        progress(f"budget: every token at {pair}")
        row = run(a.model, config, tokens, a.threads, ref)[0]
        rows.append({"retention": r, "rule": "lower bits", "cache": "K/V " + "/".join(pair), **row})

    result = {"model": a.model, "tokens": len(tokens), "scored_from": half, "runs": rows}
    result["command"] = command(__file__, argv)
    table = markdown_table(
        ["retention", "rule", "cache", "store MiB", "x f16", "tokens held", "KL", "top-1"],
        [
            [
                f"{r['retention']:.0%}",
                r["rule"],
                r["cache"],
                f"{r['cold_bytes'] / 2**20:.2f}",
                f"{r['x_f16']:.2f}",
                r["tokens_held"],
                f"{r['kl']:.4f}",
                f"{r['top1']:.3f}",
            ]
            for r in rows
        ],
    )
    md = (
        f"# Bounded memory: {a.model}, {len(tokens)} tokens of WikiText-2\n\n`{result['command']}`\n\n"
        f"KL(stock f16 || row) and top-1 agreement per token over tokens [{half}, {len(tokens)}); retention: the "
        "budget as a share of the preset's store bytes without one; store MiB: the store's codes and codebooks at "
        "the end; x f16: the f16 bytes of every token over all the cache holds (llama.cpp's cells too).\n\n"
        f"{table}\n"
    )
    write_result(a.out, result, md, a.threads)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
