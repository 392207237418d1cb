"""TieredConfig.keep: blocks a signal ranks highest stay warm instead of aging to archive."""

import numpy as np
import pytest

import kvgguf
from kvgguf.enums import Tier
from kvgguf.policy import plan
from kvgguf.policy.tiered import TieredConfig
from kvgguf.runtime.signals import TokenSignals

# --- the policy alone ---------------------------------------------------------------------


def test_kept_takes_the_top_fraction_of_the_reference():
    reference = [float(x) for x in range(10)]
    assert plan.kept([9.0, 8.0, 7.0, 6.0], reference, 0.25) == [True, True, True, False]
    assert plan.kept([9.0, 0.0], reference, 0.0) == [False, False]
    assert plan.kept([0.0], reference, 1.0) == [True]


def test_kept_leaves_unranked_blocks_to_age():
    assert plan.kept([float("nan"), 5.0], [float("nan"), 5.0, 1.0], 0.5) == [False, True]
    assert plan.kept([1.0], [float("nan")], 0.5) == [False]


def test_kept_blocks_never_age_again_and_survive_truncation():
    config = TieredConfig(warm_tokens=64)
    blocks = [plan.Block(0, 64, Tier.WARM, kept=True), plan.Block(64, 128, Tier.WARM), plan.Block(128, 192, Tier.WARM)]
    assert plan.blocks_to_archive(blocks, config) == [blocks[1]]
    assert plan.truncated(blocks, 100)[0].kept


@pytest.mark.parametrize(
    "spec, keep, fraction",
    [
        ("tiered:keep=surprisal", "surprisal", 0.25),
        ("tiered:keep=mass:0.1", "mass", 0.1),
        ("tiered:keep=random:0", "random", 0.0),
    ],
)
def test_keep_strings(spec, keep, fraction):
    config = TieredConfig.parse(spec)
    assert (config.keep, config.keep_fraction) == (keep, fraction)
    assert config.archive == TieredConfig().archive  # the preset otherwise


@pytest.mark.parametrize(
    "spec", ["tiered:keep=loudness", "tiered:keep=mass:lots", "tiered:keep=mass:1.5", "tiered:mass", "tiered:"]
)
def test_bad_keep_strings_are_refused(spec):
    with pytest.raises(ValueError, match="keep"):
        TieredConfig.parse(spec)


def test_bad_keep_fields_are_refused():
    with pytest.raises(ValueError, match="keep"):
        TieredConfig(keep="H2O")
    with pytest.raises(ValueError, match="keep_fraction"):
        TieredConfig(keep="mass", keep_fraction=-0.1)
    with pytest.raises(ValueError, match="keep_fraction"):
        TieredConfig(keep="mass", keep_fraction="half")


def test_surprisal_is_minus_log_p_of_the_next_token_across_batches():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 11)).astype(np.float32)
    tokens = [3, 1, 4, 1, 5, 9]
    s = TokenSignals("surprisal")
    s.note_logits(0, tokens[:4], logits[:4])
    s.note_logits(4, tokens[4:], logits[4:])  # the next batch: priced by the last row of the first
    logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    expected = [-logp[i - 1, tokens[i]] for i in range(1, 6)]
    assert np.isnan(s.surprisal[0])  # nothing prices the first token
    np.testing.assert_allclose(s.surprisal[1:6], expected, rtol=1e-5)
    s.truncate(2)  # rewound: position 2 is rewritten, and the last row no longer precedes it
    s.note_logits(2, [7], logits[:1])
    assert np.isnan(s.surprisal[2])


def test_mass_is_per_query_and_skips_the_sinks_granule():
    s = TokenSignals("mass", sinks=4)
    s.note_mass(np.array([[50.0, 2.0], [50.0, 2.0]]), 10)  # two layers, two granules
    s.note_mass(np.array([[0.0, 0.0, 6.0], [0.0, 0.0, 6.0]]), 2)  # a third granule went cold
    assert np.isnan(s.score(4, 64))
    assert s.score(64, 128) == pytest.approx(4.0 / 12)  # 2 + 2 over 10 + 2 queries
    assert s.score(128, 192) == pytest.approx(12.0 / 2)


# --- live: a crafted important block stays warm -------------------------------------------

