"""The `kvgguf` command."""

from __future__ import annotations

import argparse
import sys
import time

# llama.cpp's own cache types, bits per value from ggml's block layouts (bytes per block of 32).
LLAMA_CACHE_TYPES = {"f16": 16.0, "q8_0": 34 * 8 / 32, "q4_0": 18 * 8 / 32}
TABLE_CONTEXTS = (4096, 32768)


def _mib(n_bytes: float) -> str:
    return f"{n_bytes / 2**20:,.1f} MiB"


def codec_table(shape, contexts=TABLE_CONTEXTS) -> list[dict]:
    """Bits per value and KV bytes each cache type would hold for `shape` at each context.

    kvgguf codecs are measured with the native encoded_size query for the real K and V
    blocks of that many tokens (codes, scales, zero points and norms all counted).
    """
    from . import codecs

    rows = []
    for name, bpv in LLAMA_CACHE_TYPES.items():
        row = {"cache": name, "by": "llama.cpp", "bits_per_value": bpv}
        for n in contexts:
            row[n] = n * shape.values_per_token * bpv / 8
        rows.append(row)
    for name in codecs.names():
        codec = codecs.get(name)
        row = {"cache": name, "by": "kvgguf"}
        try:
            for n in contexts:
                k = codec.encoded_size((n, shape.n_head_kv, shape.head_dim_k), role="key")
                v = codec.encoded_size((n, shape.n_head_kv, shape.head_dim_v), role="value")
                row[n] = shape.n_layer * (k + v)
            row["bits_per_value"] = row[contexts[-1]] * 8 / (contexts[-1] * shape.values_per_token)
        except ValueError as e:  # e.g. rotq on a head dim that is not a power of two
            row["unavailable"] = str(e)
        rows.append(row)
    return rows


def format_table(rows, contexts=TABLE_CONTEXTS) -> str:
    head = ["cache", "from", "bits/value"] + [f"KV @ {n // 1024}K" for n in contexts]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if "unavailable" in r:
            cells = [r["cache"], r["by"], "n/a"] + ["n/a"] * len(contexts)
        else:
            cells = [r["cache"], r["by"], f"{r['bits_per_value']:.3f}"] + [_mib(r[n]) for n in contexts]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cmd_demo(args) -> int:
    import kvgguf
    from llama_cpp import Llama

    from .model_shape import KVShape

    path = kvgguf.models.path(args.model)
    print(f"llama.cpp: {kvgguf.llama_library_path()} (kvgguf patch v{kvgguf.llama_patch_version()})")
    print(f"model: {path}")
    llm = Llama(str(path), n_ctx=512, n_threads=args.threads, verbose=False, seed=0)
    t0 = time.perf_counter()
    out = llm.create_completion(args.prompt, max_tokens=args.n_predict, temperature=0.0)
    dt = time.perf_counter() - t0
    n_gen = out["usage"]["completion_tokens"]
    print(f"prompt: {args.prompt!r}")
    print(f"output: {out['choices'][0]['text']!r}")
    print(f"generated {n_gen} tokens in {dt:.2f} s")
    shape = KVShape.of(llm)
    print(
        f"\nKV shape: {shape.arch}, {shape.n_layer} layers, {shape.n_head_kv} KV heads, "
        f"head dim {shape.head_dim_k}/{shape.head_dim_v}"
        + (f", sliding window {shape.n_swa}" if shape.n_swa else "")
    )
    print("KV bytes each cache would hold, all layers at full context:\n")
    print(format_table(codec_table(shape)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgguf", description="KV-cache compression for llama.cpp")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="load a model through the patched llama.cpp, generate, list the codecs")
    demo.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    demo.add_argument("-p", "--prompt", default="The capital of France is", help="prompt to complete")
    demo.add_argument("-n", "--n-predict", type=int, default=16, help="tokens to generate")
    demo.add_argument("-t", "--threads", type=int, default=None, help="threads (default: llama.cpp's)")
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"kvgguf: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
