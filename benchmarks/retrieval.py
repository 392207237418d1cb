"""Long-range recall benchmark: facts hidden at several depths of long WikiText-2 documents,
asked for at the end, through llama.cpp's own caches and kvgguf's in the same run
(kvgguf/evaluation/retrieval.py says how the documents and questions are built).

    .venv/bin/python benchmarks/retrieval.py --contexts 2048,5120 --documents 2

writes benchmarks/results/recall/retrieval.json and .md (after every cache, so an interrupted run keeps its rows): per cache and context, the facts found out of
those asked, the bits per value the cache held with the document in it, and the facts found per depth.

Contexts that move: --retention runs --budget-base under budgets of those shares of what its store
held at the document's end (dropping by attention mass and by age), and beside each the base with
every token at lower bits in about as many bytes (benchmarks/budget.py's pair); --shift-at runs the --shifted
caches with context_shift=True in an n_ctx of that share of the document. Their facts still held at
the document's end are compared with the same cache's unmoved run on the same facts.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

from budget import lower_bits
from common import add_out_option, add_threads_option, command, markdown_table, progress, write_result

HERE = Path(__file__).resolve().parent
LLAMA_TYPES = ("f16", "q8_0", "q5_1", "q4_0", "iq4_nl")


def open_llama(path: str, cache, n_ctx: int, threads: int, context_shift: bool = False):
    import kvgguf
    from kvgguf.policy import codec_spec

    kw = dict(n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, flash_attn=True, verbose=False, seed=0)
    kw["context_shift"] = context_shift
    if isinstance(cache, kvgguf.TieredConfig):
        return kvgguf.Llama(path, kv_codec=cache, **kw)
    if cache in LLAMA_TYPES:
        return kvgguf.Llama(path, type_k=cache, type_v=cache, **kw)
    if cache.startswith(("tiered:key_bits=", "tiered:keys=")):
        return kvgguf.Llama(path, kv_codec=preset_variant(path, cache, n_ctx), **kw)
    if cache.startswith("k:"):  # "k:A/v:B" (a comma separates caches on the command line)
        return kvgguf.Llama(path, kv_codec=cache.replace("/", ","), **kw)
    # "tiered:archive=SPEC": the preset with another archive tier ("none", a codec, "k:A/v:B")
    name, _, archive = cache.partition(":archive=")
    if not archive:
        return kvgguf.Llama(path, kv_codec=cache, **kw)
    spec = (
        None
        if archive == "none"
        else codec_spec.parse_kv(archive.replace("/", ","))
        if archive.startswith("k:")
        else archive
    )
    return kvgguf.Llama(path, kv_codec=dataclasses.replace(kvgguf.TieredConfig.parse(name), archive=spec), **kw)


def preset_variant(path: str, cache: str, n_ctx: int):
    """The calibrated "tiered" of the model with its keys changed: "tiered:key_bits=N" plans with
    keys of at least N bits (0: the plan by KL alone), "tiered:keys=CODEC" holds every key at CODEC
    and the values as the preset plans them (which keys cost recall: docs/results/recall.md). Planned
    through the preset's own Request, so it cannot drift from what "tiered" asks for."""
    from kvgguf.policy import kv_codec, resolve

    what, _, value = cache.partition("=")
    request = kv_codec.parse("tiered")[1]
    if what == "tiered:key_bits":
        request = dataclasses.replace(request, key_bits=int(value))
    config, followed = resolve.calibrated_config(path, request, context=n_ctx)
    if followed is None:
        raise SystemExit(f"{cache}: the model has no calibration (kvgguf calibrate)")
    if what == "tiered:keys":
        config = dataclasses.replace(config, warm={layer: (value, v) for layer, (_, v) in config.warm.items()})
    return config