KEEP = dict(hot=128, warm_tokens=128, keep_fraction=0.1)


def _blocks_after(path, config, tokens):
    llm = kvgguf.Llama(path, kv_codec=config, n_ctx=2048, verbose=False)
    try:
        llm.eval(tokens)
        blocks = [(b.r0, b.r1, b.tier, b.kept) for b in llm.kv_cache.blocks]
        memory = llm.kv_memory()
    finally:
        llm.close()
    return blocks, memory


def _tokens(path, text):
    llm = kvgguf.Llama(path, vocab_only=True, verbose=False)
    try:
        return llm.tokenize(text.encode())
    finally:
        llm.close()


def test_surprisal_keeps_the_block_of_random_digits_warm(smollm2_path):
    filler = "The small boat drifted along the quiet river past the old mill. " * 3
    digits = " ".join(str(d) for d in np.random.default_rng(1).integers(0, 10, 40))
    tokens = _tokens(smollm2_path, filler * 6 + "Remember the access code: " + digits + ". " + filler * 12)
    start = len(_tokens(smollm2_path, filler * 6))
    blocks, memory = _blocks_after(smollm2_path, TieredConfig(keep="surprisal", **KEEP), tokens)
    holding = [b for b in blocks if b[0] <= start + 30 < b[1]][0]  # the block with most of the digits
    assert holding[2] == Tier.WARM and holding[3]
    assert any(b[2] == Tier.ARCHIVE for b in blocks)  # others aged
    # the control at the same fraction keeps about as many blocks, not chosen by content
    same, _ = _blocks_after(smollm2_path, TieredConfig(keep=None, **KEEP), tokens)
    assert [b for b in same if b[0] == holding[0]][0][2] == Tier.ARCHIVE
    assert any(t.name == "warm" and t.bytes for t in memory.tiers)


def test_mass_keeps_the_attention_sink_block_warm(smollm2_path):
    # With no exact sinks, the first block holds BOS, which most heads attend to (the crafted
    # heavy hitter): the fused op's mass counters must rank it first and keep it warm.
    from kvgguf.evaluation.text import wikitext2_test

    tokens = _tokens(smollm2_path, wikitext2_test()[5000:12000])[:900]
    blocks, _ = _blocks_after(smollm2_path, TieredConfig(keep="mass", sinks=0, **KEEP), tokens)
    assert blocks[0][:2] == (0, 64) and blocks[0][2] == Tier.WARM and blocks[0][3]
    kept = [b for b in blocks if b[3]]
    aged = [b for b in blocks if b[2] == Tier.ARCHIVE]
    assert len(aged) > 3 * len(kept)


def test_keep_needs_no_logits_when_off_and_answers_like_the_preset(smollm2_path):
    # keep_fraction 0 ranks nothing: the cache must then hold what the preset holds.
    from kvgguf.evaluation.text import wikitext2_test

    tokens = _tokens(smollm2_path, wikitext2_test()[5000:12000])[:700]
    a, _ = _blocks_after(
        smollm2_path, TieredConfig(keep="surprisal", hot=128, warm_tokens=128, keep_fraction=0.0), tokens
    )
    b, _ = _blocks_after(smollm2_path, TieredConfig(hot=128, warm_tokens=128), tokens)
    assert a == b


def test_a_restored_session_keeps_the_kept_blocks_warm(smollm2_path, tmp_path):
    filler = "The small boat drifted along the quiet river past the old mill. " * 3
    digits = " ".join(str(d) for d in np.random.default_rng(1).integers(0, 10, 40))
    tokens = _tokens(smollm2_path, filler * 6 + "Remember the access code: " + digits + ". " + filler * 12)
    config = TieredConfig(keep="surprisal", **KEEP)
    llms = [kvgguf.Llama(smollm2_path, kv_codec=config, n_ctx=2048, verbose=False) for _ in range(2)]
    try:
        llms[0].eval(tokens)
        llms[0].save_session(tmp_path / "s.kvz")
        llms[1].load_session(tmp_path / "s.kvz")
        saved, restored = ([(b.r0, b.r1, b.tier, b.kept) for b in llm.kv_cache.blocks] for llm in llms)
        assert restored == saved and any(b[3] for b in restored)
    finally:
        for llm in llms:
            llm.close()
