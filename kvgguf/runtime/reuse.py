"""What a cut needs to put back: the rows and codes a fresh context still holds and this one has
moved on from (TieredConfig.reuse).

A context cut back to a prefix (a prompt that shares only that prefix with what it holds) must
hold what a fresh context holds after evaluating the prefix (plan.state_at): its newest rows
exact in llama.cpp's cells, its younger blocks warm. Since then this context evicted some of
those rows and aged some of those blocks. RecentRows keeps llama.cpp's own bytes of every row
evicted within the newest ``reach`` cold positions (every layer's, the sliding windows' too, as
llama_state_seq_get_data writes them) and the warm codes of every block aged within as many,
and puts them back for a cut within that reach.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..llamacpp import state_format
from ..llamacpp.state_format import CacheState, LayerRows


@dataclass
class _Rows:
    """The evicted positions [p0, p1), one CacheState per cache record (their cells only)."""

    p0: int
    p1: int
    caches: list[CacheState]
    nbytes: int


@dataclass
class _Warm:
    """A block's warm codes, taken before it aged: every list's (KVStore.copy_blocks)."""

    r0: int
    r1: int
    blocks: bytes = b""

    @property
    def nbytes(self) -> int:
        return len(self.blocks)


def _select(cache: CacheState, keep: np.ndarray) -> CacheState:
    records = state_format.cell_records(cache.cells)[keep]
    layers = [LayerRows(x.il, x.k_type, x.k[keep], x.v_type, x.v[keep]) for x in cache.layers]
    return CacheState(records.tobytes(), int(keep.sum()), cache.v_trans, layers)


def _concat(parts: list[CacheState]) -> CacheState:
    """Cache records of the same layers, one after the other (in position order)."""
    parts = [p for p in parts if p.n_cells]
    if not parts:
        return CacheState()
    first = parts[0]
    layers = [
        LayerRows(
            x.il,
            x.k_type,
            np.concatenate([p.layers[j].k for p in parts]),
            x.v_type,
            np.concatenate([p.layers[j].v for p in parts]),
        )
        for j, x in enumerate(first.layers)
    ]
    return CacheState(b"".join(p.cells for p in parts), sum(p.n_cells for p in parts), first.v_trans, layers)


class RecentRows:
    def __init__(self, reach: int, warm_tokens: int):
        self.reach = reach
        self.warm_tokens = warm_tokens
        self.clear()

    def clear(self) -> None:
        self._rows: list[_Rows] = []
        self._warm: list[_Warm] = []

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self._rows) + sum(w.nbytes for w in self._warm)

    # --- keeping ---------------------------------------------------------------------

    def keep_rows(self, state: bytes, layers_of_cache: list[list[int]], p0: int, p1: int) -> None:
        """Keeps the rows of positions [p0, p1) from a sequence state taken before their eviction
        (seq_state.RangeReader's, which holds little else)."""
        if self.reach <= 0:
            return
        caches = []
        for cache in state_format.parse(state, layers_of_cache):
            pos = state_format.cell_records(cache.cells)[:, 0] if cache.n_cells else np.zeros(0, np.int32)
            keep = (pos >= p0) & (pos < p1)
            # a range's state holds only these positions: its rows are kept as parsed (copies)
            caches.append(cache if keep.all() else _select(cache, keep))
        nbytes = sum(x.k.nbytes + x.v.nbytes for c in caches for x in c.layers)
        self._rows.append(_Rows(p0, p1, caches, nbytes))

    def keep_warm(self, r0: int, r1: int, blocks: bytes) -> None:
        """Keeps a block's warm codes, as the store held them before it aged (KVStore.copy_blocks)."""
        if self.reach <= 0:
            return
        self._warm.append(_Warm(r0, r1, blocks))

    def forget_older(self, n_cold: int) -> None:
        """Drops what no cut within the reach of n_cold cold positions can need: rows evicted
        below n_cold - reach, and warm codes of blocks a fresh context at such a cut has aged too."""
        floor = n_cold - self.reach
        self._rows = [r for r in self._rows if r.p1 > floor]
        self._warm = [w for w in self._warm if w.r1 > floor - self.warm_tokens]

    def forget_from(self, position: int) -> None:
        """Drops what was kept about positions >= position (they were cut or evaluated again)."""
        self._rows = [r for r in self._rows if r.p1 <= position]
        self._warm = [w for w in self._warm if w.r1 <= position]

    # --- putting back ----------------------------------------------------------------

    def covers(self, p0: int, p1: int) -> bool:
        """Whether the rows of every position in [p0, p1) are kept."""
        at = p0
        for r in sorted(self._rows, key=lambda r: r.p0):
            if r.p0 <= at < r.p1:
                at = r.p1
        return at >= p1

    def covers_cells(self, record: int, p0: int, p1: int) -> bool:
        """Whether cache record `record` (state_format's order) has the rows of every position
        in [p0, p1) kept: a sliding window's cells may have been reused for newer positions
        before their eviction, which then found none to keep."""
        held = set()
        for r in self._rows:
            c = r.caches[record]
            if c.n_cells:
                held.update(state_format.cell_records(c.cells)[:, 0].tolist())
        return all(p in held for p in range(p0, p1))

    def warm(self, r0: int, r1: int) -> _Warm | None:
        return next((w for w in self._warm if (w.r0, w.r1) == (r0, r1)), None)

    def with_rows(self, caches: list[CacheState], p0: int, p1: int) -> list[CacheState]:
        """caches (the cells a context holds, all at positions >= p1) with the kept rows of
        [p0, p1) put in front of each record's cells."""
        out = []
        for i, cache in enumerate(caches):
            parts = []
            for r in sorted(self._rows, key=lambda r: r.p0):
                c = r.caches[i]
                if not c.n_cells:
                    continue
                pos = state_format.cell_records(c.cells)[:, 0]
                parts.append(_select(c, (pos >= p0) & (pos < p1)))
            out.append(_concat([*parts, cache]))
        return out
