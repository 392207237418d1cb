"""The live tiered cache inside llama.cpp: exactness, quality, memory, policy, reuse, errors."""

import ctypes
import struct

import llama_cpp
import numpy as np
import pytest

import kvgguf
from kvgguf import Llama, TieredConfig, codecs
from kvgguf.llamacpp import hooks
from kvgguf.evaluation.harness import kl_top1
from kvgguf.enums import Kind, Tier
from kvgguf.policy import plan
from kvgguf.evaluation.text import wikitext2_test


N_THREADS = 2


@pytest.fixture(scope="module")
def wiki_tokens(smollm2_path):
    text = wikitext2_test()[:60000]
    llm = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False)
    return llm.tokenize(text.encode("utf-8"))


def stock(path, n_ctx, n_batch, **kw):
    return llama_cpp.Llama(
        str(path),
        n_ctx=n_ctx,
        n_batch=n_batch,
        n_ubatch=n_batch,
        logits_all=True,
        verbose=False,
        n_threads=N_THREADS,
        **kw,
    )


F16_COLD = TieredConfig(
    hot=64, sinks=0, warm="f16", warm_tokens=0, archive=None, block=32, window="f16", hot_cells="f16"
)


@pytest.mark.parametrize("flash_attn", [True, False])
def test_f16_cold_rows_reproduce_stock_logits(smollm2_path, wiki_tokens, flash_attn):
    """Cold rows found, ordered and masked right: with an exact codec and the expanding path
    (llama.cpp's own attention kernels) the logits are stock's, bit for bit."""
    toks = wiki_tokens[:600]
    ref = stock(smollm2_path, 1024, 32, flash_attn=flash_attn)
    ref.eval(toks)
    llm = Llama(
        str(smollm2_path),
        kv_codec=F16_COLD,
        n_ctx=1024,
        n_batch=32,
        logits_all=True,
        flash_attn=flash_attn,
        verbose=False,
        n_threads=N_THREADS,
        kv_attention="expand",
    )
    llm.eval(toks)
    # The hot window is 64 tokens: before the last batch (tokens 576..599) at most 64 were hot.
    assert llm.kv_cache.n_cold >= 576 - 64
    assert np.array_equal(llm.scores[:600], ref.scores[:600])


def test_the_preset_splits_long_evaluations_into_its_ubatch(smollm2_path, wiki_tokens):
    """One eval() of 700 tokens: kvgguf hands llama.cpp 32 at a time, so its f16 buffer is the
    hot window plus 32 cells (256 in all), and with f16 cold rows the logits are those of stock
    llama.cpp decoding in batches of 32, bit for bit. (Stock llama.cpp's own logits depend on its
    batch size: 32 against 512 differ by up to 2.3 on this text, so 32 is the reference.)"""
    toks = wiki_tokens[:700]
    preset = TieredConfig()
    exact = TieredConfig(sinks=0, warm="f16", warm_tokens=0, archive=None, hot_cells="f16")
    assert (exact.hot, exact.ubatch) == (preset.hot, preset.ubatch) and preset.hot + preset.ubatch == 256
    llm = Llama(
        str(smollm2_path),
        kv_codec=exact,
        n_ctx=1024,
        logits_all=True,
        flash_attn=True,
        verbose=False,
        n_threads=N_THREADS,
        kv_attention="expand",
    )
    assert llm.n_batch == preset.ubatch and llm.kv_cache.capacity == 256
    llm.eval(toks)
    assert llm.kv_cache.n_cold >= 700 - preset.hot - preset.ubatch
    ref = stock(smollm2_path, 1024, preset.ubatch, flash_attn=True)
    ref.eval(toks)
    assert np.array_equal(llm.scores[:700], ref.scores[:700])
    llm.close()
    ref.close()


