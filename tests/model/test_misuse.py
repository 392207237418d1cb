"""Misuse a new user would try (issue "Nothing torn, nothing crashed", found by hand): each gets a
clear Python exception instead of a crash or a silently different object."""

import copy
import pickle

import llama_cpp
import numpy as np
import pytest

from conftest import run_python
from kvgguf import Llama, TieredConfig, codecs


def test_vocab_only_with_a_codec_is_refused_before_llama_cpp_sees_it(smollm2_path):
    with pytest.raises(ValueError, match="vocab_only"):
        Llama(str(smollm2_path), kv_codec="tiered", vocab_only=True, verbose=False)


@pytest.mark.parametrize("kv_codec", ["tiered", None])
def test_a_closed_llama_raises_instead_of_crashing(smollm2_path, tmp_path, kv_codec):
    llm = Llama(str(smollm2_path), kv_codec=kv_codec, n_ctx=512, verbose=False)
    llm.eval(llm.tokenize(b"Hello there"))
    state = llm.save_state()
    llm.close()
    for call in (
        lambda: llm.kv_memory(),
        lambda: llm.eval([1, 2]),
        lambda: llm.save_state(),
        lambda: llm.load_state(state),
        lambda: llm.save_session(tmp_path / "s.kvz"),
        lambda: list(llm.eval_logits([1, 2])),
    ):
        with pytest.raises(ValueError, match="closed"):
            call()
    assert not (tmp_path / "s.kvz").exists()


def test_pickling_or_copying_a_compressed_llama_is_refused(smollm2_path):
    llm = Llama(str(smollm2_path), kv_codec="tiered", n_ctx=1024, verbose=False)
    try:
        for dup in (pickle.dumps, copy.copy, copy.deepcopy):
            with pytest.raises(TypeError, match="cannot be pickled or copied"):
                dup(llm)
    finally:
        llm.close()


@pytest.mark.parametrize(
    "kwargs", [dict(hot="64"), dict(hot=64.5), dict(block=True), dict(warm=None), dict(archive=2), dict(sinks=1.0)]
)
def test_tiered_config_checks_types_when_made(kwargs):
    with pytest.raises(TypeError, match="TieredConfig"):
        TieredConfig(**kwargs)


def test_codec_names_with_a_nul_are_unknown():
    with pytest.raises(ValueError, match="unknown"):
        codecs.get("rotq3\x00junk")
    assert codecs.get("rotq3").name == "rotq3"


def test_context_errors_name_the_logical_context(smollm2_path):
    llm = Llama(str(smollm2_path), kv_codec="tiered", n_ctx=1024, verbose=False)
    try:
        with pytest.raises(ValueError, match="context window of 1024"):
            llm.create_completion("word " * 1500, max_tokens=2)
        out = llm.create_completion("The sky is", max_tokens=2, temperature=0.0)  # still usable
        assert out["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


@pytest.mark.parametrize("context_shift", [False, True])
def test_a_stock_context_not_a_multiple_of_256_is_the_size_asked_for(smollm2_path, context_shift):
    """llama.cpp pads n_ctx=300 to 512, llama-cpp-python's token buffer holds 300: a longer prompt
    raised numpy's broadcast error; it is refused as too long, or shifts at 300."""
    llm = Llama(str(smollm2_path), n_ctx=300, context_shift=context_shift, n_threads=1, verbose=False)
    try:
        assert llm.n_ctx() == 300
        prompt = "word " * 400
        if not context_shift:
            with pytest.raises(ValueError, match="context window of 300"):
                llm.create_completion(prompt, max_tokens=2)
        else:
            llm.eval(llm.tokenize(prompt.encode()))
            assert llm.context_shifts > 0 and llm.n_tokens <= 300
    finally:
        llm.close()


@pytest.mark.parametrize("kv_codec", ["tiered", None])
def test_a_missing_model_raises_what_stock_raises(tmp_path, kv_codec):
    for path in (tmp_path / "missing.gguf", tmp_path):
        with pytest.raises(ValueError):
            Llama(str(path), kv_codec=kv_codec, verbose=False)


def test_decode_checks_the_size_before_allocating():
    blob = codecs.get("rotq4").encode(np.zeros((4, 2, 64), np.float32))
    with pytest.raises(ValueError, match="needs"):
        codecs.get("rotq4").decode(blob, (2**24, 64, 64))  # would be 256 GiB of floats


@pytest.mark.parametrize("kv_codec", ["tiered", None])
def test_a_session_of_an_empty_context_loads(smollm2_path, tmp_path, kv_codec):
    llm = Llama(str(smollm2_path), kv_codec=kv_codec, n_ctx=512, verbose=False)
    try:
        llm.save_session(tmp_path / "empty.kvz")
        llm.eval(llm.tokenize(b"Some words first"))
        info = llm.load_session(tmp_path / "empty.kvz")
        assert info.n_tokens == 0 and llm.n_tokens == 0
        out = llm.create_completion("The sky is", max_tokens=2, temperature=0.0)
        assert out["usage"]["completion_tokens"] > 0
    finally:
        llm.close()


# A closed Llama refuses every call

CLOSED_CALLS = {
    "tokenize": "llm.tokenize(b'hi')",
    "detokenize": "llm.detokenize([1, 2])",
    "create_completion": "llm.create_completion('hi', max_tokens=1)",
    "create_chat_completion": "llm.create_chat_completion([{'role': 'user', 'content': 'hi'}], max_tokens=1)",
    "__call__": "llm('hi', max_tokens=1)",
    "embed": "llm.embed('hi')",
    "create_embedding": "llm.create_embedding('hi')",
    "generate": "next(llm.generate([1, 2]))",
    "eval": "llm.eval([1, 2])",
    "n_vocab": "llm.n_vocab()",
    "token_eos": "llm.token_eos()",
    "save_state": "llm.save_state()",
    "kv_memory": "llm.kv_memory()",
}


@pytest.mark.parametrize("kv_codec", [None, "tiered"])
def test_a_closed_llama_refuses_every_call_clearly(smollm2_path, kv_codec):
    # In a child process: before the fix these calls ended the process (SIGSEGV).
    code = f"""
import kvgguf
llm = kvgguf.Llama({str(smollm2_path)!r}, kv_codec={kv_codec!r}, n_ctx=512, verbose=False)
llm.close()
for name, call in {CLOSED_CALLS!r}.items():
    try:
        eval(call)
    except ValueError as e:
        assert "this Llama is closed" in str(e), (name, e)
    else:
        raise AssertionError(name + " ran on a closed Llama")
llm.close()  # twice is fine
print("all refused")
"""
    proc = run_python(code)
    assert proc.returncode == 0 and "all refused" in proc.stdout, proc.stderr[-2000:]


# Smaller


def test_an_oversized_ubatch_is_refused_by_its_own_name():
    with pytest.raises(ValueError, match=r"TieredConfig.ubatch \(1000000\) must not exceed hot"):
        TieredConfig(ubatch=10**6)


# Messages name what the user passed


@pytest.mark.parametrize("value, shown", [("q8_0", "'q8_0'"), (llama_cpp.GGML_TYPE_Q4_0, "'q4_0'")])
def test_a_quantized_type_with_a_kv_codec_is_refused_by_its_name(smollm2_path, value, shown):
    with pytest.raises(ValueError, match=f"type_k must be f16 or None \\(got {shown}\\)"):
        Llama(str(smollm2_path), kv_codec="tiered", type_k=value, n_threads=1, verbose=False)
