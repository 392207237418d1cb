"""The `kvgguf` command: its flags, and the dispatch to one module per command."""

from __future__ import annotations

import argparse
import sys


def _run(command: str, args) -> int:
    """Imports a command's module only when it runs (the CLI starts fast, flags are checked first)."""
    import importlib

    return importlib.import_module(f".{command}", __package__).run(args)


def _cache_type(value: str) -> str:
    from ..policy.resolve import CACHE_TYPES

    if value not in CACHE_TYPES:
        raise argparse.ArgumentTypeError(f"'{value}' is not a cache type; choose one of: {', '.join(CACHE_TYPES)}")
    return value


def _kv_codec(value: str) -> str:
    from ..bindings import codecs
    from ..policy import kv_codec

    names = [
        "tiered",
        "tiered:fixed",
        "tiered:keep=SIGNAL[:FRACTION]",
        "auto",
        "auto:BITS",
        "auto:held=BITS",
    ] + codecs.names()
    if not kv_codec.is_kv_codec(value):
        raise argparse.ArgumentTypeError(f"'{value}' is not a kv codec; choose one of: {', '.join(names)}")
    return value


def _positive(value: str) -> int:
    try:
        n = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{value}' is not an integer") from None
    if n <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvgguf", description="KV-cache compression for llama.cpp")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="a long document in llama.cpp's f16 cache and in kvgguf's, side by side: "
        "bytes held, speed, KL and a question about its start",
    )
    demo.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    demo.add_argument("--tokens", type=_positive, default=2500, help="document length in tokens (default 2500)")
    demo.add_argument("--kv-codec", type=_kv_codec, default="tiered", help="kvgguf cache (default: tiered)")
    demo.add_argument("-t", "--threads", type=int, default=None, help="threads (default: llama.cpp's)")
    demo.set_defaults(func=lambda a: _run("demo", a))

    chat = sub.add_parser("chat", help="chat in the terminal, streaming replies (llama.cpp-style flags)")
    chat.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    chat.add_argument(
        "--kv-codec",
        type=_kv_codec,
        default=None,
        help="kvgguf cache: 'tiered', 'auto[:BITS]' (calibrated), a codec name or 'k:NAME,v:NAME' "
        "(default: llama.cpp's own cache)",
    )
    chat.add_argument("--hot", type=_positive, default=None, help="tokens llama.cpp keeps exact (with --kv-codec)")
    chat.add_argument("--sinks", type=int, default=None, help="first tokens kept exact (with --kv-codec)")
    chat.add_argument("-c", "--ctx-size", type=_positive, default=4096, help="context size in tokens")
    chat.add_argument(
        "--no-context-shift",
        action="store_true",
        help="stop at the context size instead of shifting (default: shift, as llama.cpp's CLI does)",
    )
    chat.add_argument("--keep", type=int, default=None, help="tokens a context shift keeps (default: the sinks, 4)")
    chat.add_argument("-n", "--n-predict", type=_positive, default=512, help="max tokens per reply")
    chat.add_argument("--temp", type=float, default=0.8, help="sampling temperature (0: greedy)")
    chat.add_argument("--top-k", type=int, default=40, help="top-k sampling (0: off)")
    chat.add_argument("--top-p", type=float, default=0.95, help="top-p sampling (1.0: off)")
    chat.add_argument("--seed", type=int, default=-1, help="RNG seed (-1: random)")
    chat.add_argument("-t", "--threads", type=_positive, default=None, help="threads (default: llama.cpp's)")
    chat.add_argument(
        "-ctk", "--cache-type-k", type=_cache_type, default=None, help="llama.cpp K cache type (f16, q8_0, q4_0, ...)"
    )
    chat.add_argument(
        "-ctv", "--cache-type-v", type=_cache_type, default=None, help="llama.cpp V cache type (f16, q8_0, q4_0, ...)"
    )
    chat.add_argument(
        "-fa",
        "--flash-attn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="flash attention (needed for quantized V caches)",
    )
    chat.add_argument("-sys", "--system", default=None, help="system prompt")
    chat.add_argument("-p", "--prompt", default=None, help="one message, answered on stdout, then exit")
    chat.set_defaults(func=lambda a: _run("chat", a))

    ev = sub.add_parser("eval", help="KL, top-1 and perplexity against the f16 cache, every cache side by side")
    ev.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    ev.add_argument("--model", dest="model_opt", default=None, help="the same as MODEL")
    ev.add_argument(
        "--codecs",
        default=None,
        help="comma-separated: llama.cpp types (f16, q8_0, ...), 'tiered', kvgguf codecs, 'kvgguf:f16'",
    )
    ev.add_argument("--ctx", type=_positive, default=1024, help="tokens per chunk (C)")
    ev.add_argument("--chunks", type=_positive, default=4, help="chunks of the text to score")
    ev.add_argument("--batch", type=_positive, default=256, help="tokens per decode batch (B)")
    ev.add_argument("--hot", type=_positive, default=None, help="kvgguf hot window (default: the preset's)")
    ev.add_argument(
        "--ubatch",
        type=_positive,
        default=None,
        help="kvgguf's tokens per llama_decode within a batch (default: the preset's ubatch)",
    )
    ev.add_argument(
        "--quick", action="store_true", help="one chunk of 512 tokens in batches of 64, hot window 128, five caches"
    )
    ev.add_argument("--text", default=None, help="UTF-8 text to score (default: WikiText-2 test, shipped with kvgguf)")
    ev.add_argument(
        "--out",
        default=None,
        help="folder for the JSON, Markdown and PNG results (default: kvgguf's cache folder, eval/)",
    )
    ev.add_argument("-t", "--threads", type=_positive, default=2, help="threads")
    ev.add_argument(
        "--n-gpu-layers",
        type=int,
        default=0,
        help="layers on the GPU for every cache, the f16 reference too (-1: all; needs a CUDA build)",
    )
    ev.set_defaults(func=lambda a: _run("evaluate", a))

    cal = sub.add_parser(
        "calibrate",
        help="measure what each layer's K and V codec costs a model, once; "
        "kv_codec='auto' then spends a bit budget where it matters",
    )
    cal.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    cal.add_argument(
        "--budget", type=float, default=None, help="also show the plan for this many bits per compressed value"
    )
    cal.add_argument("--text", default=None, help="UTF-8 text to calibrate on (default: text the model writes itself)")
    cal.add_argument(
        "--tokens",
        type=_positive,
        default=None,
        help="tokens of text (default 512, more on models with a sliding window)",
    )
    cal.add_argument("--seed", type=int, default=0, help="seed of the self-written text")
    cal.add_argument(
        "--out", default=None, help="calibration file (default: kvgguf's cache folder, where 'auto' looks)"
    )
    cal.add_argument("-t", "--threads", type=_positive, default=None, help="threads (default: llama.cpp's)")
    cal.set_defaults(func=lambda a: _run("calibrate", a))

    insp = sub.add_parser("inspect", help="a GGUF's attention shape and KV bytes per cache type (metadata only)")
    insp.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    insp.add_argument(
        "--ctx", type=_positive, nargs="+", default=None, help="contexts (tokens) to show (default: 4096 32768)"
    )
    insp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    insp.set_defaults(func=lambda a: _run("inspect", a))

    # Its flags are llama_cpp.server's (parsed in serve.py, once the server packages are known to be there).
    serve = sub.add_parser(
        "serve",
        add_help=False,
        prefix_chars="\0",
        help="OpenAI-compatible server (llama-cpp-python's) with the compressed KV and "
        "prompt caches; kvgguf serve --help lists its flags",
    )
    serve.add_argument("args", nargs=argparse.REMAINDER)
    serve.set_defaults(func=lambda a: _run("serve", a))
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = argv
    try:
        return args.func(args)
    except (FileNotFoundError, ValueError) as e:
        print(f"kvgguf: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
