"""A prompt cache shared on Redis: time to first token, bytes held and load, against the
alternatives in the same run.

Two `kvgguf serve` processes share one redis-server (started here on a free loopback port,
without persistence); a third keeps its prompt cache in its own RAM. A question on a document
of --doc-tokens tokens of WikiText-2 is answered (streamed, greedy) four ways, each server
answering its first request about that document:
  cold            server A, nothing cached anywhere: the whole prompt is prefilled
  warm, own RAM   server C after it answered another question on the document and then an
                  unrelated prompt (so its context no longer holds the document)
  warm, Redis     server B, after server A answered: B finds A's entry in Redis
Bytes: the .kvz entry Redis holds per cached token, against llama.cpp's own state of the same
tokens (llama_state_seq_get_size of a stock f16 context), and how many such documents fit in
1 GiB either way. Load: --clients 1,4,8 clients ask server B short questions on the document
for --seconds each (requests queue in the server): requests per minute, latency p50 and p99,
server B's RSS before and after.

    .venv/bin/python benchmarks/shared_cache.py --out benchmarks/results/sessions/shared_cache
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from common import (  # noqa: E402
    add_out_option,
    add_threads_option,
    command,
    markdown_table,
    progress,
    rss_bytes,
    write_result,
)
from servers import RedisServer, get_json, kvgguf_serve, redis_server_binary  # noqa: E402

QUESTIONS = [
    "\nQuestion: what is this text about?\nAnswer:",
    "\nQuestion: who is named first?\nAnswer:",
    "\nTitle:",
    "\nSummary:",
    "\nThe main point:",
    "\nOne word for it:",
]


def _rss_kib(pid_of_port: int) -> int:
    """RSS of the process listening on that port (from /proc), 0 if not found."""
    import os

    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"serve" in cmd and str(pid_of_port).encode() in cmd:
                return rss_bytes(pid) // 1024
        except OSError:
            continue
    return 0


def ttft(base: str, prompt: str, max_tokens: int = 8) -> tuple[float, float]:
    """(seconds to the first streamed token, seconds to the end) of a greedy completion."""
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0, timeout=600)
    t0 = time.perf_counter()
    first = None
    for chunk in client.completions.create(
        model="m", prompt=prompt, max_tokens=max_tokens, temperature=0.0, stream=True
    ):
        if first is None and chunk.choices and chunk.choices[0].text:
            first = time.perf_counter() - t0
    return (first if first is not None else time.perf_counter() - t0), time.perf_counter() - t0


def load(base: str, doc: str, clients: int, seconds: float) -> dict:
    """clients threads asking short questions on doc for `seconds`: every latency, and errors."""
    import openai

    latencies, errors, lock = [], [], threading.Lock()
    stop = time.perf_counter() + seconds

    def client_loop(i: int) -> None:
        c = openai.OpenAI(base_url=base + "/v1", api_key="-", max_retries=0, timeout=600)
        k = i
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            try:
                c.completions.create(
                    model="m", prompt=doc + QUESTIONS[k % len(QUESTIONS)], max_tokens=8, temperature=0.0
                )
                with lock:
                    latencies.append(time.perf_counter() - t0)
            except Exception as e:  # counted, not raised: the point is whether any happen
                with lock:
                    errors.append(repr(e))
            k += clients

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client_loop, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.array(latencies) if latencies else np.array([np.nan])
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "wall_s": wall,
        "per_minute": 60 * len(latencies) / wall,
        "p50_s": float(np.percentile(lat, 50)),
        "p99_s": float(np.percentile(lat, 99)),
        "first_error": errors[0] if errors else None,
    }


def redis_bytes(client) -> dict:
    """What kvgguf's entries hold in Redis now: entries, pieces, the bytes kvgguf counts."""
    held = {"entries": 0, "pieces": 0, "bytes": 0}
    for key in client.keys("kvgguf:*:sizes"):
        for field, size in client.hgetall(key).items():
            held["pieces" if field.startswith(b"b:") else "entries"] += 1
            held["bytes"] += int(size)
    return held


