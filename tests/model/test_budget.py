"""A budget on the compressed rows (TieredConfig.budget, "tiered:budget=SIZE"): before an eviction
would take the store past it, kvgguf.Llama drops whole cold blocks, the least attended first
(H2O's rule) or the oldest, as a context shift drops positions: the later rows move back with
their codes and are scored with rotated queries.

The reference is stock llama.cpp given the same drops through its own llama_memory_seq_rm and
llama_memory_seq_add: with an f16 cold store the logits agree within the fused path's bound.
"""

import dataclasses

import llama_cpp
import numpy as np
import pytest

import tiny_models
from tiny_models import SPECS
from kvgguf import Llama, TieredConfig
from kvgguf.enums import Tier
from kvgguf.evaluation.harness import kl_top1
from kvgguf.llama import shift_cells, shift_tokens
from kvgguf.runtime.live_cache import LiveCache
from helpers import wikitext_tokens

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)
N_CTX = 1024
N_BATCH = 32
# blocks of one mass granule (MASS_ROWS), so that what the attention counted moves with them
F16_COLD = TieredConfig(
    hot=96, sinks=4, warm="f16", warm_tokens=0, archive=None, block=64, window="f16", hot_cells="f16"
)


@pytest.fixture(scope="module")
def text_tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 12000)


@pytest.fixture(scope="module")
def models(tmp_path_factory, smollm2_path):
    """The tiny llama of head dim 80 (position matters to its attention) and the default one
    (head dim 16: rotq4 takes it)."""
    folder = tmp_path_factory.mktemp("budget")
    return {
        name: str(tiny_models.write(folder / f"{name}.gguf", SPECS[name], smollm2_path))
        for name in ("llama-hd80", "llama")
    }


def block_bytes(path: str, config: TieredConfig) -> int:
    """Bytes of one warm block of config on the model."""
    llm = Llama(path, kv_codec=config, n_ctx=N_CTX, n_batch=N_BATCH, **KW)
    n = llm.kv_cache._block_bytes(config.block, Tier.WARM)
    llm.close()
    return n


@pytest.fixture()
def drops(monkeypatch):
    """Every drop a Llama makes, in order: (r0, r1)."""
    made = []
    real = LiveCache.drop

    def drop(self, n_past, r0, r1):
        made.append((r0, r1))
        return real(self, n_past, r0, r1)

    monkeypatch.setattr(LiveCache, "drop", drop)
    return made


def test_a_budget_holds_and_drops_as_stock_would_given_the_same_drops(models, text_tokens, drops):
    """2,400 tokens with room for twelve blocks: the store never holds more than the budget after a
    batch, the context holds as many positions as tokens are left, and stock llama.cpp given the
    same drops gives the same logits (f16 cold rows, the fused path: the drops scatter shifts over
    the blocks, more than one rotated query set per layer and ubatch used to allow)."""
    model = models["llama-hd80"]
    budget = 12 * block_bytes(model, F16_COLD) + 64 * 1024
    config = dataclasses.replace(F16_COLD, budget=budget)
    llm = Llama(model, kv_codec=config, n_ctx=N_CTX, n_batch=N_BATCH, logits_all=True, **KW)
    ref = llama_cpp.Llama(model, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, logits_all=True, **KW)
    toks, i, seen, got, want, most = text_tokens[:2400], 0, 0, [], [], 0
    while i < len(toks):
        batch = toks[i : i + N_BATCH - llm.n_tokens % N_BATCH]
        i += len(batch)
        llm.eval(batch)
        for r0, r1 in drops[seen:]:
            shift_cells(ref, r0, r1)
            shift_tokens(ref, r0, r1)
        seen = len(drops)
        ref.eval(batch)
        assert ref.n_tokens == llm.n_tokens
        assert list(ref.input_ids[: ref.n_tokens]) == list(llm.input_ids[: llm.n_tokens])
        assert llm.kv_cache.cold_bytes() <= budget
        most = max(most, len({s for _, _, s in llm.kv_cache.store.shifts(0)}))
        if drops:
            got.append(np.array(llm.scores[llm.n_tokens - 1]))
            want.append(np.array(ref.scores[ref.n_tokens - 1]))
    kl, top1 = kl_top1(np.array(want), np.array(got))
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)
    assert len(drops) >= 10 and llm.tokens_dropped == sum(r1 - r0 for r0, r1 in drops)
    assert llm.n_tokens == len(toks) - llm.tokens_dropped
    assert most > 6, most  # distinct shifts the fused path scored at once
    memory = llm.kv_memory()
    assert memory.dropped_tokens == llm.tokens_dropped and "tokens dropped for the budget" in str(memory)
    assert all(r0 >= config.sinks for r0, _ in drops)  # the sinks stay
    llm.close()
    ref.close()


