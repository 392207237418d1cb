"""`kvgguf eval`: the evaluation harness (kvgguf.evaluation) from the command line."""

from __future__ import annotations

import sys
from pathlib import Path


def run(args) -> int:
    import kvgguf

    from ..evaluation import harness as evaluate

    if args.quick:  # small enough for a laptop minute, with most of the chunk compressed
        args.ctx, args.chunks, args.batch = 512, 1, 64
        args.hot = args.hot or 128
        args.codecs = args.codecs or evaluate.QUICK_CONFIGS
    configs = evaluate.parse_configs(args.codecs or evaluate.DEFAULT_CONFIGS)
    args.model = args.model_opt or args.model
    path = kvgguf.models.path(args.model)
    if args.text:
        text_path = Path(args.text)
        if not text_path.is_file():
            raise FileNotFoundError(f"--text {text_path} does not exist")
        text = text_path.read_text(encoding="utf-8")
    else:
        from ..evaluation.text import wikitext2_test

        text = wikitext2_test()
    from llama_cpp import Llama as _Vocab

    vocab = _Vocab(str(path), vocab_only=True, verbose=False)
    tokens = vocab.tokenize(text.encode("utf-8"))
    meta, results = evaluate.run_eval(
        str(path),
        configs,
        tokens,
        ctx=args.ctx,
        chunks=args.chunks,
        batch=args.batch,
        threads=args.threads,
        hot=args.hot,
        ubatch=args.ubatch,
        n_gpu_layers=args.n_gpu_layers,
    )
    stem = f"{Path(str(args.model or 'smollm2-135m')).stem}_ctx{args.ctx}x{args.chunks}"
    command = "kvgguf eval " + " ".join(sys.argv[2:]) if args.argv is None else "kvgguf " + " ".join(args.argv)
    out = Path(args.out) if args.out else kvgguf.models.cache_dir() / "eval"
    md = evaluate.write_outputs(meta, results, out, stem, command)
    print(md.read_text())
    written = [md, md.with_suffix(".json")] + ([md.with_suffix(".png")] if md.with_suffix(".png").exists() else [])
    print("results: " + ", ".join(str(f) for f in written), file=sys.stderr)
    return 0