def run_cache(
    path: str, cache, n_tokens: int, n_documents: int, threads: int, seed: int, shift_at: float = 0.0
) -> tuple[dict, object]:
    """One cache's trials, and the kv_config it resolved to; shift_at > 0: with context_shift=True
    in that share of the document."""
    from kvgguf.evaluation import harness, retrieval
    from kvgguf.evaluation.text import wikitext2_test

    n_ctx = round(shift_at * n_tokens) if shift_at else n_tokens
    llm = open_llama(path, cache, n_ctx + retrieval.QUESTION_ROOM, threads, context_shift=bool(shift_at))
    try:
        tokenize = lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False)  # noqa: E731
        docs = retrieval.documents(tokenize, llm.token_bos(), n_tokens, n_documents, wikitext2_test(), seed=seed)
        trials, bits, cold, held, store_bits = [], [], [], [], []
        t0 = time.perf_counter()
        for i, doc in enumerate(docs):

            def show(t):
                mark = "found" if t.found else "MISSED"
                print(
                    f"    doc {t.document} depth {t.depth:.1f} ({t.distance} tokens back): "
                    f"{mark} {t.expected} -> {t.answer!r}",
                    file=sys.stderr,
                    flush=True,
                )

            trials += retrieval.ask(llm, doc, show, index=i)
            mem = llm.kv_memory()
            bits.append(mem.bits_per_value)
            cold.append(mem.cold_bytes)
            store_bits.append(mem.cold_bits_per_value or 0.0)
            held.append(llm.n_tokens)
        row = dict(
            retrieval.summary(trials),
            cache=harness.row_name(str(cache), str(cache), llm),
            n_tokens=n_tokens,
            bits_per_value=sum(bits) / len(bits),
            cold_bytes=min(cold),
            store_bits=min(store_bits),
            config=repr(llm.kv_config) if llm.kv_config is not None else None,
            tokens_held=sum(held) / len(held),
            seconds=time.perf_counter() - t0,
        )
        return row, llm.kv_config
    finally:
        llm.close()


def tables(rows: list[dict]) -> str:
    contexts = sorted({r["n_tokens"] for r in rows})
    caches = list(dict.fromkeys(r["cache"] for r in rows))
    at = {(r["cache"], r["n_tokens"]): r for r in rows}
    head = ["cache", *(f"{n} tokens: found (bits held)" for n in contexts)]
    found = []
    for c in caches:
        cells = []
        for n in contexts:
            r = at.get((c, n))
            cells.append(f"{r['found']}/{r['asked']} ({r['bits_per_value']:.2f})" if r else "")
        found.append([c, *cells])
    depths = sorted({d for r in rows for d in r["by_depth"]}, key=float)
    by_depth = []
    for c in caches:
        for n in contexts:
            r = at.get((c, n))
            if r:
                by_depth.append(
                    [c, n, *("{}/{}".format(*r["by_depth"][d]) if d in r["by_depth"] else "" for d in depths)]
                )
    lines = [
        markdown_table(head, found),
        "",
        "Found per depth of the fact (0.1: near the start of the document, asked for furthest back):",
        "",
        markdown_table(["cache", "context", *depths], by_depth),
    ]
    moved = [r for r in rows if r.get("base")]
    if moved:
        lines += [
            "",
            "Contexts that moved: the facts whose tokens were all still held at the document's end, found in the "
            "moved run and in the unmoved run of its base cache on the same facts:",
            "",
            markdown_table(
                ["cache", "context", "tokens held", "facts held", "found of those", "unmoved, same facts"],
                [
                    [
                        r["cache"],
                        r["n_tokens"],
                        f"{r['tokens_held']:.0f}",
                        f"{r['held']}/{r['asked']}",
                        r["found_held"],
                        same_facts(r, at.get((r["base"], r["n_tokens"]))),
                    ]
                    for r in moved
                ],
            ),
        ]
    return "\n".join(lines)


def same_facts(row: dict, base: dict | None) -> str:
    """The facts the base row found among those row held (its trials in the same order)."""
    if base is None:
        return ""
    found = {(t["document"], t["depth"]) for t in base["trials"] if t["found"]}
    return str(sum(t["held"] and (t["document"], t["depth"]) in found for t in row["trials"]))


