"""qjl3/qjl4 (issue 13): TurboQuant's inner-product quantizer (Zandieh et al. 2025,
arXiv:2504.19874, Algorithm 2) on QJL (Zandieh et al. 2024, arXiv:2406.03482). rotq at one bit
less gives x_hat; the residual r = x - x_hat keeps sign(S r) (S a d x d Gaussian matrix from the
seed) and ||r|| in f16; decode is x_hat + sqrt(pi/2)/d * ||r|| * S^T sign(S r), so q . decode(x)
is QJL's unbiased estimator of q . x.

Layout: residual norms [nv] f16, rotq's encoding at B - 1 bits, sign bits [nv][d] (1: >= 0).
Bits per value: B + 32/d."""

from __future__ import annotations

import concurrent.futures
import math

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError, KvgError
from helpers import kv_like, rel_mse

NAMES = [n for n in codecs.names() if codecs.family(n) == "qjl"]
ROTQ_OF = {"qjl3": "rotq2", "qjl4": "rotq3"}
BITS = {"qjl3": 3, "qjl4": 4}
DEFAULT_SEED = 0x6B766767756630  # KVG_DEFAULT_SEED
QJL_STREAM = 0x514A4C5F534B4554  # qjl.c: S's stream tag
GOLDEN = 0x9E3779B97F4A7C15
K_QJL = math.sqrt(math.pi / 2)  # QJL Lemma 3.2's dequantization constant (over m = d)


# ---- an independent model of the documented format ---------------------------------------


