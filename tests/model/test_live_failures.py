"""The live cache when something fails (issue "Nothing torn, nothing crashed", item 1): a failure
injected at steps of an eviction or of aging leaves the context as it was (or, for aging, with
the block still warm in every list); unreadable cold rows are left out of the fused attention
(as if masked) and make an expanding batch fail cleanly; a session saved from another thread
waits for the batch in flight."""

import threading
import warnings

import llama_cpp
import numpy as np
import pytest

from kvgguf import Llama, TieredConfig
from kvgguf.evaluation.harness import kl_top1
from kvgguf.bindings.binding import KvgError
from kvgguf.enums import Kind
from kvgguf.bindings.store import KVStore
from helpers import wikitext_tokens

N_THREADS = 2
# Small windows so that one 32-token batch evicts a block and ages another to archive.
SMALL = TieredConfig(
    hot=64, ubatch=32, sinks=4, warm=("kivi4", "rotq3"), warm_tokens=64, archive=("rotq4", "rotq2"), block=32
)


@pytest.fixture(scope="module")
def tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 8000)


def last_logits(llm, toks):
    out = None
    for _, logits in llm.eval_logits(toks):
        out = np.array(logits[-1])
    return out


def context(llm):
    """What the context holds: tokens, llama.cpp's rows and every stored block (save_state's
    .kvz bytes, exact) plus the live cache's block list."""
    state = llm.save_state()
    return bytes(state.llama_state), [(b.r0, b.r1, b.tier) for b in llm.kv_cache.blocks], llm.n_tokens


