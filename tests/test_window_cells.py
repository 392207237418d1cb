"""The sliding-window layers' cells in a type of their own (TieredConfig.window, patch set 12):
q8_0 unless told, where llama.cpp can hold it; counted at their real bytes; saved and restored
by sessions; and only in the context that asked. Tiny random-weight Gemma 2 models (one layer
slides over 32 tokens, one is full): head dim 32 takes q8_0's blocks of 32, head dim 16 not."""

from __future__ import annotations

from dataclasses import replace

import llama_cpp
import numpy as np
import pytest

import tiny_models
from kvgguf import Llama, TieredConfig
from kvgguf.cli import inspect
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.llamacpp import hooks, support
from kvgguf.model.shape import KVShape
from kvgguf.policy import kv_codec
from tiny_models import TinySpec

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)
CONFIG = TieredConfig(hot=96, block=32, sinks=4, warm="rotq4", warm_tokens=0, archive=None)
Q8_0, F16 = 8, 1  # ggml type numbers


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("window-cells")
    return {
        hd: str(tiny_models.write(folder / f"gemma2-hd{hd}.gguf", TinySpec("gemma2", head_dim=hd), smollm2_path))
        for hd in (32, 16)
    }


@pytest.fixture(scope="module")
def text_tokens(smollm2_path):
    vocab = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    return vocab.tokenize(wikitext2_test()[:4000].encode("utf-8"))


def test_kv_codec_strings_name_the_window_type():
    assert kv_codec.parse("tiered")[0].window is None  # q8_0 where llama.cpp can hold it
    assert kv_codec.parse("tiered:window=f16")[0].window == "f16"
    config, request = kv_codec.parse("auto:3.5:window=q4_0")
    assert config.window == "q4_0" and request.budget == 3.5
    assert kv_codec.parse("k:rotq4,v:rotq2:window=q8_0")[0].warm == ("rotq4", "rotq2")
    assert kv_codec.parse("tiered:keep=mass:0.5:window=f16")[0].keep_fraction == 0.5
    with pytest.raises(ValueError, match="q8_0, q5_1"):
        kv_codec.parse("tiered:window=q9")
    with pytest.raises(ValueError, match="TieredConfig.window"):
        TieredConfig(window="q9")


def test_window_cells_hold_q8_0_unless_told_and_are_counted_at_their_bytes(models, text_tokens):
    path = models[32]
    shape = KVShape.from_gguf(path)
    held = {}
    for window in (None, "f16"):
        config = replace(CONFIG, window=window)
        llm = Llama(path, kv_codec=config, n_ctx=1024, flash_attn=True, **KW)
        llm.eval(text_tokens[:400])
        mem = llm.kv_memory()
        want = inspect.kvgguf_bytes(shape, 1024, config, n_tokens=400)
        assert llm.kv_config.window == (window or "q8_0")
        assert support.window_type(llm.ctx, shape) == (F16 if window else Q8_0)
        assert mem.by_tier["window"].codec == llm.kv_config.window
        assert mem.by_tier["window"].bytes == want["window"] > 0
        assert mem.by_tier["hot"].bytes == want["hot"]
        assert mem.by_tier["hot"].bytes + mem.by_tier["window"].bytes == hooks.kv_bytes(llm.ctx)
        assert mem.cold_bytes == want["store"] > 0
        held[window] = mem.by_tier["window"].bytes
        llm.close()
    assert held[None] * 64 == held["f16"] * 34  # q8_0: 34 bytes per 32 values, f16 64


def test_a_window_type_llama_cpp_cannot_hold_is_refused_when_named_and_avoided_when_not(models):
    shape16 = KVShape.from_gguf(models[16])
    llm = Llama(models[16], kv_codec=CONFIG, n_ctx=512, flash_attn=True, **KW)
    assert llm.kv_config.window == "f16" and support.window_type(llm.ctx, shape16) == F16
    llm.close()
    with pytest.raises(ValueError, match="blocks of 32 divide"):
        Llama(models[16], kv_codec=replace(CONFIG, window="q8_0"), n_ctx=512, flash_attn=True, **KW)
    with pytest.raises(ValueError, match="flash attention"):
        Llama(models[32], kv_codec="rotq4:window=q8_0", n_ctx=512, flash_attn=False, **KW)
    llm = Llama(models[32], kv_codec=CONFIG, n_ctx=512, flash_attn=False, **KW)
    assert llm.kv_config.window == "f16"
    llm.close()


def test_the_window_type_holds_for_the_context_that_asked_only(models):
    path = models[32]
    shape = KVShape.from_gguf(path)
    assert hooks.set_window_types(-3, F16) == -1  # not a ggml type
    llm = Llama(path, kv_codec=CONFIG, n_ctx=512, flash_attn=True, **KW)
    stock = llama_cpp.Llama(path, n_ctx=512, flash_attn=True, **KW)  # same thread, after it
    assert support.window_type(llm.ctx, shape) == Q8_0
    assert support.window_type(stock.ctx, shape) == F16
    stock.close()
    llm.close()


def test_sessions_round_trip_quantized_window_cells(models, text_tokens, tmp_path):
    path = models[32]
    llm = Llama(path, kv_codec=CONFIG, n_ctx=1024, flash_attn=True, logits_all=True, **KW)
    llm.eval(text_tokens[:300])
    llm.save_session(tmp_path / "s.kvz", exact=True)
    again = Llama(path, kv_codec=CONFIG, n_ctx=1024, flash_attn=True, logits_all=True, **KW)
    again.load_session(tmp_path / "s.kvz")
    assert again.n_tokens == 300 and again.kv_memory().by_tier["window"].codec == "q8_0"
    for m in (llm, again):
        m.eval(text_tokens[300:301])
    assert np.array_equal(llm.scores[300], again.scores[300])

    # a context whose window cells are f16 cannot take them, and keeps what it held
    other = Llama(path, kv_codec=replace(CONFIG, window="f16"), n_ctx=1024, flash_attn=True, **KW)
    other.eval(text_tokens[:50])
    with pytest.raises(Exception, match="window"):
        other.load_session(tmp_path / "s.kvz")
    assert other.n_tokens == 50
    other.eval(text_tokens[50:51])
    for m in (llm, again, other):
        m.close()
