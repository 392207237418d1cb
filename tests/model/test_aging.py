"""When warm blocks age into the archive tier: after the batch that follows their eviction (the
one that ends on the next multiple of n_batch), on the CPU at that batch's end, and beside it on a thread of its own where the batch reads only the GPU's
device copy (forced here on the CPU with TieredConfig(age_beside=True), where the store's lock orders the
batch's reads and aging's swaps)."""

from dataclasses import replace

import llama_cpp
import numpy as np
import pytest

from kvgguf import Llama, TieredConfig
from kvgguf.enums import Tier
from kvgguf.policy import plan
from helpers import wikitext_tokens

CONFIG = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=32, hot_cells="f16")


@pytest.fixture(scope="module")
def tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 8000)[:384]


def make(path, age_beside=None):
    config = replace(CONFIG, age_beside=age_beside)
    return Llama(str(path), kv_codec=config, n_ctx=512, n_batch=32, verbose=False, n_threads=2)


def watch(kv):
    """Wraps kv's batch steps: per batch, the blocks due to age as it runs, and whether aging ran
    beside it on a thread."""
    seen = []
    before, after = kv.before_batch, kv.after_batch

    def before_batch(n_past, n_new):
        before(n_past, n_new)
        seen.append({"due": len(plan.blocks_to_archive(kv.blocks, CONFIG)), "beside": kv._aging is not None})

    def after_batch(n_past, n_tokens):
        after(n_past, n_tokens)
        if kv._aging is None and (n_past + n_tokens) % kv.step == 0:  # on the CPU's thread: done by
            # the end of the batch that ends on a multiple of n_batch
            assert plan.blocks_to_archive(kv.blocks, CONFIG) == []

    kv.before_batch, kv.after_batch = before_batch, after_batch
    return seen


def test_blocks_age_after_the_batch_that_follows_their_eviction(smollm2_path, tokens):
    llm = make(smollm2_path, age_beside=False)
    seen = watch(llm.kv_cache)
    llm.eval(tokens)
    # the batch after an eviction attends over blocks still warm that will age at its end
    assert any(b["due"] for b in seen) and not any(b["beside"] for b in seen)
    kv = llm.kv_cache
    limit = kv.n_cold - CONFIG.warm_tokens
    assert [b.tier for b in kv.blocks[1:]] == [Tier.ARCHIVE if b.r1 <= limit else Tier.WARM for b in kv.blocks[1:]]


def test_aging_beside_the_batch_ends_in_the_same_tiers_and_bytes(smollm2_path, tokens):
    held = {}
    for forced in (False, True):
        llm = make(smollm2_path, age_beside=forced)
        seen = watch(llm.kv_cache)
        llm.eval(tokens)
        assert any(b["beside"] for b in seen) == forced
        kv = llm.kv_cache
        mem = llm.kv_memory()  # waits for the last aging
        last = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
        assert kv._aging is None and np.isfinite(last).all()
        held[forced] = ([(b.r0, b.r1, b.tier) for b in kv.blocks], {t.name: t.bytes for t in mem.tiers})
        llm.close()
    # which codes each batch read depends on timing beside the batch; where the rows end does not
    assert held[True] == held[False]


def test_what_aging_beside_raised_surfaces_at_the_next_access_and_nothing_is_lost(smollm2_path, tokens):
    llm = make(smollm2_path, age_beside=True)
    kv = llm.kv_cache
    llm.eval(tokens[:160])
    age = kv._age

    def broken():
        raise MemoryError("no room to age")

    kv._age = broken
    n = llm.n_tokens
    with pytest.raises(RuntimeError, match="aging beside") as err:
        llm.eval(tokens[160:320])
    assert isinstance(err.value.__cause__, MemoryError)
    kv._age = age
    # the batches before the failure stand; the blocks that could not age are still warm, and age
    # with the next eviction
    assert n < llm.n_tokens < 320 and kv._aging is None
    llm.eval(tokens[llm.n_tokens :])
    kv.store  # noqa: B018 (waits for the last aging)
    assert plan.blocks_to_archive(kv.blocks, CONFIG) == []
    assert any(b.tier == Tier.ARCHIVE for b in kv.blocks)
