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
    # n_batch: kvgguf's default batch (logits depend on it)
    llm = kvgguf.Llama(
        str(smollm2_path),
        n_ctx=N_TOKENS + retrieval.QUESTION_ROOM,
        flash_attn=True,
        n_batch=32,
        n_threads=2,
        verbose=False,
    )
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
    llm = kvgguf.Llama(
        str(smollm2_path),
        kv_codec="f16",
        n_ctx=N_TOKENS + retrieval.QUESTION_ROOM,
        flash_attn=True,
        kv_attention="expand",
        n_threads=2,
        verbose=False,
    )
    try:
        trials = retrieval.ask(llm, doc)
        assert llm.kv_cache.n_cold > doc.positions[1]  # the first facts were asked for from the store
    finally:
        llm.close()
    assert [t.answer for t in trials] == [t.answer for t in reference]


def test_a_shifted_context_says_which_facts_it_still_held(smollm2_path, vocab, f16_trials):
    """A document longer than n_ctx shifts while decoded: the facts in the tail it kept are marked
    held, those shifted out are not, and each question starts again from the document's end
    (its saved state: a question that shifts again moves the end)."""
    doc, reference = f16_trials
    llm = kvgguf.Llama(
        str(smollm2_path),
        n_ctx=N_TOKENS * 3 // 4 + retrieval.QUESTION_ROOM,
        context_shift=True,
        flash_attn=True,
        n_batch=32,
        n_threads=2,
        verbose=False,
    )
    try:
        llm.eval(doc.tokens)
        held = llm.history_index()
        trials = retrieval.ask(llm, doc)
        again = retrieval.ask(llm, doc)
    finally:
        llm.close()
    n_keep = llm.n_keep
    tail = len(doc.tokens) - (len(held) - n_keep)  # a shift keeps n_keep tokens and the newest
    assert held.tolist() == [*range(n_keep), *range(tail, len(doc.tokens))]
    assert [t.held for t in trials] == [pos >= tail for pos in doc.positions]
    assert 0 < sum(t.held for t in trials) < len(trials)
    assert [t.answer for t in again] == [t.answer for t in trials]
    summary = retrieval.summary(trials)
    assert summary["held"] == sum(t.held for t in trials) and summary["found_held"] <= summary["held"]
    assert [t.distance for t in trials] == [t.distance for t in reference]
