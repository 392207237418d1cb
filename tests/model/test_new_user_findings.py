"""What broke when kvgguf was tried again as a new user would (issue 46), one test per finding:
one Llama shared by threads, llama-cpp-python's default batch, messages that name what the user
passed, a recurrent model's memory line, a hot window that compresses nothing, calibration
progress in a log, and the documented module names. The server's findings (a streamed prompt
longer than n_ctx, a body of the wrong shape) are in test_serve.py; the calibration tests that
depended on the machine's own calibration are in test_calibration.py."""

from __future__ import annotations

import importlib
import json
import warnings

import llama_cpp
import pytest

import kvgguf
import tiny_models
from conftest import run_python
from kvgguf import Llama, TieredConfig

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)


# --- 1. one Llama, two threads -------------------------------------------------------------

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


# --- 3. llama-cpp-python's default batch -------------------------------------------------------


def test_the_default_batch_is_split_the_same_through_the_facade_and_install(smollm2_path, capfd):
    path = str(smollm2_path)
    direct = Llama(path, kv_codec="tiered", n_ctx=1024, n_batch=512, n_threads=1, verbose=True)
    kvgguf.install(kv_codec="tiered")
    try:
        installed = llama_cpp.Llama(path, n_ctx=1024, n_batch=512, n_threads=1, verbose=True)
    finally:
        kvgguf.uninstall()
    try:
        said = capfd.readouterr().err
        assert "n_batch=512 is longer than the hot window" in said
        assert said.count("n_batch=512 is longer than the hot window") == 2, "install() says it too"
        for llm in (direct, installed):
            assert llm.n_batch == llm.kv_config.ubatch < 512
            assert llama_cpp.llama_n_ctx(llm._ctx.ctx) == llama_cpp.llama_n_ctx(direct._ctx.ctx)
        toks = installed.tokenize(b"hello " * 300)
        installed.eval(toks)  # 300 tokens in batches of the config's ubatch
        assert installed.n_tokens == len(toks) and installed.kv_cache.n_cold > 0
    finally:
        direct.close()
        installed.close()


# --- 5. messages name what the user passed -----------------------------------------------------


@pytest.mark.parametrize("value, shown", [("q8_0", "'q8_0'"), (llama_cpp.GGML_TYPE_Q4_0, "'q4_0'")])
def test_a_quantized_type_with_a_kv_codec_is_refused_by_its_name(smollm2_path, value, shown):
    with pytest.raises(ValueError, match=f"type_k must be f16 or None \\(got {shown}\\)"):
        Llama(str(smollm2_path), kv_codec="tiered", type_k=value, **KW)


# --- 6. a recurrent model's memory line -----------------------------------------------------------


def test_a_recurrent_models_memory_reads_n_a_not_nan(tmp_path, smollm2_path):
    path = str(tiny_models.write_refused(tmp_path / "mamba.gguf", "mamba", smollm2_path))
    llm = Llama(path, n_ctx=256, **KW)
    try:
        llm.eval(llm.tokenize(b"hello world"))
        line = str(llm.kv_memory())
        assert "nan" not in line and "n/a bits/value over" in line, line
    finally:
        llm.close()


# --- 7. a hot window that covers the context ---------------------------------------------------


def test_a_hot_window_covering_the_context_says_nothing_is_compressed(smollm2_path):
    with pytest.warns(UserWarning, match="covers the whole context .*nothing is compressed"):
        llm = Llama(str(smollm2_path), kv_codec=TieredConfig(hot=100000), n_ctx=1024, **KW)
    llm.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a window that leaves room to compress says nothing
        Llama(str(smollm2_path), kv_codec=TieredConfig(hot=256), n_ctx=1024, **KW).close()


# --- 8. calibration progress where stderr is not a terminal ---------------------------------------


def test_calibration_progress_prints_lines_into_a_log(capsys, smollm2_path):
    from kvgguf.policy.resolve import calibration_progress

    progress = calibration_progress(str(smollm2_path), verbose=True)
    for done in range(0, 61, 3):
        progress(done, 60)
    err = capsys.readouterr().err  # captured: not a terminal, as under a server or in a notebook log
    assert f"calibrating {smollm2_path.name} for kv_codec='auto'" in err
    lines = [line for line in err.splitlines() if "lists measured" in line]
    assert lines[0].endswith("6/60 lists measured (10%)") and lines[-1].endswith("60/60 lists measured (100%)")
    assert len(lines) == 10
    quiet = calibration_progress(str(smollm2_path), verbose=False)
    quiet(30, 60)
    assert capsys.readouterr().err == ""


# --- 9. the documented names import as modules ------------------------------------------------------


@pytest.mark.parametrize("name, attribute", [("kvgguf.codecs", "names"), ("kvgguf.models", "path")])
def test_the_documented_names_import_as_modules(name, attribute):
    module = importlib.import_module(name)
    assert callable(getattr(module, attribute))
    assert module is getattr(kvgguf, name.split(".")[1])


def test_import_kvgguf_codecs_works_in_a_fresh_interpreter():
    r = run_python("import kvgguf.codecs\nfrom kvgguf.models import names\nprint(kvgguf.codecs.names()[0], names()[0])")
    assert r.returncode == 0, r.stderr