def chunk_sizes(model: str, tokens: list, url: str, sizes: list[int], threads: int) -> list[dict]:
    """The index's chunk size: per size, the index keys Redis holds for the document's entry and
    their bytes (MEMORY USAGE), and the time to find and assemble the entry for a question on
    the document (median of 5). The shortest prefix the index finds is one chunk."""
    import kvgguf
    import redis
    from kvgguf.session.prompt_cache import kvz_tokens
    from kvgguf.session.redis_cache import CompressedRedisCache

    llm = kvgguf.Llama(model, kv_codec="tiered", n_ctx=len(tokens) + 512, n_threads=threads, verbose=False)
    served = CompressedRedisCache(url)  # keyed as the servers key their entries
    served.attach(llm)
    client = redis.Redis.from_url(url)
    newest = client.zrange(served._key("lru"), -1, -1)
    if not newest:
        print("no entry in Redis under this Llama's namespace: chunk sizes not measured", flush=True)
        return []
    entry = kvz_tokens(client.get(served._key("e", newest[0].decode()))).tolist()
    state = served[entry]
    prompt = entry + llm.tokenize(QUESTIONS[2].encode(), add_bos=False)
    rows = []
    for size in sizes:
        cache = CompressedRedisCache(url, chunk_tokens=size)
        cache.attach(llm)
        cache[tuple(entry)] = state  # its pieces are held: the skeleton and the index
        keys = cache._chunk_keys(prompt)
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            cache[prompt]
            times.append(time.perf_counter() - t0)
        rows.append(
            {
                "chunk_tokens": size,
                "index_keys": len(keys),
                "index_bytes": sum(int(client.memory_usage(k) or 0) for k in keys),
                "lookup_s": float(np.median(times)),
            }
        )
        client.delete(*keys)
    return rows


def raw_state_bytes(model: str, tokens: list, threads: int) -> int:
    """llama.cpp's own state of these tokens in a stock f16 context (sequence 0)."""
    import llama_cpp
    import llama_cpp.llama_cpp as C

    llm = llama_cpp.Llama(model, n_ctx=len(tokens) + 64, n_threads=threads, n_threads_batch=threads, verbose=False)
    llm.eval(tokens)
    return int(C.llama_state_seq_get_size(llm._ctx.ctx, 0))


def main(argv=None) -> int:
    import kvgguf
    import redis

    from kvgguf.evaluation.text import wikitext2_test

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--clients", default="1,4,8")
    p.add_argument("--seconds", type=float, default=60.0, help="seconds of load per client count")
    add_threads_option(p)
    p.add_argument("--chunks", default="16,32,64,128,256", help="index chunk sizes to time (tokens)")
    add_out_option(p, HERE / "results" / "sessions" / "shared_cache")
    args = p.parse_args(argv)

    model = str(kvgguf.models.path(args.model))
    vocab = kvgguf.Llama(model, vocab_only=True, verbose=False)
    text = wikitext2_test()
    tokens = vocab.tokenize(text[: args.doc_tokens * 6].encode())[: args.doc_tokens]
    doc = vocab.detokenize(tokens[1:]).decode("utf-8", "ignore")  # the server adds BOS again
    binary = redis_server_binary()
    if binary is None:
        raise SystemExit(
            "redis-server is not installed (bash scripts/system_packages.sh, or apt-get install redis-server)"
        )
    n_ctx = str(args.doc_tokens + 512)
    common = [
        model,
        "--model_alias",
        "m",
        "--n_ctx",
        n_ctx,
        "--n_threads",
        str(args.threads),
        "--n_threads_batch",
        str(args.threads),
    ]
    results = {"model": args.model, "doc_tokens": len(tokens), "threads": args.threads, "ttft": {}, "load": []}
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(binary, tmp)
        try:
            shared = common + ["--prompt-cache", server.url]
            client = redis.Redis(port=server.port)
            with kvgguf_serve(shared, Path(tmp) / "a.log", {}) as a:
                results["ttft"]["cold"] = ttft(a, doc + QUESTIONS[0])
            results["redis_one_entry"] = redis_bytes(client)
            with kvgguf_serve(common + ["--prompt-cache", "ram"], Path(tmp) / "c.log", {}) as c:
                ttft(c, doc + QUESTIONS[0])
                ttft(c, "Hello there,")
                results["ttft"]["warm, own RAM"] = ttft(c, doc + QUESTIONS[1])
            with kvgguf_serve(shared, Path(tmp) / "b.log", {}) as b:
                results["ttft"]["warm, Redis"] = ttft(b, doc + QUESTIONS[1])
                mem = get_json(b + "/kvgguf/memory")
                results["prompt_cache"] = mem["prompt_cache"]
                results["redis"] = {**redis_bytes(client), "used_memory": int(client.info("memory")["used_memory"])}
                port = int(b.rsplit(":", 1)[1])
                rss0 = _rss_kib(port)
                for n in (int(x) for x in args.clients.split(",")):
                    progress(f"load: {n} clients for {args.seconds:.0f} s", sys.stdout)
                    results["load"].append(load(b, doc, n, args.seconds))
                results["rss_kib"] = {"before_load": rss0, "after_load": _rss_kib(port)}
                results["redis_after_load"] = redis_bytes(client)
            sizes = [int(x) for x in args.chunks.split(",") if x]
            if sizes:
                progress(f"index chunk sizes {sizes}", sys.stdout)
                results["chunks"] = chunk_sizes(model, tokens, server.url, sizes, args.threads)
        finally:
            server.stop()
    results["raw_state_bytes"] = raw_state_bytes(model, tokens, args.threads)
    write_result(args.out, results, markdown(results), args.threads)
    print(markdown(results))
    return 0


