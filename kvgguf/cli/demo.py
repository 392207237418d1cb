"""`kvgguf demo`: load a model through the patched llama.cpp, generate, show what its KV cache costs."""

from __future__ import annotations

import time


def run(args) -> int:
    import kvgguf
    from llama_cpp import Llama

    from ..model.shape import KVShape
    from . import inspect as inspect_model

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
    print(inspect_model.format_card(path, KVShape.from_gguf(path)))
    return 0
