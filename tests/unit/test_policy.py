"""The policy's plans on row counts alone: no llama.cpp, no store."""

from __future__ import annotations

import pytest

from kvgguf import TieredConfig
from kvgguf.enums import Kind, Tier
from kvgguf.model.shape import KVShape
from kvgguf.policy import codec_spec, plan, resolve

CFG = TieredConfig(hot=256, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=64)


@pytest.mark.parametrize(
    "n_past,n_cold,expected",
    [
        (0, 0, 0),
        (256, 0, 0),  # the window is full, not over
        (257, 0, 64),  # one row over: one whole block leaves
        (512, 0, 256),
        (511, 0, 256),  # ceil to blocks
        (1000, 700, 64),  # 300 hot: 44 over, one block
        (300, 0, 64),
    ],
)
def test_rows_to_evict_keeps_at_most_hot_rows(n_past, n_cold, expected):
    n = plan.rows_to_evict(n_past, n_cold, CFG)
    assert n == expected
    n_hot_after = n_past - n_cold - n
    assert n_hot_after <= CFG.hot
    if n:
        assert n_hot_after > CFG.hot - CFG.block  # never more than needed


def test_what_a_context_holds_is_a_function_of_its_length():
    """plan.state_at: evictions only before batches at multiples of n_batch, so between them the
    hot rows grow by one a token, to at most hot + n_batch - 1; at a multiple it is what a prefill
    in batches of n_batch ends with (blocks_after), and aging follows the batch ending on the next."""
    step = 32
    for n in range(0, 1500, 7):
        blocks, due = plan.state_at(n, step, CFG)
        n_cold = blocks[-1].r1 if blocks else 0
        since = (n - 1) % step + 1  # tokens since the last multiple of step before n
        if n >= CFG.hot + step:
            assert CFG.hot - CFG.block + since < n - n_cold <= CFG.hot + since
        if n % step == 0:
            assert not due
            want = plan.blocks_after(n, step, CFG)
            assert [(b.r0, b.r1, b.tier) for b in blocks] == [(b.r0, b.r1, b.tier) for b in want]
        else:  # an eviction before the batch at the last multiple: its aging is still due
            assert due == (plan.state_at(n - n % step, step, CFG)[0] != blocks)


def test_a_cell_type_given_twice_is_refused_saying_so():
    from kvgguf.policy import kv_codec

    with pytest.raises(ValueError, match="':hot=' is given twice"):
        kv_codec.split_cells("rotq2:hot=q8_0:hot=f16")
    with pytest.raises(ValueError, match="must be one of f16, q8_0; got 'q4_0'"):
        kv_codec.split_cells("rotq2:hot=q4_0")


def test_a_budget_is_read_from_the_kv_codec_string():
    from kvgguf.policy import kv_codec

    config, request = kv_codec.parse("tiered:budget=64MiB")
    assert config.budget == 64 * 2**20 and config.drop == "mass" and request is not None
    config, _ = kv_codec.parse("rotq4:budget=1.5KiB:drop=oldest:hot=f16")
    assert (config.budget, config.drop, config.hot_cells, config.warm) == (1536, "oldest", "f16", "rotq4")
    assert kv_codec.parse("tiered:fixed:budget=65536")[0].budget == 65536
    for bad, match in (
        ("tiered:budget=lots", "not a size"),
        ("tiered:budget=0", "not a size"),
        ("tiered:budget=1MiB:budget=2MiB", "given twice"),
        ("tiered:drop=newest", "TieredConfig.drop must be one of"),
    ):
        with pytest.raises(ValueError, match=match):
            kv_codec.parse(bad)
    with pytest.raises(ValueError, match="TieredConfig.budget must be None or a positive"):
        TieredConfig(budget=-1)


def test_evicted_parts_keep_sinks_exact():
    assert plan.evicted_parts(0, 64, CFG) == [(Tier.SINK, 0, 4), (Tier.WARM, 4, 64)]
    assert plan.evicted_parts(2, 64, CFG) == [(Tier.SINK, 0, 2), (Tier.WARM, 2, 62)]
    assert plan.evicted_parts(64, 128, CFG) == [(Tier.WARM, 0, 64)]
    assert plan.evicted_parts(0, 3, CFG) == [(Tier.SINK, 0, 3)]


def test_codec_specs_expand_per_layer_and_kind():
    cfg = TieredConfig(warm={"default": "rotq4", 1: ("kivi4", "rotq3")}, archive=("rotq3", "rotq2"))
    warm = cfg.table(Tier.WARM, 3)
    assert warm[1, Kind.K] == "kivi4" and warm[1, Kind.V] == "rotq3"
    assert warm[0, Kind.K] == warm[2, Kind.V] == "rotq4"
    archive = cfg.table(Tier.ARCHIVE, 3)
    assert {archive[il, Kind.K] for il in range(3)} == {"rotq3"} and {archive[il, Kind.V] for il in range(3)} == {
        "rotq2"
    }
    assert set(cfg.table(Tier.SINK, 3).values()) == {"f16"}
    assert codec_spec.describe(archive) == "K rotq3 / V rotq2"
    assert codec_spec.describe(warm) == "per layer: kivi4 x1, rotq3 x1, rotq4 x4"
    with pytest.raises(ValueError, match=r"layers \[5\] outside \[0, 3\)"):
        TieredConfig(warm={"default": "rotq4", 5: "kivi4"}).table(Tier.WARM, 3)


