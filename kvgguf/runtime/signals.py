"""What the live cache notes about each cold token, for TieredConfig.keep to rank blocks by.

surprisal: -log p(token | what precedes it) for every position, from the logits of the
    position before it (prefill and generation alike: kvgguf.Llama asks llama.cpp for the
    logits of every token when this signal is on).
mass: the softmax weight each granule of MASS_ROWS cold rows received from the fused
    attention, summed over layers and heads, and the number of queries that attended while it
    was cold, so that a block that went cold early is not favoured for having been seen longer.
    A granule that holds attention sinks (TieredConfig.sinks) is not ranked: the sinks' mass
    swamps it (SmolLM2: ~100 per query there, 3-20 elsewhere).
random: a fixed pseudo-random score per block (the control at equal bits).

A budget (TieredConfig.budget) that drops by mass ranks blocks by the same counts
(mass_per_query).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ..bindings.store import MASS_ROWS


def _grown(a: np.ndarray, n: int, fill=0) -> np.ndarray:
    if a.size >= n:
        return a
    out = np.full(max(n, 2 * a.size), fill, dtype=a.dtype)
    out[: a.size] = a
    return out


class TokenSignals:
    def __init__(self, signal: Optional[str], sinks: int = 0, mass: bool = False):
        self.signal = signal
        self.sinks = sinks
        self.count_mass = mass or signal == "mass"  # for TieredConfig.keep, or a budget's drop rule
        self.clear()

    def clear(self) -> None:
        self.surprisal = np.zeros(0, dtype=np.float32)  # per position; NaN: not known
        self.mass = np.zeros(0, dtype=np.float64)  # per granule
        self.queries = np.zeros(0, dtype=np.int64)  # per granule
        # per granule: mass times the keys its queries saw (mass_per_query: against an even spread)
        self.share = np.zeros(0, dtype=np.float64)
        self._last: Optional[tuple[int, np.ndarray, float]] = None  # (position, logits row, its logsumexp)

    @property
    def wants_logits(self) -> bool:
        return self.signal == "surprisal"

    @property
    def wants_mass(self) -> bool:
        return self.count_mass

    def note_logits(self, n_past: int, tokens, logits: np.ndarray) -> None:
        """logits [n, n_vocab] of tokens at positions n_past.. : each row prices the next token."""
        n = len(tokens)
        if n == 0:
            return
        toks = np.asarray(tokens, dtype=np.int64)
        top = logits.max(axis=1)
        lse = top + np.log(np.exp(logits - top[:, None]).sum(axis=1))
        self.surprisal = _grown(self.surprisal, n_past + n, np.nan)
        self.surprisal[n_past + 1 : n_past + n] = lse[:-1] - logits[np.arange(n - 1), toks[1:]]
        last = self._last
        if last is not None and last[0] == n_past - 1:
            self.surprisal[n_past] = last[2] - last[1][toks[0]]
        else:  # nothing prices the first token (the start, or the context was rewound)
            self.surprisal[n_past] = np.nan
        self._last = (n_past + n - 1, logits[-1].copy(), float(lse[-1]))

    def note_mass(self, mass: np.ndarray, n_queries: int, n_keys: float = 1.0) -> None:
        """mass [n_layer, n_granules]: what the cold granules received from n_queries queries,
        which saw n_keys keys each on average."""
        g = mass.shape[1]
        self.mass = _grown(self.mass, g)
        self.queries = _grown(self.queries, g)
        self.share = _grown(self.share, g)
        total = mass.sum(axis=0)
        self.mass[:g] += total
        self.share[:g] += total * n_keys
        self.queries[:g] += n_queries

    def truncate(self, n_rows: int) -> None:
        """Forgets what was noted about positions >= n_rows (a rewound context rewrites them);
        the granule the cut falls in starts over."""
        self.surprisal[n_rows:] = np.nan
        g = n_rows // MASS_ROWS
        self.mass[g:] = 0.0
        self.share[g:] = 0.0
        self.queries[g:] = 0
        if self._last is not None and self._last[0] >= n_rows:
            self._last = None

    def shift(self, p0: int, p1: int) -> None:
        """Positions [p0, p1) dropped and the later ones moved back (a budget's drop): what was
        noted moves with them; all of it is forgotten where the cut is not on granules."""
        if p0 % MASS_ROWS or p1 % MASS_ROWS:
            self.clear()
            return
        d = p1 - p0
        self.surprisal = np.concatenate([self.surprisal[:p0], self.surprisal[p1:]])
        g0, g1 = p0 // MASS_ROWS, p1 // MASS_ROWS
        self.mass = np.concatenate([self.mass[:g0], self.mass[g1:]])
        self.share = np.concatenate([self.share[:g0], self.share[g1:]])
        self.queries = np.concatenate([self.queries[:g0], self.queries[g1:]])
        if self._last is not None:
            self._last = None if self._last[0] < p1 else (self._last[0] - d, *self._last[1:])

    def mass_per_query(self, r0: int, r1: int) -> Optional[float]:
        """The mass rows [r0, r1) received per query while cold against an even spread over the
        keys each query saw (summed over layers and heads), over their granules that hold no
        sinks; None where no query saw them (a block not attended fused yet). Weighed by the
        keys, an older block is not favoured for the shorter contexts its first queries saw."""
        g0, g1 = max(r0 // MASS_ROWS, -(-self.sinks // MASS_ROWS)), -(-r1 // MASS_ROWS)
        m, q = self.share[g0:g1] / MASS_ROWS, self.queries[g0:g1]
        seen = q > 0
        return float((m[seen] / q[seen]).mean()) if seen.any() else None

    def score(self, r0: int, r1: int) -> float:
        """A block's score under the signal (rows [r0, r1)); NaN: not ranked."""
        if self.signal == "surprisal":
            s = self.surprisal[r0:r1]
            s = s[~np.isnan(s)]
            return float(s.mean()) if s.size else 0.0
        if self.signal == "mass":
            g0, g1 = r0 // MASS_ROWS, -(-r1 // MASS_ROWS)
            if g0 * MASS_ROWS < self.sinks:
                return float("nan")
            m, q = self.mass[g0:g1], self.queries[g0:g1]
            return float((m / np.maximum(q, 1)).mean()) if m.size else 0.0
        if self.signal == "random":
            return float(np.random.default_rng(r0).random())
        return 0.0
