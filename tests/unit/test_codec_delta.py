"""delta4/pdelta4 (issue 13, the seed's TSC part I): an f16 keyframe every 64 rows, and 4-bit
residuals with an f16 min and scale per group of 64 channels of one head (the whole head when
head_dim <= 64). delta4's residual is against the decoded keyframe of the row's segment,
pdelta4's against the decoded previous row (closed-loop DPCM).

Layout of a (T, H, D) block, C = H D, n_key = ceil(T / 64), n_res = T - n_key, n_g = ceil(D / 64):
keyframes [n_key][C] f16, groups [n_res][H][n_g] (f16 min, f16 scale), codes [n_res][C] 4 bits
(code e in bits [4e, 4e + 4) of a little-endian bitstream)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError
from helpers import kv_like, rel_mse

NAMES = [n for n in codecs.names() if codecs.family(n) in ("delta", "pdelta")]
KEYFRAME = 64  # rows per keyframe (TSC part I)
GROUP = 64  # channels per min/scale, within one head
F32_EPS = float(np.finfo(np.float32).eps)
F16_EPS = 2.0**-11  # f16's relative rounding error


def sizes(shape):
    n, h, d = shape
    n_key = -(-n // KEYFRAME)
    n_res = n - n_key
    n_g = -(-d // GROUP)
    return n_key, n_res, n_g


def split(buf, shape):
    """Keyframes (n_key, C) f16, per-channel min and scale (n_res, C) float32, codes (n_res, C)."""
    n, h, d = shape
    C = h * d
    n_key, n_res, n_g = sizes(shape)
    buf = np.asarray(buf, np.uint8)
    o1 = 2 * n_key * C
    o2 = o1 + 4 * n_res * h * n_g
    assert len(buf) == o2 + (4 * n_res * C + 7) // 8
    key = buf[:o1].view(np.float16).reshape(n_key, C)
    grp = buf[o1:o2].view(np.float16).reshape(n_res, h, n_g, 2).astype(np.float32)
    group_of = np.arange(d) // GROUP  # channel of a head -> its group
    mn = grp[:, :, group_of, 0].reshape(n_res, C)
    sc = grp[:, :, group_of, 1].reshape(n_res, C)
    b = buf[o2:]
    codes = np.stack([b & 15, b >> 4], axis=1).reshape(-1)[: n_res * C].reshape(n_res, C)
    return key, mn, sc, codes


def reference_decode(name, buf, shape):
    """The documented decoder in float32: x' = ref + (min + code * scale), with ref the segment's
    keyframe (delta4) or the row before (pdelta4). Also returns each row's ref, min and scale."""
    n, h, d = shape
    key, mn, sc, codes = split(buf, shape)
    y = np.zeros((n, h * d), np.float32)
    ref = np.zeros_like(y)
    m = np.zeros_like(y)
    s = np.zeros_like(y)
    for t in range(n):
        if t % KEYFRAME == 0:
            y[t] = key[t // KEYFRAME].astype(np.float32)
            continue
        i = t - (t // KEYFRAME + 1)
        ref[t] = y[t - 1] if name == "pdelta4" else y[t - t % KEYFRAME]
        m[t], s[t] = mn[i], sc[i]
        y[t] = ref[t] + (mn[i] + codes[i].astype(np.float32) * sc[i])
    return y, ref, m, s


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("n_heads", [1, 3])
@pytest.mark.parametrize("n_tokens", [1, 33, 70, 100])
def test_round_trip_within_half_a_step(name, head_dim, n_heads, n_tokens):
    shape = (n_tokens, n_heads, head_dim)
    x = kv_like(np.random.default_rng(n_tokens * 7 + n_heads + head_dim), shape)
    c = codecs.get(name)
    buf = c.encode(x)
    y = c.decode(buf, shape)
    # the bytes are the documented layout: a float32 decoder of it gives the same values
    want, ref, m, s = reference_decode(name, buf, shape)
    assert np.array_equal(y.reshape(n_tokens, -1), want)
    xf = x.reshape(n_tokens, -1)
    key = np.arange(n_tokens) % KEYFRAME == 0
    # keyframes are the rows in f16
    assert np.array_equal(want[key], xf[key].astype(np.float16).astype(np.float32))
    # every residual within half of its group's stored step (f32 rounding of the sums aside);
    # a constant group (scale 0) holds its residual to f16 precision
    xr, rr, mr, sr = xf[~key], ref[~key], m[~key], s[~key]
    err = np.abs(xr.astype(np.float64) - want[~key])
    slack = F16_EPS * np.abs(mr) * (sr == 0) + 4 * F32_EPS * (np.abs(xr) + np.abs(rr) + np.abs(mr) + 15 * sr)
    assert np.all(err <= 0.5 * sr + slack)
    # [min, min + 15 scale] covers the residual (constant groups: scale 0, min the nearest f16),
    # and is no wider than the f16 rounding of min (down) and scale (up) makes it
    r = (xr - rr).astype(np.float64)  # the encoder's float32 residual
    live = sr > 0
    assert np.all(mr[live] <= r[live]) and np.all(mr[live] + 15.0 * sr[live] >= r[live])
    n_key, n_res, n_g = sizes(shape)
    if n_res:
        rg = r.reshape(n_res, n_heads, n_g, GROUP)
        sg = sr.reshape(n_res, n_heads, n_g, GROUP)[..., 0]
        span = rg.max(axis=-1) - rg.min(axis=-1) + 2 * F16_EPS * np.abs(rg).max(axis=-1) + 2.0**-24
        assert np.all(sg <= span / 15 * (1 + 2 * F16_EPS) + 2.0**-24)
    # the error is that of uniform rounding at the stored steps (step^2 / 12 per residual),
    # about 0.03-0.05 of the energy of these independent rows (residual ~ sqrt(2) x the row)
    if n_res:
        assert np.sum(err**2) <= 1.1 * np.sum(sr.astype(np.float64) ** 2 / 12)
        assert rel_mse(x, y) <= 0.06


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(5, 2, 1), (70, 3, 5), (70, 2, 96), (130, 1, 200), (65, 1, 3)])
def test_any_head_dim(name, shape):
    """No power-of-two requirement: groups of 64 channels never straddle heads, the last group of
    a head takes what is left."""
    x = kv_like(np.random.default_rng(sum(shape)), shape)
    c = codecs.get(name)
    buf = c.encode(x)
    y = c.decode(buf, shape)
    want, ref, m, s = reference_decode(name, buf, shape)
    assert np.array_equal(y.reshape(shape[0], -1), want)
    xf = x.reshape(shape[0], -1).astype(np.float64)
    slack = F16_EPS * np.abs(m) * (s == 0) + 4 * F32_EPS * (np.abs(xf) + np.abs(ref) + np.abs(m) + 15 * s)
    assert np.all(np.abs(xf - want) <= 0.5 * s + slack + F16_EPS * np.abs(xf))  # last term: keyframe rows


