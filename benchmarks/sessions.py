"""Session files: size, save/load time and quality after restore, against llama.cpp's own.

For each context length, a stretch of WikiText-2 is prefilled, the context is saved and
restored, and the next 256 tokens are scored (teacher forcing) against the logits of the same
context never saved (stock llama.cpp, f16 cache). llama.cpp's rows use llama_state_seq_save_file /
_load_file with an f16 and a q8_0 cache; kvgguf's use Llama.save_session / load_session on the
stock f16 cache (one codec for every row) and on the live tiered cache.

    .venv/bin/python benchmarks/sessions.py --ctx 2048,8192 --readme docs/results/sessions.md
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from common import add_out_option, add_threads_option, markdown_table, provenance_line, write_result

HERE = Path(__file__).resolve().parent
NEXT = 256


def score(llm, tokens) -> np.ndarray:
    return np.concatenate([lg.copy() for _, lg in llm.eval_logits(tokens)])


def compare(ref: np.ndarray, got: np.ndarray) -> dict:
    from kvgguf.evaluation.harness import kl_top1

    kl, top1 = kl_top1(ref, got)
    return {"kl": kl, "top1": top1}


def llama_cpp_session(src, dst, path: str, ctx_tokens, next_tokens, ref) -> dict:
    """llama.cpp's own sequence file: save from src, load into the fresh dst, continue there."""
    import llama_cpp.llama_cpp as C

    n = len(ctx_tokens)
    src._ctx.kv_cache_seq_rm(-1, n, -1)  # rows past the context (from scoring) are not part of it
    toks = (C.llama_token * n)(*ctx_tokens)
    t0 = time.perf_counter()
    if C.llama_state_seq_save_file(src._ctx.ctx, path.encode(), 0, toks, n) == 0:
        raise RuntimeError("llama_state_seq_save_file failed")
    t_save = time.perf_counter() - t0
    dst.reset()
    C.llama_memory_clear(C.llama_get_memory(dst._ctx.ctx), True)
    out = (C.llama_token * n)()
    n_out = ctypes.c_size_t()
    t0 = time.perf_counter()
    if C.llama_state_seq_load_file(dst._ctx.ctx, path.encode(), 0, out, n, ctypes.byref(n_out)) == 0:
        raise RuntimeError("llama_state_seq_load_file failed")
    t_load = time.perf_counter() - t0
    dst.input_ids[:n] = ctx_tokens
    dst.n_tokens = n
    row = {"bytes": os.path.getsize(path), "save_s": t_save, "load_s": t_load}
    row.update(compare(ref, score(dst, next_tokens)))
    return row


