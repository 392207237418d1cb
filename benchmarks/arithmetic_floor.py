"""How far llama.cpp's own exact caches are from each other: the KL floor under every eval.

Every row of `kvgguf eval` is scored against one reference, stock llama.cpp with an f16 cache
decoded in batches of 256 with flash attention on. Caches that store every value exactly but sum
in another order (another batch size, flash attention off, kvgguf's fused f32 kernels,
llama.cpp's sliding-window ring on Gemma-3) are not bit-identical to it. This runs such exact
variants on one stretch of WikiText-2 and prints KL(row || column) between every pair on the
second half of the context, the positions `kvgguf eval` scores: the level below which no
compressed cache's KL can be read as loss.

    .venv/bin/python benchmarks/arithmetic_floor.py --model smollm2-135m --ctx 2048 --out benchmarks/results/quality/floor/smollm2-135m_2k
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from common import add_out_option, add_threads_option, command, markdown_table, write_result

# name: (n_batch, Llama keyword arguments); every variant holds every value it uses exactly
VARIANTS = {
    "stock f16, batch 256 (the eval's reference)": (256, dict(flash_attn=True)),
    "stock f16, batch 32": (32, dict(flash_attn=True)),
    "stock f16, flash attention off": (256, dict(flash_attn=False)),
    "stock f16, f32 cells": (256, dict(flash_attn=True, type_k="f32", type_v="f32")),
    "kvgguf:f16 (fused, batch 32)": (32, dict(flash_attn=True, kv_codec="f16")),
}
WINDOW = "stock f16, swa window (Gemma-3)"  # llama.cpp's ring of n_swa + batch cells


def second_half(model: str, ctx: int, threads: int, n_batch: int, kw: dict) -> np.ndarray:
    from kvgguf import Llama, models
    from kvgguf.evaluation.harness import kept_half
    from kvgguf.evaluation.text import wikitext2_test

    llm = Llama(
        str(models.path(model)),
        n_ctx=ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
        **kw,
    )
    try:
        return kept_half(llm, llm.tokenize(wikitext2_test().encode())[:ctx], ctx // 2)
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--ctx", type=int, default=2048)
    add_threads_option(ap)
    add_out_option(ap)
    args = ap.parse_args()
    from kvgguf import models
    from kvgguf.evaluation.harness import kl_top1
    from kvgguf.model.shape import KVShape

    variants = dict(VARIANTS)
    if KVShape.from_gguf(str(models.path(args.model))).n_swa:
        variants = {k: (b, {**kw, "swa_full": True}) for k, (b, kw) in variants.items() if "kvgguf" not in k}
        variants[WINDOW] = (256, dict(flash_attn=True, swa_full=False))
        variants["kvgguf:f16 (fused, batch 32)"] = VARIANTS["kvgguf:f16 (fused, batch 32)"]
    logits = {}  # float32, as kvgguf eval keeps its reference; KL in float64 slices (kl_top1)
    for name, (n_batch, kw) in variants.items():
        print(f"[arithmetic_floor] {name}", file=sys.stderr, flush=True)
        logits[name] = second_half(args.model, args.ctx, args.threads, n_batch, kw)
    names = list(logits)
    kl = [[kl_top1(logits[a], logits[b])[0] for b in names] for a in names]
    run = command(__file__, python=True)
    cols = [f"[{c}]" for c in range(1, len(names) + 1)]
    md = "\n".join(
        [
            f"`{run}` ({args.model}, {args.ctx} tokens of WikiText-2, KL(row || column) mean over "
            f"positions [{args.ctx // 2}, {args.ctx}); every variant holds every value exactly)",
            "",
            markdown_table(
                ["", "variant", *cols],
                [[f"[{i + 1}]", name, *(f"{x:.5f}" for x in kl[i])] for i, name in enumerate(names)],
            ),
        ]
    )
    result = dict(command=run, model=args.model, ctx=args.ctx, names=names, kl=kl)
    write_result(args.out, result, md + "\n", args.threads)
    print(md)


if __name__ == "__main__":
    main()
