"""pq2 / vq8 / vq8f (native/src/codecs/pq.c): rotq's rotation and norm, then one byte per sub-vector
naming a centroid of a trained codebook (vq8f: the worst 1/32 of head vectors kept in f16 instead);
the store trains and keeps one codebook per (layer, kind)."""

import numpy as np
import pytest

from kvgguf import codecs
from kvgguf.bindings.codecs import KvgCorruptError, KvgError
from kvgguf.enums import Kind, Tier
from kvgguf.bindings.store import KVStore
from helpers import rel_mse

NAMES = list(codecs.CODEBOOK_CODECS)
# rotq2's bound on N(0, 1) rows (tests/unit/test_codecs.py): 1.25x the Lloyd-Max MSE at 2 bits
ROTQ2_BOUND = 1.25 * 0.1175


def sub_len(name, d):
    return 4 if name == "pq2" else d


def hadamard(d):
    w = np.array([[1.0]])
    while w.shape[0] < d:
        w = np.block([[w, w], [w, -w]])
    return w


def signs(seed, d):
    """rotq's signs (kvgguf.h): negative iff bit 63 of splitmix64_mix(seed + (i + 1) * golden) is set."""
    out = np.empty(d)
    for i in range(d):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) % 2**64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
        z ^= z >> 31
        out[i] = -1.0 if z >> 63 else 1.0
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("n_tokens", [1, 33, 100])
def test_round_trip_with_its_own_book(name, head_dim, n_tokens):
    rng = np.random.default_rng(head_dim + n_tokens)
    x = rng.standard_normal((n_tokens, 3, head_dim)).astype(np.float32)
    book = codecs.train_book(name, x)
    assert book.shape == (256, sub_len(name, head_dim)) and np.isfinite(book).all()
    c = codecs.get(name, book=book)
    buf = c.encode(x)
    assert buf.size == c.encoded_size(x.shape)
    y = c.decode(buf, x.shape)
    err = rel_mse(x, y)
    if name == "pq2":
        # k-means in 4 dimensions beats the scalar Lloyd-Max quantizer at the same 2 bits
        # (0.1175 of the variance) on the data it was trained on; with fewer sub-vectors than
        # centroids every one is a centroid (only the f16 norm and float rounding are left)
        assert err < (1e-5 if n_tokens * 3 * head_dim // 4 <= 256 else ROTQ2_BOUND)
    else:  # one byte per head vector: its 256 centroids can only hold the training vectors exactly
        assert err < (1e-5 if n_tokens * 3 <= 256 else 1.0)


@pytest.mark.parametrize("name", ["pq2", "vq8"])
def test_layout_is_norms_then_codes_of_the_rotated_vector(name):
    """Decode by hand from the layout kvgguf.h documents: x' = s * W(book[codes]) * n / d."""
    rng = np.random.default_rng(7)
    t, h, d = 40, 2, 64
    x = rng.standard_normal((t, h, d)).astype(np.float32)
    book = codecs.train_book(name, x[:20])
    c = codecs.get(name, book=book)
    buf = c.encode(x)
    norms = buf[: t * h * 2].view("<f2").astype(np.float64)
    codes = buf[t * h * 2 :].reshape(t * h, d // sub_len(name, d))
    assert np.allclose(norms, np.linalg.norm(x.reshape(-1, d), axis=1), rtol=1e-3)
    cent = book.astype(np.float64)[codes].reshape(t * h, d)
    want = (cent @ hadamard(d)) * signs(c.seed, d) * norms[:, None] / d
    assert np.allclose(c.decode(buf, x.shape).reshape(t * h, d), want, atol=1e-5)
    # and each code is the nearest centroid to its sub-vector of y = W(s * x) / n
    y = (x.reshape(-1, d).astype(np.float64) * signs(c.seed, d)) @ hadamard(d) / norms[:, None]
    sub = y.reshape(-1, sub_len(name, d))
    dist = ((sub[:, None, :] - book[None].astype(np.float64)) ** 2).sum(-1)
    got = dist[np.arange(len(sub)), codes.ravel()]
    assert np.all(got <= dist.min(1) + 1e-4)


@pytest.mark.parametrize("name", ["pq2", "vq8"])
def test_bits_per_value_from_the_bytes(name):
    d = 64
    c = codecs.get(name, book=np.zeros((256, sub_len(name, d)), np.float32))
    want = 8 / sub_len(name, d) + 16 / d
    assert c.bits_per_value((64, 3, d)) == pytest.approx(want)
    assert c.nominal_bits_per_value(d) == pytest.approx(want)


def test_vq8f_keeps_the_vectors_vq8_codes_worst_in_f16():
    """vq8's bytes, then the bitmask and the flagged vectors' y in f16 (kvgguf.h): exactly
    ceil(nv / 32) flagged, those farthest from their centroid; decode takes y for them."""
    rng = np.random.default_rng(9)
    t, h, d = 45, 3, 64
    x = rng.standard_normal((t, h, d)).astype(np.float32)
    x[::7] *= rng.uniform(0.2, 3.0, (len(x[::7]), h, 1)).astype(np.float32)
    book = codecs.train_book("vq8f", x[:20])
    assert np.array_equal(book, codecs.train_book("vq8", x[:20]))  # vq8's training
    c, plain = codecs.get("vq8f", book=book), codecs.get("vq8", book=book)
    buf, base = c.encode(x), plain.encode(x)
    nv, F = t * h, -(-t * h // 32)
    assert buf.size == base.size + -(-nv // 8) + F * d * 2 and np.array_equal(buf[: base.size], base)
    mask = np.unpackbits(buf[base.size : base.size + -(-nv // 8)], bitorder="little")[:nv].astype(bool)
    assert mask.sum() == F
    norms = base[: nv * 2].view("<f2").astype(np.float64)
    y = (x.reshape(-1, d).astype(np.float64) * signs(c.seed, d)) @ hadamard(d) / norms[:, None]
    codes = base[nv * 2 :]
    err = ((y - book.astype(np.float64)[codes]) ** 2).sum(1)
    assert err[mask].min() >= err[~mask].max() - 1e-4  # the worst ones
    kept = buf[base.size + -(-nv // 8) :].view("<f2").astype(np.float64).reshape(F, d)
    assert np.allclose(kept, y[mask], atol=2e-3)
    got, vq = c.decode(buf, x.shape).reshape(nv, d), plain.decode(base, x.shape).reshape(nv, d)
    assert np.array_equal(got[~mask], vq[~mask])
    assert np.allclose(got[mask], x.reshape(nv, d)[mask], atol=3e-3 * np.abs(x).max())
    assert rel_mse(x, got.reshape(x.shape)) < rel_mse(x, vq.reshape(x.shape))
    assert c.bits_per_value(x.shape) == pytest.approx(buf.size * 8 / x.size)
    # a damaged bitmask: a flag too many, or one past the last vector, is refused
    m0 = base.size
    for i, bad in ((m0, buf[m0] ^ 0xFF), (m0 + nv // 8, buf[m0 + nv // 8] | 0x80)):
        damaged = buf.copy()
        damaged[i] = bad
        with pytest.raises(KvgCorruptError, match="bitmask"):
            c.decode(damaged, x.shape)
    damaged = buf.copy()
    damaged[-2:] = np.frombuffer(np.float16(np.inf).tobytes(), np.uint8)
    with pytest.raises(KvgCorruptError, match="not finite"):
        c.decode(damaged, x.shape)


def test_training_is_deterministic_and_zero_rows_decode_to_zero():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 2, 64)).astype(np.float32)
    x[5] = 0.0
    a, b = codecs.train_book("pq2", x), codecs.train_book("pq2", x)
    assert np.array_equal(a, b)
    c = codecs.get("pq2", book=a)
    assert np.array_equal(c.decode(c.encode(x), x.shape)[5], np.zeros((2, 64), np.float32))
    with pytest.raises(KvgError, match="zero"):
        codecs.train_book("pq2", np.zeros((4, 1, 64), np.float32))


@pytest.mark.parametrize("name", NAMES)
def test_bad_books_and_bad_bytes_are_refused(name):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 2, 64)).astype(np.float32)
    book = codecs.train_book(name, x)
    with pytest.raises(KvgError, match="codebook"):  # none
        codecs.get(name).encode(x)
    with pytest.raises(KvgError, match="codebook"):  # wrong size (another head_dim's)
        codecs.get(name, book=book[:128]).encode(x)
    bad = book.copy()
    bad[3, 0] = np.nan
    with pytest.raises(KvgError, match="not finite"):
        codecs.get(name, book=bad).encode(x)
    c = codecs.get(name, book=book)
    buf = c.encode(x)
    with pytest.raises(KvgError, match="codebook"):
        codecs.get(name).decode(buf, x.shape)
    out = np.full(x.shape, 7.0, np.float32)
    corrupt = buf.copy()
    corrupt[2:4] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)  # vector 1's norm
    with pytest.raises(KvgCorruptError):
        c.decode_into(corrupt, out)
    assert (out == 7.0).all()  # nothing written
    with pytest.raises(ValueError):
        c.encode(np.where(np.arange(x.size).reshape(x.shape) == 9, np.nan, x))
    with pytest.raises(KvgError):  # head_dim not a power of two
        codecs.get(name, book=np.zeros((256, 4), np.float32)).encode(np.ones((2, 1, 24), np.float32))
    with pytest.raises(ValueError, match="no codebook"):
        codecs.train_book("rotq2", x)


# ---- the store keeps one codebook per (layer, kind) ------------------------------------------


def rows(rng, n, h=2, d=64):
    return rng.standard_normal((n, h * d)).astype(np.float32)


def test_store_trains_on_the_first_block_and_keeps_the_book():
    rng = np.random.default_rng(5)
    st = KVStore(2, 2, 64, 64)
    first, second = rows(rng, 64), rows(rng, 64)
    assert st.book(0, Kind.K, "pq2") is None and st.book_bytes() == 0
    st.append(0, Kind.K, Tier.WARM, "pq2", first)
    book = st.book(0, Kind.K, "pq2")
    assert np.array_equal(book, codecs.train_book("pq2", first.reshape(64, 2, 64)))
    st.append(0, Kind.K, Tier.WARM, "pq2", second)
    assert np.array_equal(st.book(0, Kind.K, "pq2"), book)  # not trained again
    assert st.book(0, Kind.V, "pq2") is None and st.book(1, Kind.K, "pq2") is None  # per list
    assert st.book_bytes() == 256 * 4 * 4
    c = codecs.get("pq2", book=book)
    want = c.decode(c.encode(second.reshape(64, 2, 64)), (64, 2, 64)).reshape(64, -1)
    assert np.array_equal(st.decode(0, Kind.K, 64, 128), want)
    # retier into vq8 trains vq8's own book; clear forgets them all (a new sequence trains anew)
    st.append(0, Kind.V, Tier.WARM, "f16", first)
    st.retier(0, 64, Tier.ARCHIVE, "vq8", il=0, kind=Kind.V)
    assert st.book(0, Kind.V, "vq8").shape == (256, 64)
    assert st.book_bytes() == 256 * 4 * 4 + 256 * 64 * 4
    st.clear()
    assert st.book_bytes() == 0 and st.books() == []


def test_failed_training_or_encode_leaves_the_store_as_it_was():
    rng = np.random.default_rng(6)
    st = KVStore(1, 2, 64, 64)
    st.append(0, Kind.K, Tier.WARM, "f16", rows(rng, 32))
    for step in range(4):  # each step that can fail in an append that trains a book
        KVStore.fail_after(step)
        try:
            st.append(0, Kind.K, Tier.WARM, "pq2", rows(rng, 32))
        except KvgError:
            assert st.n_rows(0, Kind.K) == 32 and st.book(0, Kind.K, "pq2") is None and st.book_bytes() == 0
        else:
            break
        finally:
            KVStore.fail_after(-1)
    else:
        pytest.fail("the append never succeeded")
    assert st.n_rows(0, Kind.K) == 64 and st.book(0, Kind.K, "pq2") is not None
    with pytest.raises(KvgError, match="zero"):  # nothing to train on: refused, nothing kept
        st.append(0, Kind.V, Tier.WARM, "vq8", np.zeros((8, 128), np.float32))
    assert st.n_rows(0, Kind.V) == 0 and st.book(0, Kind.V, "vq8") is None


def test_set_book_and_encoded_blocks_for_sessions():
    rng = np.random.default_rng(8)
    src = KVStore(1, 2, 64, 64)
    src.append(0, Kind.K, Tier.WARM, "pq2", rows(rng, 64))
    block, book = src.blocks(0, Kind.K)[0], src.book(0, Kind.K, "pq2")
    dst = KVStore(1, 2, 64, 64)
    with pytest.raises(KvgError, match="codebook"):  # a block before its book
        dst.append_encoded(0, Kind.K, block)
    assert dst.n_rows(0, Kind.K) == 0
    with pytest.raises(KvgError):
        dst.set_book(0, Kind.K, "pq2", book[:100])
    with pytest.raises(KvgError, match="no codebook"):
        dst.set_book(0, Kind.K, "rotq2", book)
    with pytest.raises(KvgError, match="not finite"):
        dst.set_book(0, Kind.K, "pq2", np.full_like(book, np.inf))
    dst.set_book(0, Kind.K, "pq2", book)
    dst.append_encoded(0, Kind.K, block)
    assert np.array_equal(dst.decode(0, Kind.K, 0, 64), src.decode(0, Kind.K, 0, 64))
    with pytest.raises(KvgError, match="clear it first"):  # blocks use it: it cannot change
        dst.set_book(0, Kind.K, "pq2", book * 2)
    assert np.array_equal(dst.book(0, Kind.K, "pq2"), book)