def test_a_kv_codec_turns_flash_attention_on_unless_told_otherwise(smollm2_path):
    """With a kv_codec, flash attention defaults to on (llama.cpp then keeps V untransposed,
    which the fused generation reads faster); an explicit flash_attn wins, and kv_codec=None keeps
    llama-cpp-python's own default (off)."""
    path, on, off = str(smollm2_path), llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED, llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    for kw, want in ((dict(kv_codec="tiered"), on), (dict(kv_codec="tiered", flash_attn=False), off), ({}, off)):
        llm = Llama(path, n_ctx=512, verbose=False, n_threads=N_THREADS, **kw)
        assert llm.context_params.flash_attn_type == want, kw
        llm.close()


@pytest.mark.slow
def test_at_equal_bits_held_rotq3_beats_llama_q4_0(smollm2_path, wiki_tokens):
    """Quality at equal memory, every byte counted on both sides.

    llama.cpp's q4_0 holds 4.5 bits per value. kvgguf's rotq3 cold rows (3.25 bits) beside a
    128-token hot window taking 128-token batches (an f16 buffer of 256 cells: one unit of
    llama.cpp's padding, so a smaller window would hold the same bytes) hold fewer bits than
    that only once the context is long enough to amortise the buffer: 3,328 tokens here. At
    those bits, the KL against the f16 cache must be lower than q4_0's, on the second half.
    """
    n = 3328
    toks = wiki_tokens[:n]
    ref = Llama(
        str(smollm2_path), n_ctx=n, n_batch=256, logits_all=True, flash_attn=True, verbose=False, n_threads=N_THREADS
    )
    ref.eval(toks)
    ref_logits = ref.scores[n // 2 : n].copy()
    ref.close()
    q4 = Llama(
        str(smollm2_path),
        n_ctx=n,
        n_batch=256,
        logits_all=True,
        flash_attn=True,
        verbose=False,
        n_threads=N_THREADS,
        type_k="q4_0",
        type_v="q4_0",
    )
    q4.eval(toks)
    bits_q4 = q4.kv_memory().bits_per_value
    kl_q4, _ = kl_top1(ref_logits, q4.scores[n // 2 : n])
    q4.close()
    config = TieredConfig(hot=128, ubatch=128, sinks=0, warm="rotq3", warm_tokens=0, archive=None, block=32)
    llm = Llama(
        str(smollm2_path),
        kv_codec=config,
        n_ctx=n,
        n_batch=128,
        logits_all=True,
        flash_attn=True,
        verbose=False,
        n_threads=N_THREADS,
    )
    llm.eval(toks)
    bits = llm.kv_memory().bits_per_value
    kl, top1 = kl_top1(ref_logits, llm.scores[n // 2 : n])
    assert bits_q4 == 4.5
    assert bits <= bits_q4, (bits, bits_q4)
    assert kl < kl_q4, (kl, kl_q4)
    assert top1 >= 0.85


def test_generation_far_past_the_physical_cache(smollm2_path, wiki_tokens):
    config = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=512, archive="rotq2", block=32)
    llm = Llama(str(smollm2_path), kv_codec=config, n_ctx=4096, n_batch=32, verbose=False, n_threads=N_THREADS)
    physical = llama_cpp.llama_n_ctx(llm._ctx.ctx)
    prompt = wiki_tokens[: 8 * physical - 40]
    out = llm.create_completion(prompt, max_tokens=48, temperature=0.0)
    assert out["usage"]["completion_tokens"] == 48 or out["choices"][0]["finish_reason"] == "stop"
    assert llm.n_tokens >= 8 * physical  # logical context at least 8x llama.cpp's cache
    mem = llm.kv_memory()
    shape = llm.kv_cache.shape
    # Bytes held are the store's encoded blocks, counted by the codecs' own sizes...
    expected = 0
    for b in llm.kv_cache.blocks:
        codec = {Tier.SINK: "f16", Tier.WARM: "rotq4", Tier.ARCHIVE: "rotq2"}[b.tier]
        n = b.r1 - b.r0
        per_layer = codecs.encoded_size(codec, (n, shape.n_head_kv, shape.head_dim_k), "k") + codecs.encoded_size(
            codec, (n, shape.n_head_kv, shape.head_dim_v), "v"
        )
        expected += shape.n_layer * per_layer
    assert sum(t.bytes for t in mem.tiers if t.name not in ("hot", "reuse")) == expected
    # ...and grow with the compressed size, not the f16 size.
    f16_bytes = llm.n_tokens * shape.values_per_token * 2
    assert mem.total_bytes < f16_bytes / 3
    assert str(mem).startswith("kv cache: size = ")


@pytest.mark.parametrize("flash_attn", [False, True])
def test_one_token_decode_after_evictions_against_stock(smollm2_path, wiki_tokens, flash_attn):
    """Generation through the expanding path with f16 cold rows, evictions along the way.
    Without flash attention: stock's logits bit for bit, with blocks of 64 rows: attention then
    runs over [cold rows | 256 cells], a multiple of 64 long, as stock's cells are, and ggml's f16
    dot product (64 values a step on AVX-512) sums every position in the same lane as stock's
    (with blocks of 32 the last 32 would go through its scalar tail: another order). With it, ggml's one-token flash
    attention splits the cells among threads by count once there are 512 or more
    (ggml_compute_forward_flash_attn_ext_f16, use_split_kv_path), and [cold rows | hot cells]
    has another count than stock's cache: the partial sums (V accumulated in f16) round
    differently. Measured over 150 steps: KL 0.0035; the bound asserted is 0.01."""
    n_pre, steps = 300, 100
    config = TieredConfig(hot=224, sinks=4, warm="f16", warm_tokens=0, archive=None, block=64, hot_cells="f16")
    got_llm = Llama(
        str(smollm2_path),
        kv_codec=config,
        kv_attention="expand",
        n_ctx=1024,
        n_batch=32,
        logits_all=True,
        flash_attn=flash_attn,
        verbose=False,
        n_threads=N_THREADS,
    )
    ref_llm = stock(smollm2_path, 1024, 32, flash_attn=flash_attn)
    for llm in (got_llm, ref_llm):
        llm.eval(wiki_tokens[:n_pre])
        for t in wiki_tokens[n_pre : n_pre + steps]:
            llm.eval([t])
    assert got_llm.kv_cache.n_cold > 0 and len(got_llm.kv_cache.blocks) > 2  # rows left the hot window while decoding
    got, ref = got_llm.scores[n_pre : n_pre + steps], ref_llm.scores[n_pre : n_pre + steps]
    if flash_attn:
        kl, top1 = kl_top1(ref, got)
        assert kl < 0.01 and top1 >= 0.95, (kl, top1)
    else:
        assert np.array_equal(got, ref)
    got_llm.close()
    ref_llm.close()


def test_sinks_stay_exact_and_warm_rows_age_into_archive(smollm2_path, wiki_tokens):
    toks = wiki_tokens[:700]
    # f16 cells: the sinks are then stock's f16 rows bit for bit (q8_0 cells: as the cells held them)
    config = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=32, hot_cells="f16")
    llm = Llama(str(smollm2_path), kv_codec=config, n_ctx=1024, n_batch=32, verbose=False, n_threads=N_THREADS)
    llm.eval(toks)
    kv = llm.kv_cache
    ref = stock(smollm2_path, 1024, 32, flash_attn=True)  # as kvgguf.Llama defaults with a kv_codec
    ref.eval(toks[:64])
    for il in (0, 29):
        for kind in Kind:
            rows = np.empty((4, kv.store.width(kind)), np.float16)
            pos = np.empty(4, np.int32)
            got = hooks.read_rows(
                ref._ctx.ctx,
                0,
                il,
                kind,
                0,
                4,
                rows.ctypes.data,
                rows.nbytes,
                pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)),
            )
            assert got == 4
            assert np.array_equal(kv.store.decode_f16(il, kind, 0, 4).view(np.uint16), rows.view(np.uint16))
    assert kv.blocks[0].tier == Tier.SINK and (kv.blocks[0].r0, kv.blocks[0].r1) == (0, 4)
    # 700 tokens end off a multiple of n_batch: the last eviction's blocks age after the batch
    # that ends on one (plan.state_at)
    want, due = plan.state_at(len(toks), 32, config)
    assert due and [(b.r0, b.r1, b.tier) for b in kv.blocks] == [(b.r0, b.r1, b.tier) for b in want]
    assert any(b.tier == Tier.ARCHIVE for b in kv.blocks)
    mem = llm.kv_memory()
    assert mem.by_tier["archive"].bytes > 0 and mem.by_tier["warm"].bytes > 0


def test_reset_and_a_new_prompt_leave_no_stale_rows(smollm2_path, wiki_tokens):
    config = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=32)
    kw = dict(kv_codec=config, n_ctx=1024, n_batch=32, logits_all=True, verbose=False, n_threads=N_THREADS)
    llm = Llama(str(smollm2_path), **kw)
    llm.eval(wiki_tokens[:500])
    assert llm.kv_cache.n_cold > 0
    llm.reset()
    assert llm.kv_cache.n_cold == 0 and llm.kv_memory().by_tier["warm"].bytes == 0
    other = wiki_tokens[1000:1400]
    llm.eval(other)
    fresh = Llama(str(smollm2_path), **kw)
    fresh.eval(other)
    assert np.array_equal(llm.scores[:400], fresh.scores[:400])


