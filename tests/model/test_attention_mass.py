"""Attention mass per granule of cold rows (native/src/store/mass.c, KVStore.mass, Llama.kv_attention_mass):
the share of each query's softmax that rows [64 g, 64 g + 64) received, summed over queries, must
be what float64 softmax over the decoded rows gives, whichever way the rows are split between
attend calls, and in a live model a token the model must look back at must draw more of it."""

from __future__ import annotations

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.binding import get_lib
from kvgguf.enums import Kind
from kvgguf.bindings.store import MASS_ROWS

from test_attend import build, merge, queries, N_ROWS

LEVELS = codecs.simd_levels()  # scalar, then AVX2 or NEON where this build and CPU have it


def test_granule_size_agrees_with_the_header():
    assert MASS_ROWS == int(get_lib().KVG_MASS_ROWS)


def reference_mass(store, il, r0, r1, q, scale, extra_max=None, extra_sum=None):
    """Per granule of rows, the float64 softmax weight the rows got, summed over queries; the
    normalizer may include rows outside [r0, r1) (extra_max / extra_sum: their max and sum)."""
    n_head_kv = store.n_head_kv
    dk = store.head_dim[0]
    k = store.decode(il, Kind.K, r0, r1).reshape(r1 - r0, n_head_kv, dk).astype(np.float64)
    kv_head = np.arange(q.shape[1]) // (q.shape[1] // n_head_kv)
    s = scale * np.einsum("thd,rhd->thr", q.astype(np.float64), k[:, kv_head])
    m = s.max(-1)
    if extra_max is not None:
        m = np.maximum(m, extra_max)
    w = np.exp(s - m[..., None])
    total = w.sum(-1) + (0.0 if extra_max is None else extra_sum * np.exp(extra_max - m))
    p = (w / total[..., None]).sum(axis=(0, 1))  # [rows]
    rows = np.arange(r0, r1)
    out = np.zeros(-(-N_ROWS // MASS_ROWS))
    np.add.at(out, rows // MASS_ROWS, p)
    return out


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    "k_codec,v_codec,n_head_kv,n_head",
    [("f16", "f16", 1, 1), ("rotq4", "rotq2", 3, 9), ("kivi2", "crotq3", 1, 3), ("crotq4", "kivi4", 3, 3)],
)
def test_mass_is_the_softmax_share_of_each_granule(k_codec, v_codec, n_head_kv, n_head, level):
    store = build(k_codec, v_codec, 64, n_head_kv)
    rng = np.random.default_rng(7)
    q = queries(rng, 2, n_head, 64)
    scale = 0.125
    store.set_mass(True)
    with codecs.force_simd(level):
        # three calls on pieces that cut granules and blocks, as ggml's threads would, then one merge
        parts = [store.attend(1, a, b, q, scale) for a, b in ((0, 50), (50, 131), (131, N_ROWS))]
    m, l, _ = parts[0]
    for p in parts[1:]:
        m, l, _ = merge((m, l, _), p)
    store.bring_in_mass(1, m, l)
    got = store.mass(1)
    want = reference_mass(store, 1, 0, N_ROWS, q, scale)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=1e-6)
    assert got.sum() == pytest.approx(2 * n_head, rel=1e-4)  # every query's whole softmax lies in these rows
    assert store.mass_dropped == 0


def test_rows_outside_the_store_take_their_share_of_the_normalizer():
    """Hot cells llama.cpp holds also draw attention: with their max and sum in the normalizer the
    cold granules get less than the whole softmax."""
    store = build("rotq3", "rotq3", 64, 1)
    rng = np.random.default_rng(3)
    q = queries(rng, 1, 3, 64)
    store.set_mass(True)
    m, l, _ = store.attend(1, 0, N_ROWS, q, 0.125)
    hot_max = m + 1.0  # pretend the hot cells scored higher
    hot_sum = np.full_like(l, 5.0)
    M = np.maximum(m, hot_max)
    L = l * np.exp(m - M) + hot_sum * np.exp(hot_max - M)
    store.bring_in_mass(1, M, L)
    got = store.mass(1)
    np.testing.assert_allclose(
        got, reference_mass(store, 1, 0, N_ROWS, q, 0.125, hot_max, hot_sum), rtol=2e-4, atol=1e-7
    )
    assert 0 < got.sum() < 3


def test_mass_adds_up_over_steps_and_follows_truncate_and_clear():
    store = build("kivi4", "kivi4", 64, 1)
    rng = np.random.default_rng(5)
    store.set_mass(True)
    for _ in range(3):
        q = queries(rng, 1, 1, 64)
        m, l, _ = store.attend(1, 0, N_ROWS, q, 0.125)
        store.bring_in_mass(1, m, l)
    got = store.mass(1)
    assert got.sum() == pytest.approx(3.0, rel=1e-4)
    store.truncate(100)  # granule 1 is cut: it keeps its count; granules 2-4 are gone
    after = store.mass(1)
    assert after.size == 2 and np.array_equal(after, got[:2])
    store.append(1, Kind.K, 1, "kivi4", np.zeros((200, 64), np.float32))
    store.append(1, Kind.V, 1, "kivi4", np.zeros((200, 64), np.float32))
    assert not store.mass(1)[2:].any()
    store.clear_mass()
    assert not store.mass(1).any()


def test_collection_off_notes_nothing_and_notes_of_another_layer_are_dropped():
    store = build("f16", "f16", 64, 1, il=2)
    q = queries(np.random.default_rng(1), 1, 1, 64)
    m, l, _ = store.attend(2, 0, N_ROWS, q, 0.1)  # collection is off by default
    store.bring_in_mass(2, m, l)
    assert not store.mass(2).any() and store.mass_dropped == 0
    store.set_mass(True)
    m, l, _ = store.attend(2, 0, N_ROWS, q, 0.1)
    store.bring_in_mass(1, m, l)  # wrong layer: the notes are not counted anywhere
    assert not store.mass(2).any() and not store.mass(1).any()
    assert store.mass_dropped == 1


def test_bad_arguments_raise():
    store = build("f16", "f16", 64, 1)
    with pytest.raises(ValueError):
        store.bring_in_mass(1, np.zeros((1, 2), np.float32), np.zeros((2, 1), np.float32))
    with pytest.raises(ValueError):
        store.bring_in_mass(7, np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32))
    with pytest.raises(ValueError):
        store.mass(-1)


