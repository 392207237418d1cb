"""Tests of the native codecs through kvgguf.codecs: error bounds, byte layouts, bits per
value, SIMD against the scalar oracle, and bad or corrupt input."""

from __future__ import annotations

import concurrent.futures
import math
import re

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError
from helpers import kv_like

# The codecs as the library describes them (codecs.info), so a new one joins the generic tests.
NAMES = codecs.names()
KIVI = [n for n in NAMES if codecs.family(n) == "kivi"]
ROTQ = [n for n in NAMES if codecs.family(n) == "rotq"]
CROTQ = [n for n in NAMES if codecs.family(n) == "crotq"]
# need a trained codebook or plan (tests/unit/test_codec_pq.py, test_codec_wfq.py), so not in ALL's generic tests
BOOKED = list(codecs.BOOK_CODECS)
ALL = [n for n in NAMES if n not in BOOKED]
# codecs with side data per block (issue 13); their own tests are tests/test_codec_*.py
SIDE_DATA = [n for n in ALL if codecs.info(n).block_side_data]
POW2_HEAD_DIM = [n for n in ALL if codecs.info(n).head_dim_pow2]  # rotation-based: head_dim a power of two
# enum kvg_codec_type is append-only (its values are stored with encoded data): these keep their
# numbers, and new codecs come after them.
ENUM_ORDER = [
    "f16", "kivi2", "kivi3", "kivi4", "kivi8", "rotq1", "rotq2", "rotq3", "rotq4", "crotq2", "crotq3", "crotq4",
    "delta4", "pdelta4", "outl2", "outl3", "lowrank2", "lowrank3", "qjl3", "qjl4", "pq2", "vq8", "vq8f",
    "wfq2", "wfq3", "wfq4", "tcq2", "tcq3", "tcq4",
]  # fmt: skip
# Byte offset, in a (4, 2, 64) block, of an f16 field for which NaN, +-Inf and -1.0 are all
# corrupt (a norm or a scale), for test_corrupt_header_is_detected_before_writing.
SEED_HEADER_OFFSET = {
    "delta4": 258,
    "pdelta4": 258,
    "outl2": 6,
    "outl3": 6,
    "lowrank2": 6,
    "lowrank3": 6,
    "qjl3": 6,
    "qjl4": 6,
}

# MSE per unit variance of the optimal (Lloyd-Max) scalar quantizer of N(0, 1), by bits
# (Max 1960, Table I). rotq must stay within 1.25x of it (TurboQuant's claim is ~1x).
LLOYD_MAX_GAUSS = {1: 0.3634, 2: 0.1175, 3: 0.03454, 4: 0.009497}
# Lloyd-Max centroids of N(0, 1) (positive half), for head_dim -> infinity
LLOYD_MAX_GAUSS_CENTROIDS = {
    1: [0.7979],
    2: [0.4528, 1.5104],
    3: [0.2451, 0.7560, 1.3440, 2.1520],
    4: [0.1284, 0.3881, 0.6568, 0.9424, 1.2562, 1.6181, 2.0690, 2.7326],
}

HEAD_DIMS = [64, 128, 256]
N_HEADS = [1, 3]
N_TOKENS = [1, 33, 70, 100]  # not multiples of the default G = 32
F32_EPS = float(np.finfo(np.float32).eps)