def test_prefix_reuse_truncates_inside_the_compressed_rows(smollm2_path, wiki_tokens):
    # The expanding path sums [cold | hot] in one order wherever the boundary lies, so the
    # truncated context must give a fresh one's logits bit for bit; the fused path's f32 sums
    # depend on where the cold/hot boundary lies (tests/model/test_fused_attention.py covers it).
    kw = dict(
        kv_codec=F16_COLD,
        n_ctx=1024,
        n_batch=32,
        logits_all=True,
        verbose=False,
        n_threads=N_THREADS,
        kv_attention="expand",
    )
    llm = Llama(str(smollm2_path), **kw)
    a = wiki_tokens[:640]
    b = wiki_tokens[:352] + wiki_tokens[2000:2256]  # shares 352 tokens: 5.5 blocks, all cold
    llm.create_completion(a, max_tokens=1, temperature=0.0)
    assert llm.kv_cache.n_cold > 352
    llm.create_completion(b, max_tokens=1, temperature=0.0)
    assert llm.n_tokens == len(b)  # only the new part was evaluated on top of the kept prefix
    fresh = Llama(str(smollm2_path), **kw)
    fresh.eval(b[:352])
    fresh.eval(b[352:])
    assert np.array_equal(llm.scores[352 : len(b)], fresh.scores[352 : len(b)])


