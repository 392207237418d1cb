"""`kvgguf demo`: one long document held by llama.cpp's own f16 cache and by kvgguf's compressed
cache, side by side: the KV bytes each holds, their speeds, how far apart their next-token
distributions are, and their answers to a question about something early in the document."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Optional

import numpy as np

from ..evaluation.retrieval import greedy_answer

# A fact planted near the start of the document, and the start of it again at the end: the model
# can only complete it by attending to a token that has long since left the exact window.
FACT = " The code of the blue vault is 7391."
QUESTION = "\n\nQuestion: what is the code of the blue vault?\nAnswer: The code of the blue vault is"
FACT_AT = 64  # tokens of text before the fact
KL_TOKENS = 64  # the document's last tokens, scored by both caches
ANSWER_TOKENS = 6


@dataclass
class Run:
    name: str
    kv_bytes: int
    bits_per_value: float
    prefill_tok_s: float
    decode_tok_s: float
    answer: str
    fact_held: str  # where the fact's rows are when the question comes
    logits: np.ndarray  # [KL_TOKENS, n_vocab] over the document's last tokens


def document(llm, n_tokens: int) -> list[int]:
    """BOS, WikiText-2 with FACT after FACT_AT tokens, n_tokens in all."""
    from ..evaluation.text import wikitext2_test

    text = llm.tokenize(wikitext2_test()[: 12 * n_tokens].encode("utf-8"), add_bos=False)
    fact = llm.tokenize(FACT.encode("utf-8"), add_bos=False)
    body = text[:FACT_AT] + fact + text[FACT_AT:]
    if len(body) < n_tokens - 1:
        raise ValueError(f"the evaluation text gives only {len(body) + 1} tokens, fewer than {n_tokens}")
    return [llm.token_bos()] + body[: n_tokens - 1]


def progress(total: int, desc: str):
    """A tqdm bar on stderr when it is a terminal, else a stand-in that draws nothing."""
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="tok", disable=not sys.stderr.isatty(), leave=False)


def where_held(llm, pos: int) -> str:
    """The tier and codec that hold position pos's K/V rows."""
    from ..enums import Tier

    if llm.kv_config is None:
        return "f16 (llama.cpp)"
    for b in llm.kv_cache.blocks:
        if b.r0 <= pos < b.r1:
            return f"{Tier(b.tier).label} {llm.kv_cache.codec_name(b.tier)}"
    return f"hot {llm.kv_cells['hot']}"  # llama.cpp's own cells, in the type the preset gave them


def run_one(path: str, name: str, kv_codec: Optional[str], n_tokens: int, threads: Optional[int]) -> Run:
    import kvgguf

    n_ctx = n_tokens + 64
    llm = kvgguf.Llama(
        path,
        kv_codec=kv_codec,
        n_ctx=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        flash_attn=True,
        verbose=False,
        seed=0,
    )
    try:
        doc = document(llm, n_tokens)
        head, tail = doc[:-KL_TOKENS], doc[-KL_TOKENS:]
        t0 = time.perf_counter()
        with progress(len(head), f"prefill ({name})") as bar:
            for i in range(0, len(head), llm.n_batch):
                chunk = head[i : i + llm.n_batch]
                llm.eval(chunk)
                bar.update(len(chunk))
        prefill = len(head) / (time.perf_counter() - t0)
        logits = np.concatenate([lg.copy() for _, lg in llm.eval_logits(tail)])
        mem = llm.kv_memory()
        fact_held = where_held(llm, FACT_AT + 1)

        llm.eval(llm.tokenize(QUESTION.encode("utf-8"), add_bos=False))
        t0 = time.perf_counter()
        answer, n = greedy_answer(llm, ANSWER_TOKENS)
        decode = n / (time.perf_counter() - t0) if n else float("nan")
        return Run(name, mem.total_bytes, mem.bits_per_value, prefill, decode, answer, fact_held, logits)
    finally:
        llm.close()


def run(args) -> int:
    import kvgguf

    from ..evaluation.harness import kl_top1

    path = str(kvgguf.models.path(args.model))
    codec = args.kv_codec
    print(f"llama.cpp: {kvgguf.llama_library_path()} (kvgguf patch v{kvgguf.llama_patch_version()})")
    print(f"model: {path}")
    print(
        f"document: {args.tokens} tokens of WikiText-2 with a fact planted after {FACT_AT} tokens "
        f"({FACT.strip()!r}); then the question {QUESTION.strip().splitlines()[0]!r}"
    )
    print()
    runs = [
        run_one(path, "stock f16", None, args.tokens, args.threads),
        run_one(path, f"kvgguf {codec}", codec, args.tokens, args.threads),
    ]
    base, ours = runs
    kl, top1 = kl_top1(base.logits, ours.logits)

    rows = [
        ("KV held", [f"{r.kv_bytes / 2**20:.1f} MiB" for r in runs]),
        ("bits per value", [f"{r.bits_per_value:.2f}" for r in runs]),
        ("vs stock", ["1/1.0", f"1/{base.kv_bytes / ours.kv_bytes:.1f}"]),
        ("prefill tok/s", [f"{r.prefill_tok_s:.0f}" for r in runs]),
        ("decode tok/s", [f"{r.decode_tok_s:.1f}" for r in runs]),
        ("fact held in", [r.fact_held for r in runs]),
        ("answer", [repr(r.answer) for r in runs]),
    ]
    w = max(len(c) for _, cells in rows for c in cells + [r.name for r in runs]) + 2
    print(f"{'':<16}" + "".join(f"{r.name:>{w}}" for r in runs))
    for label, cells in rows:
        print(f"{label:<16}" + "".join(f"{c:>{w}}" for c in cells))
    print()
    print(
        f"next-token distributions over the document's last {KL_TOKENS} tokens: "
        f"KL(stock || {codec}) = {kl:.4f} nats, same top-1 token {100 * top1:.0f}% of the time"
    )
    if base.answer != ours.answer:
        print(
            f"The answers differ: {codec} lost the fact, whose rows it holds in {ours.fact_held} "
            f"(long-range recall is what compression loses first; average KL does not show it)."
        )
    print("(speeds on a busy or 2-core machine vary run to run; benchmarks/live_cache.py measures them properly)")
    return 0