def test_a_failure_anywhere_in_eviction_or_aging_loses_nothing(smollm2_path, tokens):
    llm = Llama(str(smollm2_path), kv_codec=SMALL, n_ctx=1024, verbose=False, n_threads=N_THREADS)
    try:
        llm.eval(tokens[:288])  # a multiple of n_batch: the next 32 tokens are one batch
        start = llm.save_state()
        before = context(llm)
        nxt = tokens[288:320]
        reference = last_logits(llm, nxt)
        # How many fallible steps one batch takes (eviction: an append per list; aging: a re-encode per list).
        llm.load_state(start)
        KVStore.fail_after(10**9)
        last_logits(llm, nxt)
        n_steps = 10**9 - KVStore.fail_after(-1)
        assert n_steps >= 2 * 2 * 30  # 30 layers, K and V, evicted and then aged

        outcomes = {"refused": 0, "aging kept warm": 0}
        for k in sorted({0, 1, 2, 29, 59, 60, 61, 90, n_steps // 2 + 1, n_steps - 2, n_steps - 1}):
            llm.load_state(start)
            KVStore.fail_after(k)
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    got = last_logits(llm, nxt)
            except KvgError as e:
                assert "injected failure" in str(e)
                assert context(llm) == before, f"step {k}: the failed eviction changed the context"
                # Nothing lost: the same batch again gives the reference logits exactly.
                np.testing.assert_array_equal(last_logits(llm, nxt), reference)
                outcomes["refused"] += 1
            else:
                # Aging failed: the eviction stands, the block stays warm in every list, and it says so.
                assert any("stay warm" in str(w.message) for w in caught), (k, [str(w.message) for w in caught])
                for il in llm.kv_cache.layers:
                    for kind in Kind:
                        tiers = [b.tier for b in llm.kv_cache.store.blocks(il, kind)]
                        assert tiers == [b.tier for b in llm.kv_cache.blocks], (k, il, kind)
                assert got.shape == reference.shape
                outcomes["aging kept warm"] += 1
            finally:
                KVStore.fail_after(-1)
        assert outcomes["refused"] >= 5 and outcomes["aging kept warm"] >= 3, outcomes
    finally:
        llm.close()


def f16_cold(hot=128):
    return TieredConfig(hot=hot, sinks=4, warm="f16", warm_tokens=0, archive=None, block=32, hot_cells="f16")


def test_unreadable_cold_rows_are_left_out_of_the_fused_attention(smollm2_path, tokens):
    """Fused path: the rows of unreadable blocks get no softmax weight. The reference is stock
    llama.cpp with those positions removed from its cache (llama_memory_seq_rm)."""
    n = 600  # about 400 cold rows with a 128-token hot window
    llm = Llama(str(smollm2_path), kv_codec=f16_cold(), n_ctx=1024, n_batch=128, verbose=False, n_threads=N_THREADS)
    try:
        llm.eval(tokens[:n])
        poisoned = [b for b in llm.kv_cache.blocks[1:] if b.r1 <= 320]  # after the sinks, most of the cold rows
        r0, r1 = poisoned[0].r0, poisoned[-1].r1
        for il in llm.kv_cache.layers:
            for kind in Kind:
                for b in poisoned:
                    llm.kv_cache.store.fail_reads(il, kind, b.r0)
        with pytest.warns(RuntimeWarning, match="left them out of the softmax"):
            got = last_logits(llm, [tokens[n]])
    finally:
        llm.close()

    stock = llama_cpp.Llama(str(smollm2_path), n_ctx=1024, n_batch=128, verbose=False, n_threads=N_THREADS)
    stock.eval(tokens[:n])
    full = last_logits_stock(stock, tokens[n])
    stock._ctx.kv_cache_seq_rm(-1, n, -1)
    stock.n_tokens = n
    stock._ctx.kv_cache_seq_rm(0, r0, r1)
    without = last_logits_stock(stock, tokens[n])
    stock.close()

    kl_without, _ = kl_top1(without[None], got[None])
    kl_full, _ = kl_top1(full[None], got[None])
    assert r1 - r0 >= 200
    assert kl_without < 0.02, kl_without  # the fused path's tolerance against stock (test_fused_attention)
    assert kl_full > 5 * kl_without, (kl_full, kl_without)  # it would not pass with the rows in


def last_logits_stock(stock, token):
    stock.eval([token])
    return np.array(stock._ctx.get_logits()[: stock.n_vocab()], dtype=np.float32)


def test_unreadable_rows_on_the_expanding_path_refuse_the_batch(smollm2_path, tokens):
    llm = Llama(
        str(smollm2_path),
        kv_codec=f16_cold(),
        kv_attention="expand",
        n_ctx=1024,
        n_batch=128,
        verbose=False,
        n_threads=N_THREADS,
    )
    try:
        llm.eval(tokens[:600])
        reference_state = llm.save_state()
        reference = last_logits(llm, tokens[600:664])
        llm.load_state(reference_state)
        llm.kv_cache.store.fail_reads(5, Kind.V, 100)
        with pytest.raises(RuntimeError, match="the batch was not evaluated"):
            last_logits(llm, tokens[600:664])
        # The eviction before the batch stands (rows moved, none changed); the batch left nothing.
        assert llm.n_tokens == 600 and list(llm.input_ids[:600]) == tokens[:600]
        llm.kv_cache.store.fail_reads(5, Kind.V, 100, on=False)
        np.testing.assert_array_equal(last_logits(llm, tokens[600:664]), reference)
    finally:
        llm.close()


def test_a_session_saved_from_another_thread_waits_for_the_completion(smollm2_path, tokens, tmp_path):
    prompt = tokens[:400]

    def run(saver: bool):
        llm = Llama(str(smollm2_path), kv_codec="tiered", n_ctx=1024, verbose=False, n_threads=N_THREADS)
        stop, saved, errors = threading.Event(), [], []

        def save_loop():
            while not stop.is_set():
                try:
                    saved.append(llm.save_session(tmp_path / f"s{len(saved) % 2}.kvz"))
                except BaseException as e:  # noqa: BLE001 - the test reports any
                    errors.append(e)
                    return

        t = threading.Thread(target=save_loop) if saver else None
        try:
            if t:
                t.start()
            out = llm.create_completion(
                llm.detokenize(prompt).decode("utf-8", "ignore"), max_tokens=24, temperature=0.0
            )
        finally:
            stop.set()
            if t:
                t.join()
            n_after = llm.n_tokens
            llm.close()
        return out["choices"][0]["text"], saved, errors, n_after

    alone, _, _, _ = run(saver=False)
    text, saved, errors, n_after = run(saver=True)
    assert not errors, errors
    assert saved
    # A save waits for the whole completion (one call at a time, issue 46), never one batch: each
    # file holds the context before the completion or after it, nothing in between.
    assert {info.n_tokens for info in saved} <= {0, n_after}, sorted({info.n_tokens for info in saved})
    assert text == alone  # saving beside it changed nothing the generation sees
