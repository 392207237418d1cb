"""The README's usage example, run as written; its output is what the README shows.

    .venv/bin/python scripts/usage_example.py

writes benchmarks/results/usage_example.txt.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def example() -> None:
    # --- as in the README ---
    from kvgguf import Llama, models
    from kvgguf.evaluation.text import wikitext2_test

    llm = Llama(str(models.path("smollm2-135m")), kv_codec="tiered", n_ctx=32768, n_threads=2, verbose=False)
    doc = llm.tokenize(wikitext2_test().encode())[:4000]  # 4,000 tokens of WikiText-2
    llm.eval(doc)
    print(llm.kv_memory())
    # A prompt that extends what the context holds: only the new tokens are evaluated.
    out = llm.create_completion(doc + llm.tokenize(b"\n\nIn short,", add_bos=False), max_tokens=16, temperature=0.0)
    print(repr(out["choices"][0]["text"]))
    print(llm.kv_memory())


def main() -> int:
    # A fresh cache folder: what a new user sees, the fixed preset (no calibration of the model yet).
    os.environ["KVGGUF_CACHE_DIR"] = tempfile.mkdtemp(prefix="kvgguf-usage-")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        example()
    text = buf.getvalue()
    (RESULTS / "usage_example.txt").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
