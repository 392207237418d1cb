"""A context cut back to a prefix holds what a fresh context holds for it: the same prompt at
temperature 0 answers the same whatever the Llama answered before, through every entry.

One Llama answers A, B, C, A, D, B (each reusing what the cache holds: B shares A's document, C
and D only its start), then a fresh Llama answers each once; the answers must be equal and the
last logits within the arithmetic floor (benchmarks/results/quality/floor/smollm2-135m_2k.md: stock
llama.cpp's exact caches in another batch size are 0.0034-0.0039 apart in KL; here they are
equal, so the bound is far below it)."""

from __future__ import annotations

import llama_cpp
import numpy as np
import pytest

from kvgguf import Llama, TieredConfig
from kvgguf.enums import Tier
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.session.prompt_cache import CompressedDiskCache, CompressedRAMCache

KW = dict(n_ctx=1024, n_threads=2, verbose=False)
SEQUENCE = "ABCADB"
# Tokens of WikiText-2: A (317 tokens and 8 generated) passes the eviction at 320, so B's cut at
# 311 needs rows A evicted since (the preset evicts before batches at multiples of 32).
DOC = 310
KL_BOUND = 1e-4  # far below the floor of ~0.0035 between exact caches


def prompts(llm, n_doc: int = DOC) -> dict[str, list[int]]:
    doc = llm.tokenize(wikitext2_test()[:20000].encode("utf-8"))[:n_doc]

    def text(s: str) -> list[int]:
        return llm.tokenize(s.encode(), add_bos=False)

    return {
        "A": doc + text("\n\nThe article above is about"),
        "B": doc + text("\n\nIn summary,"),
        "C": doc[:100] + text("\n\nThe article above is about"),
        "D": doc[: n_doc // 2] + text(" The weather was"),
    }


def last_logits(llm) -> np.ndarray:
    return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),)).copy()


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def log_softmax(x):
        x = x.astype(np.float64) - x.max()
        return x - np.log(np.exp(x).sum())

    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def completion(llm, tokens):
    return llm.create_completion(tokens, max_tokens=8, temperature=0.0)["choices"][0]["text"]


def streamed(llm, tokens):
    return "".join(
        c["choices"][0]["text"] for c in llm.create_completion(tokens, max_tokens=8, temperature=0.0, stream=True)
    )


def check_sequence(make, ask=completion, n_doc: int = DOC, after_first=None):
    """Runs SEQUENCE on one Llama from make(), then each prompt on a fresh one; returns the
    tokens the reused Llama evaluated for each step (what reuse saved). after_first(llm) looks
    at the Llama after the first answer."""
    llm = make()
    p = prompts(llm, n_doc)
    reused, evaluated = [], []
    for key in SEQUENCE:
        before = llm.tokens_evaluated
        reused.append((key, ask(llm, p[key]), last_logits(llm)))
        evaluated.append(llm.tokens_evaluated - before)
        if after_first is not None and len(reused) == 1:
            after_first(llm)
    llm.close()
    fresh = {}
    for key in sorted(set(SEQUENCE)):
        one = make()
        fresh[key] = (ask(one, p[key]), last_logits(one))
        one.close()
    for key, text, logits in reused:
        assert text == fresh[key][0], f"prompt {key} answered {text!r} reused, {fresh[key][0]!r} fresh"
        assert kl(fresh[key][1], logits) <= KL_BOUND, f"prompt {key}: KL {kl(fresh[key][1], logits)} from fresh"
    return evaluated


def test_the_preset_answers_as_fresh_whatever_came_before(smollm2_path):
    evaluated = check_sequence(lambda: Llama(str(smollm2_path), kv_codec="tiered:fixed", **KW))
    # B after A reuses the document (the rows evicted since put back): only the tokens after the
    # last multiple of 32 before the cut (24), its own 3 and the 7 generated are evaluated, not 314
    assert evaluated[1] < 40


def test_aged_blocks_come_back_warm(smollm2_path):
    """A small window: A's blocks age into the archive tier after the batch ending at 320, where
    a fresh context at B's 311 tokens still holds the youngest of them warm."""
    config = TieredConfig(hot=96, block=32, warm_tokens=64)

    def aged(llm):
        kv = llm.kv_cache
        assert kv.recent.warm(96, 128) is not None  # aged at 320; warm in a fresh context at 311
        assert [b.tier for b in kv.blocks if (b.r0, b.r1) == (96, 128)] == [Tier.ARCHIVE]

    evaluated = check_sequence(lambda: Llama(str(smollm2_path), kv_codec=config, **KW), after_first=aged)
    assert evaluated[1] < 40


def test_without_reuse_every_deep_cut_evaluates_again(smollm2_path):
    config = TieredConfig(reuse=0)
    evaluated = check_sequence(lambda: Llama(str(smollm2_path), kv_codec=config, **KW))
    assert evaluated[1] > DOC  # B's cut lands in evicted rows: the whole prompt again


def test_streaming_answers_as_fresh(smollm2_path):
    check_sequence(lambda: Llama(str(smollm2_path), kv_codec="tiered:fixed", **KW), ask=streamed)


def test_chat_answers_as_fresh(smollm2_path):
    def chat(llm, tokens):
        text = llm.detokenize(tokens[1:]).decode("utf-8", errors="ignore")  # the prompt without BOS
        out = llm.create_chat_completion([{"role": "user", "content": text}], max_tokens=8, temperature=0.0)
        return out["choices"][0]["message"]["content"]

    check_sequence(lambda: Llama(str(smollm2_path), kv_codec="tiered:fixed", **KW), ask=chat)


