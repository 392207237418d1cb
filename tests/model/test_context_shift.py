"""Context shift (kvgguf.Llama(context_shift=True)): a context that fills n_ctx keeps its first
n_keep tokens, drops half of the rest and moves the later ones back, as llama.cpp's server does.
llama.cpp's cells shift by its own RoPE shift; the store's blocks keep their codes, and attention
rotates the queries (fused path) or the decoded keys (expanding path) to match
(native/src/store/shift.c, native/llama/src/llama-kvgguf-graph.cpp).

The reference is stock llama.cpp shifted by its own llama_memory_seq_rm and llama_memory_seq_add
over the same positions. With an f16 cold store on the expanding path the first shift gives its
logits bit for bit (the same f16 rotation of the same rows); after a second one kvgguf rotates a
twice-moved key once by the sum, stock twice with an f16 rounding between, and the fused path
rotates the query in f32 instead of the key in f16: there the bound is the fused path's own
(tests/model/test_fused_attention.py).
"""

import dataclasses

import llama_cpp
import numpy as np
import pytest

import tiny_models
from tiny_models import SPECS, TinySpec
from kvgguf import Llama, TieredConfig
from kvgguf.bindings.store import KVStore
from kvgguf.llama import shift_cells, shift_tokens
from kvgguf.evaluation.harness import kl_top1
from helpers import wikitext_tokens

KW = dict(n_threads=1, n_threads_batch=1, verbose=False)
F16_COLD = TieredConfig(
    hot=64, sinks=4, warm="f16", warm_tokens=0, archive=None, block=32, window="f16", hot_cells="f16"
)
N_CTX = 256
N_BATCH = 32


@pytest.fixture(scope="module")
def text_tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 8000)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, smollm2_path):
    folder = tmp_path_factory.mktemp("shift-models")
    made = {}

    def get(name: str, spec: TinySpec):
        if name not in made:
            made[name] = str(tiny_models.write(folder / f"{name}.gguf", spec, smollm2_path))
        return made[name]

    return get


def shifted_run(llm, ref, toks):
    """Feeds toks to llm (context_shift=True) and to stock ref, which gets the same shifts
    through llama.cpp's own calls: the last logits of each batch after the first shift, and how
    many shifts each followed."""
    got, want, after, shifts, i = [], [], [], 0, 0
    while i < len(toks):
        # the batches llm runs (up to the next multiple of N_BATCH), so that a shift falls at the
        # same token for both
        batch = toks[i : i + N_BATCH - llm.n_tokens % N_BATCH]
        i += len(batch)
        llm.eval(batch)
        if llm.context_shifts > shifts:
            shifts = llm.context_shifts
            shift_cells(ref, *llm.last_shift)
            shift_tokens(ref, *llm.last_shift)
        ref.eval(batch)
        assert ref.n_tokens == llm.n_tokens
        assert list(ref.input_ids[: ref.n_tokens]) == list(llm.input_ids[: llm.n_tokens])
        if shifts:
            got.append(np.array(llm.scores[llm.n_tokens - 1]))
            want.append(np.array(ref.scores[ref.n_tokens - 1]))
            after.append(shifts)
    return np.array(got), np.array(want), np.array(after)


def shift_against_stock(path, toks, attention):
    ref = llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, logits_all=True, **KW)
    llm = Llama(
        path,
        kv_codec=F16_COLD,
        n_ctx=N_CTX,
        n_batch=N_BATCH,
        logits_all=True,
        kv_attention=attention,
        context_shift=True,
        **KW,
    )
    got, want, after = shifted_run(llm, ref, toks)
    assert llm.context_shifts >= 3 and llm.tokens_shifted_out > len(toks) - N_CTX
    assert set(after) == {1, 2, 3}
    return llm, kl_top1(want, got)