def main(argv=None) -> int:
    import kvgguf

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="model name or GGUF path")
    p.add_argument("--contexts", default="2048,5120,8192", help="document lengths in tokens, comma-separated")
    p.add_argument(
        "--caches",
        default="f16,q8_0,q4_0,tiered,rotq4,rotq3,kivi4",
        help="llama.cpp types, kvgguf codecs, 'tiered', 'tiered:archive=SPEC' (SPEC: none, a codec, k:NAME/v:NAME), "
        "'tiered:key_bits=N' (the calibrated preset planned with keys of at least N bits), 'tiered:keys=CODEC' "
        "(its values, every key at CODEC)",
    )
    p.add_argument(
        "--retention",
        default="",
        help="budget shares, comma-separated (e.g. 0.75,0.5,0.25): --budget-base under a budget of each share of what "
        "its store held at the document's end, dropping by attention mass and by age",
    )
    p.add_argument("--budget-base", default="tiered:fixed", help="the kv_codec the budget rows bound (run unmoved too)")
    p.add_argument(
        "--shift-at",
        type=float,
        default=0.0,
        help="a share of the document (e.g. 0.75): the --shifted caches again, with context_shift=True in an n_ctx "
        "of that many tokens (plus room for the questions)",
    )
    p.add_argument("--shifted", default="f16,tiered:fixed", help="the caches --shift-at runs, comma-separated")
    p.add_argument("--documents", type=int, default=2, help="documents per context (5 facts each)")
    p.add_argument("--seed", type=int, default=0)
    add_threads_option(p)
    add_out_option(p, HERE / "results" / "recall" / "retrieval")
    args = p.parse_args(argv)
    path = str(kvgguf.models.path(args.model))
    retention = [float(r) for r in args.retention.split(",") if r]
    shifted = args.shifted.split(",") if args.shift_at else []
    # the moved rows compare with their caches unmoved, so those run too
    caches = list(dict.fromkeys([*args.caches.split(","), *([args.budget_base] if retention else []), *shifted]))
    rows = []

    def measure(n: int, spec, name: str = "", base: str = "", shift_at: float = 0.0) -> tuple[dict, object]:
        progress(f"{n} tokens, {name or spec}")
        r, config = run_cache(path, spec, n, args.documents, args.threads, args.seed, shift_at)
        r["spec"] = spec if isinstance(spec, str) else repr(spec)
        if name:
            r.update(cache=name, base=base)
        print(f"  {r['found']}/{r['asked']} found at {r['bits_per_value']:.2f} bits held", file=sys.stderr, flush=True)
        rows.append(r)
        write(args, argv, rows)  # after every cache: a long run interrupted keeps what it measured
        return r, config

    for n in [int(c) for c in args.contexts.split(",")]:
        unmoved = {cache: measure(n, cache) for cache in caches}
        for share in retention:
            base, base_config = unmoved[args.budget_base]
            budget = int(share * base["cold_bytes"])
            for rule in ("mass", "oldest"):
                spec = f"{args.budget_base}:budget={budget}" + (":drop=oldest" if rule == "oldest" else "")
                measure(n, spec, f"{args.budget_base}, {share:.0%} budget, {rule}", base["cache"])
            # every token kept in about as many bytes: budget.py's lower-bit pair on the base's windows
            pair = lower_bits(base["store_bits"], share)
            config = dataclasses.replace(base_config, warm=pair, archive=None)
            measure(n, config, f"K/V {pair[0]}/{pair[1]}, every token, {share:.0%}")
        for cache in shifted:
            measure(n, cache, f"{cache}, shifted in {args.shift_at:.0%}", unmoved[cache][0]["cache"], args.shift_at)
    print(write(args, argv, rows))
    return 0


def write(args, argv, rows: list[dict]) -> str:
    result = {"command": command(__file__, argv), "model": args.model, "rows": rows}
    md = (
        f"`{result['command']}` ({args.model}; {args.documents} documents of 5 facts per context, "
        f"greedy answers; f16 is llama.cpp's own cache)\n\n{tables(rows)}\n"
    )
    write_result(args.out, result, md, args.threads, indent=2)
    return md


if __name__ == "__main__":
    sys.exit(main())
