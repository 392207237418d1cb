"""The store's fused attention (kvg_store_hook_attend, KVStore.attend): scores and value sums
computed from the encoded rows must give the softmax attention over the rows the store decodes,
at every SIMD level, for every codec on either side, GQA, and row ranges that cut blocks."""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.binding import get_ffi, get_lib
from kvgguf.enums import Kind, Tier
from kvgguf.bindings.store import EncodedBlock, KVStore
from helpers import kv_like

ALL = codecs.names()
# No SIMD kernels (codecs.info): decoded through attend_rows.c (the side-data codecs), or pq2,
# vq8 and vq8f's scalar kernels over the codebooks the store trains on their first block.
SCALAR_ONLY = [n for n in ALL if not codecs.info(n).simd_ops]
# scored and summed in the domain of the plan the store fits on their first block
WFQ = list(codecs.PLAN_CODECS)
# Each K codec with the same V codec and with one from another family, so every kernel runs
# on both sides and next to every other kind of kernel; and domains that change inside one
# call (two wfq plans, wfq's and the rotation's), whose sums must be handed over.
PAIRS = (
    [(k, k) for k in ALL]
    + [(k, ALL[(i + 6) % len(ALL)]) for i, k in enumerate(ALL)]
    + [("wfq3", "wfq4"), ("rotq4", "wfq3"), ("wfq2", "pq2"), ("tcq3", "wfq3"), ("wfq4", "tcq2"), ("rotq3", "tcq4")]
)

HEAD_DIMS = [64, 128, 256]
# The side-data codecs (delta, outliers, low-rank, QJL) have no kernel of their own: the store
# decodes their rows (a reference decoder, the same at every level) and the rows kernels attend
# over them; PQ/VQ's kernels are scalar. These meet the wider heads through delta4 alone; the
# others at 64 (qjl4 at 256 took 43 s under the sanitizers).
CASES = [
    (k, v, d)
    for k, v in PAIRS
    for d in HEAD_DIMS
    if d == HEAD_DIMS[0] or not {k, v} & set(SCALAR_ONLY) or k == v == "delta4"
] + [(k, k, d) for k in WFQ for d in (96, 100)]  # wfq takes any head dim
# (n_head_kv, n_head): no GQA and groups of 3
HEADS = [(1, 1), (1, 3), (3, 3), (3, 9)]
N_ROWS = 263
# Blocks of the K and V lists, cut differently and never at multiples of 8: an f16 sink block,
# two blocks of the codec under test (the second spans a crotq group boundary at 128) and a last
# block of the other side's codec.
K_CUTS = [0, 4, 77, 205, N_ROWS]
V_CUTS = [0, 4, 40, 170, N_ROWS]
RANGES = [(0, N_ROWS), (3, 197), (100, 101), (61, 250), (130, 139)]

LEVELS = codecs.simd_levels()  # scalar, then AVX2 or NEON where this build and CPU have it

# The kernels compute what decoding the rows and taking the softmax would, in float32 and in
# another order (dot products of rotated queries, rotated value sums transformed once, kivi's
# scale and min folded into the query, crotq's means dotted once per group, a polynomial exp
# under AVX2 and NEON). The reference is float64 over the float32 rows kvg_store_decode gives,
# so the two differ by float32 rounding: of scores that reach a few tens here (queries of norm
# ~2 sqrt(d), keys with 8x outlier channels), i.e. ~1e-5 absolute, which moves the output by
# about that fraction of max |v|. Measured worst cases over this file's cases: 8e-6 of max |v| (scalar
# kivi3, d = 256), 8e-6 between the SIMD levels. The bounds below keep a 4-6x margin and still
# catch one row of N_ROWS left out or misread (about 1/N_ROWS ~ 4e-3 of max |v|).
TOL = 5e-5
TOL_SIMD = 3e-5


def build(k_codec, v_codec, head_dim, n_head_kv, group_size=32, il=1):
    """A store whose layer `il` holds N_ROWS K and V rows in blocks cut at K_CUTS / V_CUTS."""
    rng = np.random.default_rng(head_dim * 10 + n_head_kv)
    store = KVStore(il + 1, n_head_kv, head_dim, head_dim, group_size=group_size)
    width = n_head_kv * head_dim
    for kind, cuts, main, last in ((Kind.K, K_CUTS, k_codec, v_codec), (Kind.V, V_CUTS, v_codec, k_codec)):
        x = kv_like(rng, (N_ROWS, width), random_channels=True)
        x[10] = 0.0  # a zero row: rotq stores norm 0 and no codes
        for b, (r0, r1) in enumerate(zip(cuts, cuts[1:])):
            codec = "f16" if b == 0 else last if b == len(cuts) - 2 else main
            tier = Tier.SINK if b == 0 else Tier.ARCHIVE if b == len(cuts) - 2 else Tier.WARM
            store.append(il, kind, tier, codec, x[r0:r1])
    return store