@pytest.mark.parametrize("attention", ["expand", "fused"])
def test_a_shifted_f16_store_gives_stock_shifted_logits(tiny, text_tokens, attention, monkeypatch):
    """Three shifts over 640 tokens in n_ctx 256, compared after each batch from the first shift
    on, on the tiny llama of head dim 80 (the smaller default one's attention barely depends on
    position). Measured: KL 8.7e-7 (expanding path) and 6.9e-8 (fused), every top token the same.
    The same run without the rotation (llama.cpp never told of the moved rows) is 70x and 860x
    further (KL 6e-5), so the control runs here too."""
    path, toks = tiny("llama-hd80", SPECS["llama-hd80"]), text_tokens[:640]
    llm, (kl, top1) = shift_against_stock(path, toks, attention)
    assert llm.kv_cache.store.shifts(0), "the store holds moved blocks"
    assert kl < 1e-5 and top1 == 1.0, (kl, top1)
    llm.close()
    unrotated = KVStore.hook_functions
    monkeypatch.setattr(KVStore, "hook_functions", lambda self: (*unrotated(self)[:2], 0))
    _, (kl_unrotated, _) = shift_against_stock(path, toks, attention)
    assert kl_unrotated > 20 * kl, (kl_unrotated, kl)


# the extended checks shift every other architecture (each 2-4 s)
FAST_ARCHS = {"llama", "gemma2", "phi3-longrope", "glm4", "smollm3", "gpt-oss"}


@pytest.mark.parametrize("name", [n if n in FAST_ARCHS else pytest.param(n, marks=pytest.mark.slow) for n in SPECS])
def test_every_architecture_shifts_as_stock_does(tiny, text_tokens, name):
    """The fused path, three shifts: soft-capping and sliding windows (gemma2), LongRoPE's factors
    (phi3-longrope), a partial rotary dimension (glm4), layers without RoPE (smollm3), sinks and
    experts (gpt-oss), and the rest in the extended checks. Measured: KL 1e-12 to 6e-6 (glm4's
    3e-6, gemma4's 6e-6), every top token the same."""
    path = tiny(name, SPECS[name])
    _, (kl, top1) = shift_against_stock(path, text_tokens[:640], "fused")
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)


@pytest.mark.parametrize("path_kind", ["fused", "expand"])
def test_yarn_scaled_rope_shifts_as_stock_does(tiny, text_tokens, path_kind):
    """YaRN (a 4x longer context than trained, as Qwen's and DeepSeek's files ask): its rotation
    also scales by its attention factor, and llama.cpp's shift of cached keys applies that factor
    with the rotation. kvgguf rotates the query by the same rope instead, so the two compose the
    same: a shifted context scores as stock's shifted cells do."""
    yarn = {"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0, "rope.scaling.original_context_length": 64}
    path = tiny("llama-yarn", TinySpec("llama", head_dim=80, extra=yarn))
    _, (kl, top1) = shift_against_stock(path, text_tokens[:640], path_kind)
    assert kl < 1e-4 and top1 == 1.0, (kl, top1)


def test_quantized_hot_cells_shift_by_llama_cpp_s_own_rotation(tiny, text_tokens):
    """q8_0 hot cells (the preset's) are dequantized, rotated and quantized again by llama.cpp's
    shift; kvgguf builds them without llama.cpp's Hadamard rotation, which that shift assumed."""
    path, toks = tiny("llama-hd32", TinySpec("llama", head_dim=32)), text_tokens[:640]  # q8_0's blocks of 32
    ref = llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=N_BATCH, n_ubatch=N_BATCH, logits_all=True, **KW)
    config = dataclasses.replace(F16_COLD, hot_cells="q8_0")
    llm = Llama(path, kv_codec=config, n_ctx=N_CTX, n_batch=N_BATCH, logits_all=True, context_shift=True, **KW)
    assert llm.kv_cells["hot"] == "q8_0"
    got, want, _ = shifted_run(llm, ref, toks)
    kl, top1 = kl_top1(want, got)
    assert kl < 1e-4 and top1 >= 0.9, (kl, top1)


