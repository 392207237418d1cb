"""kvg_attend_f16: attention over llama.cpp's f16 or q8_0 cells outside the store (its hot cells on the fused
path, native/llama/src/llama-kvgguf-graph.cpp) under llama.cpp's mask, into the same online-softmax state as the store's
attend. Checked against softmax attention in float64 at every SIMD level, for contiguous and
transposed V (strides), f16 and f32 masks, q8_0 cells, soft-capping, split ranges, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType, quants

from kvgguf import codecs
from kvgguf.bindings.binding import get_ffi, get_lib

LEVELS = codecs.simd_levels()
TOL = 5e-5  # of max |v|, as tests/unit/test_attend.py holds the store's attend


def cells(rng, n_kv, n_head_kv, head_dim):
    x = rng.standard_normal((n_kv, n_head_kv, head_dim)).astype(np.float16)
    x[:, :, rng.choice(head_dim, max(1, head_dim // 32), replace=False)] *= 8
    return x


def causal_mask(n_tokens, n_kv, pad, rng):
    """llama.cpp's mask of a ubatch at the end of n_kv cells: token t sees cells <= n_kv - n_tokens + t;
    a few cells hidden from everyone (another sequence); rows padded to n_kv + pad."""
    mask = np.zeros((n_tokens, n_kv + pad), np.float32)
    for t in range(n_tokens):
        mask[t, n_kv - n_tokens + t + 1 :] = -np.inf
    mask[:, rng.choice(n_kv, 3, replace=False)] = -np.inf
    return mask


def call(level, q, k, v_mem, v_nb, c0, c1, mask, scale, softcap=0.0, state=None, mask_f16=False, q8=None):
    """q8: (K rows, V rows) as q8_0 cells (q8_cells) in place of the f16 k and v_mem."""
    ffi, lib = get_ffi(), get_lib()
    n_tokens, n_head, dk = q.shape
    n_head_kv, dv = k.shape[1], v_mem.shape[-1] if v_nb is None else v_nb[3]
    m, l, acc = state or (
        np.full((n_tokens, n_head), -np.inf, np.float32),
        np.zeros((n_tokens, n_head), np.float32),
        np.zeros((n_tokens, n_head, dv), np.float32),
    )
    m, l, acc = m.copy(), l.copy(), acc.copy()
    k_nb = ffi.new("size_t[3]", [k.strides[2], k.strides[1], k.strides[0]])
    vn = ffi.new("size_t[3]", list(v_nb[:3]) if v_nb else [v_mem.strides[2], v_mem.strides[1], v_mem.strides[0]])
    k_type = v_type = lib.KVG_CELLS_F16
    if q8 is not None:
        (k, kq_nb), (v_mem, vq_nb) = q8
        k_nb, vn = ffi.new("size_t[3]", list(kq_nb)), ffi.new("size_t[3]", list(vq_nb))
        k_type = v_type = lib.KVG_CELLS_Q8_0
    mk = None if mask is None else np.ascontiguousarray(mask.astype(np.float16 if mask_f16 else np.float32))
    with codecs.force_simd(level):
        rc = lib.kvg_attend_f16(
            ffi.from_buffer("float[]", q),
            n_tokens,
            n_head,
            n_head_kv,
            dk,
            dv,
            ffi.from_buffer(k),
            k_type,
            k_nb,
            ffi.from_buffer(v_mem),
            v_type,
            vn,
            c0,
            c1,
            ffi.NULL if mk is None else ffi.from_buffer(mk),
            int(mask_f16),
            0 if mk is None else mk.strides[0],
            scale,
            softcap,
            ffi.from_buffer("float[]", m),
            ffi.from_buffer("float[]", l),
            ffi.from_buffer("float[]", acc),
        )
    return rc, (m, l, acc)


def reference(q, k, v, c0, c1, mask, scale, softcap=0.0):
    gqa = q.shape[1] // k.shape[1]
    kk = k[c0:c1].astype(np.float64)[:, np.arange(q.shape[1]) // gqa]  # [c, h, d]
    vv = v[c0:c1].astype(np.float64)[:, np.arange(q.shape[1]) // gqa]
    s = scale * np.einsum("thd,chd->thc", q.astype(np.float64), kk)
    if softcap:
        s = softcap * np.tanh(s / softcap)
    if mask is not None:
        s = s + mask[:, None, c0:c1].astype(np.float64)
    m = s.max(-1)
    seen = np.isfinite(m)
    p = np.where(seen[..., None], np.exp(s - np.where(seen, m, 0)[..., None]), 0.0)
    return m, p.sum(-1), np.einsum("thc,chd->thd", p, vv), float(np.abs(v).max())


def assert_state_matches(state, expected, where):
    """The online-softmax state (m, l, acc) against reference()'s: maxima, normalizers and the
    normalized outputs within TOL of max |v|; a query that saw nothing keeps its state. Returns
    the normalized outputs."""
    (m, l, acc), (m_ref, l_ref, acc_ref, vmax) = state, expected
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-5, err_msg=where)
    np.testing.assert_allclose(l, l_ref, rtol=1e-4, err_msg=where)
    seen = l_ref > 0
    out = np.where(seen[..., None], acc / np.where(seen, l, 1)[..., None], 0)
    ref = np.where(seen[..., None], acc_ref / np.where(seen, l_ref, 1)[..., None], 0)
    assert float(np.abs(out - ref).max()) <= TOL * vmax, where
    assert np.all(acc[~seen] == 0), where
    return out


@pytest.mark.parametrize("head_dim", [64, 128, 80, 100])
@pytest.mark.parametrize("v_trans", [False, True])
@pytest.mark.parametrize("n_tokens,n_head_kv,n_head", [(1, 2, 8), (3, 3, 9), (24, 1, 4)])
def test_matches_masked_softmax_at_every_level(head_dim, v_trans, n_tokens, n_head_kv, n_head):
    rng = np.random.default_rng(head_dim + n_tokens)
    n_kv = 150
    k = cells(rng, n_kv, n_head_kv, head_dim)
    v = cells(rng, n_kv, n_head_kv, head_dim)
    # a transposed V (llama.cpp without flash attention): memory [d][hk][c], so cells are adjacent
    v_mem = np.ascontiguousarray(v.transpose(2, 1, 0)) if v_trans else v
    v_nb = (v_mem.strides[0], v_mem.strides[1], v_mem.strides[2], head_dim) if v_trans else None
    q = (2.0 * rng.standard_normal((n_tokens, n_head, head_dim))).astype(np.float32)
    mask = causal_mask(n_tokens, n_kv, 7, rng)
    scale = 1.0 / np.sqrt(head_dim)
    for c0, c1 in ((0, n_kv), (5, 133), (140, 150)):
        m_ref, l_ref, acc_ref, vmax = reference(q, k, v, c0, c1, mask, scale)
        outs = []
        for level in LEVELS:
            for f16_mask in (False, True):
                rc, (m, l, acc) = call(level, q, k, v_mem, v_nb, c0, c1, mask, scale, mask_f16=f16_mask)
                where = f"d={head_dim} v_trans={v_trans} T={n_tokens} [{c0},{c1}) level={level} f16 mask={f16_mask}"
                assert rc == 0, where
                outs.append(assert_state_matches((m, l, acc), (m_ref, l_ref, acc_ref, vmax), where))
        assert float(np.abs(outs[0] - outs[-1]).max()) <= TOL * vmax


@pytest.mark.parametrize("level", LEVELS)
def test_split_ranges_and_softcap_fold_into_one_state(level):
    rng = np.random.default_rng(5)
    k, v = cells(rng, 200, 2, 64), cells(rng, 200, 2, 64)
    q = (2.0 * rng.standard_normal((4, 6, 64))).astype(np.float32)
    mask = causal_mask(4, 200, 0, rng)
    _, state = call(level, q, k, v, None, 0, 77, mask, 0.125, softcap=5.0)
    _, (m, l, acc) = call(level, q, k, v, None, 77, 200, mask, 0.125, softcap=5.0, state=state)
    m_ref, l_ref, acc_ref, vmax = reference(q, k, v, 0, 200, mask, 0.125, softcap=5.0)
    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(l, l_ref, rtol=1e-4)
    assert float(np.abs(acc / l[..., None] - acc_ref / l_ref[..., None]).max()) <= TOL * vmax


def test_no_mask_and_empty_range():
    rng = np.random.default_rng(6)
    k, v = cells(rng, 40, 1, 64), cells(rng, 40, 1, 64)
    q = rng.standard_normal((2, 2, 64)).astype(np.float32)
    rc, (m, l, acc) = call(LEVELS[-1], q, k, v, None, 0, 40, None, 0.125)
    m_ref, l_ref, _, _ = reference(q, k, v, 0, 40, None, 0.125)
    assert rc == 0
    np.testing.assert_allclose(l, l_ref, rtol=1e-4)
    rc, (m, l, acc) = call(LEVELS[-1], q, k, v, None, 9, 9, None, 0.125)
    assert rc == 0 and np.all(m == -np.inf) and np.all(l == 0) and np.all(acc == 0)


@pytest.mark.parametrize("case", ["n_head not a multiple", "cells backwards", "negative softcap", "nan scale"])
def test_bad_arguments_fail_and_leave_the_state(case):
    rng = np.random.default_rng(7)
    k, v = cells(rng, 10, 2, 64), cells(rng, 10, 2, 64)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    state = (np.full((1, 4), 0.5, np.float32), np.full((1, 4), 2.0, np.float32), np.ones((1, 4, 64), np.float32))
    kw = dict(c0=0, c1=10, scale=0.125, softcap=0.0)
    if case == "n_head not a multiple":
        q = rng.standard_normal((1, 3, 64)).astype(np.float32)
        state = tuple(x[:, :3] for x in state)
    elif case == "cells backwards":
        kw.update(c0=5, c1=4)
    elif case == "negative softcap":
        kw["softcap"] = -1.0
    else:
        kw["scale"] = float("nan")
    rc, (m, l, acc) = call(LEVELS[-1], q, k, v, None, kw["c0"], kw["c1"], None, kw["scale"], kw["softcap"], state)
    assert rc == get_lib().KVG_ERR_INVALID_ARG
    assert np.array_equal(m, state[0]) and np.array_equal(l, state[1]) and np.array_equal(acc, state[2])


def q8_cells(x):
    """x [cells, heads, dim] as llama.cpp's q8_0 cells: (raw rows, strides in bytes), and their
    values (float32, exact)."""
    n, h, d = x.shape
    raw = quants.quantize(x.reshape(n, h * d).astype(np.float32), GGMLQuantizationType.Q8_0)  # gguf's copy of ggml's
    block, block_bytes = quants.GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
    per_head = d // block * block_bytes
    values = quants.dequantize(raw, GGMLQuantizationType.Q8_0).reshape(n, h, d)
    return (raw, (block_bytes, per_head, h * per_head)), values


@pytest.mark.parametrize("n_tokens,n_head_kv,n_head,head_dim", [(1, 3, 9, 64), (24, 1, 4, 256), (5, 2, 8, 128)])
def test_q8_0_cells_read_as_their_exact_values(n_tokens, n_head_kv, n_head, head_dim):
    """q8_0 cells (the preset's hot cells since issue 45) attend as their values, scale times code:
    the state matches float64 attention over the dequantized rows at every SIMD level."""
    rng = np.random.default_rng(head_dim + n_head)
    n_kv = 150
    (kq, kv_nb), k = q8_cells(cells(rng, n_kv, n_head_kv, head_dim))
    (vq, vv_nb), v = q8_cells(cells(rng, n_kv, n_head_kv, head_dim))
    q = (2.0 * rng.standard_normal((n_tokens, n_head, head_dim))).astype(np.float32)
    mask = causal_mask(n_tokens, n_kv, 3, rng)
    scale = 1.0 / np.sqrt(head_dim)
    for c0, c1 in ((0, n_kv), (7, 101)):
        m_ref, l_ref, acc_ref, vmax = reference(q, k, v, c0, c1, mask, scale, softcap=30.0)
        for level in LEVELS:
            rc, (m, l, acc) = call(
                level, q, k, v, None, c0, c1, mask, scale, softcap=30.0, q8=((kq, kv_nb), (vq, vv_nb))
            )
            where = f"T={n_tokens} d={head_dim} [{c0},{c1}) level={level}"
            assert rc == 0, where
            assert_state_matches((m, l, acc), (m_ref, l_ref, acc_ref, vmax), where)


@pytest.mark.parametrize("case", ["head dim 48", "block stride", "unknown type"])
def test_q8_0_cells_it_cannot_read_are_refused_and_leave_the_state(case):
    rng = np.random.default_rng(8)
    d = 48 if case == "head dim 48" else 64
    (kq, k_nb), k = q8_cells(cells(rng, 10, 2, 64))
    q = rng.standard_normal((1, 4, d)).astype(np.float32)
    state = (np.full((1, 4), 0.5, np.float32), np.full((1, 4), 2.0, np.float32), np.ones((1, 4, d), np.float32))
    if case == "block stride":
        k_nb = (32,) + k_nb[1:]
    ffi, lib = get_ffi(), get_lib()
    m, l, acc = (x.copy() for x in state)
    nb = ffi.new("size_t[3]", list(k_nb))
    rc = lib.kvg_attend_f16(
        ffi.from_buffer("float[]", q), 1, 4, 2, d, d,
        ffi.from_buffer(kq), 3 if case == "unknown type" else lib.KVG_CELLS_Q8_0, nb,
        ffi.from_buffer(kq), lib.KVG_CELLS_Q8_0, nb,
        0, 10, ffi.NULL, 0, 0, 0.125, 0.0,
        ffi.from_buffer("float[]", m), ffi.from_buffer("float[]", l), ffi.from_buffer("float[]", acc),
    )  # fmt: skip
    assert rc == lib.KVG_ERR_INVALID_ARG
    assert "q8_0" in ffi.string(lib.kvg_last_error()).decode()
    assert np.array_equal(m, state[0]) and np.array_equal(l, state[1]) and np.array_equal(acc, state[2])
