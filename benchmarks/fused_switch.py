"""Where the fused attention over compressed rows stops paying: time of one llama_decode of a
ubatch of T tokens at a long context, fused (rows scored from their codes) against expanded
(rows decoded to f16 for llama.cpp's flash attention), for several T; the fused runs allow the
fused path up to the largest T. Picks runtime.live_cache.FUSED_MAX_TOKENS.

    .venv/bin/python benchmarks/fused_switch.py --ctx 8192 --tokens 1,4,8,16,32,64

Run it on an otherwise idle machine (llama.cpp's threads spin). Prints a table and writes
benchmarks/results/speed/fused_switch.{json,md}.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import add_out_option, add_threads_option, best_of, command, markdown_table, write_result

HERE = Path(__file__).resolve().parent


def measure(
    path: str, tokens: list[int], n_ctx: int, sizes: list[int], attention: str, reps: int, threads: int, codec: str
) -> dict[int, float]:
    import kvgguf

    batch = max(sizes)  # one llama_decode per measured ubatch; the hot window must exceed it
    llm = kvgguf.Llama(
        path,
        kv_codec=codec,
        kv_attention=attention,
        n_ctx=n_ctx,
        n_batch=batch,
        n_ubatch=batch,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        verbose=False,
    )
    if attention == "fused":  # let every measured size take the fused path
        from kvgguf.llamacpp import hooks

        hooks.set_attend(llm._ctx.ctx, llm.kv_cache.store.attend_function(), max(sizes))
    base = n_ctx - max(sizes) - 1
    llm.eval(tokens[:base])
    out = {}
    for t in sizes:

        def rewind():
            llm.n_tokens = base  # the next eval removes what the previous one added

        out[t] = best_of(lambda: llm.eval(tokens[base : base + t]), reps, warm_up=False, before=rewind)
    llm.close()
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--codec", default="tiered")
    p.add_argument("--ctx", type=int, default=8192)
    p.add_argument("--tokens", default="1,4,8,16,32,64", help="ubatch sizes")
    p.add_argument("--reps", type=int, default=5, help="repetitions per size (the fastest counts)")
    add_threads_option(p)
    add_out_option(p, HERE / "results" / "speed" / "fused_switch")
    args = p.parse_args(argv)

    import kvgguf
    import llama_cpp
    from kvgguf.evaluation.text import wikitext2_test

    path = str(kvgguf.models.path(args.model))
    vocab = llama_cpp.Llama(path, vocab_only=True, verbose=False)
    tokens = vocab.tokenize(wikitext2_test().encode("utf-8"))
    del vocab
    sizes = [int(t) for t in args.tokens.split(",")]
    res = {
        a: measure(path, tokens, args.ctx, sizes, a, args.reps, args.threads, args.codec) for a in ("fused", "expand")
    }
    lines = [
        f"{args.model}, {args.codec}, {args.ctx} tokens of context, {args.threads} threads: "
        "seconds per llama_decode of a ubatch of T tokens (fastest of "
        f"{args.reps}).",
        "",
        markdown_table(
            ["T", "fused s", "expand s", "fused / expand"],
            [
                [t, f"{res['fused'][t]:.4f}", f"{res['expand'][t]:.4f}", f"{res['fused'][t] / res['expand'][t]:.2f}"]
                for t in sizes
            ],
            align="---:",
        ),
    ]
    md = "\n".join(lines)
    print(md)
    result = {
        "command": command(__file__, argv),
        "model": args.model,
        "codec": args.codec,
        "ctx": args.ctx,
        "threads": args.threads,
        "seconds": {a: {str(t): s for t, s in r.items()} for a, r in res.items()},
    }
    write_result(args.out, result, md + "\n", args.threads)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
