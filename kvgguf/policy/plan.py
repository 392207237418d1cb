"""Eviction and aging plans: which rows leave llama.cpp's hot window, which blocks age.

Pure functions on row counts and block lists; ``kvgguf.runtime.live_cache`` carries them
out. Rows are positions of one sequence: cold rows are [0, n_cold), hot ones follow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..enums import Tier
from .tiered import TieredConfig


@dataclass
class Block:
    """Cold rows [r0, r1), all in one tier; kept: a warm block a signal chose to keep warm
    when it aged (TieredConfig.keep), never offered to the archive again."""

    r0: int
    r1: int
    tier: int
    kept: bool = False


def rows_to_evict(n_past: int, n_cold: int, config: TieredConfig) -> int:
    """Hot rows to move out before the next batch: whole blocks of the oldest, until at most
    ``config.hot`` rows stay hot (so hot + one batch always fits llama.cpp's buffer)."""
    n_hot = n_past - n_cold
    over = n_hot - config.hot
    if over <= 0:
        return 0
    return min(n_hot, -(-over // config.block) * config.block)


def evicted_parts(p0: int, p1: int, config: TieredConfig) -> list[tuple[int, int, int]]:
    """Rows [p0, p1) leaving the hot window, split by tier: (tier, a, b) with a, b offsets
    into the range. Positions below ``config.sinks`` stay exact (attention sinks)."""
    sinks = min(max(config.sinks - p0, 0), p1 - p0)
    parts = [(Tier.SINK, 0, sinks), (Tier.WARM, sinks, p1 - p0)]
    return [p for p in parts if p[2] > p[1]]


def blocks_to_archive(blocks: list[Block], config: TieredConfig) -> list[Block]:
    """Warm blocks that lie wholly below the newest ``config.warm_tokens`` compressed rows."""
    if config.archive is None or not blocks:
        return []
    limit = blocks[-1].r1 - config.warm_tokens
    return [b for b in blocks if b.tier == Tier.WARM and not b.kept and b.r1 <= limit]


def kept(scores: Sequence[float], reference: Sequence[float], fraction: float) -> list[bool]:
    """Which aging blocks stay warm: those whose score is among the top ``fraction`` of
    ``reference`` (the scores of every compressed block, the aging ones included). NaN
    scores are not ranked: such a block ages and does not count in the reference."""
    ranked = np.asarray(reference, dtype=np.float64)
    ranked = ranked[~np.isnan(ranked)]
    if fraction <= 0.0 or ranked.size == 0:
        return [False] * len(scores)
    threshold = np.quantile(ranked, 1.0 - fraction, method="higher")
    return [bool(s >= threshold) for s in scores]  # NaN >= x is False


def truncated(blocks: list[Block], n_rows: int) -> list[Block]:
    """The block list after cold rows at positions >= n_rows are dropped."""
    return [Block(b.r0, min(b.r1, n_rows), b.tier, b.kept) for b in blocks if b.r0 < n_rows]


def shift_range(blocks: list[Block], n_past: int, n_keep: int, n_discard: int) -> tuple[int, int]:
    """The positions [p0, p1) a context shift drops: from the first block start at or after
    n_keep, at least n_discard of them, to the next block start (a cold block moves whole with
    its codes, so a cut lies between blocks; hot rows are llama.cpp's cells, cut anywhere), at
    most up to n_past."""
    n_cold = blocks[-1].r1 if blocks else 0

    def boundary(p: int) -> int:
        return p if p >= n_cold else min([b.r0 for b in blocks if b.r0 >= p] + [n_cold])

    p0 = min(boundary(n_keep), n_past)
    return p0, min(boundary(p0 + n_discard), n_past)


def shifted(blocks: list[Block], p0: int, p1: int) -> list[Block]:
    """The block list after a context shift dropped rows [p0, p1) (block boundaries) and moved
    the later ones back by p1 - p0."""
    d = p1 - p0
    return [b if b.r1 <= p0 else Block(b.r0 - d, b.r1 - d, b.tier, b.kept) for b in blocks if b.r1 <= p0 or b.r0 >= p1]


def blocks_after(n_tokens: int, n_batch: int, config: TieredConfig) -> list[Block]:
    """The block list a sequence of n_tokens fed in batches of n_batch ends with once the last
    eviction's aging ran too: state_at's (for predictions: inspect)."""
    blocks, due = state_at(n_tokens, n_batch, config)
    if due:
        for b in blocks_to_archive(blocks, config):
            b.tier = Tier.ARCHIVE
    return blocks


def state_at(n_tokens: int, step: int, config: TieredConfig) -> tuple[list[Block], bool]:
    """What a context of n_tokens holds, whatever it was asked before: the live cache evicts
    only before a batch that starts on a multiple of ``step`` (its n_batch; no batch crosses
    one), and ages the blocks an eviction pushed out of the warm window once the batch that
    ends on the next multiple is done. So every row was computed over the same cold rows as
    in a fresh evaluation, and the blocks are a function of n_tokens: (blocks, whether the
    last eviction's aging is still due). Blocks that aged are ARCHIVE here; a keep signal
    may have kept some of them warm instead (LiveCache._age)."""
    blocks: list[Block] = []
    due = False

    def age() -> None:
        for b in blocks_to_archive(blocks, config):
            b.tier = Tier.ARCHIVE

    for start in range(0, n_tokens, step):
        if due:
            age()
        n_cold = blocks[-1].r1 if blocks else 0
        n_evict = rows_to_evict(start, n_cold, config)
        blocks += [
            Block(n_cold + a, n_cold + b, tier) for tier, a, b in evicted_parts(n_cold, n_cold + n_evict, config)
        ]
        due = n_evict > 0
    if due and n_tokens % step == 0:
        age()
        due = False
    return blocks, due


def _eviction_period(n_starts: int, step: int, config: TieredConfig) -> tuple[list[int], list[int]]:
    """The rows evicted before each of n_starts batches of step tokens, as (prefix, cycle): the hot
    rows before batch i, h, follow h' = h - evicted(h) + step, a function on a finite set of
    values, so after the prefix the evictions repeat (cycle empty: every batch was walked)."""
    sizes, first_at, h = [], {}, 0
    while len(sizes) < n_starts and h not in first_at:
        first_at[h] = len(sizes)
        sizes.append(rows_to_evict(h, 0, config))
        h += step - sizes[-1]
    c0 = first_at.get(h, len(sizes))
    return sizes[:c0], sizes[c0:]


def last_evictions(n_tokens: int, step: int, config: TieredConfig, rows: int) -> tuple[list[tuple[int, int]], bool]:
    """The rows [p0, p1) each of state_at's evictions moved out, in order, of those that end
    above the newest cold row less `rows` (and the one before them), and whether the last one's
    aging is still due: in time independent of n_tokens (inspect answers at any context), by
    the period of the hot rows before each batch (block_counts)."""
    n_starts = -(-n_tokens // step) if n_tokens > 0 else 0
    prefix, cycle = _eviction_period(n_starts, step, config)
    c0 = len(prefix)

    def size(j: int) -> int:
        return prefix[j] if j < c0 else cycle[(j - c0) % len(cycle)]

    reps, rest = divmod(n_starts - c0, len(cycle)) if cycle and n_starts > c0 else (0, 0)
    n_cold = sum(prefix[:n_starts]) + reps * sum(cycle) + sum(cycle[:rest])
    out, end, j = [], n_cold, n_starts - 1
    while j >= 0 and (end > n_cold - rows or len(out) < 2):
        if size(j):
            out.append((end - size(j), end))
            end -= size(j)
        if end <= 0:
            break
        j -= 1
    due = n_starts > 0 and size(n_starts - 1) > 0 and n_tokens % step != 0
    return out[::-1], due


def block_counts(n_tokens: int, n_batch: int, config: TieredConfig) -> tuple[dict[tuple[int, int], int], int]:
    """What blocks_after ends with, in closed form: ({(rows, tier): how many blocks}, n_cold), in
    time independent of n_tokens (inspect answers at any context).

    The evictions repeat with a period (_eviction_period). Positions grow with the sum of the
    evictions, so which blocks lie below the archive limit is arithmetic too."""
    n_starts = -(-n_tokens // n_batch) if n_tokens > 0 else 0
    prefix, cycle = _eviction_period(n_starts, n_batch, config)
    repeats, rest = divmod(n_starts - len(prefix), len(cycle)) if cycle else (0, 0)
    period = sum(cycle)
    n_cold = sum(prefix) + repeats * period + sum(cycle[:rest])
    limit = n_cold - config.warm_tokens if config.archive is not None else -1  # blocks_to_archive's
    counts: dict[tuple[int, int], int] = {}

    def add(p0: int, sizes_: list[int], times: int = 1) -> int:
        for e in sizes_:
            if e and times:
                for tier, a, b in evicted_parts(p0, p0 + e, config):
                    if tier == Tier.WARM and p0 + b <= limit:
                        tier = Tier.ARCHIVE
                    counts[b - a, tier] = counts.get((b - a, tier), 0) + times
            p0 += e
        return p0

    pos = add(0, prefix)
    while repeats and pos < config.sinks:  # periods that still cut sinks are walked one by one
        pos, repeats = add(pos, cycle), repeats - 1
    below = min(max((limit - pos) // period, 0), repeats) if repeats else 0
    add(pos, cycle, below)  # periods wholly under the archive limit
    pos += below * period
    if repeats > below:  # the period that straddles the limit, then periods wholly above it
        pos = add(pos, cycle)
        add(pos, cycle, repeats - below - 1)
        pos += (repeats - below - 1) * period
    add(pos, cycle[:rest])
    return counts, n_cold