def reference(store, il, r0, r1, q, scale, softcap=0.0):
    """(m, l, out) of softmax attention in float64 over the rows as kvg_store_decode gives them
    (scores capped to softcap * tanh(s / softcap) where softcap > 0)."""
    n_head_kv = store.n_head_kv
    dk, dv = store.head_dim
    k = store.decode(il, Kind.K, r0, r1).reshape(r1 - r0, n_head_kv, dk).astype(np.float64)
    v = store.decode(il, Kind.V, r0, r1).reshape(r1 - r0, n_head_kv, dv).astype(np.float64)
    kv_head = np.arange(q.shape[1]) // (q.shape[1] // n_head_kv)
    s = scale * np.einsum("thd,rhd->thr", q.astype(np.float64), k[:, kv_head])
    if softcap:
        s = softcap * np.tanh(s / softcap)
    m = s.max(-1)
    p = np.exp(s - m[..., None])
    out = np.einsum("thr,rhd->thd", p, v[:, kv_head]) / p.sum(-1)[..., None]
    return m, p.sum(-1), out, float(np.abs(v).max())


def queries(rng, n_tokens, n_head, head_dim):
    return (2.0 * rng.standard_normal((n_tokens, n_head, head_dim))).astype(np.float32)


def attend_at(level, store, il, r0, r1, q, scale, state=None):
    with codecs.force_simd(level):
        return store.attend(il, r0, r1, q, scale, state)


@pytest.mark.parametrize("k_codec,v_codec,head_dim", CASES)
def test_attend_matches_softmax_over_decoded_rows(k_codec, v_codec, head_dim):
    rng = np.random.default_rng(7)
    scale = 1.0 / np.sqrt(head_dim)
    for n_head_kv, n_head in HEADS:
        store = build(k_codec, v_codec, head_dim, n_head_kv)
        for n_tokens in (1, 3):
            q = queries(rng, n_tokens, n_head, head_dim)
            for r0, r1 in RANGES:
                m_ref, l_ref, out_ref, vmax = reference(store, 1, r0, r1, q, scale)
                outs = []
                for level in LEVELS:
                    m, l, acc = attend_at(level, store, 1, r0, r1, q, scale)
                    out = acc / l[..., None]
                    where = f"{k_codec}/{v_codec} d={head_dim} heads={n_head_kv}/{n_head} T={n_tokens} [{r0},{r1}) simd={level}"
                    assert m.shape == (n_tokens, n_head) and acc.shape == (n_tokens, n_head, head_dim)
                    np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-5, err_msg=where)
                    np.testing.assert_allclose(l, l_ref, rtol=1e-4, err_msg=where)
                    err = float(np.abs(out - out_ref).max())
                    assert err <= TOL * vmax, f"{where}: max error {err:.3g} > {TOL} * {vmax:.3g}"
                    outs.append(out)
                if len(outs) == 2:
                    err = float(np.abs(outs[0] - outs[1]).max())
                    assert err <= TOL_SIMD * vmax, (
                        f"scalar vs SIMD level {LEVELS[1]} {k_codec}/{v_codec} d={head_dim}: {err:.3g}"
                    )


