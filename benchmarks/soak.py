"""Soak: a long generation through the tiered cache, watching memory.

One kvgguf.Llama generates --tokens tokens in conversations: each starts from the same prompt
(the first --prompt tokens of WikiText-2), samples until the logical context is full, then
goes back to the prompt (llama-cpp-python's truncation: kvgguf drops the compressed rows past
it) and starts again. So every path runs thousands of times: eviction, aging into the archive
tier, truncation, the fused attention. Every --every tokens it records the process's RSS and
kv_memory() (llama.cpp's buffers plus the store's encoded rows). Pass criteria, checked at the
end: no error; the bytes held follow the compressed size (the store's bytes at each sample are
what the rows held need: the same token count gives the same bytes in every conversation);
RSS bounded (the peak of the last conversation within --rss-slack MiB of the first one's).

    .venv/bin/python benchmarks/soak.py --tokens 100000 --out benchmarks/results/endurance/soak/soak_100k
    .venv/bin/python benchmarks/soak.py --cache tiered:keep=mass --held-spread 0.5 --tokens 20000 \
        --out benchmarks/results/endurance/soak/soak_keep_20k

writes OUT.json, OUT.md and (with matplotlib) OUT.png.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import time
from pathlib import Path

from common import add_out_option, add_threads_option, command, result_path, rss_bytes, write_json

HERE = Path(__file__).resolve().parent


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (n, ctypes.c_size_t)
        for n in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_bytes() -> tuple[int, int]:
    """(bytes the program has allocated and not freed, free bytes glibc keeps in its arenas),
    over every arena (glibc's mallinfo2 sums them): a leak grows the first; fragmentation and
    memory glibc keeps for reuse grow the second and RSS, not the first. (-1, -1) without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
    except (OSError, AttributeError):
        return -1, -1
    m = libc.mallinfo2()
    return m.uordblks + m.hblkhd, m.fordblks


def python_heap() -> int:
    """Bytes the interpreter's allocator holds in its arenas (sys._debugmallocstats is too
    verbose): a leak of Python objects shows here, one of native memory only in RSS."""
    return sum(sys.getsizeof(o) for o in gc.get_objects())


def soak(
    model: str,
    cache: str,
    n_ctx: int,
    n_tokens: int,
    n_prompt: int,
    every: int,
    threads: int,
    seed: int,
    trim: bool = False,
    keep_open: bool = False,
) -> dict:
    import kvgguf
    from kvgguf.evaluation.text import wikitext2_test

    path = str(kvgguf.models.path(model))
    kv_codec = None if cache == "none" else cache  # "none": llama.cpp's own f16 cache, the reference
    llm = kvgguf.Llama(path, kv_codec=kv_codec, n_ctx=n_ctx, n_threads=threads, seed=seed, verbose=False)
    prompt = llm.tokenize(wikitext2_test()[:20000].encode("utf-8"))[:n_prompt]
    samples, conversations = [], []
    generated, t0 = 0, time.perf_counter()
    rss0 = rss_bytes()
    while generated < n_tokens:
        llm.n_tokens = 0  # back to the prompt; the next eval drops what followed it (compressed rows too)
        llm.eval(prompt)
        conv = {"start": generated, "rss_peak": 0}
        while llm.n_tokens < n_ctx and generated < n_tokens:
            token = llm.sample(temp=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1)
            llm.eval([token])
            generated += 1
            if generated % every == 0:
                mem = llm.kv_memory()
                rss = rss_bytes()
                conv["rss_peak"] = max(conv["rss_peak"], rss)
                in_use, free_held = malloc_bytes()
                conv["heap_peak"] = max(conv.get("heap_peak", 0), in_use)
                samples.append(
                    {
                        "generated": generated,
                        "n_tokens": llm.n_tokens,
                        "seconds": round(time.perf_counter() - t0, 2),
                        "rss": rss,
                        "kv_held": mem.total_bytes,
                        "hot": mem.total_bytes - mem.cold_bytes - mem.index_bytes,  # llama.cpp's cells
                        "python_heap": python_heap(),
                        "malloc_in_use": in_use,
                        "malloc_free_held": free_held,
                        "store": mem.cold_bytes,
                        "index": mem.index_bytes,
                        "bits_per_value": round(mem.bits_per_value, 3),
                    }
                )
                if generated % (20 * every) == 0:
                    print(
                        f"soak: {generated} tokens, {samples[-1]['seconds']} s, RSS {rss / 2**20:.1f} MiB, "
                        f"KV held {mem.total_bytes / 2**20:.1f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
        conv["end"] = generated
        conv["rss_end"] = rss_bytes()
        # What the process still holds once Python's cyclic garbage is gone: llama-cpp-python's
        # samplers (one per sample() call) sit in reference cycles until a full collection, each
        # holding native buffers, so the heap between collections swings by tens of MiB.
        gc.collect()
        conv["heap_after_gc"], _ = malloc_bytes()
        conv["rss_after_gc"] = rss_bytes()
        if trim:  # memory glibc keeps but nothing uses (fragmentation) goes back; a leak stays
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            conv["rss_after_trim"] = rss_bytes()
        conversations.append(conv)
    elapsed = time.perf_counter() - t0
    if not keep_open:  # --exit-without-close: a leak checker then reports all the context holds
        llm.close()
    return {
        "samples": samples,
        "conversations": conversations,
        "seconds": round(elapsed, 1),
        "rss_start": rss0,
        "generated": generated,
    }


def verdicts(result: dict, rss_slack_mib: float, held_spread: float) -> dict:
    """The pass criteria, computed from the samples."""
    by_position: dict[int, list[int]] = {}
    for s in result["samples"]:
        by_position.setdefault(s["n_tokens"], []).append(s["store"] + s["hot"])
    # Bytes held follow the rows held: at one context length, the same bytes in every conversation
    # (exactly, unless a keep signal chooses which blocks stay warm by content).
    spread = max(max(v) / min(v) - 1 for v in by_position.values())
    held_follows = spread <= held_spread
    full = [c for c in result["conversations"] if c["rss_peak"]]
    first, last = full[0]["rss_peak"], full[-1]["rss_peak"]
    growth_mib = (last - first) / 2**20
    g_first, g_last = full[0].get("heap_after_gc", -1), full[-1].get("heap_after_gc", -1)
    h_first, h_last = full[0].get("heap_peak", -1), full[-1].get("heap_peak", -1)
    heap_growth_mib = (h_last - h_first) / 2**20
    return {
        "held_follows_rows": held_follows,
        "held_spread": round(spread, 4),
        "heap_first_conversation_mib": round(h_first / 2**20, 1),
        "heap_last_conversation_mib": round(h_last / 2**20, 1),
        "heap_growth_mib": round(heap_growth_mib, 1),
        "heap_bounded": h_first >= 0 and heap_growth_mib <= rss_slack_mib,
        "heap_after_gc_first_mib": round(g_first / 2**20, 1),
        "heap_after_gc_last_mib": round(g_last / 2**20, 1),
        "heap_after_gc_growth_mib": round((g_last - g_first) / 2**20, 2),
        "rss_first_conversation_mib": round(first / 2**20, 1),
        "rss_last_conversation_mib": round(last / 2**20, 1),
        "rss_growth_mib": round(growth_mib, 1),
        "rss_bounded": growth_mib <= rss_slack_mib,
        "rss_slack_mib": rss_slack_mib,
    }


def plot(result: dict, out: Path, title: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    xs = [s["generated"] / 1000 for s in result["samples"]]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(xs, [s["rss"] / 2**20 for s in result["samples"]], label="process RSS")
    if result["samples"] and result["samples"][0].get("malloc_in_use", -1) >= 0:
        ax.plot(xs, [s["malloc_in_use"] / 2**20 for s in result["samples"]], label="malloc'd, in use (mallinfo2)")
        ax.plot(xs, [s["malloc_free_held"] / 2**20 for s in result["samples"]], label="free, kept by glibc")
    ax.plot(xs, [s["kv_held"] / 2**20 for s in result["samples"]], label="KV held (kv_memory)")
    ax.plot(xs, [s["store"] / 2**20 for s in result["samples"]], label="of which cold rows rows")
    ax.set_xlabel("tokens generated (thousands)")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title, fontsize=9)
    ax.legend(loc="center right", fontsize=8)
    fig.tight_layout()
    fig.savefig(result_path(out, ".png"), dpi=110)
    plt.close(fig)
    return True


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument(
        "--cache",
        default="tiered:fixed",
        help="kv_codec (default: the fixed preset, all three tiers; 'none': llama.cpp's own cache)",
    )
    ap.add_argument("--ctx", type=int, default=4096, help="logical context of each conversation")
    ap.add_argument("--tokens", type=int, default=100_000)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--every", type=int, default=250, help="tokens between samples")
    add_threads_option(ap)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--rss-slack", type=float, default=32.0, help="MiB the RSS peak may grow, last vs first conversation"
    )
    ap.add_argument(
        "--held-spread",
        type=float,
        default=0.0,
        help="how far the bytes held at one context length may differ between conversations "
        "(0: not at all; a keep signal needs some)",
    )
    ap.add_argument(
        "--trim",
        action="store_true",
        help="after each conversation, malloc_trim(0) and note the RSS before and after (a leak "
        "survives it, memory glibc merely keeps does not)",
    )
    ap.add_argument(
        "--exit-without-close",
        action="store_true",
        help="end the process without freeing the Llama, so that heaptrack or valgrind lists everything it "
        "still holds by where it was allocated (what grows with the run stands out)",
    )
    add_out_option(ap, HERE / "results" / "endurance" / "soak" / "soak", ".json, .md and .png")
    args = ap.parse_args(argv)

    result = soak(
        args.model,
        args.cache,
        args.ctx,
        args.tokens,
        args.prompt,
        args.every,
        args.threads,
        args.seed,
        args.trim,
        keep_open=args.exit_without_close,
    )
    result["verdicts"] = verdicts(result, args.rss_slack, args.held_spread)
    result["setting"] = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result["command"] = command(__file__, argv)
    write_json(result_path(args.out, ".json"), result, args.threads)
    v = result["verdicts"]
    last = result["samples"][-1] if result["samples"] else {}
    md = [
        f"# Soak: {args.cache} on {args.model}, {result['generated']} tokens generated",
        "",
        f"Command: `{result['command']}`",
        "",
        f"- conversations of up to {args.ctx} tokens: {len(result['conversations'])}; {result['seconds']} s "
        f"({result['generated'] / max(result['seconds'], 1e-9):.1f} tokens/s, sampling included)",
        "- errors: none (the run ended)",
        f"- bytes held follow the rows held (at one context length, the same bytes in every conversation, "
        f"spread {v['held_spread']:.4f}, allowed {args.held_spread}): {'yes' if v['held_follows_rows'] else 'NO'}",
        f"- RSS peak, first conversation {v['rss_first_conversation_mib']} MiB, last {v['rss_last_conversation_mib']} "
        f"MiB: growth {v['rss_growth_mib']} MiB ({'bounded' if v['rss_bounded'] else 'NOT bounded'}: "
        f"slack {v['rss_slack_mib']} MiB)",
        f"- heap in use (malloc'd and not freed, all arenas) peak, first conversation {v['heap_first_conversation_mib']} "
        f"MiB, last {v['heap_last_conversation_mib']} MiB: growth {v['heap_growth_mib']} MiB "
        f"({'bounded' if v['heap_bounded'] else 'NOT bounded'})",
        f"- heap in use after each conversation and a full garbage collection: first {v['heap_after_gc_first_mib']} MiB, "
        f"last {v['heap_after_gc_last_mib']} MiB (growth {v['heap_after_gc_growth_mib']} MiB; per conversation: "
        f"{', '.join(str(round(c['heap_after_gc'] / 2**20, 1)) for c in result['conversations'])})",
        f"- at the last sample ({last.get('n_tokens')} tokens in context): KV held {last.get('kv_held', 0) / 2**20:.1f} MiB, "
        f"{last.get('bits_per_value')} bits per value",
    ]
    if plot(result, args.out, f"{args.cache} on {args.model}: {result['generated']} tokens, ctx {args.ctx}"):
        md += ["", f"![RSS and KV bytes]({result_path(args.out, '.png').name})"]
    result_path(args.out, ".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    code = 0 if v["held_follows_rows"] and v["rss_bounded"] else 1
    if args.exit_without_close:
        sys.stdout.flush()
        os._exit(code)
    return code


if __name__ == "__main__":
    sys.exit(main())
