"""llama.cpp's own cells in types of their own (patch set 12). The sliding-window layers' cells
(TieredConfig.window): q8_0 unless told, where llama.cpp can hold it; as many as the hot window's,
unpadded (patch set 14); counted at their real bytes; saved and restored by sessions; and only in
the context that asked. The hot window's
cells (TieredConfig.hot_cells): q8_0 on request, evicted and attended as f16 rows. Tiny
random-weight models: Gemma 2 (one layer slides over 32 tokens, one is full) and llama, with
head dim 32 or 64 (q8_0's blocks of 32 divide them) or 16 (they do not).
"""

from __future__ import annotations

import ctypes
from dataclasses import replace

import llama_cpp
import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

import tiny_models
from kvgguf import Llama, TieredConfig
from kvgguf.cli import inspect
from kvgguf.errors import SessionMismatchError
from kvgguf.llamacpp import hooks, support
from kvgguf.model.shape import KVShape
from kvgguf.policy import kv_codec
from tiny_models import TinySpec
from kvgguf.evaluation.harness import kl_top1
from helpers import wikitext_tokens

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)
CONFIG = TieredConfig(hot=96, block=32, sinks=4, warm="rotq4", warm_tokens=0, archive=None)
Q8_0, F16 = 8, 1  # ggml type numbers


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("window-cells")
    made = {
        hd: str(tiny_models.write(folder / f"gemma2-hd{hd}.gguf", TinySpec("gemma2", head_dim=hd), smollm2_path))
        for hd in (32, 16)
    }
    # head dim 64: llama.cpp would rotate its quantized cells (it rotates head dims of multiples of 64)
    made["llama"] = str(tiny_models.write(folder / "llama-hd64.gguf", TinySpec("llama", head_dim=64), smollm2_path))
    return made


@pytest.fixture(scope="module")
def text_tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 4000)


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
        assert llm.kv_cells == {"hot": "q8_0", "window": window or "q8_0"}
        assert support.window_type(llm.ctx, shape) == (F16 if window else Q8_0)
        assert mem.by_tier["window"].codec == llm.kv_cells["window"]
        assert mem.by_tier["window"].bytes == want["window"] > 0
        assert mem.by_tier["hot"].bytes == want["hot"]
        assert mem.by_tier["hot"].bytes + mem.by_tier["window"].bytes == hooks.kv_bytes(llm.ctx)
        assert mem.cold_bytes == want["store"] > 0
        held[window] = mem.by_tier["window"].bytes
        llm.close()
    assert held[None] * 64 == held["f16"] * 34  # q8_0: 34 bytes per 32 values, f16 64


def cells_held(llm, shape: KVShape, il: int) -> int:
    """How many cells layer il holds, from the bytes of its K and V (q8_0: 34 bytes per 32 values)."""
    k, v, n_bytes = hooks.cells_of(llm.ctx, il)
    assert k == v == Q8_0
    return n_bytes // ((shape.width(il, 0) + shape.width(il, 1)) // 32 * 34)


def test_window_layers_hold_as_many_cells_as_the_hot_window_unpadded(models):
    """The window layers hold hot + ubatch cells (patch set 14): LiveCache evicts a position from
    every layer, so llama.cpp's padding to 256 (and swa_full's n_ctx) would hold cells never used."""
    path = models[32]
    shape = KVShape.from_gguf(path)
    full, sliding = shape.full_layers[0], next(il for il in range(shape.n_layer) if il not in shape.full_layers)
    for swa_full in (True, False):
        llm = Llama(path, kv_codec=CONFIG, n_ctx=512, flash_attn=True, swa_full=swa_full, **KW)
        assert cells_held(llm, shape, sliding) == CONFIG.hot + CONFIG.ubatch == 128
        assert cells_held(llm, shape, full) == 256  # llama.cpp pads n_ctx (128) to 256
        llm.close()
    # a stock context the same thread makes next: llama.cpp's own sizes again
    stock = llama_cpp.Llama(path, n_ctx=512, n_ubatch=32, flash_attn=True, type_k=Q8_0, type_v=Q8_0, **KW)
    assert cells_held(stock, shape, sliding) == 512  # swa_full: the whole context
    stock.close()
    stock = llama_cpp.Llama(
        path, n_ctx=512, n_ubatch=32, flash_attn=True, type_k=Q8_0, type_v=Q8_0, swa_full=False, **KW
    )
    assert cells_held(stock, shape, sliding) == 256  # window 32 + ubatch 32, padded to 256
    stock.close()