def random_walk(rng, shape, step):
    """Rows that drift slowly from a fixed offset, with outlier channels, as a smooth K/V would."""
    n, h, d = shape
    base = 4 * kv_like(rng, (1, h, d))
    return (base + np.cumsum(step * rng.standard_normal(shape), axis=0)).astype(np.float32)


@pytest.mark.parametrize("name", NAMES)
def test_slowly_varying_rows_cost_little(name):
    """What the codecs are for: when consecutive rows differ little, the residual's range, and so
    the 4-bit step, is a small fraction of the row's. kivi4 and rotq4 quantize each row whole
    and keep their usual error (~1e-2 on these rows); delta4 is more than 10^3x below (measured
    ~10^4x), pdelta4 more than 3 10^4x (measured ~2 10^5x: its residual is one step of the walk)."""
    x = random_walk(np.random.default_rng(0), (128, 2, 128), 0.01)
    e = rel_mse(x, codecs.decode(name, codecs.encode(name, x, "v"), x.shape, "v"))
    for other in ("kivi4", "rotq4"):
        e_other = rel_mse(x, codecs.decode(other, codecs.encode(other, x, "v"), x.shape, "v"))
        assert e_other > 5e-3
        assert e <= e_other * {"delta4": 1e-3, "pdelta4": 3e-5}[name]


def test_prediction_from_the_previous_row_does_not_accumulate():
    """pdelta4 codes each row against the DECODED row before it, so its error stays one step of
    the row-to-row residual however far the row is from its keyframe, while delta4's residual
    against the keyframe (and its step) grows with the drift, as sqrt(t) on a random walk."""
    x = random_walk(np.random.default_rng(1), (64, 1, 128), 0.01)

    def err(name):
        y = codecs.decode(name, codecs.encode(name, x), x.shape)
        return np.sqrt(np.mean((x.astype(np.float64) - y) ** 2, axis=(1, 2)))  # RMS error per row

    ed, ep = err("delta4"), err("pdelta4")
    early, late = slice(1, 9), slice(56, 64)
    # closed loop: no growth along the segment (an open loop would add up 63 errors)
    assert ep[late].mean() <= 1.5 * ep[early].mean()
    # delta4's error grows with the distance to the keyframe: sqrt(60/5) ~ 3.5x
    assert ed[late].mean() >= 2.0 * ed[early].mean()
    assert ep[late].mean() <= ed[late].mean() / 4