def _fake_gguf(path, arch):
    key, value = b"general.architecture", arch.encode()
    with open(path, "wb") as f:
        f.write(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
        f.write(struct.pack("<Q", len(key)) + key + struct.pack("<I", 8))
        f.write(struct.pack("<Q", len(value)) + value)
    return path


def test_bad_configs_raise_clear_errors(smollm2_path, tmp_path):
    path = str(smollm2_path)
    with pytest.raises(
        ValueError,
        match="kv_codec 'rotq5' is unknown; choose 'tiered', 'tiered:fixed', 'auto', 'auto:BITS', 'auto:held=BITS', 'k:NAME,v:NAME' or one of: f16",
    ):
        Llama(path, kv_codec="rotq5", n_ctx=1024)
    split = Llama(path, kv_codec=TieredConfig(hot=128), n_ctx=1024, n_batch=256, verbose=False)
    assert split.n_batch == split.kv_config.ubatch  # a batch longer than the hot window is split (issue 46)
    split.close()
    with pytest.raises(ValueError, match="type_k must be f16"):
        Llama(path, kv_codec="tiered", n_ctx=1024, type_k="q8_0")
    with pytest.raises(ValueError, match="type_v 'q9' is unknown"):
        Llama(path, n_ctx=1024, type_v="q9")
    with pytest.raises(ValueError, match="'mamba'"):
        Llama(str(_fake_gguf(tmp_path / "m.gguf", "mamba")), kv_codec="tiered", n_ctx=1024)
    with pytest.raises(ValueError, match="codec 'zstd' is unknown"):
        TieredConfig(warm="zstd")
    with pytest.raises(ValueError, match="must exceed block"):
        TieredConfig(hot=32, block=64)


def test_llama_cache_types_by_name(smollm2_path):
    llm = Llama(str(smollm2_path), n_ctx=512, type_k="q8_0", type_v="q8_0", flash_attn=True, verbose=False)
    out = llm.create_completion("The capital of France is", max_tokens=4, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1
    assert llm.kv_memory().total_bytes > 0


def test_stock_behaviour_without_a_codec(smollm2_path, wiki_tokens):
    toks = wiki_tokens[:300]
    ref = stock(smollm2_path, 512, 64)
    ref.eval(toks)
    llm = Llama(
        str(smollm2_path), n_ctx=512, n_batch=64, n_ubatch=64, logits_all=True, verbose=False, n_threads=N_THREADS
    )
    llm.eval(toks)
    assert llm.kv_cache is None
    assert np.array_equal(llm.scores[:300], ref.scores[:300])


@pytest.mark.model  # loads the model by name
def test_gemma3_cold_rows_only_on_full_attention_layers():
    path = kvgguf.models.path("gemma3-270m")
    llm = Llama(str(path), kv_codec="tiered", n_ctx=4096, verbose=False, n_threads=N_THREADS)
    kv = llm.kv_cache
    assert kv.config.hot >= 512 + kv.config.block  # raised to cover the sliding window
    assert 0 < len(kv.layers) < kv.shape.n_layer  # sliding-window layers keep llama.cpp's window
    out = llm.create_completion("Once upon a time " * 450, max_tokens=8, temperature=0.0)
    assert out["usage"]["completion_tokens"] >= 1
    assert kv.n_cold > 0
    assert all(kv.store.n_rows(il) == 0 for il in range(kv.shape.n_layer) if il not in kv.layers)


def test_everyday_api_works_with_a_codec(smollm2_path, wiki_tokens):
    config = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=32)
    llm = Llama(str(smollm2_path), kv_codec=config, n_ctx=2048, n_batch=32, verbose=False, n_threads=N_THREADS)
    assert llm.n_ctx() == 2048  # the logical context, not llama.cpp's 256 cells
    text = llm.detokenize(wiki_tokens[:700]).decode("utf-8", "ignore")
    assert llm.detokenize(llm.tokenize(b"hello world", add_bos=False)).strip() == b"hello world"
    chunks = list(llm(text + "\n\nIn summary,", max_tokens=12, temperature=0.0, stream=True))
    assert len(chunks) >= 2 and llm.kv_cache.n_cold > 0
    chat = llm.create_chat_completion(
        messages=[{"role": "system", "content": text[:2500]}, {"role": "user", "content": "What is this about?"}],
        max_tokens=8,
        temperature=0.0,
    )
    assert chat["choices"][0]["message"]["content"] is not None
    assert llm.kv_cache.n_cold > 0
    tokens = list(zip(range(5), llm.generate(llm.tokenize(b"Once upon a time"), temp=0.0)))
    assert len(tokens) == 5


def test_embed_after_eviction_matches_stock(smollm2_path, wiki_tokens):
    """embed() clears the cache: rows already compressed must go with llama.cpp's cells, and the
    context must keep working after it."""
    kw = dict(n_ctx=1024, embedding=True, flash_attn=True, verbose=False, n_threads=N_THREADS)
    # f16 cells, as stock's: the embedding is then stock's within float noise
    config = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=32, hot_cells="f16")
    llm = Llama(str(smollm2_path), kv_codec=config, n_batch=64, **kw)
    llm.eval(wiki_tokens[:400])
    assert llm.kv_cache.n_cold >= 400 - 64 - 64  # rows were evicted before the embedding
    mine = llm.embed("The quick brown fox")
    assert llm.kv_cache.n_cold == 0
    ref = Llama(str(smollm2_path), n_batch=64, **kw).embed("The quick brown fox")
    assert np.isfinite(np.asarray(mine)).all()
    assert np.allclose(np.asarray(mine), np.asarray(ref), atol=1e-4)
    llm.eval(wiki_tokens[:300])  # and it evicts again from an empty store
    assert llm.kv_cache.n_cold > 0