def test_a_window_type_llama_cpp_cannot_hold_is_refused_when_named_and_avoided_when_not(models):
    shape16 = KVShape.from_gguf(models[16])
    llm = Llama(models[16], kv_codec=CONFIG, n_ctx=512, flash_attn=True, **KW)
    assert llm.kv_cells == {"hot": "f16", "window": "f16"} and support.window_type(llm.ctx, shape16) == F16
    llm.close()
    with pytest.raises(ValueError, match="blocks of 32 divide"):
        Llama(models[16], kv_codec=replace(CONFIG, window="q8_0"), n_ctx=512, flash_attn=True, **KW)
    with pytest.raises(ValueError, match="flash attention"):
        Llama(models[32], kv_codec="rotq4:window=q8_0", n_ctx=512, flash_attn=False, **KW)
    llm = Llama(models[32], kv_codec=CONFIG, n_ctx=512, flash_attn=False, **KW)
    assert llm.kv_cells == {"hot": "f16", "window": "f16"}
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
    with pytest.raises(SessionMismatchError, match="saved in q8_0 and this Llama holds them in f16"):
        other.load_session(tmp_path / "s.kvz")
    assert other.n_tokens == 50
    other.eval(text_tokens[50:51])
    for m in (llm, again, other):
        m.close()


HOT_Q8 = replace(CONFIG, warm="f16", sinks=0, hot_cells="q8_0")  # cold rows exact: what differs is the hot cells


def test_hot_cells_in_q8_0_are_evicted_and_attended(models, text_tokens):
    """Cold rows in f16 from the q8_0 cells: the expanding path (llama.cpp's attention over the f16
    rows) and the fused one (libkvgguf's kernels over the cells read as f16) agree, and both
    stay near stock llama.cpp with a q8_0 cache, which quantizes queries too."""
    path, toks = models["llama"], text_tokens[:308]
    stock = llama_cpp.Llama(path, n_ctx=1024, n_batch=32, n_ubatch=32, logits_all=True, flash_attn=True,
                            type_k=8, type_v=8, **KW)  # fmt: skip
    stock.eval(toks)
    out = {}
    for attention in ("expand", "fused"):
        llm = Llama(path, kv_codec=HOT_Q8, n_ctx=1024, n_batch=32, logits_all=True, kv_attention=attention, **KW)
        llm.eval(toks[:300])
        for t in toks[300:]:
            llm.eval([t])
        assert llm.kv_cache.n_cold >= 300 - 96 - 32
        mem = llm.kv_memory()
        assert mem.by_tier["hot"].codec == "q8_0"
        want = inspect.kvgguf_bytes(KVShape.from_gguf(path), 1024, HOT_Q8, n_tokens=308)
        assert mem.by_tier["hot"].bytes == want["hot"] == hooks.kv_bytes(llm.ctx)
        out[attention] = np.array(llm.scores[250:308])
        if attention == "fused":
            assert llm.kv_attention_mass().sum() > 0  # the fused path ran, saw the cold rows, counted them
        llm.close()
    kl, top1 = kl_top1(out["expand"], out["fused"])
    assert kl < 0.02 and top1 >= 0.75, (kl, top1)
    kl, top1 = kl_top1(np.array(stock.scores[250:308]), out["expand"])
    assert kl < 0.02 and top1 >= 0.75, (kl, top1)


def test_sessions_code_q8_0_rows_as_ggml_does():
    """kvgguf.session.q8_0 (a saved state's q8_0 cells) against gguf's copy of ggml's q8_0."""
    from kvgguf.session import q8_0

    x = np.random.default_rng(0).standard_normal((5, 64)).astype(np.float32)
    x[1, :32] = 0  # a block of zeros keeps scale 0
    raw = q8_0.quantize(x)
    assert np.array_equal(raw, quants.quantize(x, GGMLQuantizationType.Q8_0))
    assert np.array_equal(q8_0.dequantize(raw, 64), quants.dequantize(raw, GGMLQuantizationType.Q8_0))
    assert np.array_equal(q8_0.quantize(q8_0.dequantize(raw, 64)), raw)  # its own output round-trips


