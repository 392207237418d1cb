"""The fused attention over compressed rows (llama.cpp's native/llama/src/llama-kvgguf-graph.cpp, through
kvg_store_hook_attend) against the expanding path on the same store: both models, flash
attention on and off, every codec family.

Why a KL tolerance and not bit equality: stock llama.cpp's own one-token attention rounds in
f16 (its flash-attention kernel accumulates V in f16; without flash attention the softmax is
rounded to f16 before the V product), the fused path accumulates in f32. The two stock paths
already differ by that much: measured over these 8 decode steps, KL(flash || no flash) of the
expanding path was 0.005 (SmolLM2) and 0.008 (Gemma-3), fused against expanding 0.003 and
0.005. A wrong row, mask or head mapping costs orders of magnitude more (leaving the current
token's own row out: KL > 0.1).
"""

import ctypes

import llama_cpp
import numpy as np
import pytest

from kvgguf import Llama, TieredConfig
from kvgguf.evaluation.harness import kl_top1
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.llamacpp import hooks
from kvgguf.runtime.live_cache import FUSED_MAX_TOKENS
from helpers import wikitext_tokens

N_THREADS = 2
N_PREFILL = 900
N_DECODE = 8
KL_TOLERANCE = 0.02  # see the module docstring


@pytest.fixture(scope="module")
def tokens(smollm2_path):
    return wikitext_tokens(smollm2_path, 20000)


def uniform(codec: str, hot: int = 128) -> TieredConfig:
    return TieredConfig(hot=hot, sinks=4, warm=codec, warm_tokens=0, archive=None, block=32)


def open_llama(path, config, attention="fused", *, flash_attn=True, n_ctx=1024) -> Llama:
    """The context every test here builds: batches of 128, every position's logits kept."""
    return Llama(
        str(path),
        kv_codec=config,
        kv_attention=attention,
        n_ctx=n_ctx,
        n_batch=128,
        logits_all=True,
        flash_attn=flash_attn,
        verbose=False,
        n_threads=N_THREADS,
    )


def decode_logits(path, config, attention, toks, *, flash_attn=True, n_ctx=1024):
    llm = open_llama(path, config, attention, flash_attn=flash_attn, n_ctx=n_ctx)
    # Both prefill on the expanding path (batches of 128 over the fused path's limit, lowered to
    # 64 here), so the two contexts hold the same rows and the decode steps compare the paths alone:
    # qjl3's rows, prefilled fused, differ by KL 0.08 after 900 tokens (its estimator's noise,
    # compounded over the layers).
    if attention == "fused":
        hooks.set_attend(llm._ctx.ctx, llm.kv_cache.store.attend_function(), 64)
    llm.eval(toks[:N_PREFILL])
    if attention == "fused":
        hooks.set_attend(llm._ctx.ctx, llm.kv_cache.store.attend_function(), FUSED_MAX_TOKENS)
    assert llm.kv_cache.n_cold > 0
    for t in toks[N_PREFILL : N_PREFILL + N_DECODE]:
        llm.eval([t])  # one token: the fused path
    out = np.array(llm.scores[N_PREFILL : N_PREFILL + N_DECODE])
    llm.close()
    return out


@pytest.mark.parametrize(
    "codec, flash_attn",
    [
        ("f16", True),
        ("f16", False),
        ("rotq4", True),
        ("rotq4", False),
        ("kivi4", True),
        ("qjl3", True),
        # the extended checks: each 10-20 s (tests/unit/test_attend.py checks their kernels in every tier)
        *(
            pytest.param(codec, fa, marks=pytest.mark.slow)
            for codec, fa in [
                ("rotq2", True),
                ("crotq3", False),
                ("delta4", True),
                ("pdelta4", False),
                ("outl3", True),
                ("lowrank2", False),
                ("pq2", False),
                ("vq8f", True),
            ]
        ),
    ],
)
def test_fused_matches_expanding_path_smollm2(smollm2_path, tokens, codec, flash_attn):
    """SmolLM2: 9 query heads on 3 KV heads (GQA), head_dim 64, every layer full attention."""
    cfg = uniform(codec)
    ref = decode_logits(smollm2_path, cfg, "expand", tokens, flash_attn=flash_attn)
    got = decode_logits(smollm2_path, cfg, "fused", tokens, flash_attn=flash_attn)
    kl, top1 = kl_top1(ref, got)
    assert kl < KL_TOLERANCE, (codec, flash_attn, kl)
    assert top1 >= 0.75