def test_a_per_layer_per_kind_plan_stores_the_codecs_it_names(smollm2_path, wiki_tokens):
    """Every (layer, K/V) list holds its tiers in the codecs the plan names, byte for byte, and
    the fused attention reads the mixed codecs while generating."""
    warm = {"default": ("rotq4", "rotq3"), 0: ("kivi4", "kivi2"), 5: "f16"}
    archive = {"default": "rotq2", 1: ("crotq3", "kivi2")}
    config = TieredConfig(hot=64, sinks=4, warm=warm, warm_tokens=128, archive=archive, block=32)
    llm = Llama(str(smollm2_path), kv_codec=config, n_ctx=1024, n_batch=32, verbose=False, n_threads=N_THREADS)
    llm.eval(wiki_tokens[:400])
    for _ in range(3):  # one token at a time: the fused path
        llm.eval([llm.sample(temp=0.0)])
    kv, shape = llm.kv_cache, llm.kv_cache.shape
    tables = {tier: config.table(tier, shape.n_layer) for tier in (Tier.SINK, Tier.WARM, Tier.ARCHIVE)}
    seen = set()
    for il in kv.layers:
        for kind, dim, role in ((Kind.K, shape.head_dim_k, "k"), (Kind.V, shape.head_dim_v, "v")):
            for b in kv.store.blocks(il, kind):
                want = tables[b.tier][il, kind]
                assert b.codec == want, (il, kind, b.tier)
                assert len(b.data) == codecs.encoded_size(want, (b.n_rows, shape.n_head_kv, dim), role)
                seen.add((b.tier, want))
    assert {
        (Tier.WARM, "kivi4"),
        (Tier.WARM, "kivi2"),
        (Tier.WARM, "f16"),
        (Tier.WARM, "rotq3"),
        (Tier.ARCHIVE, "crotq3"),
        (Tier.ARCHIVE, "kivi2"),
        (Tier.ARCHIVE, "rotq2"),
    } <= seen
    labels = {t.name: t.codec for t in llm.kv_memory().tiers}
    assert labels["warm"].startswith("per layer:") and labels["archive"].startswith("per layer:")
    llm.close()


