"""`kvgguf inspect` predicts what live contexts hold: checked against kv_memory() of real
contexts of both models, for llama.cpp's own cache types (both sliding-window settings) and
kvgguf's tiered cache."""

from __future__ import annotations

import json

import pytest

import kvgguf
from kvgguf import Llama, TieredConfig
from kvgguf.cli import inspect
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.model.gguf_file import GGUFError, read_metadata
from kvgguf.model.shape import KVShape

from test_cli import run_cli

KW = dict(n_threads=2, n_threads_batch=2, verbose=False, flash_attn=True)


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_shape_is_the_gguf_metadata(name):
    path = kvgguf.models.path(name)
    meta = read_metadata(path)
    arch = meta["general.architecture"]
    shape = KVShape.from_gguf(path)
    assert (shape.arch, shape.n_layer, shape.n_head, shape.n_head_kv) == (
        arch, meta[f"{arch}.block_count"], meta[f"{arch}.attention.head_count"],
        meta[f"{arch}.attention.head_count_kv"])
    assert shape.n_swa == meta.get(f"{arch}.attention.sliding_window", 0)
    out = run_cli("inspect", name, "--json")
    assert out.returncode == 0, out.stderr
    card = json.loads(out.stdout)
    assert card["head_dim_k"] == shape.head_dim_k and card["full_attention_layers"] == shape.full_layers


def test_full_attention_layers_match_llama_cpp():
    """The sliding-window rule read from metadata agrees with the layers llama.cpp reports."""
    path = kvgguf.models.path("gemma3-270m")
    llm = Llama(str(path), kv_codec="tiered", n_ctx=1024, **KW)
    assert KVShape.from_gguf(path).full_layers == llm._kv.layers == [5, 11, 17]


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
@pytest.mark.parametrize("cache", ["f16", "q8_0", "q4_0"])
@pytest.mark.parametrize("n_ctx", [1000, 2048])
def test_llama_cpp_cache_bytes_are_predicted_exactly(name, cache, n_ctx):
    path = kvgguf.models.path(name)
    shape = KVShape.from_gguf(path)
    for swa_full in ((True, False) if shape.n_swa else (None,)):
        kw = {} if swa_full is None else {"swa_full": swa_full}
        llm = Llama(str(path), n_ctx=n_ctx, type_k=cache, type_v=cache, **kw, **KW)
        want = inspect.llama_cache_bytes(shape, n_ctx, cache, swa_full=swa_full is not False)
        assert llm.kv_memory().total_bytes == want, (name, cache, n_ctx, swa_full)
        llm.close()


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_tiered_cache_bytes_are_predicted(name):
    """The hot buffer and the store's blocks exactly (the policy's plans replayed over the same
    batches), and the total up to the store's index."""
    path = kvgguf.models.path(name)
    shape = KVShape.from_gguf(path)
    # with an archive tier at this length; on Gemma-3 the window covers the sliding window
    config = TieredConfig(hot=shape.n_swa + 64 if shape.n_swa else 256, warm_tokens=512)
    llm = Llama(str(path), kv_codec=config, n_ctx=4096, **KW)
    llm.eval(llm.tokenize(wikitext2_test()[:12000].encode())[:1800])
    mem = llm.kv_memory()
    assert mem.by_tier["archive"].bytes > 0
    want = inspect.kvgguf_bytes(shape, 4096, config, n_tokens=1800)
    assert want["n_cold"] == llm._kv.n_cold
    assert mem.by_tier["hot"].bytes == want["hot"]
    assert mem.cold_bytes == want["store"]
    assert 0 <= mem.total_bytes - want["hot"] - want["store"] == mem.index_bytes < 0.01 * mem.total_bytes


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path):
    for data in (b"", b"GGUF", b"NOPE" + bytes(40), b"GGUF" + bytes([3, 0, 0, 0]) + bytes(8) + bytes([9]) + bytes(7)):
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(data)
        with pytest.raises(GGUFError):
            read_metadata(bad)
