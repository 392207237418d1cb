"""The native store: rows in blocks and tiers, exact byte accounting, errors as exceptions."""

import struct

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.enums import Kind, Tier
from kvgguf.bindings.binding import KvgError
from kvgguf.bindings.store import KVStore


def make_store():
    return KVStore(n_layer=3, n_head_kv=2, head_dim_k=64, head_dim_v=64)


def rows(n, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 128)).astype(np.float32)


def test_append_decode_and_byte_accounting():
    s = make_store()
    x = rows(70)
    s.append(0, Kind.K, Tier.SINK, "f16", x[:4])
    s.append(0, Kind.K, Tier.WARM, "rotq4", x[4:70])
    assert s.n_rows(0, Kind.K) == 70 and s.n_rows(1, Kind.K) == 0
    back = s.decode(0, Kind.K, 0, 70)
    assert np.array_equal(back[:4], x[:4].astype(np.float16).astype(np.float32))  # sinks exact
    assert np.array_equal(s.decode(0, Kind.K, 2, 9), back[2:9])  # ranges across blocks
    assert np.array_equal(s.decode_f16(0, Kind.K, 0, 70), back.astype(np.float16))
    held = s.held(Tier.WARM)
    assert held.bytes == codecs.encoded_size("rotq4", (66, 2, 64), "k")
    assert held.values == 66 * 128
    assert s.held(Tier.SINK).bytes == 4 * 128 * 2
    assert s.held().bytes == s.held(Tier.SINK).bytes + held.bytes


def test_retier_reencodes_whole_blocks_and_refuses_cut_blocks():
    s = make_store()
    for il in range(3):
        for kind in Kind:
            s.append(il, kind, Tier.WARM, "rotq4", rows(32, il))
            s.append(il, kind, Tier.WARM, "rotq4", rows(32, il + 10))
    before = s.held(Tier.WARM).bytes
    with pytest.raises(ValueError, match="cut block"):
        s.retier(0, 40, Tier.ARCHIVE, "rotq2")
    assert s.held(Tier.WARM).bytes == before  # nothing changed
    s.retier(0, 32, Tier.ARCHIVE, "rotq2")
    assert s.held(Tier.ARCHIVE).bytes == 6 * codecs.encoded_size("rotq2", (32, 2, 64))
    assert s.held(Tier.WARM).bytes == before // 2
    err = np.abs(s.decode(0, Kind.K, 0, 32) - rows(32, 0)).mean()
    assert err < 0.5  # 2-bit rows, still the same rows


def test_aging_keeps_a_codec_s_bytes_and_codes_rotq_again_from_its_codes():
    s = make_store()
    x = rows(64)
    for kind in Kind:
        s.append(0, kind, Tier.WARM, "rotq4", x[:32])
        s.append(0, kind, Tier.WARM, "rotq4", x[32:])
    k_bytes = s.blocks(0, Kind.K)[0].data
    v_rows = s.decode(0, Kind.V, 0, 32)
    s.retier_lists(0, 32, Tier.ARCHIVE, {(0, Kind.K): "rotq4", (0, Kind.V): "rotq2"})
    # the same codec: the tier alone changes, the bytes stay (no second rounding)
    k = s.blocks(0, Kind.K)[0]
    assert (k.tier, k.codec, k.data) == (Tier.ARCHIVE, "rotq4", k_bytes)
    # rotq4 -> rotq2 from the codes: what encoding the decoded rows gives, up to the rounding
    # of the two rotations that the codes skip
    v = s.blocks(0, Kind.V)[0]
    ref = bytes(codecs.encode("rotq2", v_rows.reshape(32, 2, 64), "v"))
    assert (v.tier, v.codec, len(v.data)) == (Tier.ARCHIVE, "rotq2", len(ref))
    n_norms = 32 * 2 * 2
    norms = np.frombuffer(v.data[:n_norms], np.float16).astype(np.float32)
    ref_norms = np.frombuffer(ref[:n_norms], np.float16).astype(np.float32)
    assert np.allclose(norms, ref_norms, rtol=2e-3)
    codes = np.unpackbits(np.frombuffer(v.data[n_norms:], np.uint8))
    ref_codes = np.unpackbits(np.frombuffer(ref[n_norms:], np.uint8))
    assert np.mean(codes == ref_codes) > 0.99
    got, want = s.decode(0, Kind.V, 0, 32), codecs.decode("rotq2", ref, (32, 2, 64), "v").reshape(32, 128)
    assert np.abs(got - want).mean() < 0.01 * np.abs(want).mean()


