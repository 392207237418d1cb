"""outl2 / outl3 (native/src/codecs/outliers.c): each head's highest-energy channels of a block kept in
f16, the rest through rotq."""

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError, KvgError
from helpers import rel_mse

NAMES = [n for n in codecs.names() if codecs.family(n) == "outl"]
ROTQ_OF = {"outl2": "rotq2", "outl3": "rotq3"}
# rotq's bound on N(0, 1)-like rows: 1.25x the Lloyd-Max MSE (tests/unit/test_codecs.py)
LLOYD_MAX_GAUSS = {2: 0.1175, 3: 0.03454}


def n_out(d):
    return max(1, d // 32)


def outlier_channels(d):
    """n_out(d) channels spread over the head: the ones with_outliers makes large."""
    return [3 + i * (d // n_out(d)) for i in range(n_out(d))]


def with_outliers(rng, shape, scale=30.0):
    """Rows whose outlier_channels of every head are `scale` times larger (keys' outlier channels)."""
    x = rng.standard_normal(shape).astype(np.float32)
    x[..., outlier_channels(shape[-1])] *= scale
    return x


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("n_heads", [1, 3])
@pytest.mark.parametrize("n_tokens", [1, 33, 70, 100])
def test_round_trip_within_rotq_bound(name, head_dim, n_heads, n_tokens):
    rng = np.random.default_rng(head_dim + n_heads + n_tokens)
    x = rng.standard_normal((n_tokens, n_heads, head_dim)).astype(np.float32)
    c = codecs.get(name)
    y = c.decode(c.encode(x), x.shape)
    # what is left after taking the kept channels out is rotq's, with rotq's bound
    bound = 1.25 * LLOYD_MAX_GAUSS[c.bits] if n_tokens * n_heads >= 30 else 3 * LLOYD_MAX_GAUSS[c.bits]
    assert rel_mse(x, y) <= bound


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [64, 256])
def test_outlier_channels_come_back_at_f16_precision(name, head_dim):
    rng = np.random.default_rng(1)
    x = with_outliers(rng, (64, 3, head_dim))
    c = codecs.get(name)
    y = c.decode(c.encode(x), x.shape)
    kept = outlier_channels(head_dim)
    assert np.array_equal(y[..., kept], x[..., kept].astype(np.float16).astype(np.float32))
    # and that is what they are for: far less error than rotq at the same bits, whose
    # rotation spreads the large channels over every coordinate
    base = codecs.get(ROTQ_OF[name])
    assert rel_mse(x, y) < rel_mse(x, base.decode(base.encode(x), x.shape)) / 5


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(64, 1, 64), (64, 3, 64), (64, 1, 256), (33, 2, 128), (1, 1, 8), (5, 3, 2)])
def test_bits_per_value_formula(name, shape):
    t, h, d = shape
    c = codecs.get(name)
    n = len(c.encode(np.ones(shape, np.float32)))
    assert n == t * h * 2 + (t * h * d * c.bits + 7) // 8 + h * n_out(d) * 2 + t * h * n_out(d) * 2
    if shape == (64, 1, 64):
        assert c.nominal_bits_per_value(64) == pytest.approx(c.bits + 0.25 + 0.5 + 16 * 2 / (64 * 64))
    if shape == (64, 1, 256):
        assert c.nominal_bits_per_value(256) == pytest.approx(c.bits + 0.0625 + 0.5 + 16 * 8 / (64 * 256))


def indices_offset(c, shape):
    t, h, d = shape
    return t * h * 2 + (t * h * d * c.bits + 7) // 8


@pytest.mark.parametrize("name", NAMES)
def test_corrupt_indices_and_values_are_refused_before_writing(name):
    shape = (8, 2, 128)  # two kept channels a head
    c = codecs.get(name)
    buf = c.encode(with_outliers(np.random.default_rng(2), shape))
    off = indices_offset(c, shape)
    cases = []
    for bad_idx in (128, 1000):  # out of the head
        b = buf.copy()
        b[off : off + 2] = np.frombuffer(np.uint16(bad_idx).tobytes(), np.uint8)
        cases.append(b)
    b = buf.copy()  # not increasing: the second index of head 0 equal to the first
    b[off + 2 : off + 4] = b[off : off + 2]
    cases.append(b)
    val = off + 2 * 2 * n_out(128)
    for bad in (0x7E00, 0x7C00, 0xFC00):  # a kept value NaN / +-Inf
        b = buf.copy()
        b[val + 6 : val + 8] = np.frombuffer(np.uint16(bad).tobytes(), np.uint8)
        cases.append(b)
    for b in cases:
        out = np.full(shape, 7.0, np.float32)
        with pytest.raises(KvgCorruptError):
            c.decode_into(b, out)
        assert np.all(out == 7.0)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_ties_and_shapes(name):
    c = codecs.get(name)
    x = np.ones((16, 2, 64), np.float32)  # every channel ties: the lowest indices are kept
    buf = c.encode(x)
    off = indices_offset(c, x.shape)
    assert np.frombuffer(bytes(buf[off : off + 8]), "<u2").tolist() == [0, 1, 0, 1]
    assert np.array_equal(buf, c.encode(x))
    with pytest.raises(ValueError):
        c.encoded_size((4, 1, 48))  # rotq needs a power-of-two head_dim
    with pytest.raises(ValueError):
        c.encoded_size((4, 1, 1))


@pytest.mark.parametrize("name", NAMES)
def test_kept_value_beyond_f16_is_refused(name):
    x = np.zeros((4, 1, 64), np.float32)
    x[2, 0, 9] = 7e4  # the highest-energy channel, kept in f16: it cannot hold it
    with pytest.raises(KvgError, match="f16"):
        codecs.get(name).encode(x)
