"""wfq2 / wfq3 / wfq4 (native/src/codecs/wfq.c): bits per coordinate water-filled on its energy, the
coordinates of one width mixed by a fixed random rotation, Gaussian Lloyd-Max levels, an f16
gain per head vector; B bits per value held. The plan per (layer, kind) is the store's book."""

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError, KvgError
from kvgguf.bindings.store import KVStore
from kvgguf.enums import Kind, Tier
from helpers import rel_mse

NAMES = list(codecs.PLAN_CODECS)
# Gaussian Lloyd-Max MSE at 1..4 bits (Max 1960): what an equal-bits scalar code of unit-variance
# coordinates reaches at best
LLOYD_MAX = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}


def skewed(rng, n, h, d, spread=1.5):
    """Rows whose coordinates carry very different energies (as K/V channels do), the same
    spread for every row."""
    scale = np.exp(rng.normal(0.0, spread, (h, d)))
    return (rng.standard_normal((n, h, d)) * scale).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [16, 64, 96, 128, 256])
@pytest.mark.parametrize("n_tokens", [1, 33, 100])
def test_round_trip_with_its_own_plan(name, head_dim, n_tokens):
    rng = np.random.default_rng(head_dim + n_tokens)
    x = skewed(rng, max(n_tokens, 64), 3, head_dim)
    plan = codecs.train_book(name, x)
    assert plan.shape == (3, 3, head_dim)
    bits = int(name[-1])
    for h in range(3):
        perm, sigma, b = plan[h]
        assert sorted(perm.astype(int)) == list(range(head_dim)) and (sigma > 0).all()
        assert b.sum() == bits * head_dim - 16 and b.min() >= 1 and (np.diff(b) <= 0).all()
    c = codecs.get(name, book=plan)
    x = x[:n_tokens]
    buf = c.encode(x)
    assert c.bits_per_value(x.shape) == bits  # the gain included: B bits per value, from the bytes
    err = rel_mse(x, c.decode(buf, x.shape))
    # Water-filling on a skewed spectrum beats coding every coordinate alike with the same code
    # bits, on the rows the plan was fitted to, by far; at 16 coordinates wfq2 has 1 bit for each
    # and nothing to water-fill (its bound allows for the noise of one row of 16 values)
    equal = LLOYD_MAX[int(bits - 16 / head_dim)]
    assert err < (0.6 if head_dim > 16 else 1.15) * equal


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_it_beats_rotq_at_fewer_bits_on_skewed_rows(bits):
    rng = np.random.default_rng(bits)
    scale = np.exp(rng.normal(0.0, 1.5, (4, 64)))
    fit, test = ((rng.standard_normal((256, 4, 64)) * scale).astype(np.float32) for _ in range(2))  # held out
    w = codecs.get(f"wfq{bits}", book=codecs.train_book(f"wfq{bits}", fit))
    r = codecs.get(f"rotq{bits}")
    assert w.bits_per_value(test.shape) < r.bits_per_value(test.shape)
    e_w = rel_mse(test, w.decode(w.encode(test), test.shape))
    e_r = rel_mse(test, r.decode(r.encode(test), test.shape))
    assert e_w < 0.5 * e_r, (e_w, e_r)


def test_zero_constant_and_unseen_rows():
    rng = np.random.default_rng(3)
    x = skewed(rng, 64, 2, 64)
    x[5] = 0.0
    plan = codecs.train_book("wfq3", x)
    assert np.array_equal(plan, codecs.train_book("wfq3", x))  # deterministic
    c = codecs.get("wfq3", book=plan)
    assert np.array_equal(c.decode(c.encode(x), x.shape)[5], np.zeros((2, 64), np.float32))
    # a row unlike the plan (flat where it expects a skewed spectrum) loses its weak coordinates
    # to clipping: coded, but far worse than the rows the plan fits (which is why sinks stay f16)
    const = np.full((3, 2, 64), 2.5, np.float32)
    assert 0.05 < rel_mse(const, c.decode(c.encode(const), const.shape)) < 1.0
    # a plan fitted on all-zero rows is uniform: rows still code (as rotq-like equal bits)
    flat = codecs.train_book("wfq3", np.zeros((4, 2, 64), np.float32))
    assert set(np.unique(flat[:, 2])) <= {2.0, 3.0} and np.all(flat[:, 1] == 1.0)
    y = rng.standard_normal((8, 2, 64)).astype(np.float32)
    cf = codecs.get("wfq3", book=flat)
    assert rel_mse(y, cf.decode(cf.encode(y), y.shape)) < 0.1
    small = codecs.get("wfq3", book=codecs.train_book("wfq3", x * 1e-3))
    huge = np.full((1, 2, 64), 6e4, np.float32)  # a gain past f16 (rows far above the plan's): refused
    with pytest.raises(KvgError, match="f16"):
        small.encode(huge)