@pytest.mark.parametrize("rule", ["mass", "oldest"])
def test_the_drop_rule_picks_the_blocks(models, text_tokens, monkeypatch, rule):
    """mass: each drop takes the block that received the least attention per query among those
    attended (H2O); oldest: the first block after the sinks' every time (StreamingLLM)."""
    model, config = models["llama"], dataclasses.replace(F16_COLD, warm="rotq4", drop=rule)
    config = dataclasses.replace(config, budget=6 * block_bytes(model, config))
    llm = Llama(model, kv_codec=config, n_ctx=N_CTX, n_batch=N_BATCH, **KW)
    ranked = []
    real = LiveCache.drops_due

    def drops_due(self, n_past, n_new):
        out = real(self, n_past, n_new)
        if out:
            mass = {(b.r0, b.r1): self.signals.mass_per_query(b.r0, b.r1) for b in self.blocks if b.tier != Tier.SINK}
            ranked.append((out, mass))
        return out

    monkeypatch.setattr(LiveCache, "drops_due", drops_due)
    llm.eval(text_tokens[:1200])
    assert len(ranked) >= 5
    for out, mass in ranked:
        for r0, r1 in out:
            dropped = [m for (a, b), m in mass.items() if r0 <= a and b <= r1]
            kept = [m for (a, b), m in mass.items() if (b <= r0 or a >= r1) and m is not None]
            if rule == "mass":
                assert None not in dropped and max(dropped) <= min(kept), (dropped, kept)
            else:
                assert r0 == min(a for a, _ in mass), (r0, sorted(mass))
    if rule == "mass":  # not the oldest every time: the rule looked at the counts
        assert any(out[-1][0] != min(a for a, _ in mass) for out, mass in ranked)
    llm.close()


def test_a_budget_below_one_eviction_is_refused_before_the_first_token(models):
    config = dataclasses.replace(F16_COLD, budget=1000)
    with pytest.raises(ValueError, match="cannot hold the sinks and one eviction"):
        Llama(models["llama"], kv_codec=config, n_ctx=N_CTX, n_batch=N_BATCH, **KW)


def test_a_chat_under_a_budget_runs_past_n_ctx_and_reuses_its_context(models, text_tokens):
    """Each turn sends the whole conversation: the budget keeps the context's positions under
    n_ctx (512 here: 224 hot tokens and three blocks of 64) without a context shift, and a turn
    evaluates only its own tokens."""
    path, n_ctx = models["llama"], 512
    llm = Llama(path, kv_codec="rotq4:budget=15KiB", n_ctx=n_ctx, n_batch=N_BATCH, **KW)
    assert llm.kv_config.budget == 15 * 1024
    no_eos = {llm.token_eos(): -1e9}
    conversation = []
    for turn in (text_tokens[i : i + 90] for i in range(0, 1800, 90)):
        conversation += turn
        before = llm.tokens_evaluated
        out = llm.create_completion(conversation, max_tokens=20, temperature=0.0, logit_bias=no_eos)
        assert out["usage"]["completion_tokens"] == 20
        assert llm.tokens_evaluated - before <= len(turn) + 19
        conversation += llm.input_ids[llm.n_tokens - 19 : llm.n_tokens].tolist()
        assert llm.n_tokens <= n_ctx and llm.kv_cache.cold_bytes() <= llm.kv_config.budget
    assert len(conversation) > 3 * n_ctx and llm.tokens_dropped > 0 and llm.context_shifts == 0
    llm.close()


def test_a_context_under_a_budget_saves_and_restores(models, text_tokens, tmp_path):
    path = models["llama"]
    kw = dict(kv_codec="rotq4:budget=15KiB", n_ctx=512, n_batch=N_BATCH, **KW)
    llm = Llama(path, **kw)
    llm.eval(text_tokens[:1000])
    assert llm.tokens_dropped and llm.kv_cache.store.shifts(0)
    llm.save_session(tmp_path / "b.kvz")
    restored = Llama(path, **kw)
    restored.load_session(tmp_path / "b.kvz")
    assert restored.kv_cache.store.shifts(0) == llm.kv_cache.store.shifts(0)
    assert list(restored.input_ids[: restored.n_tokens]) == list(llm.input_ids[: llm.n_tokens])
    restored.eval(text_tokens[1000:1200])  # and it goes on dropping within the budget
    assert restored.tokens_dropped and restored.kv_cache.cold_bytes() <= restored.kv_config.budget