@pytest.mark.parametrize(
    "codec, flash_attn", [("tiered", True), pytest.param("f16", False, marks=pytest.mark.slow)]
)  # each path once: 15-20 s a case
def test_fused_matches_expanding_path_gemma3(gemma3_path, codec, flash_attn):
    """Gemma-3: 4 query heads on 1 KV head, head_dim 256, sliding-window layers beside the
    full ones (only those get cold rows)."""
    vocab = llama_cpp.Llama(str(gemma3_path), vocab_only=True, verbose=False)
    toks = vocab.tokenize(wikitext2_test()[:20000].encode("utf-8"))
    # the hot window must cover the 512-token sliding window plus a block
    cfg = TieredConfig(hot=576, warm_tokens=128) if codec == "tiered" else uniform(codec, hot=576)
    ref = decode_logits(gemma3_path, cfg, "expand", toks, flash_attn=flash_attn, n_ctx=2048)
    got = decode_logits(gemma3_path, cfg, "fused", toks, flash_attn=flash_attn, n_ctx=2048)
    kl, top1 = kl_top1(ref, got)
    assert kl < KL_TOLERANCE, (codec, flash_attn, kl)
    assert top1 >= 0.75


def prefill_scores(path, tokens, attention, *, fused_limit=None):
    """Logits of 640 tokens prefilled in batches of 128, f16 cold rows behind a hot window of 256;
    fused_limit: the fused path's ubatch limit (llama_kvgguf_set_attend), else FUSED_MAX_TOKENS."""
    llm = open_llama(path, uniform("f16", hot=256), attention)
    if fused_limit is not None:
        hooks.set_attend(llm._ctx.ctx, llm.kv_cache.store.attend_function(), fused_limit)
    llm.eval(tokens[:640])
    assert llm.kv_cache.n_cold > 0
    out = np.array(llm.scores[:640])
    llm.close()
    return out


def test_batches_above_the_fused_limit_take_the_expanding_path(smollm2_path, tokens):
    """A batch larger than the fused path's limit (here lowered to 64) expands cold rows: f16 cold
    rows then give the very logits of kv_attention="expand"."""
    fused = prefill_scores(smollm2_path, tokens, "fused", fused_limit=64)
    assert np.array_equal(fused, prefill_scores(smollm2_path, tokens, "expand"))


def test_prefill_batches_take_the_fused_path(smollm2_path, tokens):
    """Ubatches of up to FUSED_MAX_TOKENS (prefill's included) attend fused, hot cells through
    kvg_attend_f16: with f16 cold rows the logits stay within the fused path's stated bound of
    the expanding path's, and differ from them (the fused path ran)."""
    assert FUSED_MAX_TOKENS >= 256
    out = {attention: prefill_scores(smollm2_path, tokens, attention) for attention in ("fused", "expand")}
    assert np.array_equal(out["fused"][:256], out["expand"][:256])  # no cold rows yet: stock attention
    kl, top1 = kl_top1(out["expand"][384:], out["fused"][384:])
    assert 0 < kl < KL_TOLERANCE and top1 >= 0.9


ATTEND = ctypes.CFUNCTYPE(
    ctypes.c_int32,
    ctypes.c_void_p,
    ctypes.c_int32,
    ctypes.c_int64,
    ctypes.c_int64,
    ctypes.c_void_p,
    ctypes.c_int32,
    ctypes.c_int32,
    ctypes.c_float,
    ctypes.c_void_p,
    ctypes.c_void_p,
    ctypes.c_void_p,
)


def test_attend_failure_warns_after_decode_and_cache_stays_usable(smollm2_path, tokens):
    """An attend hook that fails (leaving its rows out, as the contract says) is counted by
    llama.cpp and reported in Python after llama_decode (a RuntimeWarning: the rows were masked,
    test_live_failures); with the store's hook back, the same context decodes as a fresh one does."""
    cfg = uniform("rotq4")
    llm = open_llama(smollm2_path, cfg)
    llm.eval(tokens[:N_PREFILL])
    failing = ATTEND(lambda *args: -1)
    hooks.set_attend(llm._ctx.ctx, ctypes.cast(failing, ctypes.c_void_p).value, FUSED_MAX_TOKENS)
    with pytest.warns(RuntimeWarning, match="left them out of the softmax"):
        llm.eval([tokens[N_PREFILL]])
    hooks.set_attend(llm._ctx.ctx, llm.kv_cache.store.attend_function(), FUSED_MAX_TOKENS)
    llm.n_tokens = N_PREFILL  # drop the failed step; the next eval removes its rows
    for t in tokens[N_PREFILL : N_PREFILL + 4]:
        llm.eval([t])
    got = np.array(llm.scores[N_PREFILL : N_PREFILL + 4])

    fresh = open_llama(smollm2_path, cfg)
    fresh.eval(tokens[:N_PREFILL])
    for t in tokens[N_PREFILL : N_PREFILL + 4]:
        fresh.eval([t])
    assert np.array_equal(got, np.array(fresh.scores[N_PREFILL : N_PREFILL + 4]))
