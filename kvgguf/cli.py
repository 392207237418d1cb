"""The `kvgguf` command."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def cmd_demo(args) -> int:
    import kvgguf
    from llama_cpp import Llama

    from . import inspect_model

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
    print()
    print(inspect_model.format_card(inspect_model.read_card(path)))
    return 0


def cmd_chat(args) -> int:
    import kvgguf

    from .chat import FALLBACK_CHAT_FORMAT, ChatSession, log, run_interactive
    from .gguf_meta import read_metadata

    path = kvgguf.models.path(args.model)
    kw = dict(n_ctx=args.ctx_size, seed=args.seed, verbose=False, flash_attn=args.flash_attn)
    if args.threads:
        kw.update(n_threads=args.threads, n_threads_batch=args.threads)
    meta = read_metadata(path)
    if "tokenizer.chat_template" not in meta:
        arch = meta.get("general.architecture", "")
        kw["chat_format"] = FALLBACK_CHAT_FORMAT.get(arch, "chatml")
        log(f"kvgguf chat: {path.name} has no chat template; using the {kw['chat_format']} format")
    if args.kv_codec:
        from .tiered import TieredConfig

        config = TieredConfig.parse(args.kv_codec)
        changes = {k: v for k, v in (("hot", args.hot), ("sinks", args.sinks)) if v is not None}
        if changes:
            from dataclasses import replace

            config = replace(config, **changes)
        kw["kv_codec"] = config if changes else args.kv_codec
    elif args.hot is not None or args.sinks is not None:
        raise ValueError("--hot and --sinks need --kv-codec")
    if args.cache_type_k:
        kw["type_k"] = args.cache_type_k
    if args.cache_type_v:
        kw["type_v"] = args.cache_type_v
    llm = kvgguf.Llama(str(path), **kw)
    sampling = dict(temperature=args.temp, top_k=args.top_k, top_p=args.top_p)
    session = ChatSession(llm, system=args.system, max_tokens=args.n_predict, sampling=sampling)
    log(f"kvgguf chat: {path.name}, {llm.kv_memory()}")
    if args.prompt is not None or not sys.stdin.isatty():
        text = args.prompt if args.prompt is not None else sys.stdin.read()
        session.reply(text.strip())
        return 0
    return run_interactive(session)


def cmd_inspect(args) -> int:
    import json

    from . import inspect_model
    from .models import path as model_path

    card = inspect_model.read_card(model_path(args.model))
    if args.json:
        print(json.dumps(inspect_model.as_json(card), indent=2))
    else:
        print(inspect_model.format_card(card))
    return 0


def cmd_eval(args) -> int:
    import kvgguf

    from . import evaluate

    if args.quick:  # small enough for a laptop minute, with most of the chunk compressed
        args.ctx, args.chunks, args.batch = 512, 1, 64
        args.hot = args.hot or 128
        args.codecs = args.codecs or evaluate.QUICK_CONFIGS
    configs = evaluate.parse_configs(args.codecs or evaluate.DEFAULT_CONFIGS)
    args.model = args.model_opt or args.model
    path = kvgguf.models.path(args.model)
    text_path = Path(args.text) if args.text else evaluate.default_text()
    if not text_path.is_file():
        raise FileNotFoundError(f"--text {text_path} does not exist")
    from llama_cpp import Llama as _Vocab

    vocab = _Vocab(str(path), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text_path.read_text(encoding="utf-8").encode("utf-8"))
    meta, results = evaluate.run_eval(str(path), configs, tokens, ctx=args.ctx, chunks=args.chunks,
                                      batch=args.batch, threads=args.threads, hot=args.hot)
    stem = f"{Path(str(args.model or 'smollm2-135m')).stem}_ctx{args.ctx}x{args.chunks}"
    command = "kvgguf eval " + " ".join(sys.argv[2:]) if args.argv is None else "kvgguf " + " ".join(args.argv)
    md = evaluate.write_outputs(meta, results, Path(args.out), stem, command)
    print(md.read_text())
    print(f"results: {md.with_suffix('.json')}, {md.with_suffix('.png')}", file=sys.stderr)
    return 0


def _cache_type(value: str) -> str:
    from .llama import CACHE_TYPES

    if value not in CACHE_TYPES:
        raise argparse.ArgumentTypeError(f"'{value}' is not a cache type; choose one of: {', '.join(CACHE_TYPES)}")
    return value


def _kv_codec(value: str) -> str:
    from . import codecs

    names = ["tiered"] + codecs.names()
    if value not in names:
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
    demo = sub.add_parser("demo", help="load a model through the patched llama.cpp, generate, list the codecs")
    demo.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    demo.add_argument("-p", "--prompt", default="The capital of France is", help="prompt to complete")
    demo.add_argument("-n", "--n-predict", type=int, default=16, help="tokens to generate")
    demo.add_argument("-t", "--threads", type=int, default=None, help="threads (default: llama.cpp's)")
    demo.set_defaults(func=cmd_demo)

    chat = sub.add_parser("chat", help="chat in the terminal, streaming replies (llama.cpp-style flags)")
    chat.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    chat.add_argument("--kv-codec", type=_kv_codec, default=None,
                      help="kvgguf cache: 'tiered' or a codec name (default: llama.cpp's own cache)")
    chat.add_argument("--hot", type=_positive, default=None, help="tokens llama.cpp keeps exact (with --kv-codec)")
    chat.add_argument("--sinks", type=int, default=None, help="first tokens kept exact (with --kv-codec)")
    chat.add_argument("-c", "--ctx-size", type=_positive, default=4096, help="context size in tokens")
    chat.add_argument("-n", "--n-predict", type=_positive, default=512, help="max tokens per reply")
    chat.add_argument("--temp", type=float, default=0.8, help="sampling temperature (0: greedy)")
    chat.add_argument("--top-k", type=int, default=40, help="top-k sampling (0: off)")
    chat.add_argument("--top-p", type=float, default=0.95, help="top-p sampling (1.0: off)")
    chat.add_argument("--seed", type=int, default=-1, help="RNG seed (-1: random)")
    chat.add_argument("-t", "--threads", type=_positive, default=None, help="threads (default: llama.cpp's)")
    chat.add_argument("-ctk", "--cache-type-k", type=_cache_type, default=None, help="llama.cpp K cache type (f16, q8_0, q4_0, ...)")
    chat.add_argument("-ctv", "--cache-type-v", type=_cache_type, default=None, help="llama.cpp V cache type (f16, q8_0, q4_0, ...)")
    chat.add_argument("-fa", "--flash-attn", action=argparse.BooleanOptionalAction, default=True,
                      help="flash attention (needed for quantized V caches)")
    chat.add_argument("-sys", "--system", default=None, help="system prompt")
    chat.add_argument("-p", "--prompt", default=None, help="one message, answered on stdout, then exit")
    chat.set_defaults(func=cmd_chat)

    ev = sub.add_parser("eval", help="KL, top-1 and perplexity against the f16 cache, every cache side by side")
    ev.add_argument("model", nargs="?", default=None, help="model name or GGUF path (default: smollm2-135m)")
    ev.add_argument("--model", dest="model_opt", default=None, help="the same as MODEL")
    ev.add_argument("--codecs", default=None,
                    help="comma-separated: llama.cpp types (f16, q8_0, ...), 'tiered', kvgguf codecs, 'kvgguf:f16'")
    ev.add_argument("--ctx", type=_positive, default=1024, help="tokens per chunk (C)")
    ev.add_argument("--chunks", type=_positive, default=4, help="chunks of the text to score")
    ev.add_argument("--batch", type=_positive, default=256, help="tokens per decode batch (B)")
    ev.add_argument("--hot", type=_positive, default=None, help="kvgguf hot window (default: the preset's)")
    ev.add_argument("--quick", action="store_true", help="one chunk of 512 tokens in batches of 64, hot window 128, five caches")
    ev.add_argument("--text", default=None, help="UTF-8 text to score (default: WikiText-2 test)")
    ev.add_argument("--out", default="kvgguf-eval", help="folder for the JSON, Markdown and PNG results")
    ev.add_argument("-t", "--threads", type=_positive, default=2, help="threads")
    ev.set_defaults(func=cmd_eval)

    insp = sub.add_parser("inspect", help="a GGUF's attention shape and KV bytes per cache type (metadata only)")
    insp.add_argument("model", help="GGUF path or model name")
    insp.add_argument("--json", action="store_true", help="print JSON instead of a table")
    insp.set_defaults(func=cmd_inspect)
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