def test_k_and_v_apart_as_a_string():
    cfg = TieredConfig.parse("k:kivi4,v:rotq3")
    assert cfg.warm == ("kivi4", "rotq3") and cfg.archive is None and cfg.sinks == 0
    assert TieredConfig.parse(" k:kivi4, v:rotq3".strip()).warm == ("kivi4", "rotq3")


@pytest.mark.parametrize(
    "text,error",
    [
        ("k:kivi4", "write K and V codecs as 'k:NAME,v:NAME'"),
        ("k:kivi4,v:rotq9", "codec 'rotq9' is unknown"),
        ("k:kivi4,x:rotq3", "write K and V codecs"),
        ("k:kivi4,v:rotq3,v:rotq2", "write K and V codecs"),
    ],
)
def test_bad_k_and_v_strings_say_what_is_wrong(text, error):
    with pytest.raises(ValueError, match=error):
        TieredConfig.parse(text)


@pytest.mark.parametrize(
    "warm,error",
    [
        ({"rotq4": "kivi4"}, ValueError),
        ({"default": "rotq4", -1: "kivi4"}, ValueError),
        (("kivi4",), TypeError),
        (("kivi4", 4), TypeError),
        ({"default": "rotq9"}, ValueError),
    ],
)
def test_bad_codec_specs_are_refused_when_made(warm, error):
    with pytest.raises(error):
        TieredConfig(warm=warm)


def test_blocks_age_into_archive_behind_the_newest_warm_tokens():
    blocks = [
        plan.Block(0, 4, Tier.SINK),
        plan.Block(4, 64, Tier.WARM),
        plan.Block(64, 128, Tier.WARM),
        plan.Block(128, 192, Tier.WARM),
        plan.Block(192, 256, Tier.WARM),
    ]
    old = plan.blocks_to_archive(blocks, CFG)  # newest 128 compressed rows stay warm: [128, 256)
    assert [(b.r0, b.r1) for b in old] == [(4, 64), (64, 128)]
    assert plan.blocks_to_archive(blocks, TieredConfig(archive=None)) == []
    blocks[1].tier = Tier.ARCHIVE
    assert [(b.r0, b.r1) for b in plan.blocks_to_archive(blocks, CFG)] == [(64, 128)]


def test_truncated_cuts_the_block_that_straddles():
    blocks = [plan.Block(0, 4, Tier.SINK), plan.Block(4, 64, Tier.WARM), plan.Block(64, 128, Tier.WARM)]
    assert [(b.r0, b.r1) for b in plan.truncated(blocks, 100)] == [(0, 4), (4, 64), (64, 100)]
    assert [(b.r0, b.r1) for b in plan.truncated(blocks, 64)] == [(0, 4), (4, 64)]
    assert plan.truncated(blocks, 0) == []
    assert blocks[2].r1 == 128  # the input is left as it was


def _blocks(*starts: int, end: int) -> list:
    edges = [*starts, end]
    return [plan.Block(a, b, Tier.SINK if a == 0 else Tier.WARM) for a, b in zip(edges, edges[1:])]


def test_a_shift_cuts_on_block_starts_after_n_keep():
    blocks = _blocks(0, 4, *range(64, 1280, 64), end=1280)  # sinks, then 64-row blocks from 64
    # from the first block start at or after n_keep, at least n_discard, to a block start
    assert plan.shift_range(blocks, 1536, 4, 700) == (4, 704)
    assert plan.shift_range(blocks, 1536, 300, 500) == (320, 832)
    # past the cold rows the cut is llama.cpp's cells, anywhere; none of the store moves
    assert plan.shift_range(blocks, 1536, 4, 1290) == (4, 1294)
    assert plan.shift_range(blocks, 1536, 1300, 100) == (1300, 1400)
    assert plan.shift_range(blocks, 1350, 4, 2000) == (4, 1350)  # at most up to n_past


def test_blocks_after_lays_out_contiguous_tiers():
    blocks = plan.blocks_after(3000, 256, CFG)
    assert blocks[0].r0 == 0 and all(a.r1 == b.r0 for a, b in zip(blocks, blocks[1:]))
    n_cold = blocks[-1].r1
    assert 3000 - 256 - CFG.hot < n_cold <= 3000 - 256  # the window before the last batch
    assert blocks[0].tier == Tier.SINK and blocks[0].r1 == CFG.sinks
    for b in blocks[1:]:
        assert b.tier == (Tier.ARCHIVE if b.r1 <= n_cold - CFG.warm_tokens else Tier.WARM)
    assert plan.blocks_after(200, 256, CFG) == []  # nothing ever left the window