def test_k_and_v_apart_from_a_string(smollm2_path, wiki_tokens):
    llm = Llama(str(smollm2_path), kv_codec="k:kivi4,v:rotq3", n_ctx=1024, verbose=False, n_threads=N_THREADS)
    llm.eval(wiki_tokens[:400])
    kv = llm.kv_cache
    assert {b.codec for b in kv.store.blocks(0, Kind.K)} == {"kivi4"}
    assert {b.codec for b in kv.store.blocks(0, Kind.V)} == {"rotq3"}
    assert [t.codec for t in llm.kv_memory().tiers if t.name == "warm"] == ["K kivi4 / V rotq3"]
    llm.close()


def test_sample_frees_the_sampler_chain_it_builds(smollm2_path):
    """llama_cpp.Llama.sample builds a sampler chain per call that sits in a reference cycle
    until a full garbage collection (1.3 KB of native buffers per call, heaptrack over the soak);
    kvgguf.Llama frees it when the call returns. With the collector off, none may be left."""
    import gc

    from llama_cpp._internals import LlamaSampler

    llm = Llama(str(smollm2_path), kv_codec="tiered", n_ctx=512, n_threads=2, verbose=False)
    llm.eval(llm.tokenize(b"The history of the city begins"))
    gc.collect()
    gc.disable()
    try:
        tokens = [llm.sample(temp=0.9, top_k=40, top_p=0.95, repeat_penalty=1.1) for _ in range(20)]
        alive = [o for o in gc.get_objects() if isinstance(o, LlamaSampler) and o.sampler is not None]
    finally:
        gc.enable()
    assert len(tokens) == 20 and alive == []
    assert all(0 <= t < llm.n_vocab() for t in tokens)
    llm.close()