@pytest.mark.parametrize("kv_codec", [None, "tiered"])
def test_a_completion_past_n_ctx_raises_naming_the_option_or_shifts(tiny, text_tokens, kv_codec):
    path = tiny("llama", TinySpec("llama"))
    prompt = text_tokens[:300]  # longer than n_ctx
    llm = Llama(path, kv_codec=kv_codec, n_ctx=N_CTX, **KW)
    with pytest.raises(ValueError, match="context_shift=True"):
        llm.create_completion(prompt, max_tokens=4)
    llm.close()
    llm = Llama(path, kv_codec=kv_codec, n_ctx=N_CTX, context_shift=True, **KW)
    out = llm.create_completion(prompt, max_tokens=N_CTX, temperature=0.0, logit_bias={llm.token_eos(): -1e9})
    assert out["usage"]["completion_tokens"] == N_CTX and out["choices"][0]["finish_reason"] == "length"
    assert llm.context_shifts >= 2 and llm.n_tokens <= N_CTX
    assert list(llm.input_ids[: llm.n_keep]) == prompt[: llm.n_keep]  # the kept tokens stay in front
    chat = llm.create_chat_completion([{"role": "user", "content": "hello " * 300}], max_tokens=8)
    assert chat["usage"]["completion_tokens"] >= 1
    llm.close()


def test_a_generation_keeps_its_sampler_chain_across_shifts(tiny, text_tokens):
    """The sampler chain lives through every shift: a grammar that allows one "<" and then only
    letters would ask for "<" again if its state started over at a shift."""
    path = tiny("llama", TinySpec("llama"))
    llm = Llama(path, kv_codec="tiered", n_ctx=N_CTX, context_shift=True, **KW)
    grammar = llama_cpp.LlamaGrammar.from_string('root ::= "<" [a-z]+', verbose=False)
    out = llm.create_completion(
        text_tokens[:200],
        max_tokens=N_CTX,
        temperature=0.8,
        repeat_penalty=1.3,
        grammar=grammar,
        logit_bias={llm.token_eos(): -1e9},
        seed=3,
    )
    text = out["choices"][0]["text"]
    assert llm.context_shifts >= 2 and out["usage"]["completion_tokens"] == N_CTX
    assert text.startswith("<") and text[1:].isalpha() and text[1:].islower(), text
    llm.close()


def test_n_keep_that_leaves_no_room_is_refused_before_the_first_token(tiny):
    path = tiny("llama", TinySpec("llama"))
    with pytest.raises(ValueError, match="n_keep=200 leaves no room"):
        Llama(path, kv_codec="tiered", n_ctx=N_CTX, context_shift=True, n_keep=200, **KW)


def test_a_shifted_context_saves_and_restores_its_moved_rows(tiny, text_tokens, tmp_path):
    """The session lists the moved runs (format version 2): restored, the context goes on as the
    one that saved it, logit for logit; without the runs its keys would be read unrotated."""
    path = tiny("llama-hd80", SPECS["llama-hd80"])
    kw = dict(kv_codec=F16_COLD, n_ctx=N_CTX, n_batch=N_BATCH, context_shift=True, logits_all=True, **KW)
    llm = Llama(path, **kw)
    llm.eval(text_tokens[:640])
    runs = llm.kv_cache.store.shifts(0)
    assert runs  # moved blocks (a shift past the cold rows moves none)
    llm.save_session(tmp_path / "s.kvz", exact=True)
    nxt = text_tokens[640:672]

    def go_on(other):
        other.eval(nxt)
        return np.array(other.scores[other.n_tokens - len(nxt) : other.n_tokens])

    want = go_on(llm)
    restored = Llama(path, **kw)
    restored.load_session(tmp_path / "s.kvz")
    assert restored.kv_cache.store.shifts(0) == runs
    assert restored.kv_cache.canonical <= runs[0][0]  # a cut among moved rows evaluates again
    assert np.array_equal(go_on(restored), want)
    unrotated = Llama(path, **kw)
    unrotated.load_session(tmp_path / "s.kvz")
    for il in unrotated.kv_cache.layers:
        for r0, r1, _ in runs:
            unrotated.kv_cache.store.set_shift(il, r0, r1, 0)
    assert not np.allclose(go_on(unrotated), want, atol=1e-3)