@pytest.mark.parametrize("name", NAMES)
def test_residuals_are_against_the_decoded_reference(name):
    """Residuals are taken against the DECODED keyframe: rows equal to the keyframe carry only
    its f16 rounding error as residual, so they come back an order of magnitude closer than
    f16 (their 4-bit step is 1/15 of that error's span); and a constant block codes as zeros."""
    row = kv_like(np.random.default_rng(5), (1, 2, 64))
    x = np.repeat(row, 100, axis=0)
    c = codecs.get(name)
    buf = c.encode(x)
    key, mn, sc, codes = split(buf, x.shape)
    f16_err = row - row.astype(np.float16).astype(np.float32)
    assert np.all(mn[0] <= f16_err.reshape(-1))  # the first residual row: x - f16(x) itself
    assert np.all(sc <= np.abs(f16_err).max() * 2 / 15 * (1 + 2 * F16_EPS))
    y = c.decode(buf, x.shape)
    rest = np.arange(100) % KEYFRAME != 0
    assert np.abs(y[rest] - x[rest]).max() <= np.abs(f16_err).max() / 10
    z = np.full((100, 2, 64), 0.375, np.float32)  # exact in f16: every residual is zero
    key, mn, sc, codes = split(c.encode(z), z.shape)
    assert not mn.any() and not sc.any() and not codes.any()
    assert np.array_equal(c.decode(c.encode(z), z.shape), z)


@pytest.mark.parametrize("name", NAMES)
def test_segments_are_independent(name):
    """Each 64-row segment depends only on its own rows: a block decodes as its 64-row pieces do
    (the live cache's blocks), and a change in one segment leaves the others' bytes alone."""
    x = kv_like(np.random.default_rng(6), (150, 3, 64))
    c = codecs.get(name)
    y = c.decode(c.encode(x), x.shape)
    parts = [c.decode(c.encode(x[t : t + 64]), x[t : t + 64].shape) for t in range(0, 150, 64)]
    assert np.array_equal(y, np.concatenate(parts))
    x2 = x.copy()
    x2[64:128] += 1.0
    y2 = c.decode(c.encode(x2), x.shape)
    assert np.array_equal(y[:64], y2[:64]) and np.array_equal(y[128:], y2[128:])


BPV_SHAPES = [
    (64, 1, 64),
    (64, 1, 128),
    (64, 1, 256),
    (64, 3, 64),
    (1, 1, 64),
    (33, 3, 128),
    (100, 2, 96),
    (130, 1, 5),
    (2, 1, 1),
    (65, 2, 200),
]


def formula_bytes(shape):
    n, h, d = shape
    n_key, n_res, n_g = sizes(shape)
    return 2 * n_key * h * d + 4 * n_res * h * n_g + (4 * n_res * h * d + 7) // 8


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", BPV_SHAPES)
def test_bits_per_value_formula(name, shape):
    """Bytes produced = f16 keyframes + 32 bits per (residual row, group) + 4-bit codes."""
    n, h, d = shape
    c = codecs.get(name)
    for kind in ("k", "v"):
        buf = c.encode(kv_like(np.random.default_rng(0), shape), kind)
        assert len(buf) == formula_bytes(shape) == c.encoded_size(shape, kind)
        assert c.bits_per_value(shape, kind) == len(buf) * 8 / (n * h * d)


@pytest.mark.parametrize("name", NAMES)
def test_nominal_bits_at_the_live_block(name):
    """(16 D + 63 (4 D + 32 ceil(D / 64))) / (64 D): 4.6797 for every multiple of 64."""
    c = codecs.get(name)
    for d in (64, 128, 256):
        assert c.nominal_bits_per_value(d) == pytest.approx(4 + 16 / 64 - 4 / 64 + 63 * 32 / (64 * 64), rel=1e-12)
    for d in (32, 96):
        want = (16 * d + 63 * (4 * d + 32 * math.ceil(d / 64))) / (64 * d)
        assert c.nominal_bits_per_value(d) == pytest.approx(want, rel=1e-12)