class _Counted:
    """A module or library whose attribute reads are counted: each is a call into llama.cpp or
    libkvgguf (or an address taken of one)."""

    def __init__(self, target, seen: list):
        self._target, self._seen = target, seen

    def __getattr__(self, name):
        got = getattr(self._target, name)
        if callable(got):
            self._seen.append(name)
        return got


@pytest.mark.parametrize("reuse", [0, 128])
def test_an_eviction_crosses_into_c_as_often_for_30_layers_as_for_2(smollm2_path, tmp_path, monkeypatch, reuse):
    """An eviction is one call into llama.cpp whatever the layer count (it reads each list's rows,
    hands them to the store's C entry point, removes and compacts), and aging one store call per
    block: on 2 layers and on 30, the same few crossings from Python, and no numpy on the rows.
    (With reuse on, the eviction also reads the state of the evicted positions once, to keep
    the rows, and aging copies the block's warm codes out once.)"""
    import tiny_models
    from kvgguf.bindings import store as store_module
    from kvgguf.llamacpp import seq_state as seq_state_module
    from kvgguf.runtime import live_cache

    config = TieredConfig(hot=64, block=32, sinks=4, warm="rotq4", warm_tokens=32, archive="rotq2", reuse=reuse)
    toks = list(range(10, 10 + 300))
    seen: list[str] = []
    per_layers = {}
    for n_layer in (2, 30):
        spec = tiny_models.TinySpec("llama", n_layer=n_layer)
        path = tiny_models.write(tmp_path / f"llama-{n_layer}.gguf", spec, smollm2_path)
        llm = Llama(str(path), kv_codec=config, n_ctx=512, n_batch=32, n_threads=1, n_threads_batch=1, verbose=False)
        calls = {"_evict": [], "_age": []}
        with monkeypatch.context() as m:
            for name in ("hooks", "C", "seq_state"):
                m.setattr(live_cache, name, _Counted(getattr(live_cache, name), seen))
            m.setattr(seq_state_module, "hooks", _Counted(seq_state_module.hooks, seen))  # RangeReader's call
            m.setattr(store_module, "get_lib", lambda real=store_module.get_lib: _Counted(real(), seen))
            m.setattr(live_cache.LiveCache, "read_rows", None)  # rows no longer pass through numpy
            for step in calls:

                def counted(self, *a, _real=getattr(live_cache.LiveCache, step), _calls=calls[step]):
                    before = len(seen)
                    _real(self, *a)
                    _calls.append(seen[before:])

                m.setattr(live_cache.LiveCache, step, counted)
            llm.eval(toks)
        assert llm.kv_cache.n_cold >= 300 - 64 - 32 and len(calls["_evict"]) >= 6 and calls["_age"]
        per_layers[n_layer] = calls
        llm.close()
    for step in ("_evict", "_age"):
        few, many = per_layers[2][step], per_layers[30][step]
        assert few == many, step  # the same calls, by name, eviction by eviction
        limit = {"_evict": 3, "_age": 4}[step]
        assert max(len(c) for c in many[1:]) <= limit, (step, many)
        # the first eviction with reuse also learns the size of the range's state (its buffer grows)
        assert len(many[0]) <= limit + (step == "_evict" and reuse > 0), (step, many)
    assert all(c.count("evict") == 1 for c in per_layers[30]["_evict"])
    assert all(c.count("state_range") == (1 if reuse else 0) for c in per_layers[30]["_evict"][1:])
