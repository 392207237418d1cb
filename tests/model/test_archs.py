"""Architectures and shapes beyond the two real models, on tiny random-weight GGUFs
(tests/tiny_models.py): an exact cold store gives stock llama.cpp's logits bit for bit, the
preset evicts, generates and saves, inspect predicts kv_memory(), head dims that rotations cannot
take are handled before the first token, and what kvgguf refuses it refuses clearly (install()
then falls back to stock)."""

from __future__ import annotations

import re

import llama_cpp
import numpy as np
import pytest

import kvgguf
from kvgguf import Llama, TieredConfig
from kvgguf.cli import inspect
from kvgguf.errors import UnsupportedModelError
from kvgguf.evaluation.harness import kl_top1
from kvgguf.llamacpp import support
from kvgguf.model.shape import KVShape

import tiny_models
from tiny_models import SPECS, TinySpec
from helpers import wikitext_tokens

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)
F16_COLD = TieredConfig(
    hot=64, sinks=0, warm="f16", warm_tokens=0, archive=None, block=32, window="f16", hot_cells="f16"
)


def test_every_architecture_the_readme_lists_as_tested_has_a_tiny_model():
    """support.TESTED_ARCHS (docs/models.md's table) is what these tests run: gemma3 and llama on
    their real models and tiny ones, the rest on tiny ones."""
    assert set(support.TESTED_ARCHS) == {spec.arch for spec in SPECS.values()} | {"gemma3"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("tiny-models")
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = tiny_models.write(folder / f"{name}.gguf", SPECS[name], smollm2_path)
        return made[name]

    return get


@pytest.fixture(scope="module")
def text_tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 4000)


@pytest.mark.parametrize("flash_attn", [True, False])
@pytest.mark.parametrize("name", list(SPECS))
def test_an_exact_cold_store_gives_stock_logits(tiny, text_tokens, name, flash_attn):
    path, toks = str(tiny(name)), text_tokens[:300]
    ref = llama_cpp.Llama(path, n_ctx=1024, n_batch=32, n_ubatch=32, logits_all=True, flash_attn=flash_attn, **KW)
    ref.eval(toks)
    got = Llama(
        path,
        kv_codec=F16_COLD,
        n_ctx=1024,
        n_batch=32,
        logits_all=True,
        flash_attn=flash_attn,
        kv_attention="expand",
        **KW,
    )
    got.eval(toks)
    assert got.kv_cache.n_cold >= 300 - 64 - 32
    assert np.array_equal(got.scores[:300], ref.scores[:300])


@pytest.mark.parametrize("name", list(SPECS))
def test_fused_attention_agrees_with_the_expanding_path(tiny, text_tokens, name):
    """Decode steps over 300 tokens, 236 of them cold: the bound and its reason are
    tests/model/test_fused_attention.py's (f32 against llama.cpp's f16 rounding). Soft-capping (gemma2)
    and sinks (granite_swa) are on the fused path (native/llama/src/llama-kvgguf-graph.cpp; tests/unit/test_attend.py checks
    the capped scores themselves)."""
    path, toks = str(tiny(name)), text_tokens[:308]
    out = {}
    for attention in ("expand", "fused"):
        llm = Llama(path, kv_codec=F16_COLD, n_ctx=1024, n_batch=32, logits_all=True, kv_attention=attention, **KW)
        llm.eval(toks[:300])
        for t in toks[300:]:
            llm.eval([t])
        out[attention] = np.array(llm.scores[300:308])
        if attention == "fused":
            assert llm.kv_attention_mass().sum() > 0  # the fused path ran and saw the cold rows
    kl, top1 = kl_top1(out["expand"], out["fused"])
    assert kl < 0.02 and top1 >= 0.75, (kl, top1)