def unpack_codes(code_bytes: np.ndarray, n: int, bits: int) -> np.ndarray:
    """Codes of the documented bitstream: code e in bits [e*B, e*B+B), little-endian."""
    assert len(code_bytes) == (n * bits + 7) // 8
    stream = np.unpackbits(np.asarray(code_bytes, dtype=np.uint8), bitorder="little")[: n * bits]
    return (stream.reshape(n, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)


def kivi_layout(buf, shape, kind, bits, group_size):
    """(min, scale, code) of every element, read from the layout kvgguf.h documents."""
    t, h, d = shape
    c = h * d
    if kind == "k":
        n_groups = -(-t // group_size) * c
        gidx = (np.arange(t)[:, None] // group_size) * c + np.arange(c)[None, :]
    else:
        n_cg = -(-c // group_size)
        n_groups = t * n_cg
        gidx = np.arange(t)[:, None] * n_cg + np.arange(c)[None, :] // group_size
    params = np.frombuffer(buf[: 4 * n_groups].tobytes(), dtype="<f2").reshape(n_groups, 2).astype(np.float32)
    codes = unpack_codes(buf[4 * n_groups :], t * c, bits).reshape(t, c)
    return params[gidx, 0], params[gidx, 1], codes


def kivi_bound(x, x_hat, mins, scales):
    """Half a stored step per element, plus slack: 1e-3 of the step for the float32
    (x - min) * (1/scale) near a half-step tie, and 4 float32 ulps of the magnitudes in
    min + code * scale. Constant groups (scale 0) store the value as f16: half an f16 ulp
    (2^-11 relative, 2^-25 absolute for f16 subnormals)."""
    step = 0.5 * scales * (1 + 1e-3) + 4 * F32_EPS * (np.abs(x) + np.abs(mins) + np.abs(x_hat))
    return np.where(scales == 0, np.abs(x) * 2.0**-11 + 2.0**-25, step)


def rotq_signs(seed: int, d: int) -> np.ndarray:
    """The documented sign rule: splitmix64 finalizer of seed + (i + 1) * golden gamma."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + np.arange(1, d + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return np.where((z >> np.uint64(63)) == 1, -1.0, 1.0)


def hadamard(d: int) -> np.ndarray:
    w = np.ones((1, 1))
    while w.shape[0] < d:
        w = np.block([[w, w], [w, -w]])
    return w


def rotq_reference_decode(buf, shape, bits, seed):
    """rotq decode in numpy (float64) from the documented layout: x = s * W(c) * norm / d."""
    t, h, d = shape
    nv = t * h
    norms = np.frombuffer(buf[: 2 * nv].tobytes(), dtype="<f2").astype(np.float64)
    codes = unpack_codes(buf[2 * nv :], nv * d, bits).reshape(nv, d)
    cb = codecs.rotq_codebook(bits, d).astype(np.float64)
    y = cb[codes] @ hadamard(d)
    return (y * (norms[:, None] / d) * rotq_signs(seed, d)[None, :]).reshape(shape)


# ---- the table -------------------------------------------------------------------------------


def test_names_in_enum_order():
    assert codecs.names()[: len(ENUM_ORDER)] == ENUM_ORDER


def test_codec_properties():
    # the B of the name (f16: 16; vq8f: vq8's 8)
    assert [codecs.get(n).bits for n in NAMES] == [int(re.search(r"\d+", n).group()) for n in NAMES]
    assert codecs.get("kivi2", group_size=64).group_size == 64
    assert codecs.get("rotq3", seed=7).seed == 7
    assert codecs.get("rotq3").seed == codecs.get("rotq3", seed=None).seed


# ---- f16 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(1, 1, 64), (33, 3, 64), (70, 1, 128), (100, 3, 256), (5, 7)])
def test_f16_round_trip_is_ieee_half(shape):
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32) * 100
    x.flat[:4] = [0.0, -0.0, 1e-8, 65504.0]  # zero, signed zero, subnormal in f16, f16 max
    buf = codecs.encode("f16", x)
    assert buf.tobytes() == x.astype("<f2").tobytes()  # round to nearest even, as numpy
    np.testing.assert_array_equal(codecs.decode("f16", buf, shape), x.astype(np.float16).astype(np.float32))


# ---- kivi ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", KIVI)
@pytest.mark.parametrize("kind", ["k", "v"])
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("n_heads", N_HEADS)
@pytest.mark.parametrize("n_tokens", N_TOKENS)
def test_kivi_round_trip_within_half_step(name, kind, head_dim, n_heads, n_tokens):
    rng = np.random.default_rng(n_tokens * 1000 + head_dim + n_heads)
    shape = (n_tokens, n_heads, head_dim)
    x = kv_like(rng, shape)
    x[:, 0, 1] = 0.3  # a constant key channel
    c = codecs.get(name)
    buf = c.encode(x, kind)
    x_hat = c.decode(buf, shape, kind)

    # The documented layout decodes to what the library decodes.
    mins, scales, codes = kivi_layout(buf, shape, kind, c.bits, c.group_size)
    assert codes.min() >= 0 and codes.max() <= 2**c.bits - 1
    assert np.all(scales >= 0)
    flat = x_hat.reshape(n_tokens, -1)
    np.testing.assert_allclose(flat, mins + codes.astype(np.float32) * scales, rtol=1e-6, atol=0)

    # Every element within half a step of the stored (f16) scale.
    xs = x.reshape(n_tokens, -1)
    worst = np.max(np.abs(flat - xs) - kivi_bound(xs, flat, mins, scales))
    assert worst <= 0, f"error exceeds half a step by {worst}"


@pytest.mark.parametrize("name", KIVI)
@pytest.mark.parametrize("kind", ["k", "v"])
def test_kivi_constant_groups_decode_to_f16_of_the_value(name, kind):
    for value in [0.0, 0.1, -3.7, 1e-6, 60000.0, -65504.0]:
        x = np.full((40, 2, 64), value, dtype=np.float32)
        x_hat = codecs.decode(name, codecs.encode(name, x, kind), x.shape, kind)
        np.testing.assert_array_equal(x_hat, x.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize("name", KIVI)
@pytest.mark.parametrize("group_size", [1, 7, 32, 64, 1000])
def test_kivi_group_sizes(name, group_size):
    rng = np.random.default_rng(group_size)
    shape = (37, 3, 24)  # 72 channels: neither dim a multiple of most G
    x = kv_like(rng, shape)
    c = codecs.get(name, group_size=group_size)
    for kind in ("k", "v"):
        buf = c.encode(x, kind)
        mins, scales, codes = kivi_layout(buf, shape, kind, c.bits, group_size)
        x_hat = c.decode(buf, shape, kind).reshape(37, -1)
        xs = x.reshape(37, -1)
        assert np.all(np.abs(x_hat - xs) <= kivi_bound(xs, x_hat, mins, scales))


def test_kivi_extreme_ranges():
    # the whole f16 range in one group, and groups narrower than an f16 subnormal step
    x = np.zeros((32, 1, 8), dtype=np.float32)
    x[:, 0, 0] = np.linspace(-65504, 65504, 32)
    x[:, 0, 1] = np.linspace(1e-9, 2e-9, 32)
    x[:, 0, 2] = np.linspace(-1e-30, 1e-30, 32)
    for name in KIVI:
        c = codecs.get(name)
        buf = c.encode(x, "k")
        mins, scales, _ = kivi_layout(buf, x.shape, "k", c.bits, c.group_size)
        x_hat = c.decode(buf, x.shape, "k").reshape(32, -1)
        assert np.all(np.isfinite(x_hat))
        xs = x.reshape(32, -1)
        assert np.all(np.abs(x_hat - xs) <= kivi_bound(xs, x_hat, mins, scales))


# ---- rotq ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ROTQ)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_rotq_mse_within_lloyd_max(name, head_dim, record_property):
    rng = np.random.default_rng(head_dim)
    x = rng.standard_normal((1000, 2, head_dim)).astype(np.float32)  # 2000 vectors
    c = codecs.get(name)
    x_hat = c.decode(c.encode(x), x.shape)
    ratio = float(np.mean((x - x_hat) ** 2) / np.mean(x**2))
    figure = LLOYD_MAX_GAUSS[c.bits]
    record_property("mse_over_lloyd_max", ratio / figure)
    assert ratio <= 1.25 * figure, f"{name} d={head_dim}: MSE {ratio:.5f} > 1.25 x {figure}"


@pytest.mark.parametrize("name", ROTQ)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
@pytest.mark.parametrize("n_heads", N_HEADS)
@pytest.mark.parametrize("n_tokens", N_TOKENS)
def test_rotq_round_trip_matches_documented_layout(name, head_dim, n_heads, n_tokens):
    rng = np.random.default_rng(n_tokens * 7 + head_dim + n_heads)
    shape = (n_tokens, n_heads, head_dim)
    x = kv_like(rng, shape) * 3.0
    c = codecs.get(name)
    buf = c.encode(x)
    assert len(buf) == 2 * n_tokens * n_heads + (x.size * c.bits + 7) // 8
    x_hat = c.decode(buf, shape)
    # norms: f16 of each head vector's L2 norm (1 f16 ulp for float32 summation order)
    norms = np.frombuffer(buf[: 2 * n_tokens * n_heads].tobytes(), dtype="<f2").astype(np.float64)
    np.testing.assert_allclose(norms, np.linalg.norm(x.astype(np.float64), axis=-1).ravel(), rtol=1e-3)
    # bytes -> values by the documented rule, in float64 numpy
    ref = rotq_reference_decode(buf, shape, c.bits, c.seed)
    np.testing.assert_allclose(x_hat, ref, rtol=1e-4, atol=1e-5 * float(np.max(norms)))
    # a loose bound per block: small blocks are noisy estimates of the MSE
    ratio = np.mean((x - x_hat) ** 2) / np.mean(x**2)
    assert ratio <= 2.5 * LLOYD_MAX_GAUSS[c.bits]


@pytest.mark.parametrize("name", ROTQ)
def test_rotq_zero_vectors_and_small_dims(name):
    c = codecs.get(name)
    for d in [2, 4, 8, 16, 4096]:
        x = np.random.default_rng(d).standard_normal((3, 2, d)).astype(np.float32)
        x[1, 0] = 0.0
        x_hat = c.decode(c.encode(x), x.shape)
        assert np.all(x_hat[1, 0] == 0.0)
        assert np.all(np.isfinite(x_hat))
        cos = np.sum(x[0] * x_hat[0], axis=-1) / (np.linalg.norm(x[0], axis=-1) * np.linalg.norm(x_hat[0], axis=-1))
        assert np.all(cos > 0.5)  # direction kept even at 1 bit


def test_rotq_seed_changes_signs_deterministically():
    x = np.random.default_rng(3).standard_normal((10, 2, 64)).astype(np.float32)
    a, b = codecs.get("rotq3", seed=1), codecs.get("rotq3", seed=2)
    assert np.array_equal(a.encode(x), a.encode(x))
    assert not np.array_equal(a.encode(x), b.encode(x))
    good = np.mean((a.decode(a.encode(x), x.shape) - x) ** 2)
    wrong = np.mean((b.decode(a.encode(x), x.shape) - x) ** 2)  # decoding with the wrong seed
    assert wrong > 10 * good


def test_rotq_scale_equivariance():
    x = np.random.default_rng(4).standard_normal((8, 3, 128)).astype(np.float32)
    c = codecs.get("rotq4")
    a = c.decode(c.encode(x), x.shape)
    b = c.decode(c.encode(x * 4.0), x.shape)  # powers of two scale the f16 norm exactly
    np.testing.assert_allclose(b, 4.0 * a, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("bits", [1, 2, 3, 4])
def test_rotq_codebook_symmetric_and_gaussian_limit(bits):
    for d in [2, 8, 64, 4096]:
        cb = codecs.rotq_codebook(bits, d)
        assert cb.shape == (2**bits,)
        assert np.all(np.diff(cb) > 0)
        np.testing.assert_array_equal(cb, -cb[::-1])
    # finite-d corrections are O(1/d): at d = 4096 within 2e-3 of the Gaussian codebook
    cb = codecs.rotq_codebook(bits, 4096)
    np.testing.assert_allclose(cb[2 ** (bits - 1) :], LLOYD_MAX_GAUSS_CENTROIDS[bits], atol=2e-3)


@pytest.mark.parametrize("d", [2, 8, 64, 256])
@pytest.mark.parametrize("bits", [1, 2, 4])
def test_rotq_codebook_is_lloyd_max_for_the_sphere_density(d, bits):
    # Centroid condition: each level is the mean of y = sqrt(d) sin(theta) over its cell,
    # under the density cos(theta)^(d-2) d theta (a coordinate of a uniform unit vector).
    cb = codecs.rotq_codebook(bits, d).astype(np.float64)
    edges = np.concatenate([[-math.sqrt(d)], (cb[1:] + cb[:-1]) / 2, [math.sqrt(d)]])
    th_edges = np.arcsin(np.clip(edges / math.sqrt(d), -1, 1))
    for i in range(len(cb)):
        th = np.linspace(th_edges[i], th_edges[i + 1], 200_001)
        w = np.cos(th) ** (d - 2)
        y = math.sqrt(d) * np.sin(th)
        mass = np.trapezoid(w, th) if hasattr(np, "trapezoid") else np.trapz(w, th)
        moment = np.trapezoid(w * y, th) if hasattr(np, "trapezoid") else np.trapz(w * y, th)
        assert moment / mass == pytest.approx(cb[i], abs=2e-5)


# ---- bits per value --------------------------------------------------------------------------

BPV_SHAPES = [
    (1, 1, 64),
    (31, 1, 64),
    (32, 2, 64),
    (33, 3, 64),
    (64, 3, 128),
    (100, 8, 128),
    (7, 1, 256),
    (5, 3, 8),
    (3, 2, 2),
]


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind", ["k", "v"])
def test_bits_per_value_is_measured_size(name, kind):
    rng = np.random.default_rng(0)
    c = codecs.get(name)
    for shape in BPV_SHAPES + [(9, 3, 5), (40, 1, 3)] * (name in KIVI + ["f16"]):
        x = rng.standard_normal(shape).astype(np.float32)
        buf = c.encode(x, kind)
        assert len(buf) == c.encoded_size(shape, kind)
        assert c.bits_per_value(shape, kind) == len(buf) * 8 / x.size
        assert codecs.bits_per_value(name, shape, kind) == len(buf) * 8 / x.size


@pytest.mark.parametrize("name", ALL)
def test_nominal_bits_per_value(name):
    c = codecs.get(name)
    for d in [64, 128, 256]:
        # whole groups: the nominal figure is exact (side-data codecs: a 64-row block of one head)
        x = np.zeros((64, 1, d) if name in SIDE_DATA else (128, 2, d), dtype=np.float32)
        measured = len(c.encode(x)) * 8 / x.size
        assert c.nominal_bits_per_value(d) == pytest.approx(measured, rel=1e-12)
    if name in SIDE_DATA:
        assert c.nominal_bits_per_value(128) > c.bits
        return
    expected = {
        "f16": 16.0,
        "kivi2": 3.0,
        "kivi3": 4.0,
        "kivi4": 5.0,
        "kivi8": 9.0,
        "rotq1": 1.125,
        "rotq2": 2.125,
        "rotq3": 3.125,
        "rotq4": 4.125,
        "crotq2": 2.25,
        "crotq3": 3.25,
        "crotq4": 4.25,
        "tcq2": 2.125,
        "tcq3": 3.125,
        "tcq4": 4.125,
    }.get(name)
    if expected is not None:
        assert c.nominal_bits_per_value(128) == expected
    assert codecs.get("kivi4", group_size=128).nominal_bits_per_value(128) == 4.25


# ---- SIMD against the scalar oracle ----------------------------------------------------------

SIMD_CASES = [
    ((1, 1, 64), 32),
    ((33, 3, 64), 32),
    ((70, 1, 128), 32),
    ((100, 3, 256), 32),
    ((65, 2, 8), 32),
    ((17, 3, 64), 7),
    ((9, 2, 16), 1),
    ((9, 3, 4), 32),
    ((9, 1, 2), 32),
    ((33, 3, 5), 32),
]


def special_values(rng, shape):
    x = kv_like(rng, shape)
    flat = x.reshape(-1)
    n = flat.size
    flat[rng.integers(0, n, max(1, n // 50))] = 0.0
    flat[rng.integers(0, n, max(1, n // 50))] = -0.0
    flat[rng.integers(0, n, max(1, n // 50))] = 1e-40  # float32 subnormal
    flat[rng.integers(0, n, max(1, n // 100))] = 3000.0
    if shape[0] > 3:
        x[2] = 0.0  # zero rows / vectors
        x[1] = -0.0
        x[3] = np.abs(x[3])
        x[3].reshape(-1)[::3] = -0.0  # groups whose min is zero of both signs
        x[3].reshape(-1)[1::3] = 0.0
    return x


@pytest.mark.skipif(codecs.simd_levels() == [0], reason="CPU or build without SIMD kernels: nothing to compare")
@pytest.mark.parametrize("name", ALL)
def test_simd_matches_scalar_oracle(name):
    """This build's SIMD kernels (AVX2 or NEON) write the scalar oracle's bytes."""
    rng = np.random.default_rng(5)
    level = codecs.simd_max_level()
    for shape, g in SIMD_CASES:
        if name in POW2_HEAD_DIM and shape[-1] & (shape[-1] - 1):
            continue
        x = special_values(rng, shape)
        c = codecs.get(name, group_size=g)
        for kind in ("k", "v"):
            with codecs.force_simd(0):
                b0 = c.encode(x, kind)
                y0 = c.decode(b0, shape, kind)
            with codecs.force_simd(level):
                b1 = c.encode(x, kind)
                y1 = c.decode(b0, shape, kind)
            assert np.array_equal(b0, b1), f"{name} {kind} {shape} G={g}: SIMD level {level} bytes differ"
            assert np.max(np.abs(y0 - y1), initial=0) <= 1e-6 * max(1.0, float(np.max(np.abs(y0))))


def test_force_simd_restores_level():
    before = codecs.simd_level()
    assert before in codecs.simd_levels() and codecs.simd_levels()[0] == 0
    with codecs.force_simd("scalar"):
        assert codecs.simd_level() == 0
    assert codecs.simd_level() == before
    for level in codecs.simd_levels():
        with codecs.force_simd(level):
            assert codecs.simd_level() == level
    assert codecs.simd_level() == before


@pytest.mark.parametrize("name,level", [("avx2", 1), ("neon", 2)])
def test_force_simd_refuses_levels_this_build_lacks(name, level):
    """A build has AVX2 (x86-64) or NEON (AArch64) kernels, not both: the other is refused by name
    and number, with the reason, and the level in force stays."""
    if level in codecs.simd_levels():
        pytest.skip(f"{name} is available here")
    before = codecs.simd_level()
    for arg in (name, level):
        with pytest.raises(codecs.KvgUnsupportedError, match=f"{level} \\({name}\\) is not supported"):
            with codecs.force_simd(arg):
                pass
        assert codecs.simd_level() == before


@pytest.mark.parametrize("bad", [3, -1, "sse4", True])
def test_force_simd_rejects_levels_that_do_not_exist(bad):
    with pytest.raises(ValueError, match="SIMD level must be one of"):
        with codecs.force_simd(bad):
            pass


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_input_raises(name, bad):
    x = np.random.default_rng(0).standard_normal((40, 2, 64)).astype(np.float32)
    for pos in [(0, 0, 0), (20, 1, 33), (39, 1, 63)]:
        y = x.copy()
        y[pos] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            codecs.encode(name, y, "k")
        y = x.copy()
        y[pos[0]] = bad  # a whole row
        with pytest.raises(ValueError, match="NaN or Inf"):
            codecs.encode(name, y, "v")


@pytest.mark.parametrize("name", ALL)
def test_out_of_f16_range_raises(name):
    x = np.ones((4, 1, 64), dtype=np.float32)
    x[2, 0, 5] = 1e6
    with pytest.raises(ValueError, match="f16"):
        codecs.encode(name, x)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("kind", ["k", "v"])
def test_decode_wrong_buffer_size_raises(name, kind):
    shape = (33, 3, 64)
    buf = codecs.encode(name, np.ones(shape, np.float32), kind)
    with pytest.raises(ValueError, match="bytes"):
        codecs.decode(name, buf[:-1], shape, kind)
    with pytest.raises(ValueError, match="bytes"):
        codecs.decode(name, np.concatenate([buf, [0]]).astype(np.uint8), shape, kind)
    with pytest.raises(ValueError):
        codecs.decode(name, b"", shape, kind)
    with pytest.raises(ValueError):  # right bytes, wrong shape
        codecs.decode(name, buf, (34, 3, 64), kind)


def test_unknown_codec_name():
    with pytest.raises(ValueError, match=r"codec 'rotq5' is unknown; choose one of: f16, kivi2, .*rotq4"):
        codecs.get("rotq5")
    with pytest.raises(ValueError, match="unknown"):
        codecs.encode("", np.ones((1, 64), np.float32))
    with pytest.raises(TypeError):
        codecs.get(3)


@pytest.mark.parametrize("name", ROTQ)
def test_rotq_rejects_head_dims(name):
    x = np.ones((4, 2, 96), np.float32)
    with pytest.raises(ValueError, match=rf"{name} needs a power-of-two head_dim.*got 96"):
        codecs.encode(name, x)
    for d in [1, 3, 96, 8192]:
        with pytest.raises(ValueError, match="power-of-two"):
            codecs.encoded_size(name, (4, 2, d))
        with pytest.raises(ValueError, match="power-of-two"):
            codecs.get(name).nominal_bits_per_value(d)


@pytest.mark.parametrize("name", ALL)
def test_bad_shapes_raise(name):
    c = codecs.get(name)
    for shape in [(0, 1, 64), (4, 0, 64), (4, 1, 0), (-1, 1, 64), (4, -2, 64), (4, 1, -64)]:
        with pytest.raises(ValueError):
            c.encoded_size(shape)
        with pytest.raises(ValueError):
            c.decode(b"\0" * 16, shape)
    with pytest.raises(ValueError):
        c.encode(np.zeros((0, 1, 64), np.float32))
    with pytest.raises(ValueError):
        c.encode(np.zeros((2, 1, 1, 64), np.float32))  # 4-D
    with pytest.raises(ValueError):
        c.encode(np.zeros(64, np.float32))  # 1-D
    with pytest.raises(ValueError):
        c.decode(b"", (2, 3, 4, 64))
    with pytest.raises(ValueError):
        c.encoded_size((4, 1, 64.0))
    with pytest.raises(ValueError):
        c.encoded_size((1 << 30, 1 << 20, 1 << 20))  # over 2^56 values


def test_native_rejects_bad_dims_directly():
    from kvgguf.bindings.binding import get_ffi, get_lib

    ffi, lib = get_ffi(), get_lib()
    out = ffi.new("size_t *")
    assert lib.kvg_encoded_size(lib.KVG_CODEC_KIVI4, 0, -1, 1, 64, ffi.NULL, out) == lib.KVG_ERR_SHAPE
    assert lib.kvg_encoded_size(lib.KVG_CODEC_KIVI4, 0, 1 << 40, 1 << 40, 64, ffi.NULL, out) == lib.KVG_ERR_SHAPE
    assert lib.kvg_encoded_size(lib.KVG_CODEC_KIVI4, 2, 1, 1, 64, ffi.NULL, out) == lib.KVG_ERR_INVALID_ARG
    assert lib.kvg_encoded_size(99, 0, 1, 1, 64, ffi.NULL, out) == lib.KVG_ERR_UNKNOWN_CODEC
    assert lib.kvg_encoded_size(lib.KVG_CODEC_ROTQ2, 0, 1, 1, 96, ffi.NULL, out) == lib.KVG_ERR_SHAPE
    assert lib.kvg_encoded_size(lib.KVG_CODEC_F16, 0, 1, 1, 64, ffi.NULL, ffi.NULL) == lib.KVG_ERR_INVALID_ARG
    src = ffi.new("float[]", 64)
    dst = ffi.new("uint8_t[]", 1024)
    assert (
        lib.kvg_encode(lib.KVG_CODEC_F16, 0, ffi.NULL, 64, 1, 1, 64, ffi.NULL, dst, 1024, ffi.NULL)
        == lib.KVG_ERR_INVALID_ARG
    )
    assert (
        lib.kvg_encode(lib.KVG_CODEC_F16, 0, src, 63, 1, 1, 64, ffi.NULL, dst, 1024, ffi.NULL)
        == lib.KVG_ERR_BUFFER_SIZE
    )
    assert (
        lib.kvg_encode(lib.KVG_CODEC_F16, 0, src, 64, 1, 1, 64, ffi.NULL, dst, 127, ffi.NULL) == lib.KVG_ERR_BUFFER_SIZE
    )
    assert lib.kvg_encode(lib.KVG_CODEC_F16, 0, src, 64, 1, 1, 64, ffi.NULL, dst, 128, ffi.NULL) == lib.KVG_OK
    out_f = ffi.new("float[]", 64)
    assert lib.kvg_decode(lib.KVG_CODEC_F16, 0, dst, 128, 1, 1, 64, ffi.NULL, out_f, 65) == lib.KVG_ERR_BUFFER_SIZE
    assert lib.kvg_codec_name(-1) == ffi.NULL and lib.kvg_codec_name(lib.kvg_codec_count()) == ffi.NULL
    t = ffi.new("int *")
    assert lib.kvg_codec_from_name(ffi.NULL, t) == lib.KVG_ERR_INVALID_ARG
    assert lib.kvg_set_simd_level(7) == lib.KVG_ERR_INVALID_ARG
    assert lib.kvg_rotq_codebook(5, 64, ffi.new("float[]", 32), 32) == lib.KVG_ERR_INVALID_ARG
    assert lib.kvg_rotq_codebook(2, 64, ffi.new("float[]", 3), 3) == lib.KVG_ERR_BUFFER_SIZE


def test_dtypes_and_layouts():
    rng = np.random.default_rng(9)
    x64 = rng.standard_normal((20, 2, 64))
    for name in ["f16", "kivi4", "rotq3"]:
        c = codecs.get(name)
        ref = c.encode(x64.astype(np.float32))
        assert np.array_equal(c.encode(x64), ref)  # float64 is converted
        assert np.array_equal(c.encode(x64.astype(np.float16)), c.encode(x64.astype(np.float16).astype(np.float32)))
        assert np.array_equal(c.encode(x64.astype(">f4")), ref)  # byte order converted
        assert np.array_equal(c.encode(x64.astype(np.float32).tolist()), ref)  # nested lists
        t = np.ascontiguousarray(x64.astype(np.float32).transpose(2, 1, 0)).transpose(2, 1, 0)  # not C-contiguous
        assert not t.flags.c_contiguous
        assert np.array_equal(c.encode(t), ref)
        two_d = x64[:, 0, :].astype(np.float32)
        assert np.array_equal(c.encode(two_d), c.encode(two_d[:, None, :]))  # 2-D is one head
        assert c.decode(c.encode(two_d), two_d.shape).shape == two_d.shape
        for bad in [x64.astype(np.int32), x64 > 0, x64.astype(np.complex64)]:
            with pytest.raises(TypeError, match="floating-point"):
                c.encode(bad)


def test_kinds_and_params_validation():
    x = np.ones((4, 64), np.float32)
    c = codecs.get("kivi2")
    assert np.array_equal(c.encode(x, "k"), c.encode(x, "key"))
    assert np.array_equal(c.encode(x, "v"), c.encode(x, "value"))
    assert np.array_equal(c.encode(x, "k"), c.encode(x, 0)) and np.array_equal(c.encode(x, "V"), c.encode(x, 1))
    for kind in ["keys", "kv", "", None, 2, True]:
        with pytest.raises(ValueError, match="kind"):
            c.encode(x, kind)
    for g in [0, -1, 2**31, 1.5, True]:
        with pytest.raises(ValueError, match="group_size"):
            codecs.get("kivi2", group_size=g)
    for s in [-1, 2**64, 1.0]:
        with pytest.raises(ValueError, match="seed"):
            codecs.get("rotq2", seed=s)


def test_decode_into_is_zero_copy_and_checks_out():
    x = np.random.default_rng(2).standard_normal((33, 3, 64)).astype(np.float32)
    c = codecs.get("rotq4")
    buf = c.encode(x)
    out = np.empty_like(x)
    assert c.decode_into(buf, out) is out
    np.testing.assert_array_equal(out, c.decode(buf, x.shape))
    np.testing.assert_array_equal(c.decode(bytes(buf), x.shape), out)  # bytes work too
    with pytest.raises(TypeError):
        c.decode_into(buf, np.empty(x.shape, np.float64))
    with pytest.raises(ValueError):
        c.decode_into(buf, np.empty((64, 3, 33), np.float32).transpose(2, 1, 0))
    ro = np.empty_like(x)
    ro.setflags(write=False)
    with pytest.raises(ValueError):
        c.decode_into(buf, ro)


# ---- corrupt data ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_random_buffers_never_crash(name):
    rng = np.random.default_rng(11)
    c = codecs.get(name)
    raised = 0
    for i in range(300):
        shape = [(3, 2, 64), (1, 1, 8), (5, 3, 16)][i % 3]
        kind = ("k", "v")[i % 2]
        buf = rng.integers(0, 256, c.encoded_size(shape, kind), dtype=np.uint8)
        try:
            y = c.decode(buf, shape, kind)
        except KvgCorruptError:
            raised += 1
            continue
        assert np.all(np.isfinite(y))
    if name != "f16":
        assert raised > 0  # random norms/scales are often negative or NaN


@pytest.mark.parametrize("name", ALL)
def test_corrupt_header_is_detected_before_writing(name):
    shape = (4, 2, 64)
    c = codecs.get(name)
    buf = c.encode(np.random.default_rng(1).standard_normal(shape).astype(np.float32))
    for bad in [0x7E00, 0x7C00, 0xFC00, 0xBC00]:  # NaN, +Inf, -Inf, -1.0
        b = buf.copy()
        off = 0 if name == "f16" else (2 if name in KIVI else 6)  # a value / a kivi scale / a rotq norm
        if name in SIDE_DATA:
            off = SEED_HEADER_OFFSET[name]
        if name in CROTQ:
            off += 2 * 64 * 2  # past the channel means (one group): a rotq norm
        b[off : off + 2] = np.frombuffer(np.uint16(bad).tobytes(), np.uint8)
        out = np.full(shape, 123.0, np.float32)
        if name == "f16" and bad == 0xBC00:
            c.decode_into(b, out)  # -1.0 is a valid f16 value
            continue
        with pytest.raises(KvgCorruptError):
            c.decode_into(b, out)
        assert np.all(out == 123.0)


# ---- threads ---------------------------------------------------------------------------------


def test_concurrent_encode_decode():
    # head_dim 2048 is used by no other test: its codebook is built while threads race for it
    rng = np.random.default_rng(8)
    blocks = [
        (name, rng.standard_normal((16, 2, 2048 if name in POW2_HEAD_DIM else 64)).astype(np.float32))
        for name in ALL
        for _ in range(3)
    ]

    def work(item):
        name, x = item
        buf = codecs.encode(name, x, "v")
        return buf, codecs.decode(name, buf, x.shape, "v")

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(work, blocks * 2))
    for (name, x), (buf, y) in zip(blocks * 2, results):
        ref_buf, ref_y = work((name, x))
        assert np.array_equal(buf, ref_buf)
        assert np.array_equal(y, ref_y)


@pytest.mark.parametrize("name", CROTQ)
def test_crotq_nonfinite_channel_mean_is_corrupt(name):
    x = np.random.default_rng(2).standard_normal((4, 2, 64)).astype(np.float32)
    buf = codecs.encode(name, x)
    buf[10:12] = np.frombuffer(np.uint16(0x7E00).tobytes(), np.uint8)
    out = np.full(x.shape, 123.0, np.float32)
    with pytest.raises(KvgCorruptError):
        codecs.get(name).decode_into(buf, out)
    assert np.all(out == 123.0)


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_crotq_removes_channel_offsets_that_rotq_pays_for(bits):
    """Keys with per-channel offsets (outlier channels): centering first cuts the error."""
    rng = np.random.default_rng(5)
    offsets = rng.standard_normal((1, 2, 64)).astype(np.float32) * 4
    x = rng.standard_normal((300, 2, 64)).astype(np.float32) + offsets
    err = {}
    for name in (f"rotq{bits}", f"crotq{bits}"):
        y = codecs.decode(name, codecs.encode(name, x, "k"), x.shape, "k")
        err[name] = float(((y - x) ** 2).sum() / (x**2).sum())
    assert err[f"crotq{bits}"] < 0.5 * err[f"rotq{bits}"]
    # 3 groups of 128 tokens' f16 means on top of rotq's bytes
    extra = codecs.encoded_size(f"crotq{bits}", x.shape) - codecs.encoded_size(f"rotq{bits}", x.shape)
    assert extra == 3 * 2 * 64 * 2