# Many queries per KV head (a prefill's ubatch: KVG_DENSE_MIN_QUERIES = 16 in attend.c): f16,
# rotq and tcq rows are decoded once per chunk and multiplied as dense tiles, beside codecs that
# keep their kernels (kivi, wfq) in the same call. 7 tokens of groups of 3 give 21 queries per KV
# head (a tail of 5 after the tiles of 8); 16 without GQA, exactly two tiles.
DENSE_PAIRS = [
    ("f16", "f16"),
    ("rotq3", "rotq2"),
    ("tcq3", "tcq4"),
    ("rotq4", "kivi2"),
    ("kivi4", "tcq2"),
    ("wfq3", "rotq1"),
]


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("k_codec,v_codec", DENSE_PAIRS)
def test_dense_tiles_for_many_queries_match_the_softmax(k_codec, v_codec, head_dim):
    rng = np.random.default_rng(11)
    scale = 1.0 / np.sqrt(head_dim)
    for (n_head_kv, n_head), n_tokens in (((3, 9), 7), ((1, 1), 16), ((1, 3), 2)):
        store = build(k_codec, v_codec, head_dim, n_head_kv)
        q = queries(rng, n_tokens, n_head, head_dim)
        for r0, r1 in ((0, N_ROWS), (61, 250)):
            m_ref, l_ref, out_ref, vmax = reference(store, 1, r0, r1, q, scale)
            outs = []
            for level in LEVELS:
                m, l, acc = attend_at(level, store, 1, r0, r1, q, scale)
                out = acc / l[..., None]
                where = f"{k_codec}/{v_codec} d={head_dim} T={n_tokens} heads={n_head_kv}/{n_head} simd={level}"
                np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-5, err_msg=where)
                np.testing.assert_allclose(l, l_ref, rtol=1e-4, err_msg=where)
                assert float(np.abs(out - out_ref).max()) <= TOL * vmax, where
                outs.append(out)
            if len(outs) == 2:
                assert float(np.abs(outs[0] - outs[1]).max()) <= TOL_SIMD * vmax, where


def merge(a, b):
    """Two online-softmax states over disjoint rows, merged in log-sum-exp form."""
    (m1, l1, acc1), (m2, l2, acc2) = a, b
    m = np.maximum(m1, m2)
    f1, f2 = np.exp(m1 - m), np.exp(m2 - m)
    return m, l1 * f1 + l2 * f2, acc1 * f1[..., None] + acc2 * f2[..., None]


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize(
    "k_codec,v_codec", [("f16", "f16"), ("rotq4", "rotq2"), ("kivi2", "crotq3"), ("crotq4", "kivi4")]
)
def test_split_ranges_merge_to_the_one_call_result(k_codec, v_codec, level):
    store = build(k_codec, v_codec, 64, 3)
    q = queries(np.random.default_rng(3), 2, 9, 64)
    scale = 0.125
    whole = attend_at(level, store, 1, 5, 240, q, scale)
    want = whole[2] / whole[1][..., None]
    for cut in (6, 77, 101, 239):  # inside blocks and on a K block edge
        parts = merge(attend_at(level, store, 1, 5, cut, q, scale), attend_at(level, store, 1, cut, 240, q, scale))
        np.testing.assert_allclose(parts[0], whole[0], rtol=0, atol=0)
        np.testing.assert_allclose(parts[2] / parts[1][..., None], want, rtol=0, atol=1e-6 * np.abs(want).max())
        # continuing from a state is the same fold
        cont = attend_at(level, store, 1, cut, 240, q, scale, state=attend_at(level, store, 1, 5, cut, q, scale))
        np.testing.assert_allclose(cont[2] / cont[1][..., None], want, rtol=0, atol=1e-6 * np.abs(want).max())


def test_empty_range_leaves_the_state_as_it_was():
    store = build("rotq4", "rotq4", 64, 3)
    q = queries(np.random.default_rng(0), 1, 9, 64)
    m, l, acc = store.attend(1, 40, 40, q, 0.125)
    assert np.all(m == -np.inf) and not l.any() and not acc.any()


def test_shapes_off_the_fast_paths_fall_back_to_the_reference():
    """head_dim 8 (rotq's smallest SIMD shape), 4 and 24 (not handled by the SIMD kernels), and a
    kivi group size that is not a multiple of 8: every level still matches the decoded rows."""
    rng = np.random.default_rng(11)
    for head_dim, group_size, pairs in (
        (8, 32, [("rotq3", "crotq2"), ("kivi3", "f16")]),
        (4, 32, [("rotq2", "rotq4"), ("f16", "kivi2")]),
        (24, 7, [("kivi4", "kivi3"), ("f16", "kivi8")]),
    ):
        for k_codec, v_codec in pairs:
            store = build(k_codec, v_codec, head_dim, 3, group_size=group_size)
            q = queries(rng, 3, 9, head_dim)
            scale = 1.0 / np.sqrt(head_dim)
            for r0, r1 in RANGES:
                _, _, out_ref, vmax = reference(store, 1, r0, r1, q, scale)
                for level in LEVELS:
                    m, l, acc = attend_at(level, store, 1, r0, r1, q, scale)
                    err = float(np.abs(acc / l[..., None] - out_ref).max())
                    assert err <= TOL * vmax, f"{k_codec}/{v_codec} d={head_dim} G={group_size} simd={level}: {err:.3g}"


