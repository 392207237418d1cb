"""Where llama.cpp's sliding-window ring leaves its full-size cache (Gemma-3): position by position.

Stock llama.cpp decodes the same WikiText-2 tokens twice, with swa_full on (the window layers
hold the whole context: what `kvgguf eval` takes as its reference) and off (they hold a ring of
n_swa + batch cells, padded to 256, whose cells are reused once it is full: the layout kvgguf's
live cache keeps for those layers). Prints the mean KL and the largest logit difference per
stretch of 128 positions and the first position whose logits differ.

    .venv/bin/python benchmarks/swa_ring_floor.py --ctx 1024 --batch 256 --out benchmarks/results/quality/floor/swa_ring_b256
"""

from __future__ import annotations

import argparse

import numpy as np

from common import add_out_option, command, markdown_table, write_result

STRETCH = 128


def logits(path: str, ctx: int, batch: int, flash: bool, cells: str, swa_full: bool) -> np.ndarray:
    import kvgguf
    from kvgguf.evaluation.text import wikitext2_test

    llm = kvgguf.Llama(
        path,
        n_ctx=ctx,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=1,
        n_threads_batch=1,
        flash_attn=flash,
        type_k=cells,
        type_v=cells,
        swa_full=swa_full,
        verbose=False,
    )
    try:
        tokens = llm.tokenize(wikitext2_test().encode())[:ctx]
        return np.concatenate([lg.copy() for _, lg in llm.eval_logits(tokens)])
    finally:
        llm.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gemma3-270m")
    ap.add_argument("--ctx", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-flash", action="store_true", help="flash attention off")
    ap.add_argument("--cells", default="f16", help="llama.cpp cache type of both runs (f16, f32)")
    add_out_option(ap)
    args = ap.parse_args()
    from kvgguf import models
    from kvgguf.evaluation.harness import log_softmax, score

    path = str(models.path(args.model))
    runs = {full: logits(path, args.ctx, args.batch, not args.no_flash, args.cells, full) for full in (True, False)}

    kl = score(runs[True], runs[False], np.full(args.ctx, -1))[0]
    differ = np.nonzero(np.abs(runs[True] - runs[False]).max(-1) > 0)[0]
    first = int(differ[0]) if len(differ) else None
    stretches = []
    for s in range(0, args.ctx, STRETCH):
        gap = np.abs(log_softmax(runs[True][s : s + STRETCH]) - log_softmax(runs[False][s : s + STRETCH])).max()
        stretches.append(dict(start=s, kl=float(kl[s : s + STRETCH].mean()), max_logprob_diff=float(gap)))
    run = command(__file__, python=True)
    md = "\n".join(
        [
            f"`{run}` ({args.model}, batches of {args.batch}, flash attention {'off' if args.no_flash else 'on'}, "
            f"{args.cells} cells): swa_full on against off; first position whose logits differ: {first}",
            "",
            markdown_table(
                ["positions", "KL mean", "largest log-probability difference"],
                [
                    [f"{s['start']}-{s['start'] + STRETCH - 1}", f"{s['kl']:.5f}", f"{s['max_logprob_diff']:.3f}"]
                    for s in stretches
                ],
            ),
        ]
    )
    result = dict(command=run, first_differing_position=first, stretches=stretches)
    write_result(args.out, result, md + "\n", threads=1)  # logits() runs llama.cpp on one thread
    print(md)


if __name__ == "__main__":
    main()