@pytest.mark.parametrize(
    "src, dst", [("rotq4", "rotq2"), ("rotq4", "rotq1"), ("rotq4", "rotq3"), ("rotq3", "rotq2"), ("rotq2", "rotq4")]
)
@pytest.mark.parametrize("head_dim", [2, 8, 128])
def test_rotq_ages_from_its_codes_as_decoding_and_encoding_would(src, dst, head_dim):
    """kvg_rotq_transcode (its 4-bit fast paths and the general one) against coding the decoded
    rows again: norms within an f16 step, codes equal but for a rounding at a boundary."""
    s = KVStore(n_layer=1, n_head_kv=3, head_dim_k=head_dim, head_dim_v=head_dim)
    x = np.random.default_rng(head_dim).standard_normal((40, 3 * head_dim)).astype(np.float32)
    x[5] = 0.0  # a zero vector stays zero
    s.append(0, Kind.V, Tier.WARM, src, x)
    decoded = s.decode(0, Kind.V, 0, 40)
    s.retier(0, 40, Tier.ARCHIVE, dst, kind=Kind.V)
    got = s.blocks(0, Kind.V)[0].data
    ref = bytes(codecs.encode(dst, decoded.reshape(40, 3, head_dim), "v"))
    n = 40 * 3 * 2
    assert len(got) == len(ref)
    norms, ref_norms = (np.frombuffer(b[:n], np.float16).astype(np.float32) for b in (got, ref))
    assert np.allclose(norms, ref_norms, rtol=1e-3) and norms[15:18].max() == 0.0
    codes, ref_codes = (np.unpackbits(np.frombuffer(b[n:], np.uint8)) for b in (got, ref))
    assert np.mean(codes == ref_codes) > 0.995


def test_a_rotq_block_cut_by_truncate_keeps_its_rows_exactly():
    s = make_store()
    for kind in Kind:
        s.append(0, kind, Tier.WARM, "rotq3", rows(64))
    before = s.decode(0, Kind.V, 0, 64)
    s.truncate(40)
    assert s.n_rows(0, Kind.V) == 40
    assert np.array_equal(s.decode(0, Kind.V, 0, 40), before[:40])  # the codes copied, not coded again
    assert s.held().bytes == 2 * codecs.encoded_size("rotq3", (40, 2, 64))


def test_retier_of_one_layer_and_kind_leaves_the_other_lists_alone():
    s = make_store()
    for il in range(3):
        for kind in Kind:
            s.append(il, kind, Tier.WARM, "rotq4", rows(32, il))
    s.retier(0, 32, Tier.ARCHIVE, "kivi2", il=1, kind=Kind.V)
    assert s.held(Tier.ARCHIVE).bytes == codecs.encoded_size("kivi2", (32, 2, 64), "v")
    assert [b.codec for b in s.blocks(1, Kind.V)] == ["kivi2"]
    assert [b.codec for il in range(3) for kind in Kind if (il, kind) != (1, Kind.V) for b in s.blocks(il, kind)] == [
        "rotq4"
    ] * 5
    s.retier(0, 32, Tier.ARCHIVE, "rotq3", kind=Kind.K)  # every layer's K
    assert [b.codec for il in range(3) for b in s.blocks(il, Kind.K)] == ["rotq3"] * 3
    with pytest.raises(ValueError, match="layer 3 is out of range"):
        s.retier(0, 32, Tier.ARCHIVE, "rotq2", il=3)
    with pytest.raises(ValueError, match="kind 2 is unknown"):
        s.retier(0, 32, Tier.ARCHIVE, "rotq2", kind=2)


def test_truncate_cuts_inside_a_block():
    s = make_store()
    x = rows(64)
    for kind in Kind:
        s.append(1, kind, Tier.WARM, "f16", x[:32])
        s.append(1, kind, Tier.WARM, "f16", x[32:])
    s.truncate(40)
    assert s.n_rows(1, Kind.K) == 40 and s.n_rows(1, Kind.V) == 40
    assert np.array_equal(s.decode(1, Kind.V, 0, 40), x[:40].astype(np.float16).astype(np.float32))
    assert s.held().bytes == 2 * 40 * 128 * 2
    s.clear()
    assert s.held().bytes == 0 and s.n_rows(1, Kind.K) == 0


