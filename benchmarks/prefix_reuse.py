"""What cutting a context back to a prefix costs: a second question about the same document.

A Llama answers A (a document + one question, 16 tokens at temperature 0), then B (the same
document + another question): B cuts the context back to the document and evaluates its own
tokens. Timed: B's prompt on that Llama (reuse), and B's prompt on a fresh Llama (the whole
prompt), each up to its first sampled token; medians of the repeats, in one process. kvgguf
with its default reach (TieredConfig.reuse = 128: the rows evicted since are put back) and with
reuse=0 (the cut evaluates the document again); stock llama.cpp's f16 cache beside them.

    .venv/bin/python benchmarks/prefix_reuse.py --contexts 1024,4096 --repeats 3 --out benchmarks/results/sessions/prefix_reuse
"""

from __future__ import annotations

import argparse
import statistics
import time

from common import add_out_option, add_threads_option, command, markdown_table, progress, write_result

CACHES = {
    "stock f16": None,
    "tiered (reuse 128)": "tiered:fixed",
    "tiered (reuse 0)": "reuse0",
}


def make(model: str, cache, n_ctx: int, threads: int):
    from kvgguf import Llama, TieredConfig, models

    kv_codec = TieredConfig(reuse=0) if cache == "reuse0" else cache
    kw = dict(flash_attn=True) if kv_codec is None else {}
    return Llama(str(models.path(model)), kv_codec=kv_codec, n_ctx=n_ctx, n_threads=threads, verbose=False, **kw)


def first_token_seconds(llm, prompt) -> float:
    t0 = time.perf_counter()
    llm.create_completion(prompt, max_tokens=1, temperature=0.0)
    return time.perf_counter() - t0


def measure(model: str, cache, doc_tokens: int, n_ctx: int, threads: int, repeats: int) -> dict:
    from kvgguf.evaluation.text import wikitext2_test

    fresh, reuse, evaluated = [], [], []
    for _ in range(repeats):
        llm = make(model, cache, n_ctx, threads)
        doc = llm.tokenize(wikitext2_test().encode("utf-8"))[:doc_tokens]
        a = doc + llm.tokenize(b"\n\nThe article above is about", add_bos=False)
        b = doc + llm.tokenize(b"\n\nIn summary,", add_bos=False)
        fresh.append(first_token_seconds(llm, b))
        llm.close()
        llm = make(model, cache, n_ctx, threads)
        llm.create_completion(a, max_tokens=16, temperature=0.0)
        before = getattr(llm, "tokens_evaluated", 0)
        reuse.append(first_token_seconds(llm, b))
        evaluated.append(getattr(llm, "tokens_evaluated", 0) - before)
        llm.close()
    return {
        "fresh_s": statistics.median(fresh),
        "reuse_s": statistics.median(reuse),
        "reuse_evaluated": evaluated[0] if cache is not None else None,
        "prompt_tokens": len(b),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--contexts", default="1024,4096", help="document lengths in tokens")
    parser.add_argument("--repeats", type=int, default=3)
    add_threads_option(parser)
    add_out_option(parser)
    args = parser.parse_args(argv)
    rows, result = [], {"command": command(__file__, argv), "model": args.model, "rows": []}
    for n in (int(x) for x in args.contexts.split(",")):
        for name, cache in CACHES.items():
            progress(f"{name} at {n}")
            got = measure(args.model, cache, n, n + 256, args.threads, args.repeats)
            result["rows"].append({"doc_tokens": n, "cache": name, **got})
            rows.append(
                [
                    n,
                    name,
                    f"{got['fresh_s']:.2f}",
                    f"{got['reuse_s']:.3f}",
                    f"{got['reuse_s'] / got['fresh_s']:.3f}",
                    "-" if got["reuse_evaluated"] is None else got["reuse_evaluated"],
                ]
            )
    md = (
        f"`{result['command']}` ({args.model}, {args.threads} threads, medians of {args.repeats}; B's prompt "
        "up to its first token, fresh against after A)\n\n"
        + markdown_table(
            ["document", "cache", "fresh (s)", "reused (s)", "reused / fresh", "tokens evaluated reused"], rows
        )
    )
    write_result(args.out, result, md, args.threads)
    print(md)


if __name__ == "__main__":
    main()