def _mix64(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def sketch_matrix(d: int, seed: int) -> np.ndarray:
    """S (d x d) as qjl.c builds it: splitmix64 from mix64(seed ^ tag), Box-Muller in double."""
    state0 = _mix64(np.array([seed ^ QJL_STREAM], np.uint64))
    k = np.arange(1, d * d + 1, dtype=np.uint64)
    v = _mix64(state0 + k * np.uint64(GOLDEN))
    u1 = ((v[0::2] >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53
    u2 = (v[1::2] >> np.uint64(11)).astype(np.float64) * 2.0**-53
    rad = np.sqrt(-2.0 * np.log(u1))
    s = np.empty(d * d, np.float64)
    s[0::2] = rad * np.cos(2 * np.pi * u2)
    s[1::2] = rad * np.sin(2 * np.pi * u2)
    return s.astype(np.float32).astype(np.float64).reshape(d, d)


def split(name, buf, shape, kind="k"):
    """(residual norms [nv] as float, rotq bytes, sign bits [nv][d] as 0/1)."""
    n, h, d = shape
    nv = n * h
    nr = codecs.get(ROTQ_OF[name]).encoded_size(shape, kind)
    assert len(buf) == 2 * nv + nr + (nv * d + 7) // 8
    rn = np.frombuffer(buf[: 2 * nv].tobytes(), np.float16).astype(np.float64)
    bits = np.unpackbits(buf[2 * nv + nr :], bitorder="little")[: nv * d].reshape(nv, d)
    return rn, buf[2 * nv : 2 * nv + nr], bits


# ---- round trips -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("n_heads", [1, 3])
@pytest.mark.parametrize("n_tokens", [1, 33, 70, 100])
def test_round_trip_matches_the_documented_format(name, head_dim, n_heads, n_tokens):
    shape = (n_tokens, n_heads, head_dim)
    nv, d = n_tokens * n_heads, head_dim
    x = kv_like(np.random.default_rng(n_tokens * 7 + n_heads + head_dim), shape)
    c, rq = codecs.get(name), codecs.get(ROTQ_OF[name])
    S = sketch_matrix(d, DEFAULT_SEED)
    for kind in ("k", "v"):
        buf = c.encode(x, kind)
        y = c.decode(buf, shape, kind).reshape(nv, d)
        rn, rbuf, z = split(name, buf, shape, kind)
        # the rotq part is rotq's own encoding at one bit less
        assert np.array_equal(rbuf, rq.encode(x, kind))
        xh = rq.decode(rbuf, shape, kind).reshape(nv, d)
        r = x.reshape(nv, d) - xh  # float32, as the encoder computes it
        # ||r|| in f16 (round to nearest: within half an f16 ulp)
        norm = np.linalg.norm(r.astype(np.float64), axis=1)
        assert np.all(np.abs(rn - norm) <= norm * 2.0**-11 * 1.001 + 1e-7)
        # sign(S r), except where (S r)_i is within float32 rounding of zero
        sr = r.astype(np.float64) @ S.T
        tie = np.abs(sr) <= 1e-5 * norm[:, None] * math.sqrt(d)
        assert np.all((z == (sr >= 0)) | tie)
        assert np.mean(tie) < 1e-3
        # decode = x_hat + sqrt(pi/2)/d * ||r|| * S^T z
        want = xh + (K_QJL / d) * rn[:, None] * ((2.0 * z - 1.0) @ S)
        scale = np.abs(want).max() + 1.0
        assert np.max(np.abs(y - want)) <= 2e-5 * scale
        # the reconstruction error is that of QJL's decode: E||r' - r||^2 = (pi/2) ||r||^2 (m = d)
        if nv * d >= 4096:
            err = np.sum((y - x.reshape(nv, d)) ** 2)
            assert 0.6 * (math.pi / 2) < err / np.sum(norm**2) < 1.5 * (math.pi / 2)


@pytest.mark.parametrize("name", NAMES)
def test_zero_and_exact_rows_cost_no_sketch(name):
    # rows that rotq reproduces exactly (zeros) have a zero residual: no sign bits, no noise
    x = np.zeros((5, 2, 64), np.float32)
    x[2, 1, 7] = 3.0  # one-hot rows are not exact for rotq: a nonzero residual
    c = codecs.get(name)
    buf = c.encode(x)
    rn, _, z = split(name, buf, x.shape)
    assert np.count_nonzero(rn) == 1 and rn[5] > 0
    assert not z[np.arange(10) != 5].any()
    y = c.decode(buf, x.shape)
    assert np.all(y[x.reshape(10, 64).any(axis=1).reshape(5, 2) == 0] == 0)


def test_private_matrices_beyond_the_cache_agree():
    # more (head_dim, seed) pairs than the cache holds: the private copies are the same S
    x = kv_like(np.random.default_rng(5), (3, 1, 32))
    for seed in range(1000, 1020):
        c = codecs.get("qjl3", seed=seed)
        buf = c.encode(x)
        assert np.array_equal(buf, c.encode(x))
        rn, rbuf, z = split("qjl3", buf, x.shape)
        xh = codecs.get("rotq2", seed=seed).decode(rbuf, x.shape).reshape(3, 32)
        S = sketch_matrix(32, seed)
        want = xh + (K_QJL / 32) * rn[:, None] * ((2.0 * z - 1.0) @ S)
        np.testing.assert_allclose(c.decode(buf, x.shape).reshape(3, 32), want, rtol=1e-5, atol=1e-5)


# ---- what it is for: an unbiased inner-product estimate --------------------------------------


def _errors(name, x, q, seeds):
    """q_v . decode(x)_v - q_v . x_v for each seed (rows) and vector (columns)."""
    exact = np.sum(q.astype(np.float64) * x, axis=-1).ravel()
    out = []
    for s in seeds:
        c = codecs.get(name, seed=s)
        y = c.decode(c.encode(x), x.shape)
        out.append(np.sum(q.astype(np.float64) * y, axis=-1).ravel() - exact)
    return np.array(out)


@pytest.mark.parametrize("name", NAMES)
def test_inner_product_estimate_is_unbiased_over_seeds(name):
    # q . x' over independent S (and rotq signs): mean error within 4 standard errors of zero,
    # for q = x (where rotq's shrinkage bias is largest) and for a correlated query.
    rng = np.random.default_rng(17)
    x = kv_like(rng, (6, 1, 64))
    q = np.concatenate([x[:3], x[3:] + rng.standard_normal((3, 1, 64)).astype(np.float32)])
    seeds = range(1, 2001)
    e = _errors(name, x, q, seeds)
    t = e.mean(axis=0) / (e.std(axis=0, ddof=1) / math.sqrt(len(seeds)))
    assert np.all(np.abs(t) < 4.0), t
    # rotq at the same bits (B) and at B - 1 shrinks inner products: the same test sees its bias
    for other in (ROTQ_OF[name], "rotq%d" % BITS[name]):
        eo = _errors(other, x[:3], q[:3], seeds)
        to = eo.mean(axis=0) / (eo.std(axis=0, ddof=1) / math.sqrt(len(seeds)) + 1e-30)
        assert np.all(to < -5.0), (other, to)


@pytest.mark.parametrize("name", NAMES)
def test_estimator_variance_within_qjl_bound(name):
    # QJL Lemma 3.2: Var_S(q . r') <= pi/(2m) ||r||^2 ||q||^2; over many vectors and one seed the
    # mean squared error of q . x' must stay within that bound (the bound is tight for q along r)
    rng = np.random.default_rng(23)
    n, d = 1024, 128
    x = kv_like(rng, (n, 1, d))
    q = rng.standard_normal((n, 1, d)).astype(np.float32)
    c, rq = codecs.get(name), codecs.get(ROTQ_OF[name])
    buf = c.encode(x)
    y = c.decode(buf, x.shape)
    rn = split(name, buf, x.shape)[0]
    e = np.sum(q.astype(np.float64) * (y - x), axis=-1).ravel()
    bound = math.pi / (2 * d) * rn**2 * np.sum(q.astype(np.float64) ** 2, axis=-1).ravel()
    assert np.mean(e**2) <= 1.25 * np.mean(bound)
    # and the noise is real: it is larger than rotq(B - 1)'s own error on these random queries
    eh = np.sum(q.astype(np.float64) * (rq.decode(rq.encode(x), x.shape) - x), axis=-1).ravel()
    assert np.mean(e**2) > np.mean(eh**2)


# ---- sizes -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(1, 1, 64), (33, 3, 128), (64, 1, 64), (64, 1, 256), (70, 2, 32)])
def test_bits_per_value_formula(name, shape):
    n, h, d = shape
    nv, N, B = n * h, n * h * d, BITS[name]
    c = codecs.get(name)
    want = 2 * nv + 2 * nv + (N * (B - 1) + 7) // 8 + (N + 7) // 8
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    assert len(c.encode(x)) == want == c.encoded_size(shape)
    assert c.bits_per_value(shape) == pytest.approx(want * 8 / N)
    if n == 64:
        assert c.bits_per_value(shape) == B + 32 / d  # (B-1) + 1 + 16/d + 16/d
        assert c.nominal_bits_per_value(d) == B + 32 / d


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("d", [48, 100, 8192])
def test_head_dim_must_be_a_power_of_two(name, d):
    with pytest.raises(KvgError, match=name):
        codecs.get(name).encoded_size((4, 1, d))


# ---- corrupt data ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [0x7E00, 0x7C00, 0xFC00, 0xBC00, 0x8000])  # NaN, +Inf, -Inf, -1, -0
@pytest.mark.parametrize("field", ["residual", "rotq"])
def test_corrupt_norms_are_detected_before_writing(name, bad, field):
    shape = (5, 3, 64)
    nv = 15
    c = codecs.get(name)
    buf = c.encode(kv_like(np.random.default_rng(2), shape))
    for v in (0, 7, nv - 1):
        b = buf.copy()
        off = 2 * v if field == "residual" else 2 * nv + 2 * v
        b[off : off + 2] = np.frombuffer(np.uint16(bad).tobytes(), np.uint8)
        out = np.full(shape, 123.0, np.float32)
        with pytest.raises(KvgCorruptError):
            c.decode_into(b, out)
        assert np.all(out == 123.0)


@pytest.mark.parametrize("name", NAMES)
def test_any_sign_bits_and_norms_decode_finite(name):
    rng = np.random.default_rng(9)
    shape = (7, 2, 256)
    c = codecs.get(name)
    n = c.encoded_size(shape)
    for _ in range(20):
        b = rng.integers(0, 256, n, dtype=np.uint8)
        h = np.uint16(0x7BFF)  # the largest finite f16 in every norm
        b[: 4 * 14] = np.frombuffer(np.full(28, h).tobytes(), np.uint8)
        y = c.decode(b, shape)
        assert np.all(np.isfinite(y))


# ---- determinism -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_seeded(name):
    x = kv_like(np.random.default_rng(3), (10, 2, 64))
    a, b = codecs.get(name, seed=1), codecs.get(name, seed=2)
    assert np.array_equal(a.encode(x), a.encode(x))
    assert np.array_equal(a.decode(a.encode(x), x.shape), a.decode(a.encode(x), x.shape))
    assert not np.array_equal(split(name, a.encode(x), x.shape)[2], split(name, b.encode(x), x.shape)[2])
    good = rel_mse(x, a.decode(a.encode(x), x.shape))
    wrong = rel_mse(x, b.decode(a.encode(x), x.shape))  # decoding with the wrong seed
    assert wrong > 3 * good


def test_threads_build_the_same_matrices():
    # threads race for the cache (a head_dim used nowhere else, several seeds): same bytes
    rng = np.random.default_rng(8)
    items = [
        (name, seed, rng.standard_normal((4, 2, 512)).astype(np.float32)) for name in NAMES for seed in (71, 72, 73)
    ]

    def work(item):
        name, seed, x = item
        c = codecs.get(name, seed=seed)
        buf = c.encode(x, "v")
        return buf, c.decode(buf, x.shape, "v")

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, items * 3))
    for item, (buf, y) in zip(items * 3, results):
        ref_buf, ref_y = work(item)
        assert np.array_equal(buf, ref_buf)
        assert np.array_equal(y, ref_y)