def test_bad_input_raises_and_leaves_the_store_intact():
    s = make_store()
    s.append(0, Kind.K, Tier.WARM, "rotq4", rows(8))
    with pytest.raises(ValueError, match="layer 7"):
        s.append(7, Kind.K, Tier.WARM, "rotq4", rows(8))
    with pytest.raises(ValueError):
        s.append(0, Kind.K, Tier.WARM, "rotq4", np.full((2, 128), np.nan, np.float32))
    with pytest.raises(ValueError, match="outside"):
        s.decode(0, Kind.K, 0, 9)
    with pytest.raises(ValueError, match="codec 'nope' is unknown"):
        s.append(0, Kind.K, Tier.WARM, "nope", rows(8))
    s.set_layer_enabled(2, False)
    with pytest.raises(ValueError, match="disabled"):
        s.append(2, Kind.K, Tier.WARM, "f16", rows(1))
    assert s.n_rows(0, Kind.K) == 8
    assert s.decode(0, Kind.K, 0, 8).shape == (8, 128)


@pytest.mark.parametrize("codec", ["kivi2", "kivi3", "kivi4"])  # rotq refuses such norms when encoding
@pytest.mark.parametrize("kind", [Kind.K, Kind.V])
def test_rows_at_the_edge_of_f16_never_reach_llama_cpp_as_inf(codec, kind):
    """A group spanning all of f16's range decodes a hair past 65504 (kivi's scale rounds up);
    the f16 read path, which feeds llama.cpp, saturates instead of writing Inf."""
    s = make_store()
    x = rows(32)
    x[::2, :] = 65504.0
    x[1::2, :] = -65504.0
    s.append(1, kind, Tier.WARM, codec, x)
    back = s.decode_f16(1, kind, 0, 32)
    assert np.isfinite(back).all()
    assert np.all(np.abs(back.astype(np.float32)) <= 65504.0)


def test_aging_on_threads_gives_one_thread_s_bytes_and_books():
    # Each list is coded by one thread, as one thread codes it: rotq from its codes, kivi and pq2
    # from the decoded rows (pq2 trains the list's book on the rows it codes first).
    def aged(n_threads):
        s = KVStore(n_layer=6, n_head_kv=2, head_dim_k=64, head_dim_v=64)
        s.set_threads(n_threads)
        for il in range(6):
            for kind in Kind:
                s.append(il, kind, Tier.WARM, "rotq4", rows(48, 10 * il + kind))
                s.append(il, kind, Tier.WARM, "rotq4", rows(16, 10 * il + kind + 5))
        table = {(il, kind): ("rotq2", "kivi2", "pq2")[il % 3] for il in range(6) for kind in Kind}
        s.retier_lists(0, 64, Tier.ARCHIVE, table)
        blocks = [(b.tier, b.codec, b.data) for il in range(6) for kind in Kind for b in s.blocks(il, kind)]
        return blocks, [(il, kind, codec, book.tobytes()) for il, kind, codec, book in s.books()]

    one = aged(1)
    assert {codec for _, codec, _ in one[0]} == {"rotq2", "kivi2", "pq2"} and len(one[1]) == 4
    assert aged(4) == one
    assert aged(64) == one