def crafted_context(path):
    """BOS, unrelated text with a fact at positions 150-162 (mass granule 2), 450 more tokens of
    text, then the start of the fact again, which the model can only complete by looking back."""
    import llama_cpp

    from kvgguf.evaluation.text import wikitext2_test

    vocab = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    filler = vocab.tokenize(wikitext2_test()[5000:20000].encode(), add_bos=False)
    fact = vocab.tokenize(b" The secret code of the vault is 7391.", add_bos=False)
    ask = vocab.tokenize(b" The secret code of the vault is", add_bos=False)
    context = [vocab.token_bos()] + filler[:149] + fact + filler[150:600]
    return context, ask, 150 // MASS_ROWS


@pytest.mark.parametrize("attention", ["fused", "expand"])
def test_live_mass_finds_the_token_the_model_looks_back_at(smollm2_path, attention):
    from kvgguf import Llama, TieredConfig

    context, ask, fact_granule = crafted_context(smollm2_path)
    cfg = TieredConfig(hot=128, sinks=4, warm="rotq4", warm_tokens=0, archive=None, block=32)
    llm = Llama(
        str(smollm2_path), kv_codec=cfg, kv_attention=attention, n_ctx=1024, n_batch=128, verbose=False, n_threads=2
    )
    try:
        llm.eval(context)  # ubatches of 128: fused (counted) up to FUSED_MAX_TOKENS, as generation is
        assert llm.kv_attention_mass(reset=True).any() == (attention == "fused")
        steps = 0
        for t in ask:
            llm.eval([t])
            steps += 1
        for _ in range(3):
            llm.eval([llm.sample(temp=0)])
            steps += 1
        mass = llm.kv_attention_mass(reset=True)
        n_cold = llm.kv_cache.n_cold
        assert mass.shape == (30, -(-n_cold // MASS_ROWS))
        if attention == "expand":  # only the fused path sees the scores
            assert not mass.any()
            return
        n_head = 9
        assert (mass >= 0).all()
        # every token's softmax is shared between these rows and the hot window
        assert mass.sum(axis=1).max() <= n_head * steps * (1 + 1e-4)
        assert mass.sum(axis=1).min() > 0
        per_granule = mass.sum(axis=0)
        g = fact_granule
        assert per_granule[g] > per_granule[g - 1] and per_granule[g] > per_granule[g + 1], per_granule
        assert not llm.kv_attention_mass().any()  # reset
    finally:
        llm.close()


def test_stock_cache_has_no_attention_mass(smollm2_path):
    from kvgguf import Llama

    llm = Llama(str(smollm2_path), n_ctx=256, verbose=False)
    try:
        with pytest.raises(ValueError, match="kv_codec"):
            llm.kv_attention_mass()
    finally:
        llm.close()