def test_q8_0_cells_leave_llama_cpp_as_ggml_dequantizes_them(models, text_tokens):
    """What an eviction or calibration reads out of q8_0 cells (llama_kvgguf_read_rows_f32) is
    ggml's dequantization of the raw rows: gguf's own copy of it agrees bit for bit, K and V."""
    llm = Llama(models["llama"], kv_codec=HOT_Q8, n_ctx=1024, n_batch=32, **KW)
    llm.eval(text_tokens[:64])
    assert llm.kv_cache.n_cold == 0 and hooks.cells_of(llm.ctx, 0)[:2] == (Q8_0, Q8_0)
    n = 40
    for kind in (0, 1):
        got = llm.kv_cache.read_rows(0, kind, 8, 8 + n)
        raw = np.empty((n, got.shape[1] // 32 * 34), dtype=np.uint8)
        pos = (ctypes.c_int32 * n)()
        assert hooks.read_rows(llm.ctx, 0, 0, kind, 8, 8 + n, raw.ctypes.data, raw.nbytes, pos) == n
        assert list(pos) == list(range(8, 8 + n))
        want = quants.dequantize(raw, GGMLQuantizationType.Q8_0)
        assert got.dtype == np.float32 and np.array_equal(got, want)
    with pytest.raises(RuntimeError, match="could not read positions"):
        llm.kv_cache.read_rows(0, 0, 60, 70)  # 64 tokens held: 64..69 are not
    llm.close()


def test_q8_0_hot_cells_hold_rows_as_the_model_makes_them(models, text_tokens):
    """llama.cpp rotates quantized cells (a Hadamard transform, queries rotated to match); kvgguf
    turns that off for the hot cells, whose rows leave for its store: its codecs rotate where they
    gain, and calibrations measured unrotated rows (rotated, rotq4 read 1.25x its KL on SmolLM2 at
    1K and the calibrated preset twice its KL on Gemma-3 at 4K)."""
    rows = {}
    for hot in ("f16", "q8_0"):
        llm = Llama(models["llama"], kv_codec=replace(HOT_Q8, hot_cells=hot), n_ctx=512, **KW)
        llm.eval(text_tokens[:50])
        rows[hot] = np.concatenate([llm.kv_cache.read_rows(0, kind, 0, 50) for kind in (0, 1)])
        llm.close()
    err = np.linalg.norm(rows["q8_0"] - rows["f16"]) / np.linalg.norm(rows["f16"])
    assert err < 0.02, err  # q8_0's own error only


def test_hot_cells_in_q8_0_are_refused_where_llama_cpp_cannot_read_them(models):
    with pytest.raises(ValueError, match="flash attention"):
        Llama(models["llama"], kv_codec="rotq4:hot=q8_0", n_ctx=512, flash_attn=False, **KW)
    with pytest.raises(ValueError, match="blocks of 32 divide"):
        Llama(models[16], kv_codec="rotq4:hot=q8_0", n_ctx=512, flash_attn=True, **KW)
    with pytest.raises(ValueError, match=":hot=q8_0"):
        Llama(models["llama"], kv_codec="rotq4", type_k="q8_0", n_ctx=512, **KW)


def test_sessions_round_trip_q8_0_hot_cells(models, text_tokens, tmp_path):
    path = models["llama"]
    llm = Llama(path, kv_codec=HOT_Q8, n_ctx=1024, logits_all=True, **KW)
    llm.eval(text_tokens[:300])
    llm.save_session(tmp_path / "s.kvz", exact=True)
    again = Llama(path, kv_codec=HOT_Q8, n_ctx=1024, logits_all=True, **KW)
    again.load_session(tmp_path / "s.kvz")
    for m in (llm, again):
        m.eval(text_tokens[300:301])
    assert np.array_equal(llm.scores[300], again.scores[300])
    plain = Llama(path, kv_codec=replace(HOT_Q8, hot_cells="f16"), n_ctx=1024, **KW)
    with pytest.raises(SessionMismatchError, match="saved in q8_0"):
        plain.load_session(tmp_path / "s.kvz")
    for m in (llm, again, plain):
        m.close()


def test_sessions_code_q8_0_hot_cells_in_the_session_codec(models, text_tokens, tmp_path):
    """A lossy session codes the q8_0 cells' values (rotq4 here) rather than keeping 8.5 bits
    raw, and quantizes them back to q8_0 when restored."""
    path = models["llama"]
    llm = Llama(path, kv_codec=replace(CONFIG, sinks=4), n_ctx=1024, **KW)
    llm.eval(text_tokens[:300])
    info = llm.save_session(tmp_path / "lossy.kvz", codec="rotq4")
    f16_cells = Llama(path, kv_codec=replace(CONFIG, sinks=4, hot_cells="f16"), n_ctx=1024, **KW)
    f16_cells.eval(text_tokens[:300])
    same = f16_cells.save_session(tmp_path / "f16-cells.kvz", codec="rotq4")
    f16_cells.close()
    # as many bytes as from f16 cells (raw, the 108 hot rows would have added 8.5 bits a value)
    assert abs(info.file_bytes - same.file_bytes) < 0.03 * same.file_bytes, (info.file_bytes, same.file_bytes)
    again = Llama(path, kv_codec=replace(CONFIG, sinks=4), n_ctx=1024, **KW)
    again.load_session(tmp_path / "lossy.kvz")
    a = [t for _, t in zip(range(6), llm.generate(text_tokens[:300], top_k=1, temp=0.0))]
    b = [t for _, t in zip(range(6), again.generate(text_tokens[:300], top_k=1, temp=0.0))]
    assert len(a) == len(b) == 6
    for m in (llm, again):
        m.close()