@pytest.mark.parametrize(
    "hot,block,ubatch,sinks,warm_tokens,archive",
    [
        (224, 64, 32, 4, 2048, ("rotq4", "rotq2")),  # the preset
        (65, 16, 7, 200, 100, "rotq2"),  # sinks beyond the first evictions, an odd batch
        (100, 64, 50, 0, 0, None),  # evictions that alternate in size, no archive
        (300, 16, 64, 4, 0, "rotq2"),  # everything but the newest block archived
    ],
)
def test_block_counts_in_closed_form_equal_the_simulation(hot, block, ubatch, sinks, warm_tokens, archive):
    cfg = TieredConfig(hot=hot, block=block, ubatch=ubatch, sinks=sinks, warm_tokens=warm_tokens, archive=archive)
    for n_batch in (1, 33, ubatch, hot):
        for n_tokens in (0, 1, 250, 777, 5001):
            blocks = plan.blocks_after(n_tokens, n_batch, cfg)
            counts = {}
            for b in blocks:
                counts[b.r1 - b.r0, b.tier] = counts.get((b.r1 - b.r0, b.tier), 0) + 1
            assert plan.block_counts(n_tokens, n_batch, cfg) == (counts, blocks[-1].r1 if blocks else 0)


def test_block_counts_at_ten_billion_tokens():
    counts, n_cold = plan.block_counts(10**10, 32, TieredConfig())
    assert sum(rows * n for (rows, _), n in counts.items()) == n_cold
    assert 10**10 - 32 - TieredConfig().hot <= n_cold <= 10**10
    assert counts[64, Tier.ARCHIVE] > 10**8


def test_the_presets_widen_the_hot_window_and_batch_where_weights_dominate_or_on_a_gpu():
    from kvgguf.policy.tiered import WIDE_HOT, WIDE_UBATCH, sized_for_model

    preset = TieredConfig()
    # SmolLM2-135M: 23,040 bytes of f16 K/V per token, a 94 MiB file: 512 cells are 12% of it
    assert sized_for_model(preset, 23040, 98_360_000) == preset
    # ... but on a GPU, where each ubatch is a graph launch, every model takes them
    on_gpu = sized_for_model(preset, 23040, 98_360_000, gpu=True)
    assert (on_gpu.hot, on_gpu.ubatch) == (WIDE_HOT, WIDE_UBATCH) and on_gpu.warm == preset.warm
    # the Llama-3.2-1B shape: 32 KiB per token, a 667 MiB file: 2.4%
    wide = sized_for_model(preset, 32768, 699_359_456)
    assert (wide.hot, wide.ubatch) == (WIDE_HOT, WIDE_UBATCH) and wide.warm == preset.warm
    # a hot window already wider (Gemma 3's sliding window) stays as wide
    assert sized_for_model(TieredConfig(hot=576), 32768, 699_359_456).hot == 576


def test_cache_type_numbers_are_ggmls():
    """policy.resolve names llama.cpp's cache types by ggml's numbers without importing llama_cpp."""
    import llama_cpp

    from kvgguf.policy.resolve import CACHE_TYPES

    for name, number in CACHE_TYPES.items():
        constant = getattr(llama_cpp, f"GGML_TYPE_{name.upper()}", None)
        assert constant is None or constant == number, name
    assert CACHE_TYPES["bf16"] == 30 and CACHE_TYPES["q8_0"] == llama_cpp.GGML_TYPE_Q8_0


def gemma_like(every: int, n_layer: int = 18) -> KVShape:
    return KVShape.from_metadata(
        {
            "general.architecture": "gemma3",
            "gemma3.block_count": n_layer,
            "gemma3.attention.head_count": 4,
            "gemma3.embedding_length": 640,
            "gemma3.attention.sliding_window": 512,
            "gemma3.attention.sliding_window_pattern": every,
        }
    )


def test_tiered_keeps_cold_rows_near_exact_only_where_few_layers_see_everything():
    """Gemma 3 (one full-attention layer in six): the cold rows are a small share of the bytes,
    so "tiered" holds them in kivi8; a model with more full layers, or none sliding, keeps the
    4-bit preset."""
    gemma3, half = gemma_like(6), gemma_like(2)
    assert len(gemma3.full_layers) == 3 and resolve.near_exact(gemma3)
    preset = resolve.tiered_preset_for(gemma3, TieredConfig())
    assert (preset.warm, preset.archive, preset.group_size) == ("kivi8", None, 64)
    assert not resolve.near_exact(half)
    assert resolve.tiered_preset_for(half, TieredConfig()) == TieredConfig()
    llama = KVShape.from_metadata(
        {
            "general.architecture": "llama",
            "llama.block_count": 8,
            "llama.attention.head_count": 4,
            "llama.embedding_length": 256,
        }
    )
    assert not resolve.near_exact(llama)