def test_attention_beside_aging_on_threads_reads_whole_lists_before_or_after():
    # Aging may run on its own thread beside a batch (LiveCache.ages_beside), and a layer that
    # falls back to the CPU path would then read blocks that the retier swaps. The store's lock
    # orders them: each attend call reads a layer's blocks wholly before the swap or wholly after.
    import threading

    def filled():
        s = KVStore(n_layer=4, n_head_kv=2, head_dim_k=64, head_dim_v=64)
        s.set_threads(2)
        for il in range(4):
            for kind in Kind:
                for b in range(8):
                    s.append(il, kind, Tier.WARM, "rotq4", rows(32, 100 * il + 10 * kind + b))
        return s

    q = np.random.default_rng(7).standard_normal((1, 4, 64)).astype(np.float32)
    table = {(il, kind): "rotq2" for il in range(4) for kind in Kind}
    before = [filled().attend(il, 0, 256, q, 0.125) for il in range(4)]
    aged = filled()
    aged.retier_lists(0, 256, Tier.ARCHIVE, table)
    after = [aged.attend(il, 0, 256, q, 0.125) for il in range(4)]
    same = lambda a, b: all(np.array_equal(x, y) for x, y in zip(a, b))  # noqa: E731
    for _ in range(3):
        s, seen, done = filled(), [], threading.Event()

        def attend_until_done():
            while not done.is_set():
                for il in range(4):
                    seen.append((il, s.attend(il, 0, 256, q, 0.125)))

        reader = threading.Thread(target=attend_until_done)
        reader.start()
        s.retier_lists(0, 256, Tier.ARCHIVE, table)
        done.set()
        reader.join()
        assert seen and all(same(got, before[il]) or same(got, after[il]) for il, got in seen)
        assert all(same(s.attend(il, 0, 256, q, 0.125), after[il]) for il in range(4))


def test_set_threads_refuses_counts_outside_1_to_64():
    s = make_store()
    for bad in (0, -1, 65):
        with pytest.raises(ValueError, match="1 to 64"):
            s.set_threads(bad)
    s.set_threads(64)


def test_an_eviction_plan_appends_each_part_in_its_tier_and_refuses_bad_lists():
    """kvg_store_hook_append, as llama_kvgguf_evict calls it: each part of the rows into its tier
    with its own codec (-1: list skipped), and a clear error, the store unchanged, for a NULL plan,
    a list the store has not, rows of the wrong width or parts beyond the rows."""
    from kvgguf.bindings.binding import check, get_ffi, get_lib

    ffi, lib = get_ffi(), get_lib()
    s = make_store()
    sink, warm = {(il, k): "f16" for il in range(3) for k in Kind}, {(il, k): "rotq4" for il in range(3) for k in Kind}
    del warm[2, Kind.V]  # skipped
    plan = s.evict_plan([(Tier.SINK, 0, 4), (Tier.WARM, 4, 36)], {Tier.SINK: sink, Tier.WARM: warm})
    append = ffi.cast("int32_t (*)(void *, int32_t, int32_t, const float *, int64_t, int64_t)", s.append_function())
    x = rows(36)
    user = ffi.cast("void *", plan.address)
    for il in range(3):
        for kind in Kind:
            assert append(user, il, kind, ffi.from_buffer("float[]", x), 36, 128) == 0
    ref = make_store()
    ref.append(0, Kind.K, Tier.SINK, "f16", x[:4])
    ref.append(0, Kind.K, Tier.WARM, "rotq4", x[4:])
    assert np.array_equal(s.decode(1, Kind.V, 0, 36), ref.decode(0, Kind.K, 0, 36))
    assert s.n_rows(2, Kind.V) == 4 and s.held(Tier.WARM).bytes == 5 * codecs.encoded_size("rotq4", (32, 2, 64), "k")
    before = s.held().bytes
    assert append(ffi.NULL, 0, 0, ffi.from_buffer("float[]", x), 36, 128) == lib.KVG_ERR_INVALID_ARG
    for il, kind, n_rows, n_embd in ((3, 0, 36, 128), (0, 2, 36, 128), (0, 0, 36, 64), (0, 0, 20, 128)):
        rc = append(user, il, kind, ffi.from_buffer("float[]", x), n_rows, n_embd)
        assert rc != 0 and plan.c.status == rc
        with pytest.raises(KvgError):
            plan.check("evict")
        with pytest.raises(KvgError, match="list|values|part"):
            check(rc, "evict")
    assert s.held().bytes == before and s.n_rows(0, Kind.K) == 36


