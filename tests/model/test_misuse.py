"""Misuse a new user would try (issue "Nothing torn, nothing crashed", found by hand): each gets a
clear Python exception instead of a crash or a silently different object."""

import copy
import pickle

import numpy as np
import pytest

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