def test_concurrent_calls_on_overlapping_ranges_agree_with_serial_ones():
    store = build("rotq4", "rotq2", 128, 3)
    q = queries(np.random.default_rng(5), 1, 9, 128)
    ranges = [(0, 263), (4, 200), (100, 263), (50, 51), (0, 130)] * 4
    serial = [store.attend(1, r0, r1, q, 0.1) for r0, r1 in ranges]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda r: store.attend(1, r[0], r[1], q, 0.1), ranges))
    for a, b in zip(serial, parallel):
        for x, y in zip(a, b):
            assert np.array_equal(x, y)


# ---- bad arguments: a negative status or an exception, never an abort, and the state unchanged ----


def raw_call(store, il, r0, r1, q, n_tokens, n_head, m, l, acc, *, user=None, null=()):
    ffi, lib = get_ffi(), get_lib()
    args = {
        name: ffi.NULL if name in null else ffi.from_buffer("float[]", x)
        for name, x in (("q", q), ("m", m), ("l", l), ("acc", acc))
    }
    return lib.kvg_store_hook_attend(
        store._ptr if user is None else user,
        il,
        r0,
        r1,
        args["q"],
        n_tokens,
        n_head,
        0.125,
        args["m"],
        args["l"],
        args["acc"],
    )


@pytest.mark.parametrize(
    "case",
    [
        "layer",
        "negative layer",
        "r1 past rows",
        "r0 negative",
        "r0 > r1",
        "n_head not a multiple",
        "n_tokens 0",
        "null user",
        "null q",
        "null m",
        "null l",
        "null acc",
        "rows only in K",
        "disabled layer",
    ],
)
def test_bad_arguments_return_an_error_and_leave_the_state_unchanged(case):
    ffi, lib = get_ffi(), get_lib()
    store = build("rotq4", "kivi2", 64, 3)
    store.append(1, Kind.K, Tier.WARM, "rotq4", np.ones((5, 192), np.float32))  # K now has 5 more rows than V
    store2 = KVStore(3, 3, 64, 64)
    store2.set_layer_enabled(2, False)
    rng = np.random.default_rng(0)
    n_tokens, n_head = 2, 9
    q = rng.standard_normal(n_tokens * n_head * 64).astype(np.float32)
    m = rng.standard_normal(n_tokens * n_head).astype(np.float32)
    l = rng.random(n_tokens * n_head).astype(np.float32)
    acc = rng.standard_normal(n_tokens * n_head * 64).astype(np.float32)
    before = [x.copy() for x in (m, l, acc)]
    args = dict(il=1, r0=0, r1=N_ROWS, n_tokens=n_tokens, n_head=n_head)
    kw = {}
    target = store
    if case == "layer":
        args["il"] = 2
    elif case == "negative layer":
        args["il"] = -1
    elif case == "r1 past rows":
        args["r1"] = N_ROWS + 100
    elif case == "r0 negative":
        args["r0"] = -1
    elif case == "r0 > r1":
        args["r0"], args["r1"] = 20, 10
    elif case == "n_head not a multiple":
        args["n_head"] = 4
    elif case == "n_tokens 0":
        args["n_tokens"] = 0
    elif case == "null user":
        kw["user"] = ffi.NULL
    elif case.startswith("null "):
        kw["null"] = (case.split()[1],)
    elif case == "rows only in K":
        args["r1"] = N_ROWS + 3
    elif case == "disabled layer":
        target, args["il"], args["r1"] = store2, 2, 1
    st = raw_call(target, args["il"], args["r0"], args["r1"], q, args["n_tokens"], args["n_head"], m, l, acc, **kw)
    assert st < 0
    assert ffi.string(lib.kvg_last_error()).decode()  # says why
    for x, y in zip((m, l, acc), before):
        assert np.array_equal(x, y)


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("k_codec,v_codec", [("f16", "f16"), ("rotq4", "kivi2"), ("kivi4", "crotq3")])
def test_soft_capped_scores_match_the_capped_softmax(k_codec, v_codec, level):
    """Gemma 2's logit soft-capping (kvg_store_hook_attend_capped): scores of a few tens capped at
    5 change the weights completely, so a missing or misplaced cap fails by far."""
    rng = np.random.default_rng(11)
    store = build(k_codec, v_codec, 64, 3)
    q = queries(rng, 2, 9, 64)
    for softcap in (5.0, 50.0):
        m_ref, l_ref, out_ref, vmax = reference(store, 1, 3, 197, q, 0.125, softcap)
        with codecs.force_simd(level):
            m, l, acc = store.attend(1, 3, 197, q, 0.125, softcap=softcap)
        assert float(np.abs(m).max()) <= softcap
        np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(l, l_ref, rtol=1e-4)
        assert float(np.abs(acc / l[..., None] - out_ref).max()) <= TOL * vmax
    uncapped = reference(store, 1, 3, 197, q, 0.125)[2]
    assert float(np.abs(uncapped - out_ref).max()) > 100 * TOL * vmax  # the cap matters here
    with pytest.raises(ValueError, match="softcap"):
        store.attend(1, 3, 197, q, 0.125, softcap=-1.0)


