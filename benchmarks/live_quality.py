"""Quick quality check of the live cache: KL and top-1 against stock llama.cpp's f16 cache.

One stretch of WikiText-2 is prefilled in batches (flash attention on) and the logits of its
second half are compared with the f16 reference, for llama.cpp's own cache types and kvgguf's
codecs in the same run. (The full protocol, chunked and for both models, is `kvgguf eval`'s job.)

    .venv/bin/python benchmarks/live_quality.py --tokens 1000
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
TEXT = HERE.parent.parent / "shared" / "data" / "wikitext-2-test.txt"


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--tokens", type=int, default=1000)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--caches", default="q8_0,q4_0,f16-cold,kivi4,rotq4,rotq3,rotq2,tiered")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--out", default=str(HERE / "results" / "live_quality"))
    args = p.parse_args(argv)

    import kvgguf

    path = str(kvgguf.models.path(args.model))
    n = args.tokens
    kw = dict(n_ctx=n, n_batch=args.batch, n_ubatch=args.batch, logits_all=True, flash_attn=True,
              verbose=False, n_threads=args.threads, n_threads_batch=args.threads)
    ref = kvgguf.Llama(path, **kw)
    tokens = ref.tokenize(TEXT.read_text(encoding="utf-8")[: n * 20].encode("utf-8"))[:n]
    ref.eval(tokens)
    lr = log_softmax(ref.scores[n // 2 : n])
    del ref
    rows = []
    for cache in args.caches.split(","):
        if cache in kvgguf.llama.CACHE_TYPES:
            llm = kvgguf.Llama(path, type_k=cache, type_v=cache, **kw)
        else:
            llm = kvgguf.Llama(path, kv_codec="f16" if cache == "f16-cold" else cache, **kw)
        t0 = time.perf_counter()
        llm.eval(tokens)
        dt = time.perf_counter() - t0
        lt = log_softmax(llm.scores[n // 2 : n])
        kl = (np.exp(lr) * (lr - lt)).sum(axis=1)
        mem = llm.kv_memory()
        rows.append({"cache": cache, "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
                     "top1": float((lr.argmax(1) == lt.argmax(1)).mean()), "bits_per_value": mem.bits_per_value,
                     "cold_tokens": llm._kv.n_cold if llm._kv else 0, "seconds": dt})
        print(f"{cache}: KL {rows[-1]['kl_mean']:.4f}", file=sys.stderr, flush=True)
        llm.close()
        del llm, lt
    cmd = "benchmarks/live_quality.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"`{cmd}` ({args.model}, {n} tokens, batches of {args.batch}, scored on the second half)", "",
             "| cache | cold tokens | bits/value held | KL mean | KL p99 | top-1 |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['cache']} | {r['cold_tokens']} | {r['bits_per_value']:.2f} | {r['kl_mean']:.4f} | "
                     f"{r['kl_p99']:.3f} | {r['top1']:.3f} |")
    Path(args.out + ".json").write_text(json.dumps({"command": cmd, "rows": rows}, indent=2))
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