@pytest.mark.parametrize("name", list(SPECS))
def test_the_preset_evicts_generates_saves_and_is_predicted(tiny, text_tokens, tmp_path, name):
    path = tiny(name)
    llm = Llama(str(path), kv_codec="tiered", n_ctx=2048, flash_attn=True, **KW)
    prompt = text_tokens[:600]
    out = [t for _, t in zip(range(8), llm.generate(prompt, top_k=1, temp=0.0))]
    assert len(out) == 8
    mem = llm.kv_memory()
    assert mem.cold_bytes > 0 and mem.by_tier["warm"].bytes > 0
    want = inspect.kvgguf_bytes(KVShape.from_gguf(path), 2048, llm.kv_config, n_tokens=llm.n_tokens)
    # inspect's plan replays batches of the preset's ubatch; generation adds one token a batch
    assert mem.by_tier["hot"].bytes == want["hot"]
    info = llm.save_session(tmp_path / "s.kvz")
    again = Llama(str(path), kv_codec="tiered", n_ctx=2048, flash_attn=True, **KW)
    again.load_session(tmp_path / "s.kvz")
    assert again.n_tokens == info.n_tokens == llm.n_tokens
    assert (
        len([t for _, t in zip(range(4), again.generate(again.input_ids[: info.n_tokens].tolist(), top_k=1, temp=0.0))])
        == 4
    )


def test_head_dims_rotations_cannot_take_are_settled_before_the_first_token(tiny, capsys):
    path = str(tiny("llama-hd96"))
    llm = Llama(path, kv_codec="tiered", n_ctx=1024, n_threads=1, verbose=True)
    assert llm.kv_config.warm == "kivi4" and llm.kv_config.archive == ("kivi4", "kivi2")
    assert "which rotations cannot take" in capsys.readouterr().err
    with pytest.raises(ValueError, match="rotq3 needs a power-of-two head_dim.*kivi"):
        Llama(path, kv_codec="rotq3", n_ctx=1024, **KW)
    with pytest.raises(ValueError, match="kv_codec='auto' calibrates codecs that rotate rows"):
        Llama(path, kv_codec="auto", n_ctx=1024, **KW)
    stock = Llama(path, n_ctx=512, **KW)
    stock.eval([1, 2, 3, 4])
    assert stock.save_session(tmp_session := path + ".kvz").codec == "kivi4"  # the default session codec fits
    assert stock.load_session(tmp_session).n_tokens == 4


def test_install_falls_back_to_stock_where_kvgguf_refuses(tiny, recwarn):
    kvgguf.install(kv_codec="rotq4")
    try:
        llm = llama_cpp.Llama(str(tiny("llama-hd80")), n_ctx=512, **KW)
    finally:
        kvgguf.uninstall()
    assert llm.kv_config is None
    assert any("rotq4 needs a power-of-two head_dim" in str(w.message) for w in recwarn)


def test_a_phi3_window_is_ignored_as_llama_cpp_ignores_it_and_uniform_arrays_are_read():
    meta = {
        "general.architecture": "phi3",
        "phi3.block_count": 2,
        "phi3.attention.head_count": 4,
        "phi3.attention.head_count_kv": [2, 2],
        "phi3.embedding_length": 64,
        "phi3.attention.sliding_window": 2047,
    }
    shape = KVShape.from_metadata(meta)
    assert (shape.n_swa, shape.full_layers, shape.n_head_kv) == (0, [0, 1], 2)
    qwen2 = {k.replace("phi3", "qwen2"): v for k, v in meta.items()} | {"general.architecture": "qwen2"}
    assert KVShape.from_metadata(qwen2).n_swa == 0  # llama.cpp's qwen2 never reads a window
    varying = KVShape.from_metadata(dict(meta, **{"phi3.attention.head_count_kv": [2, 4]}))
    assert (varying.kv_heads(0), varying.kv_heads(1), varying.values_per_token) == (2, 4, 2 * 16 * 2 + 4 * 16 * 2)
    assert "differ in KV heads" in varying.uneven_full_layers
    exaone4 = {k.replace("phi3", "exaone4"): v for k, v in meta.items()} | {"general.architecture": "exaone4"}
    assert KVShape.from_metadata(exaone4).n_swa == 0  # llama.cpp slides EXAONE 4 only at 64 layers
    exaone4_32b = KVShape.from_metadata(exaone4 | {"exaone4.block_count": 64, "exaone4.attention.head_count_kv": 2})
    assert (exaone4_32b.n_swa, exaone4_32b.full_layers[:2]) == (2047, [3, 7])


