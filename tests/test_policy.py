"""The policy's plans on row counts alone: no llama.cpp, no store."""

from __future__ import annotations

import pytest

from kvgguf import TieredConfig
from kvgguf.native.store import TIER_ARCHIVE, TIER_SINK, TIER_WARM
from kvgguf.policy import plan

CFG = TieredConfig(hot=256, sinks=4, warm="rotq4", warm_tokens=128, archive="rotq2", block=64)


@pytest.mark.parametrize("n_past,n_cold,expected", [
    (0, 0, 0), (256, 0, 0),          # the window is full, not over
    (257, 0, 64),                    # one row over: one whole block leaves
    (512, 0, 256), (511, 0, 256),    # ceil to blocks
    (1000, 700, 64),                 # 300 hot: 44 over, one block
    (300, 0, 64),
])
def test_rows_to_evict_keeps_at_most_hot_rows(n_past, n_cold, expected):
    n = plan.rows_to_evict(n_past, n_cold, CFG)
    assert n == expected
    n_hot_after = n_past - n_cold - n
    assert n_hot_after <= CFG.hot
    if n:
        assert n_hot_after > CFG.hot - CFG.block  # never more than needed


def test_decode_keeps_the_configured_window():
    # One token at a time: the hot rows stay within (hot - block, hot] once the window filled.
    n_cold = 0
    for n_past in range(1, 2000):
        n_cold += plan.rows_to_evict(n_past, n_cold, CFG)
        if n_past >= CFG.hot:
            assert CFG.hot - CFG.block < n_past - n_cold <= CFG.hot


def test_evicted_parts_keep_sinks_exact():
    assert plan.evicted_parts(0, 64, CFG) == [(TIER_SINK, "f16", 0, 4), (TIER_WARM, "rotq4", 4, 64)]
    assert plan.evicted_parts(2, 64, CFG) == [(TIER_SINK, "f16", 0, 2), (TIER_WARM, "rotq4", 2, 62)]
    assert plan.evicted_parts(64, 128, CFG) == [(TIER_WARM, "rotq4", 0, 64)]
    assert plan.evicted_parts(0, 3, CFG) == [(TIER_SINK, "f16", 0, 3)]


def test_blocks_age_into_archive_behind_the_newest_warm_tokens():
    blocks = [plan.Block(0, 4, TIER_SINK), plan.Block(4, 64, TIER_WARM), plan.Block(64, 128, TIER_WARM),
              plan.Block(128, 192, TIER_WARM), plan.Block(192, 256, TIER_WARM)]
    old = plan.blocks_to_archive(blocks, CFG)  # newest 128 compressed rows stay warm: [128, 256)
    assert [(b.r0, b.r1) for b in old] == [(4, 64), (64, 128)]
    assert plan.blocks_to_archive(blocks, TieredConfig(archive=None)) == []
    blocks[1].tier = TIER_ARCHIVE
    assert [(b.r0, b.r1) for b in plan.blocks_to_archive(blocks, CFG)] == [(64, 128)]


def test_truncated_cuts_the_block_that_straddles():
    blocks = [plan.Block(0, 4, TIER_SINK), plan.Block(4, 64, TIER_WARM), plan.Block(64, 128, TIER_WARM)]
    assert [(b.r0, b.r1) for b in plan.truncated(blocks, 100)] == [(0, 4), (4, 64), (64, 100)]
    assert [(b.r0, b.r1) for b in plan.truncated(blocks, 64)] == [(0, 4), (4, 64)]
    assert plan.truncated(blocks, 0) == []
    assert blocks[2].r1 == 128  # the input is left as it was


def test_blocks_after_lays_out_contiguous_tiers():
    blocks = plan.blocks_after(3000, 256, CFG)
    assert blocks[0].r0 == 0 and all(a.r1 == b.r0 for a, b in zip(blocks, blocks[1:]))
    n_cold = blocks[-1].r1
    assert 3000 - 256 - CFG.hot < n_cold <= 3000 - 256  # the window before the last batch
    assert blocks[0].tier == TIER_SINK and blocks[0].r1 == CFG.sinks
    for b in blocks[1:]:
        assert b.tier == (TIER_ARCHIVE if b.r1 <= n_cold - CFG.warm_tokens else TIER_WARM)
    assert plan.blocks_after(200, 256, CFG) == []  # nothing ever left the window