@pytest.mark.parametrize("kv_codec", [None, "tiered"])
def test_a_conversation_past_n_ctx_evaluates_only_each_new_turn(tiny, text_tokens, kv_codec):
    """Each turn sends the whole conversation, as a chat does: after shifts the context still
    stands for it (its dropped tokens are remembered by their place in the conversation), so a
    turn evaluates its own tokens, not the conversation again."""
    path = tiny("llama", TinySpec("llama"))
    llm = Llama(path, kv_codec=kv_codec, n_ctx=N_CTX, context_shift=True, **KW)
    conversation, turns = [], [text_tokens[i : i + 90] for i in range(0, 900, 90)]
    no_eos = {llm.token_eos(): -1e9}
    for turn in turns:
        conversation += turn
        before = llm.tokens_evaluated
        out = llm.create_completion(conversation, max_tokens=20, temperature=0.0, logit_bias=no_eos)
        evaluated = llm.tokens_evaluated - before
        assert out["usage"]["completion_tokens"] == 20
        assert evaluated <= len(turn) + 19, (evaluated, len(conversation))  # the turn, then 19 generated
        conversation += llm.input_ids[llm.n_tokens - 19 : llm.n_tokens].tolist()  # the reply as evaluated
    assert llm.context_shifts >= 3 and len(conversation) > 4 * N_CTX
    # a prompt that departs from the conversation inside what was dropped is evaluated again
    before = llm.tokens_evaluated
    llm.create_completion(conversation[:10] + [t ^ 1 for t in conversation[10:300]], max_tokens=2)
    assert llm.tokens_evaluated - before >= 280
    llm.close()


def test_the_preset_shifts_a_prompt_longer_than_n_ctx_and_the_next_turn(smollm2_path):
    """SmolLM2's preset (blocks of 64 after 4 sinks, batches of 32): a shift moves n_tokens off
    the multiples of n_batch, so the live cache then evicts where a batch needs it. kvgguf serve's
    first failure, as a 500."""
    llm = Llama(str(smollm2_path), kv_codec="tiered:fixed", n_ctx=1024, context_shift=True, **KW)
    prompt = "word " * 1500
    out = llm.create_completion(prompt, max_tokens=2)
    assert out["usage"]["prompt_tokens"] > 1024 and llm.kv_cache.store.shifts(0)
    before = llm.tokens_evaluated
    llm.create_completion(prompt + "word " * 40, max_tokens=2)
    assert llm.tokens_evaluated - before <= 45
    llm.close()


def test_a_prompt_cache_keeps_no_moved_context_and_still_loads_an_earlier_one(tiny, text_tokens):
    """llama-cpp-python hands a completion's state to its prompt cache and loads a cached state
    that matches a prompt further than the context does: a moved context is not cached (its state
    is None), and a cached one loads over it."""
    from kvgguf.session.prompt_cache import CompressedRAMCache

    path = tiny("llama", TinySpec("llama"))
    llm = Llama(path, kv_codec=F16_COLD, n_ctx=N_CTX, n_batch=N_BATCH, context_shift=True, **KW)
    cache = CompressedRAMCache(capacity_bytes=64 << 20)
    llm.set_cache(cache)
    short = text_tokens[:100]
    llm.create_completion(short, max_tokens=2)  # cached: no shift
    assert len(cache.cache_state) == 1
    llm.create_completion(text_tokens[:640], max_tokens=2)  # shifts, moves compressed rows
    assert llm.kv_cache.store.shifts(0) and len(cache.cache_state) == 1
    llm.create_completion(short + text_tokens[200:210], max_tokens=2)  # the cached state loads over it
    assert not llm.kv_cache.store.shifts(0)
    llm.close()