def markdown(r: dict) -> str:
    n = r["doc_tokens"]
    entry = r["redis_one_entry"]["bytes"]
    second = r["redis"]["bytes"] - entry
    raw = r["raw_state_bytes"]
    lines = [
        f"`{command(__file__)}` ({r['model']}, a question on a {n:,}-token document, {r['threads']} threads per "
        "server, greedy, streamed)",
        "",
    ]
    cold = r["ttft"]["cold"][0]
    ttft_rows = [
        [name, f"{first:.2f} s" + ("" if name == "cold" else f" ({cold / first:.1f}x faster)"), f"{done:.2f} s"]
        for name, (first, done) in r["ttft"].items()
    ]
    lines.append(
        markdown_table(["where the document's KV rows come from", "time to first token", "answer done"], ttft_rows)
    )
    gib = 2**30
    entry_rows = [
        [
            f"kvgguf `.kvz` in Redis (server A's entry: skeleton and {r['redis_one_entry']['pieces']} pieces)",
            f"{entry / n:,.0f}",
            f"{gib // entry if entry else 0:,}",
        ],
        ["a second question's entry on the same document (server B: what it adds)", f"{second / n:,.0f}", ""],
        ["llama.cpp's own state (f16, same tokens)", f"{raw / n:,.0f}", f"{gib // raw:,}"],
    ]
    load_rows = [
        [
            row["clients"],
            row["requests"],
            row["errors"],
            f"{row['per_minute']:.1f}",
            f"{row['p50_s']:.2f} s",
            f"{row['p99_s']:.2f} s",
        ]
        for row in r["load"]
    ]
    lines += [
        "",
        markdown_table(["cache entry", "bytes per token", f"{n:,}-token documents per GiB"], entry_rows),
        "",
        markdown_table(["clients", "requests", "errors", "requests/min", "p50", "p99"], load_rows),
    ]
    rss = r["rss_kib"]
    lines += [
        "",
        f"Server B's RSS: {rss['before_load'] / 1024:.0f} MiB before the load, "
        f"{rss['after_load'] / 1024:.0f} MiB after. Redis held {r['redis']['entries']} entries "
        f"({r['redis']['used_memory'] / 2**20:.1f} MiB used_memory) before the load, "
        f"{r['redis_after_load']['entries']} entries in {r['redis_after_load']['bytes'] / 2**20:.1f} MiB "
        f"({r['redis_after_load']['pieces']} pieces) after it; server B's prompt "
        f"cache: {r['prompt_cache'].get('hits')} hit(s), {r['prompt_cache'].get('tokens_served')} tokens "
        f"served, faults {r['prompt_cache'].get('faults') or 'none'}.",
    ]
    if r.get("chunks"):
        chunk_rows = [
            [
                c["chunk_tokens"],
                c["index_keys"],
                f"{c['index_bytes']:,}",
                f"{c['index_bytes'] / n:.1f}",
                f"{1000 * c['lookup_s']:.0f} ms",
            ]
            for c in r["chunks"]
        ]
        header = ["index chunk (tokens)", "index keys", "index bytes in Redis", "per cached token", "find and assemble"]
        lines += ["", markdown_table(header, chunk_rows)]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