def test_bad_plans_and_bad_bytes_are_refused():
    rng = np.random.default_rng(4)
    x = skewed(rng, 16, 2, 64)
    plan = codecs.train_book("wfq3", x)
    with pytest.raises(KvgError, match="plan"):  # none
        codecs.get("wfq3").encode(x)
    with pytest.raises(KvgError, match="plan"):  # another shape's
        codecs.get("wfq3", book=plan[:1]).encode(x)
    for damage in ("duplicate", "scale", "bits", "fraction"):
        bad = plan.copy()
        if damage == "duplicate":
            bad[1, 0, 3] = bad[1, 0, 4]
        elif damage == "scale":
            bad[0, 1, 7] = 0.0
        elif damage == "bits":
            bad[0, 2, 0] += 1  # one bit too many
        else:
            bad[0, 2, 0] += 0.5
        with pytest.raises(KvgError, match="plan of head"):
            codecs.get("wfq3", book=bad).encode(x)
    c = codecs.get("wfq3", book=plan)
    buf = c.encode(x)
    out = np.full(x.shape, 7.0, np.float32)
    corrupt = buf.copy()
    vec = 2 + (3 * 64 - 16) // 8
    corrupt[vec : vec + 2] = np.frombuffer(np.float16(-1.0).tobytes(), np.uint8)  # vector 1's gain
    with pytest.raises(KvgCorruptError, match="gain"):
        c.decode_into(corrupt, out)
    assert (out == 7.0).all()  # nothing written
    with pytest.raises(KvgError, match="head_dim"):
        codecs.train_book("wfq3", np.ones((2, 1, 8), np.float32))
    assert codecs.fits("wfq2", 96) and not codecs.fits("wfq2", 8) and not codecs.fits("rotq2", 96)


def test_the_store_fits_a_plan_on_the_first_block_and_sessions_carry_it():
    rng = np.random.default_rng(5)
    st = KVStore(2, 2, 96, 96)  # a head dim rotations cannot take
    first, second = skewed(rng, 64, 2, 96), skewed(rng, 64, 2, 96)
    st.append(0, Kind.K, Tier.WARM, "wfq3", first.reshape(64, -1))
    plan = st.book(0, Kind.K, "wfq3")
    assert np.array_equal(plan, codecs.train_book("wfq3", first))
    st.append(0, Kind.K, Tier.WARM, "wfq3", second.reshape(64, -1))
    assert np.array_equal(st.book(0, Kind.K, "wfq3"), plan)  # not fitted again
    assert st.book_bytes() == 2 * 3 * 96 * 4
    assert [(il, kind, name) for il, kind, name, _ in st.books()] == [(0, Kind.K, "wfq3")]
    c = codecs.get("wfq3", book=plan)
    want = c.decode(c.encode(second), second.shape).reshape(64, -1)
    assert np.array_equal(st.decode(0, Kind.K, 64, 128), want)

    dst = KVStore(2, 2, 96, 96)
    with pytest.raises(KvgError, match="plan"):  # a block before its plan
        dst.append_encoded(0, Kind.K, st.blocks(0, Kind.K)[0])
    bad = plan.copy()
    bad[0, 2, :2] = [8, 8]
    with pytest.raises(KvgError, match="plan of head"):  # refused where it enters
        dst.set_book(0, Kind.K, "wfq3", bad)
    dst.set_book(0, Kind.K, "wfq3", plan)
    for block in st.blocks(0, Kind.K):
        dst.append_encoded(0, Kind.K, block)
    assert np.array_equal(dst.decode(0, Kind.K, 0, 128), st.decode(0, Kind.K, 0, 128))
