"""Random-weight GGUFs with the exact shapes of the models people run, for speed benchmarks.

Decode and prefill speed depend on a model's shape and weight type, not on its weights' values,
and no model may be downloaded: this writes layers, widths, heads, head dims, vocabulary size and
sliding windows as the real models have them, with random Q4_0 matrices (tests/tiny_models.py's
writer, SmolLM2's tokenizer padded to the real vocabulary). Built once into kvgguf's cache folder:

    .venv/bin/python benchmarks/shapes.py llama-3.2-1b      # prints the GGUF's path
    .venv/bin/python benchmarks/live_cache.py --model llama-3.2-1b

Their text is gibberish and their quality means nothing: only speed and memory are measured on them.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))

from tiny_models import TinySpec  # noqa: E402

# From each model's config.json (Hugging Face), as llama.cpp's converter writes them.
SHAPES = {
    "llama-3.2-1b": TinySpec(
        "llama",
        n_layer=16,
        n_embd=2048,
        n_head=32,
        n_head_kv=8,
        head_dim=64,
        n_ff=8192,
        n_ctx_train=131072,
        n_vocab=128256,
        extra={"rope.freq_base": 500000.0},
    ),
    "llama-3.2-3b": TinySpec(
        "llama",
        n_layer=28,
        n_embd=3072,
        n_head=24,
        n_head_kv=8,
        head_dim=128,
        n_ff=8192,
        n_ctx_train=131072,
        n_vocab=128256,
        extra={"rope.freq_base": 500000.0},
    ),
    "qwen3-1.7b": TinySpec(
        "qwen3",
        n_layer=28,
        n_embd=2048,
        n_head=16,
        n_head_kv=8,
        head_dim=128,
        n_ff=6144,
        n_ctx_train=40960,
        n_vocab=151936,
        extra={"rope.freq_base": 1000000.0},
    ),
    # 5 of every 6 layers slide over 512 tokens
    "gemma-3-1b": TinySpec(
        "gemma3",
        n_layer=26,
        n_embd=1152,
        n_head=4,
        n_head_kv=1,
        head_dim=256,
        n_ff=6912,
        n_ctx_train=32768,
        n_vocab=262144,
        sliding_window=512,
        extra={"rope.freq_base": 1000000.0},
    ),
}


def path(name: str, weights: str = "q4_0") -> Path:
    """The GGUF of shape `name`, written into kvgguf's cache folder on first use (a minute or two)."""
    import dataclasses

    import tiny_models

    if name not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; choose one of: {', '.join(SHAPES)}")
    # kvgguf's cache folder; KVGGUF_CACHE_DIR and KVGGUF_TOKENIZER_FROM given, nothing of kvgguf is
    # imported (a GPU machine writes these while its CUDA build of kvgguf is still compiling)
    cache = os.environ.get("KVGGUF_CACHE_DIR")
    if not cache:
        import kvgguf

        cache = kvgguf.models.cache_dir()
    out = Path(cache) / "shapes" / f"{name}.{weights}.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        partial = out.with_suffix(".partial")
        print(f"writing {out} (random weights, once) ...", file=sys.stderr, flush=True)
        # SmolLM2's tokenizer: its GGUF, or where the model package is absent (a GPU machine) the GPU
        # kit's copy of its keys (KVGGUF_TOKENIZER_FROM=.gpu-kit/smollm2-tokenizer.pkl)
        tokenizer = os.environ.get("KVGGUF_TOKENIZER_FROM")
        if not tokenizer:
            import kvgguf

            tokenizer = kvgguf.models.path()
        tiny_models.write(partial, dataclasses.replace(SHAPES[name], weights=weights), Path(tokenizer))
        partial.replace(out)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", default=list(SHAPES), help=f"shapes to write (default all: {', '.join(SHAPES)})")
    p.add_argument("--weights", default="q4_0", choices=("q4_0", "f16"))
    args = p.parse_args(argv)
    for name in args.names:
        print(path(name, args.weights))
    return 0


if __name__ == "__main__":
    sys.exit(main())