def test_bad_arguments_raise_in_python():
    store = build("f16", "rotq4", 64, 3)
    q = np.zeros((1, 9, 64), np.float32)
    with pytest.raises(ValueError, match="outside"):
        store.attend(1, 0, N_ROWS + 1, q, 0.125)
    with pytest.raises(ValueError, match="layer 5"):
        store.attend(5, 0, 1, q, 0.125)
    with pytest.raises(ValueError, match="multiple of n_head_kv"):
        store.attend(1, 0, 1, np.zeros((1, 4, 64), np.float32), 0.125)
    with pytest.raises(ValueError, match="q must be"):
        store.attend(1, 0, 1, np.zeros((1, 9, 32), np.float32), 0.125)
    with pytest.raises(ValueError, match="state shapes"):
        store.attend(1, 0, 1, q, 0.125, state=(np.zeros((1, 9)), np.zeros((1, 9)), np.zeros((1, 9, 32))))


def test_corrupt_blocks_are_refused_when_appended_not_when_attended():
    store = build("rotq2", "kivi4", 64, 3)
    blocks = store.blocks(1, Kind.K)
    bad = bytearray(blocks[1].data)
    bad[0:2] = b"\x00\xfc"  # first norm: f16 -Inf
    with pytest.raises(codecs.KvgCorruptError):
        store.append_encoded(1, Kind.K, EncodedBlock(blocks[1].n_rows, blocks[1].codec, blocks[1].tier, bytes(bad)))
    assert store.n_rows(1, Kind.K) == N_ROWS
    m, l, acc = store.attend(1, 0, N_ROWS, np.ones((1, 9, 64), np.float32), 0.125)
    assert np.isfinite(acc).all() and (l > 0).all()


def test_a_wfq_plan_in_any_order_of_widths_attends_like_its_decoded_rows():
    """kvg_wfq_train orders a plan's positions by bits, widest first; a plan from elsewhere (a
    session) may not. The SIMD kernels read 8 codes at a time and zero the lanes past a set's
    end, which must not spill over a set already read: sets of 25, 5, 19, 13 and 2 coordinates
    at 3, 6, 1, 4 and 0 bits."""
    rng = np.random.default_rng(11)
    d, n_head_kv = 64, 2
    bits = np.array([3] * 25 + [6] * 5 + [1] * 19 + [4] * 13 + [0] * 2, np.float32)
    assert bits.sum() == 3 * d - 16
    store = KVStore(1, n_head_kv, d, d)
    for kind in Kind:
        x = kv_like(rng, (N_ROWS, n_head_kv * d), random_channels=True)
        heads = x.reshape(N_ROWS, n_head_kv, d)
        plan = np.stack(
            [
                np.stack([rng.permutation(d).astype(np.float32), np.sqrt((heads[:, h] ** 2).mean(0)) + 0.1, bits])
                for h in range(n_head_kv)
            ]
        )
        store.set_book(0, kind, "wfq3", plan)
        store.append(0, kind, Tier.WARM, "wfq3", x)
    q = queries(rng, 3, 2 * n_head_kv, d)
    m_ref, l_ref, out_ref, vmax = reference(store, 0, 0, N_ROWS, q, 0.125)
    for level in LEVELS:
        m, l, acc = attend_at(level, store, 0, 0, N_ROWS, q, 0.125)
        np.testing.assert_allclose(m, m_ref, rtol=1e-5, atol=1e-5)
        err = float(np.abs(acc / l[..., None] - out_ref).max())
        assert err <= TOL * vmax, f"simd={level}: max error {err:.3g}"
