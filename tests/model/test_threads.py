"""One Llama shared by threads, as a server's thread pool shares it: whole calls under one lock,
a stream stepped from two threads, and a stream dropped half way."""

from __future__ import annotations

import json

from conftest import run_python
from kvgguf import Llama

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)


# One Llama, two threads

# Two threads complete on one Llama, one of them streaming; a third steps a stream from two
# threads, as a server's thread pool does. Before the lock held each whole call, 2 runs of 3
# aborted in llama-sampler.cpp (GGML_ASSERT(logits != nullptr)). In a child process: an abort
# must fail this test, not end the test run.
SHARED = """
import json, threading, kvgguf
from kvgguf.evaluation.text import wikitext2_test
llm = kvgguf.Llama({path!r}, kv_codec="tiered", n_ctx=1024, n_threads=1, n_threads_batch=1, verbose=False)
doc = wikitext2_test()[:1300]
errors, texts = [], {{}}

def complete(i, stream):
    try:
        for j in range(2):
            prompt = doc[100 * i + 50 * j:] + " In short,"
            if stream:
                text = "".join(c["choices"][0]["text"] for c in llm(prompt, max_tokens=6, temperature=0.0, stream=True))
            else:
                text = llm(prompt, max_tokens=6, temperature=0.0)["choices"][0]["text"]
            texts[i, j] = text
    except Exception as e:
        errors.append(repr(e))

threads = [threading.Thread(target=complete, args=(i, i == 1)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
# one stream stepped from two threads in turn
stream = llm(doc + " In short,", max_tokens=4, temperature=0.0, stream=True)
pieces = []
for _ in range(2):
    t = threading.Thread(target=lambda: pieces.append(next(stream)["choices"][0]["text"]))
    t.start(); t.join(60)
    assert not t.is_alive(), "deadlock"
pieces += [c["choices"][0]["text"] for c in stream]
print(json.dumps({{"errors": errors, "n": len(texts), "pieces": len(pieces), "cold": llm.kv_cache.n_cold}}))
"""


def test_two_threads_share_one_llama_without_an_abort(smollm2_path):
    r = run_python(SHARED.format(path=str(smollm2_path)))
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["errors"] == []
    assert out["n"] == 4, out
    assert out["pieces"] >= 2 and out["cold"] > 0, out


def test_a_stream_dropped_half_way_lets_the_next_call_run(smollm2_path):
    llm = Llama(str(smollm2_path), kv_codec="tiered", n_ctx=512, **KW)
    try:
        stream = llm("Once upon a time", max_tokens=32, temperature=0.0, stream=True)
        next(stream)
        assert llm._calls.held  # noqa: SLF001 - the stream holds the Llama between chunks
        del stream  # a client that went away
        assert not llm._calls.held
        out = llm("The capital of France is", max_tokens=2, temperature=0.0)
        assert out["usage"]["completion_tokens"] >= 1
    finally:
        llm.close()