def kvgguf_session(src, dst, path: str, n: int, next_tokens, ref, unsaved=None, **save_kw) -> dict:
    """Llama.save_session from src, load_session into the fresh dst, continue there."""
    src.n_tokens = n
    t0 = time.perf_counter()
    info = src.save_session(path, **save_kw)
    t_save = time.perf_counter() - t0
    if unsaved is not None:  # the same cache continuing without a save (lossy caches)
        unsaved = score(src, next_tokens)
    dst.reset()
    t0 = time.perf_counter()
    dst.load_session(path)
    t_load = time.perf_counter() - t0
    assert dst.n_tokens == n
    row = {"bytes": info.file_bytes, "save_s": t_save, "load_s": t_load, "cold_tokens": info.n_cold}
    got = score(dst, next_tokens)
    row.update(compare(ref, got))
    if unsaved is not None:
        row["kl_vs_same_cache_unsaved"] = compare(unsaved, got)["kl"]
    return row


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--ctx", default="2048,8192")
    p.add_argument(
        "--codecs",
        default="f16,f16+zstd,rotq4+zstd,rotq4/rotq3,rotq4/rotq3+zstd,kivi4+zstd,crotq3/rotq3+zstd,rotq3+zstd",
        help="session codecs for the stock cache (f16 = exact; K/V for a pair; +zstd: "
        "entropy-coded); the default of save_session is rotq4/rotq3+zstd",
    )
    p.add_argument("--batch", type=int, default=512)
    add_threads_option(p)
    add_out_option(p, HERE / "results" / "sessions" / "sessions")
    p.add_argument("--readme", help="also put the table into this README between the sessions markers")
    args = p.parse_args(argv)

    import kvgguf
    from kvgguf.evaluation.text import wikitext2_test

    path = str(kvgguf.models.path(args.model))
    text = wikitext2_test()
    results = {"model": args.model, "next_tokens": NEXT, "contexts": {}}
    tmp = tempfile.mkdtemp(prefix="kvgguf-sessions-")
    for n in (int(c) for c in args.ctx.split(",")):
        kw = dict(
            n_ctx=n + NEXT,
            n_batch=args.batch,
            n_ubatch=args.batch,
            flash_attn=True,
            verbose=False,
            n_threads=args.threads,
            n_threads_batch=args.threads,
        )
        rows = {}
        src, dst = kvgguf.Llama(path, **kw), kvgguf.Llama(path, **kw)
        tokens = src.tokenize(text[: (n + NEXT) * 12].encode("utf-8"))[: n + NEXT]
        ctx_tokens, next_tokens = tokens[:n], tokens[n:]
        print(f"ctx {n}: prefill f16", file=sys.stderr, flush=True)
        src.eval(ctx_tokens)
        ref = score(src, next_tokens)
        src.n_tokens = n
        rows["llama.cpp f16"] = llama_cpp_session(src, dst, f"{tmp}/f16.bin", ctx_tokens, next_tokens, ref)
        for variant in args.codecs.split(","):
            spec, _, zstd = variant.partition("+")
            codec = tuple(spec.split("/")) if "/" in spec else spec  # "K/V"
            name = f"kvgguf {spec}{' +zstd' if zstd else ''}"
            print(f"ctx {n}: {name}", file=sys.stderr, flush=True)
            rows[name] = kvgguf_session(
                src, dst, f"{tmp}/s.kvz", n, next_tokens, ref, codec=codec, exact=spec == "f16", entropy=bool(zstd)
            )
        src.close(), dst.close()

        print(f"ctx {n}: prefill q8_0", file=sys.stderr, flush=True)
        src, dst = (kvgguf.Llama(path, type_k="q8_0", type_v="q8_0", **kw) for _ in range(2))
        src.eval(ctx_tokens)
        rows["llama.cpp q8_0"] = llama_cpp_session(src, dst, f"{tmp}/q8.bin", ctx_tokens, next_tokens, ref)
        src.close(), dst.close()

        print(f"ctx {n}: prefill tiered", file=sys.stderr, flush=True)
        tkw = {k: v for k, v in kw.items() if k not in ("n_batch", "n_ubatch")}  # kvgguf's ubatch (hot + ubatch cells)
        src, dst = (kvgguf.Llama(path, kv_codec="tiered", **tkw) for _ in range(2))
        src.eval(ctx_tokens)
        rows["kvgguf tiered +zstd"] = kvgguf_session(
            src, dst, f"{tmp}/t.kvz", n, next_tokens, ref, unsaved=True, entropy=True
        )
        src.close(), dst.close()

        f16 = rows["llama.cpp f16"]["bytes"]
        for r in rows.values():
            r["fraction_of_f16"] = r["bytes"] / f16
        results["contexts"][str(n)] = rows
    written = write_result(args.out, results, markdown(results), args.threads)
    print(markdown(results))
    if args.readme:
        write_readme(Path(args.readme), markdown(results), provenance_line(written["provenance"]))
    return 0


def write_readme(path: Path, table: str, provenance: str) -> None:
    """The table and its provenance between the file's sessions markers (readme_sections' way)."""
    from readme_sections import replace

    text = path.read_text(encoding="utf-8")
    body = table.strip() + "\n\n" + provenance
    path.write_text(replace(text, "sessions", body, str(path)), encoding="utf-8")


def markdown(results: dict) -> str:
    lines = [
        f"Sessions, {results['model']}: KL and top-1 over the next {results['next_tokens']} tokens "
        "after restore, against the f16 cache never saved.",
        "",
    ]
    for n, rows in results["contexts"].items():
        lines += [
            f"**{n} tokens of context**",
            "",
            markdown_table(
                ["session", "file MiB", "of f16 file", "save s", "load s", "KL", "top-1"],
                [
                    [
                        name,
                        f"{r['bytes'] / 2**20:.2f}",
                        f"1/{1 / r['fraction_of_f16']:.2f}",
                        f"{r['save_s']:.2f}",
                        f"{r['load_s']:.2f}",
                        f"{r['kl']:.4f}",
                        f"{r['top1']:.3f}",
                    ]
                    for name, r in rows.items()
                ],
                align=["---"] + ["---:"] * 6,
            ),
            "",
        ]
        for name, r in rows.items():
            if "kl_vs_same_cache_unsaved" in r:
                lines += [
                    f"{name}: {r['cold_tokens']} of the {n} tokens were cold rows (in the store) "
                    f"before saving; KL against the same tiered cache never saved "
                    f"{r['kl_vs_same_cache_unsaved']:.4f}.",
                    "",
                ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