def test_a_range_of_blocks_leaves_and_comes_back_in_one_buffer_or_not_at_all():
    """copy_blocks / append_blocks (aging's warm copies, a cut putting them back): every list's
    blocks of a range, bytes unchanged; a buffer cut short, out of place or of bytes no encoder
    writes changes nothing."""
    s = make_store()
    for il in range(3):
        for kind in Kind:
            for r0 in (0, 32, 64):
                s.append(il, kind, Tier.WARM, "rotq4" if r0 else "f16", rows(32, il * 10 + r0))
    tail = s.copy_blocks(32, 96)
    assert s.copy_blocks(96, 200) == b"" and len(s.copy_blocks(0, 33)) > len(s.copy_blocks(32, 33))
    before = {(il, k): s.decode(il, k, 0, 96) for il in range(3) for k in Kind}
    s.truncate(32)
    s.append_blocks(tail)
    assert all(np.array_equal(s.decode(il, k, 0, 96), before[il, k]) for il in range(3) for k in Kind)
    assert s.copy_blocks(32, 96) == tail
    s.truncate(32)
    held = s.held().bytes
    at = 0  # the last record: 40 bytes (layer, kind, kvg_block_info), then its codes
    while at + 40 + struct.unpack_from("<Q", tail, at + 32)[0] < len(tail):
        at += 40 + struct.unpack_from("<Q", tail, at + 32)[0]
    bad = bytearray(tail)
    struct.pack_into("<i", bad, at + 28, 99)  # its tier: refused after every other block went in
    for data in (tail[:-1], tail[:20], bytes(bad)):
        with pytest.raises((ValueError, KvgError)):
            s.append_blocks(data)
        assert s.held().bytes == held and s.n_rows(2, Kind.V) == 32
    s.append_blocks(tail)
    with pytest.raises(KvgError, match="ends at 96"):
        s.append_blocks(tail)  # rows 32.. again, after 96
    assert s.held().bytes > held and s.copy_blocks(32, 96) == tail


def test_a_shift_drops_whole_blocks_and_moves_the_later_ones_with_their_codes():
    s = make_store()
    x = rows(100)
    for il in range(3):
        for kind in Kind:
            s.append(il, kind, Tier.SINK, "f16", x[:4])
            s.append(il, kind, Tier.WARM, "rotq4", x[4:36])
            s.append(il, kind, Tier.WARM, "rotq4", x[36:68])
            s.append(il, kind, Tier.WARM, "kivi4", x[68:100])
    before = s.decode(1, Kind.V, 0, 100)
    with pytest.raises(KvgError, match="do not start and end on blocks"):
        s.shift(4, 40)  # cuts a block: refused, nothing changed
    assert s.n_rows(1, Kind.V) == 100 and s.shifts(1) == []
    s.shift(4, 36)
    assert s.n_rows(1, Kind.V) == 68
    back = s.decode(1, Kind.V, 0, 68)
    assert np.array_equal(back[:4], before[:4]) and np.array_equal(back[4:], before[36:])  # the same codes
    assert s.shifts(1) == [(4, 68, 32)]  # one run: two blocks moved by the same 32
    s.append(1, Kind.K, Tier.WARM, "f16", x[:16])
    s.append(1, Kind.V, Tier.WARM, "f16", x[:16])
    assert s.shifts(1) == [(4, 68, 32)]  # new rows are where they were rotated
    s.shift(4, 36)  # a block that moved twice, one that moved once
    assert s.shifts(1) == [(4, 36, 64), (36, 52, 32)]
    s.truncate(20)  # a cut block keeps its shift
    assert s.shifts(1) == [(4, 20, 64)]
    s.shift(4, 1000)  # past the end: the rows after p0 go, as a truncate would
    assert s.n_rows(0, Kind.K) == 4 and s.shifts(0) == []


def test_set_shift_gives_whole_blocks_of_a_layer_their_shift_or_refuses():
    s = make_store()
    x = rows(68)
    for il in range(3):
        for kind in Kind:
            s.append(il, kind, Tier.WARM, "rotq4", x[:36])
            s.append(il, kind, Tier.WARM, "rotq4", x[36:68])
    s.set_shift(1, 36, 68, 7)
    assert s.shifts(1) == [(36, 68, 7)] and s.shifts(0) == []
    for r0, r1 in ((30, 68), (36, 60), (36, 100)):  # cuts a block, or past the rows: nothing changes
        with pytest.raises(KvgError, match="not whole blocks"):
            s.set_shift(1, r0, r1, 9)
        assert s.shifts(1) == [(36, 68, 7)]
    s.set_shift(1, 0, 68, 0)
    assert s.shifts(1) == []