def test_gemma4_full_layers_hold_their_own_head_dims_and_kv_heads(tiny):
    """Gemma 4: sliding layers 16-wide x 2 KV heads, full ones 32-wide x 1 (key_length_swa and a
    per-layer head_count_kv): the store holds the full layers' shape, inspect predicts it."""
    shape = KVShape.from_gguf(tiny("gemma4"))
    assert (shape.full_layers, shape.n_head_kv, shape.head_dim_k, shape.uneven_full_layers) == ([1, 3], 1, 32, None)
    assert [shape.width(il, 0) for il in range(4)] == [32, 32, 32, 32] and shape.head_dim(0, 1) == 16


def test_full_layers_of_different_shapes_are_refused_and_run_stock(tmp_path, smollm2_path, recwarn):
    """deci (Nemotron) layers each have their own KV head count: kvgguf's store holds one shape,
    so kv_codec refuses before any token, while a stock context keeps every kvgguf service
    (kv_memory, sessions, inspect) and install() falls back to it."""
    path = str(tiny_models.write(tmp_path / "deci.gguf", TinySpec("deci", n_head_kv=(2, 1)), smollm2_path))
    with pytest.raises(UnsupportedModelError, match="full-attention layers differ in KV heads.*kv_codec=None"):
        Llama(path, kv_codec="tiered", n_ctx=512, **KW)
    stock = Llama(path, n_ctx=512, **KW)
    toks = stock.tokenize(b"one two three four five six")
    stock.eval(toks)
    assert stock.kv_memory().values_per_token == 2 * 16 * 2 + 1 * 16 * 2
    stock.save_session(tmp_path / "deci.kvz")
    again = Llama(path, n_ctx=512, **KW)
    assert again.load_session(tmp_path / "deci.kvz").n_tokens == len(toks)
    assert inspect.kv_table(KVShape.from_gguf(path))[-1]["unavailable"].startswith("its full-attention layers")
    kvgguf.install(kv_codec="tiered")
    try:
        assert llama_cpp.Llama(path, n_ctx=512, **KW).kv_config is None
    finally:
        kvgguf.uninstall()
    assert any("differ in KV heads" in str(w.message) for w in recwarn)


@pytest.mark.parametrize(
    "arch, why",
    [
        ("deepseek2", "layer 0's attention does not read llama.cpp's KV cache"),  # MLA: a K-only latent cache
        ("mamba", "no attention heads"),  # recurrent: a state, no KV cache
    ],
)
def test_what_kvgguf_cannot_hold_is_refused_by_what_llama_cpp_built(tmp_path, smollm2_path, arch, why, recwarn):
    path = str(tiny_models.write_refused(tmp_path / f"{arch}.gguf", arch, smollm2_path))
    with pytest.raises(UnsupportedModelError, match=f"{re.escape(path)} \\('{arch}'\\): .*{why}.*kv_codec=None"):
        Llama(path, kv_codec="tiered", n_ctx=512, **KW)
    stock = Llama(path, n_ctx=512, **KW)  # llama.cpp's own cache runs it
    stock.eval(stock.tokenize(b"hello world"))
    kvgguf.install(kv_codec="tiered")
    try:
        installed = llama_cpp.Llama(path, n_ctx=512, **KW)
    finally:
        kvgguf.uninstall()
    assert installed.kv_config is None
    assert any(why in str(w.message) for w in recwarn)


def test_every_supported_layer_is_on_the_hooked_path_and_soft_capping_expands(tiny):
    llm = Llama(str(tiny("gemma2")), kv_codec=F16_COLD, n_ctx=512, **KW)
    layers = support.attention_layers(llm._ctx.ctx, llm.kv_shape)
    assert layers == support.AttentionLayers((1,), ())  # odd layers full; soft-capping is fused
    llm = Llama(str(tiny("cohere2")), kv_codec=F16_COLD, n_ctx=512, **KW)
    assert support.attention_layers(llm._ctx.ctx, llm.kv_shape) == support.AttentionLayers((3,), ())
