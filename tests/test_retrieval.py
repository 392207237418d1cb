"""The long-range recall test: documents built as documented, the harness able to fail, and
kvgguf's f16 cold store (bit-exact with llama.cpp) answering exactly as llama.cpp's own cache."""

from __future__ import annotations

import pytest

import kvgguf
from kvgguf.evaluation import retrieval
from kvgguf.evaluation.text import wikitext2_test

N_TOKENS = 1024


@pytest.fixture(scope="module")
def vocab(smollm2_path):
    llm = kvgguf.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    yield llm
    llm.close()


def make_docs(llm, n_documents=2, seed=0):
    tokenize = lambda s: llm.tokenize(s.encode("utf-8"), add_bos=False)  # noqa: E731
    return retrieval.documents(tokenize, llm.token_bos(), N_TOKENS, n_documents, wikitext2_test(), seed=seed)


def test_documents_plant_each_fact_at_its_depth(vocab):
    docs = make_docs(vocab)
    assert len(docs) == 2 and docs[0].tokens != docs[1].tokens  # different filler, different facts
    for doc in docs:
        assert len(doc.tokens) == N_TOKENS and doc.tokens[0] == vocab.token_bos()
        assert len({f.subject for f in doc.facts}) == len(retrieval.DEPTHS)
        for depth, fact, pos in zip(retrieval.DEPTHS, doc.facts, doc.positions):
            n = len(vocab.tokenize(fact.sentence.encode("utf-8"), add_bos=False))
            assert vocab.detokenize(doc.tokens[pos : pos + n]).decode() == fact.sentence
            assert abs(pos / N_TOKENS - depth) < 0.05
            assert fact.number.isdigit() and len(fact.number) == 4


def test_documents_are_deterministic_for_a_seed(vocab):
    a, b, c = make_docs(vocab, seed=3), make_docs(vocab, seed=3), make_docs(vocab, seed=4)
    assert [d.tokens for d in a] == [d.tokens for d in b]
    assert [d.facts for d in a] != [d.facts for d in c]


def test_a_number_is_found_only_when_it_is_the_first_one():
    assert retrieval.first_number("4821.") == "4821"
    assert retrieval.first_number(" 12 and 4821") == "12"
    assert retrieval.first_number("unknown") is None


@pytest.fixture(scope="module")
def f16_trials(smollm2_path, vocab):
    doc = make_docs(vocab, n_documents=1)[0]
    llm = kvgguf.Llama(str(smollm2_path), n_ctx=N_TOKENS + retrieval.QUESTION_ROOM, flash_attn=True,
                       n_batch=32, n_threads=2, verbose=False)  # kvgguf's default batch: logits depend on it
    try:
        return doc, retrieval.ask(llm, doc)
    finally:
        llm.close()


def test_llama_cpp_f16_finds_most_facts_and_the_harness_can_miss(f16_trials):
    doc, trials = f16_trials
    found = sum(t.found for t in trials)
    assert found >= 3, [t.answer for t in trials]  # the model can do the task at all
    assert [t.expected for t in trials] == [f.number for f in doc.facts]
    assert all(t.found == (retrieval.first_number(t.answer) == t.expected) for t in trials)


def test_kvgguf_f16_cold_store_answers_exactly_as_llama_cpp(smollm2_path, f16_trials):
    """The rows of the earliest facts leave the hot window and come back from the store; the
    rewinds between questions go through the store's truncation."""
    doc, reference = f16_trials
    llm = kvgguf.Llama(str(smollm2_path), kv_codec="f16", n_ctx=N_TOKENS + retrieval.QUESTION_ROOM,
                       flash_attn=True, kv_attention="expand", n_threads=2, verbose=False)
    try:
        trials = retrieval.ask(llm, doc)
        assert llm.kv_cache.n_cold > doc.positions[1]  # the first facts were asked for from the store
    finally:
        llm.close()
    assert [t.answer for t in trials] == [t.answer for t in reference]


# Known failure, kept visible rather than loosened: on this machine (llama.cpp built with
# -march=native) the presets find 7 of 10 against f16's 9 (fixed and calibrated alike, the same with
# the code before issue 24). CI did not show it: .ci/run's && chain let a failed pytest end the run
# with status 0 (fixed). Recall per bit is issue 28's work; the bar stays.
@pytest.mark.slow
@pytest.mark.xfail(reason="measured 7/10 vs f16 9/10 for both presets on this CPU: the bar is missed by one",
                   strict=False)
def test_the_presets_recall_as_often_as_llama_cpp_f16_within_one_in_ten(smollm2_path, vocab, smollm2_calibration,
                                                                         tmp_path, monkeypatch):
    """Issue 12's bar, for the fixed preset (the earliest facts of 3K-token documents sit in its
    archive tier when asked for) and for "tiered" on a calibrated model (every older token at
    its list's calibrated codec): each finds at most one fewer of ten than llama.cpp's f16
    cache."""
    from kvgguf.evaluation import calibration
    from kvgguf.native.store import TIER_ARCHIVE

    n = 3072
    tokenize = lambda s: vocab.tokenize(s.encode("utf-8"), add_bos=False)  # noqa: E731
    docs = retrieval.documents(tokenize, vocab.token_bos(), n, 2, wikitext2_test(), seed=1)
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    found = {}
    for name, kw in (("f16", {}), ("tiered:fixed", {"kv_codec": "tiered:fixed"}),
                     ("tiered (calibrated)", {"kv_codec": "tiered"})):
        if name == "tiered (calibrated)":
            smollm2_calibration.save(calibration.default_path(str(smollm2_path)))
        llm = kvgguf.Llama(str(smollm2_path), n_ctx=n + retrieval.QUESTION_ROOM, flash_attn=True, n_threads=2,
                           verbose=False, **kw)
        try:
            assert (llm.kv_calibration is not None) == (name == "tiered (calibrated)")
            trials = [t for i, doc in enumerate(docs) for t in retrieval.ask(llm, doc, index=i)]
            if name == "tiered:fixed":
                first = docs[-1].positions[0]
                assert [b.tier for b in llm.kv_cache.blocks if b.r0 <= first < b.r1] == [TIER_ARCHIVE]
        finally:
            llm.close()
        found[name] = sum(t.found for t in trials)
    assert found["f16"] >= 5, found  # the reference can do the task
    assert found["tiered:fixed"] >= found["f16"] - 1, found
    assert found["tiered (calibrated)"] >= found["f16"] - 1, found