def set_f16(buf, off, bits):
    b = buf.copy()
    b[off : off + 2] = np.frombuffer(np.uint16(bits).tobytes(), np.uint8)
    return b


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("field", ["key_first", "key_last", "min_first", "scale_first", "min_last", "scale_last"])
def test_corrupt_fields_are_detected_before_writing(name, field):
    shape = (70, 3, 96)  # 2 keyframes, 68 residual rows of 3 heads x 2 groups
    n, h, d = shape
    n_key, n_res, n_g = sizes(shape)
    c = codecs.get(name)
    buf = c.encode(kv_like(np.random.default_rng(2), shape))
    o1 = 2 * n_key * h * d
    o2 = o1 + 4 * n_res * h * n_g
    off = {
        "key_first": 0,
        "key_last": o1 - 2,
        "min_first": o1,
        "scale_first": o1 + 2,
        "min_last": o2 - 4,
        "scale_last": o2 - 2,
    }[field]
    is_scale = field.startswith("scale")
    bads = [0x7E00, 0x7C00, 0xFC00, 0xFE00] + ([0xBC00, 0x8000, 0x8001] if is_scale else [])  # NaN, +-Inf; -1, -0
    for bad in bads:
        out = np.full(shape, 123.0, np.float32)
        with pytest.raises(KvgCorruptError):
            c.decode_into(set_f16(buf, off, bad), out)
        assert np.all(out == 123.0)
    # any finite keyframe or min is valid, and so is any finite non-negative scale
    y = c.decode(set_f16(buf, off, 0x7BFF), shape)  # 65504
    assert np.all(np.isfinite(y))
    if not is_scale:
        assert np.all(np.isfinite(c.decode(set_f16(buf, off, 0xFBFF), shape)))  # -65504


@pytest.mark.parametrize("name", NAMES)
def test_extreme_blocks_decode_finite(name):
    """The largest stored values (keyframes, mins and scales all 65504, codes all 15) chain through
    pdelta4's 63 residual rows and still decode to finite floats."""
    shape = (64, 1, 64)
    c = codecs.get(name)
    buf = np.full(c.encoded_size(shape), 0xFF, np.uint8)
    n_key, n_res, n_g = sizes(shape)
    f16s = buf[: 2 * n_key * 64 + 4 * n_res * n_g].view(np.uint16)
    f16s[:] = 0x7BFF
    y = c.decode(buf, shape)
    assert np.all(np.isfinite(y))
    assert y.max() == pytest.approx(65504 * (1 + 16 * (63 if name == "pdelta4" else 1)), rel=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_residual_beyond_f16_raises(name):
    """Two rows inside f16's range whose difference is not: refused (KVG_ERR_RANGE), never clamped."""
    x = np.zeros((3, 1, 64), np.float32)
    x[0] = -60000.0
    x[1] = 60000.0
    with pytest.raises(ValueError, match="f16"):
        codecs.encode(name, x)
    x[1, 0, 5] = 70000.0  # a value beyond f16, even where the residual would fit
    x[0] = 65000.0
    with pytest.raises(ValueError, match="f16"):
        codecs.encode(name, x)
    x[1] = 65504.0  # the edge of f16 is fine
    x[0] = -0.0
    y = codecs.decode(name, codecs.encode(name, x), x.shape)
    assert np.abs(y - x).max() <= 65504 / 15 / 2 * (1 + 1e-3)


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_and_kind_independent(name):
    x = kv_like(np.random.default_rng(4), (70, 3, 64))
    c = codecs.get(name)
    a = c.encode(x, "k")
    assert np.array_equal(a, c.encode(x.copy(), "k"))
    assert np.array_equal(a, c.encode(x, "v"))  # keys and values are coded alike
    assert np.array_equal(a, codecs.get(name, seed=12345, group_size=7).encode(x))  # no seed, no G
    with codecs.force_simd(0):
        assert np.array_equal(a, c.encode(x))
    assert np.array_equal(c.decode(a, x.shape), c.decode(a, x.shape))


def test_delta_and_pdelta_share_keyframes_and_layout():
    x = kv_like(np.random.default_rng(7), (100, 2, 64))
    a, b = codecs.encode("delta4", x), codecs.encode("pdelta4", x)
    assert len(a) == len(b)
    n_key = sizes(x.shape)[0]
    assert np.array_equal(a[: 2 * n_key * 128], b[: 2 * n_key * 128])
    # the first residual row of a segment has the same reference (the keyframe) in both
    o1 = 2 * n_key * 128
    assert np.array_equal(a[o1 : o1 + 4 * 2], b[o1 : o1 + 4 * 2])
    assert not np.array_equal(a, b)
