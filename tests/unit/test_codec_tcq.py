"""tcq2 / tcq3 / tcq4 (native/src/codecs/tcq.c): rotq's rotation and f16 norm, then a bitshift trellis
code: value i is the trained level of the 8-bit window of the stream that ends with its own B
bits, the codes of a head vector chosen together by a Viterbi search. B + 16/head_dim bits per
value, as rotq."""

import itertools

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError

from test_codecs import hadamard, rotq_signs, unpack_codes
from helpers import rel_mse

NAMES = [n for n in codecs.names() if codecs.family(n) == "tcq"]
WINDOW = 8


def windows(codes: np.ndarray, bits: int) -> np.ndarray:
    """The documented windows of one vector's codes: the 8 bits of the stream ending with code
    i's, bits before the vector's first read as 0."""
    stream = np.concatenate([np.zeros(WINDOW, np.int64), ((codes[:, None] >> np.arange(bits)) & 1).reshape(-1)])
    ends = WINDOW + bits * (np.arange(len(codes)) + 1)
    return np.array([(stream[e - WINDOW : e] << np.arange(WINDOW)).sum() for e in ends])


def reference_decode(buf, shape, bits, seed):
    """tcq decode in numpy (float64) from the layout kvgguf.h documents."""
    t, h, d = shape
    nv = t * h
    norms = np.frombuffer(buf[: 2 * nv].tobytes(), dtype="<f2").astype(np.float64)
    codes = unpack_codes(buf[2 * nv :], nv * d, bits).reshape(nv, d)
    levels = codecs.tcq_levels(bits).astype(np.float64)
    y = np.stack([levels[windows(c, bits)] for c in codes]) @ hadamard(d)
    return (y * (norms[:, None] / d) * rotq_signs(seed, d)[None, :]).reshape(shape)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("shape", [(1, 1), (33, 3), (70, 2)])
def test_decode_follows_the_documented_layout(name, head_dim, shape):
    rng = np.random.default_rng(head_dim + shape[0])
    x = rng.standard_normal((*shape, head_dim)).astype(np.float32)
    x[:, :, :: head_dim // 8] *= 8.0  # outlier channels
    c = codecs.get(name)
    buf = c.encode(x)
    assert len(buf) == c.encoded_size(x.shape) and c.bits_per_value(x.shape) == c.bits + 16 / head_dim
    y = c.decode(buf, x.shape)
    ref = reference_decode(buf, x.shape, c.bits, c.seed)
    assert np.max(np.abs(y - ref)) <= 1e-5 * np.max(np.abs(ref))


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_it_beats_rotq_at_the_same_bits(bits, head_dim):
    """About a quarter of a bit: on rotated unit-variance coordinates the trellis reaches 0.085 /
    0.024 / 0.0068 where rotq's Lloyd-Max levels reach 0.118 / 0.035 / 0.0095."""
    rng = np.random.default_rng(bits * head_dim)
    x = rng.standard_normal((200, 2, head_dim)).astype(np.float32)
    x[:, :, :4] *= 6.0
    t, r = codecs.get(f"tcq{bits}"), codecs.get(f"rotq{bits}")
    assert t.encoded_size(x.shape) == r.encoded_size(x.shape)  # equal bits held
    e_t = rel_mse(x, t.decode(t.encode(x), x.shape))
    e_r = rel_mse(x, r.decode(r.encode(x), x.shape))
    assert e_t < 0.85 * e_r, (e_t, e_r)


@pytest.mark.parametrize("bits", [2, 3])
def test_the_encoder_finds_the_best_path(bits):
    """At head_dim 4 every code sequence can be tried: none decodes closer than the encoder's."""
    rng = np.random.default_rng(bits)
    levels = codecs.tcq_levels(bits).astype(np.float64)
    c = codecs.get(f"tcq{bits}")
    paths = np.array(list(itertools.product(range(1 << bits), repeat=4)))
    decoded = np.stack([levels[windows(p, bits)] for p in paths])  # every path's y
    for _ in range(20):
        x = rng.standard_normal((1, 1, 4)).astype(np.float32)
        buf = c.encode(x)
        n = float(np.frombuffer(buf[:2].tobytes(), "<f2")[0])
        y = (x[0, 0] * rotq_signs(c.seed, 4)) @ hadamard(4) / n  # the y the encoder codes
        got = windows(unpack_codes(buf[2:], 4, bits), bits)
        err = ((levels[got] - y) ** 2).sum()
        assert err <= ((decoded - y) ** 2).sum(axis=1).min() + 1e-5


@pytest.mark.parametrize("name", NAMES)
def test_zero_constant_and_huge_rows(name):
    c = codecs.get(name)
    x = np.zeros((5, 2, 64), np.float32)
    x[1] = 3.0  # constant
    x[2] = 1e-30  # below f16: its norm rounds to zero
    x[3, 0, 5] = 6e4  # one huge coordinate
    x[4] = np.linspace(-1000, 1000, 128, dtype=np.float32).reshape(2, 64)
    y = c.decode(c.encode(x), x.shape)
    assert np.all(y[0] == 0) and np.all(y[2] == 0)
    for t in (1, 3, 4):
        assert rel_mse(x[t], y[t]) < {2: 0.15, 3: 0.05, 4: 0.015}[c.bits]
    with pytest.raises(ValueError, match="f16"):
        c.encode(np.full((1, 1, 64), 1e4, np.float32))  # norm 8e4


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_seeded(name):
    x = np.random.default_rng(0).standard_normal((9, 3, 64)).astype(np.float32)
    a, b = codecs.get(name).encode(x), codecs.get(name).encode(x)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, codecs.get(name, seed=7).encode(x))


@pytest.mark.parametrize("name", NAMES)
def test_bad_norms_are_refused_and_bad_head_dims_too(name):
    c = codecs.get(name)
    buf = c.encode(np.ones((2, 1, 64), np.float32))
    buf[2:4] = np.frombuffer(np.uint16(0xFC00).tobytes(), np.uint8)  # -Inf
    with pytest.raises(KvgCorruptError):
        c.decode(buf, (2, 1, 64))
    with pytest.raises(ValueError, match="power-of-two"):
        c.encoded_size((1, 1, 96))


def test_levels_are_finite_and_refuse_bad_bits():
    for bits in (2, 3, 4):
        t = codecs.tcq_levels(bits)
        assert t.shape == (256,) and np.all(np.isfinite(t)) and 1.0 < np.abs(t).max() < 6.0
    for bad in (1, 5, True):
        with pytest.raises(ValueError):
            codecs.tcq_levels(bad)
