"""Quality after context shifts: kvgguf.Llama(context_shift=True) against stock llama.cpp's f16
cache shifted the same way (its own llama_memory_seq_rm / llama_memory_seq_add over the positions
kvgguf dropped, at the same token).

WikiText-2 runs through a context of --ctx tokens four times its length over, so the context
shifts again and again (llama.cpp's server rule: keep --keep tokens, drop half of the rest).
Every token's logits are compared (KL(stock || kvgguf), top-1 agreement), apart before the first
shift (the codec's own loss, at the same context fill) and after it: a shift that adds no loss
leaves the two alike. An f16 cold store measures the shift alone (KL at the arithmetic floor).

    .venv/bin/python benchmarks/context_shift.py --out benchmarks/results/quality/context_shift/smollm2_1k
    .venv/bin/python benchmarks/context_shift.py --model gemma3-270m --ctx 2048 \
        --out benchmarks/results/quality/context_shift/gemma3_2k

writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from common import add_out_option, add_threads_option, command, markdown_table, progress, write_result

HERE = Path(__file__).resolve().parent
N_BATCH = 64
CELLS = {"f16": 1, "f32": 0}  # the reference's ggml cell type


def run(
    model: str, cache: str, tokens: list[int], n_ctx: int, n_keep: int, threads: int, attention: str, reference: str
) -> dict:
    import llama_cpp

    import kvgguf
    from kvgguf.evaluation.harness import kl_top1
    from kvgguf.llama import shift_cells, shift_tokens

    path = str(kvgguf.models.path(model))
    kw = dict(n_ctx=n_ctx, n_batch=N_BATCH, logits_all=True, flash_attn=True, verbose=False)
    kw.update(n_threads=threads, n_threads_batch=threads)
    ref = llama_cpp.Llama(path, n_ubatch=N_BATCH, type_k=CELLS[reference], type_v=CELLS[reference], **kw)
    if cache == "stock":  # llama.cpp's own f16 cells, shifted by kvgguf.Llama
        llm = kvgguf.Llama(path, kv_codec=None, context_shift=True, n_keep=n_keep, n_ubatch=N_BATCH, **kw)
    else:
        llm = kvgguf.Llama(path, kv_codec=cache, context_shift=True, n_keep=n_keep, kv_attention=attention, **kw)
    # per token (KL, top-1 agreement), before / after the first shift: summed per batch, as a
    # vocabulary of 262K (Gemma 3) makes every token's logits 1 MiB
    before, after = [], []
    hot = llm.kv_config.hot if cache != "stock" else 0
    t0, i = time.perf_counter(), 0
    while i < len(tokens):
        batch = tokens[i : i + N_BATCH - llm.n_tokens % N_BATCH]  # the batches kvgguf runs
        i += len(batch)
        shifts = llm.context_shifts
        llm.eval(batch)
        if llm.context_shifts > shifts:
            shift_cells(ref, *llm.last_shift)
            shift_tokens(ref, *llm.last_shift)
        ref.eval(batch)
        assert ref.n_tokens == llm.n_tokens
        # before the first shift: the tokens that attend over compressed rows (past the hot window)
        first = 0 if llm.context_shifts else max(0, hot - (llm.n_tokens - len(batch)))
        if first < len(batch):
            want = ref.scores[ref.n_tokens - len(batch) + first : ref.n_tokens]
            got = llm.scores[llm.n_tokens - len(batch) + first : llm.n_tokens]
            kl, top1 = kl_top1(np.asarray(want), np.asarray(got))
            (after if llm.context_shifts else before).append((len(want), kl, top1))
    seconds = time.perf_counter() - t0

    def mean(parts: list) -> tuple[int, float, float]:
        n = sum(p[0] for p in parts)
        return n, sum(p[0] * p[1] for p in parts) / n, sum(p[0] * p[2] for p in parts) / n

    (n_b, kl_b, top1_b), (n_a, kl_a, top1_a) = mean(before), mean(after)
    out = {
        "cache": cache,
        "shifts": llm.context_shifts,
        "tokens_shifted_out": llm.tokens_shifted_out,
        "before_first_shift": {"tokens": n_b, "kl": kl_b, "top1": top1_b},
        "after_first_shift": {"tokens": n_a, "kl": kl_a, "top1": top1_a},
        "kv": str(llm.kv_memory()),
        "seconds": seconds,
    }
    llm.close()
    ref.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m", help="model name (default: %(default)s)")
    p.add_argument("--ctx", type=int, default=1024, help="n_ctx (default: %(default)s)")
    p.add_argument("--tokens", type=int, default=None, help="tokens to run (default: 4 x --ctx)")
    p.add_argument("--keep", type=int, default=4, help="tokens a shift keeps (default: %(default)s)")
    p.add_argument(
        "--caches",
        default="f16,tiered:fixed",
        help="kv_codecs, comma-separated; stock: llama.cpp's own f16 cells (default: %(default)s)",
    )
    p.add_argument(
        "--reference",
        choices=tuple(CELLS),
        default="f16",
        help="the cell type of the stock reference: f32 shifts its keys without rounding (default: f16)",
    )
    p.add_argument("--attention", choices=("fused", "expand"), default="fused", help="kv_attention (default: fused)")
    add_threads_option(p)
    add_out_option(p)
    a = p.parse_args(argv)

    import llama_cpp

    import kvgguf
    from kvgguf.evaluation.text import wikitext2_test

    vocab = llama_cpp.Llama(str(kvgguf.models.path(a.model)), vocab_only=True, verbose=False)
    n_tokens = a.tokens or 4 * a.ctx
    tokens = vocab.tokenize(wikitext2_test().encode("utf-8"))[:n_tokens]
    rows = []
    for cache in a.caches.split(","):
        progress(f"context_shift: {a.model} {cache}, n_ctx {a.ctx}, {len(tokens)} tokens")
        rows.append(run(a.model, cache, tokens, a.ctx, a.keep, a.threads, a.attention, a.reference))
    result = {"model": a.model, "n_ctx": a.ctx, "n_keep": a.keep, "attention": a.attention, "tokens": len(tokens)}
    result["reference"] = a.reference
    result["runs"] = rows
    result["command"] = command(__file__, argv)
    table = markdown_table(
        ["cache", "shifts", "KL before", "top-1 before", "KL after", "top-1 after", "tokens after"],
        [
            [
                r["cache"],
                r["shifts"],
                f"{r['before_first_shift']['kl']:.2e}",
                f"{r['before_first_shift']['top1']:.3f}",
                f"{r['after_first_shift']['kl']:.2e}",
                f"{r['after_first_shift']['top1']:.3f}",
                r["after_first_shift"]["tokens"],
            ]
            for r in rows
        ],
    )
    md = (
        f"# Context shift: {a.model}, n_ctx {a.ctx}, n_keep {a.keep}, {a.attention} attention, "
        f"{len(tokens)} tokens of WikiText-2\n\n"
        f"`{result['command']}`\n\nKL(stock {a.reference} shifted the same way || kvgguf) per token; before: the tokens "
        "past the hot window before the first shift (the codec's own loss), after: every token after it.\n\n"
        f"{table}\n"
    )
    write_result(a.out, result, md, a.threads)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