@pytest.mark.parametrize("cache", ["ram", pytest.param("disk", marks=pytest.mark.slow)])  # the same code path
def test_prompt_cache_entries_restored_and_cut_answer_as_fresh(smollm2_path, tmp_path, cache):
    """Each step's state goes into the cache; the next prompt restores the longest prefix from it."""

    def make():
        llm = Llama(str(smollm2_path), kv_codec="tiered:fixed", **KW)
        made = CompressedRAMCache() if cache == "ram" else CompressedDiskCache(str(tmp_path / "cache"))
        llm.set_cache(made)
        return llm

    def ask(llm, tokens):
        llm.reset()  # nothing in the context: what the cache holds is what is reused
        return completion(llm, tokens)

    check_sequence(make, ask=ask)


def test_reset_then_a_prompt_answers_as_fresh(smollm2_path):
    def ask(llm, tokens):
        llm.reset()
        return completion(llm, tokens)

    check_sequence(lambda: Llama(str(smollm2_path), kv_codec="tiered:fixed", **KW), ask=ask)


@pytest.mark.slow  # 24 s; the test command cuts Gemma-3 in the next test
def test_sliding_window_model_answers_as_fresh(gemma3_path):
    """Gemma-3: the sliding-window layers' cells come back with the full layers' (hot 576)."""
    check_sequence(lambda: Llama(str(gemma3_path), kv_codec="tiered", **KW), n_doc=900)


def test_the_calibrated_preset_answers_as_fresh(smollm2_path, calibrated):
    llm = Llama(str(smollm2_path), kv_codec="tiered", **KW)
    assert llm.kv_calibration is not None  # the per-layer plan, not the fixed preset
    llm.close()
    check_sequence(lambda: Llama(str(smollm2_path), kv_codec="tiered", **KW))


def test_sliding_window_rows_a_cut_needs_are_there_or_the_prefix_is_evaluated_again(gemma3_path):
    """The context goes 100 tokens past B's document, evicting rows that B's window layers still
    see from its cut (llama.cpp may have reused their cells for newer positions before the
    eviction kept them): B answers as fresh either way."""

    def make():
        return Llama(str(gemma3_path), kv_codec="tiered", **KW)

    llm = make()
    p = prompts(llm, 900)
    llm.eval(llm.tokenize(wikitext2_test()[:20000].encode("utf-8"))[:1000])
    n_swa = llm.kv_shape.n_swa
    assert llm.kv_cache.n_cold > 896 - n_swa + 1  # rows the window sees from B's cut (at 896) were evicted
    got = (completion(llm, p["B"]), last_logits(llm))
    llm.close()
    fresh = make()
    want = (completion(fresh, p["B"]), last_logits(fresh))
    fresh.close()
    assert got[0] == want[0] and kl(want[1], got[1]) <= KL_BOUND


@pytest.mark.parametrize("arch", ["llama", "gemma2"])
def test_the_state_of_a_range_is_the_full_state_cut_to_it(smollm2_path, tmp_path, arch):
    """What an eviction keeps for reuse (llama_kvgguf_state_range) is llama.cpp's own sequence
    state restricted to the evicted positions, byte for byte: every cache record (gemma2 adds a
    sliding-window one, whose masked cells both leave out), its cell records and each layer's K/V
    rows; a range that holds no cell gives empty records, and bad arguments -1."""
    import tiny_models
    from kvgguf.llamacpp import hooks, seq_state, state_format

    path = tiny_models.write(tmp_path / f"{arch}.gguf", tiny_models.TinySpec(arch, n_layer=2), smollm2_path)
    llm = Llama(str(path), kv_codec=None, n_ctx=256, n_batch=64, n_threads=1, n_threads_batch=1, verbose=False)
    llm.eval(list(range(10, 10 + 150)))
    ctx = llm._ctx.ctx
    layers = state_format.cache_layers(ctx, 2, hooks.layer_info)
    full = state_format.parse(seq_state.read(ctx), layers)
    read_range = seq_state.RangeReader(ctx)
    for p0, p1 in [(0, 150), (4, 36), (100, 140), (149, 150), (150, 200)]:
        part = state_format.parse(read_range(p0, p1), layers)
        assert len(part) == len(full) == len(layers)
        for whole, cut in zip(full, part):
            pos = state_format.cell_records(whole.cells)[:, 0] if whole.n_cells else np.zeros(0, int)
            keep = (pos >= p0) & (pos < p1)
            assert cut.n_cells == int(keep.sum()), (p0, p1)
            if not cut.n_cells:
                continue
            assert cut.cells == state_format.cell_records(whole.cells)[keep].astype("<i4").tobytes()
            assert cut.v_trans == whole.v_trans
            for a, b in zip(whole.layers, cut.layers):
                assert (a.il, a.k_type, a.v_type) == (b.il, b.k_type, b.v_type)
                assert np.array_equal(a.k[keep], b.k) and np.array_equal(a.v[keep], b.v)
    if arch == "gemma2":  # the window's record holds only the last 32 positions'
        assert full[1].n_cells < full[0].n_cells
    assert hooks.state_range(ctx, 0, 10, 5, None, 0) == -1
    assert hooks.state_range(ctx, -1, 0, 5, None, 0) == -1
    assert hooks.state_range(ctx, 0, 0, 150, None, 0) == len(seq_state.read(ctx))
    llm.close()
