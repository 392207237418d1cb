"""Bits under a budget: one codec per (layer, K/V) list from measured error curves.

Each list has candidates (bits per value, error); errors of different lists add up (each is the
output error that list alone causes when compressed, which is what calibration measures). The
allocation starts every list at its cheapest candidate and buys the upgrade with the most error
removed per bit until the next one would break the budget: the greedy walk along each list's
lower convex hull, which is optimal for convex curves (the Lagrangian solution) and close to it
otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable, Mapping, Sequence


@dataclass(frozen=True)
class Candidate:
    codec: str
    bits: float  # bits per value this codec holds on this list's rows
    error: float  # output error when only this list uses this codec


def hull(cands: Sequence[Candidate]) -> list[Candidate]:
    """The candidates worth buying, cheapest first: each costs more and errs less than the one
    before, with the error removed per bit falling (lower convex hull of (bits, error))."""
    pts: list[Candidate] = []
    for c in sorted(cands, key=lambda c: (c.bits, c.error)):
        if pts and c.error >= pts[-1].error:
            continue  # costs at least as much and errs at least as much as a kept one
        while len(pts) >= 2 and _slope(pts[-2], pts[-1]) <= _slope(pts[-1], c):
            pts.pop()  # pts[-1] lies above the chord: buying past it is cheaper per unit error
        pts.append(c)
    return pts


def _slope(a: Candidate, b: Candidate) -> float:
    """Error removed per bit going from a to b (positive)."""
    return (a.error - b.error) / (b.bits - a.bits)


def allocate(
    curves: Mapping[Hashable, Sequence[Candidate]], weights: Mapping[Hashable, float], budget: float
) -> dict[Hashable, Candidate]:
    """{list: candidate} with sum(weight * bits) / sum(weight) <= budget and the summed error
    as low as the greedy walk gets it. weights: values per row of each list (K and V widths).
    ValueError when even the cheapest candidates exceed the budget."""
    if not curves:
        raise ValueError("nothing to allocate: no lists")
    total = float(sum(weights[k] for k in curves))
    paths = {k: hull(v) for k, v in curves.items()}
    if any(not p for p in paths.values()):
        raise ValueError("every list needs at least one candidate")
    at = {k: 0 for k in paths}
    spent = sum(weights[k] * paths[k][0].bits for k in paths) / total
    if spent > budget + 1e-9:
        raise ValueError(f"a budget of {budget:.2f} bits per value is below the cheapest plan ({spent:.2f})")
    while True:
        best, best_gain = None, 0.0
        for k, p in paths.items():
            i = at[k]
            if i + 1 < len(p):
                cost = weights[k] * (p[i + 1].bits - p[i].bits) / total
                if spent + cost <= budget + 1e-9:
                    gain = _slope(p[i], p[i + 1])
                    if gain > best_gain:  # ties: the first list in order, so plans are deterministic
                        best, best_gain = k, gain
        if best is None:
            break
        i = at[best]
        spent += weights[best] * (paths[best][i + 1].bits - paths[best][i].bits) / total
        at[best] = i + 1
    return {k: paths[k][at[k]] for k in paths}


def average_bits(choice: Mapping[Hashable, Candidate], weights: Mapping[Hashable, float]) -> float:
    total = sum(weights[k] for k in choice)
    return sum(weights[k] * c.bits for k, c in choice.items()) / total
