"""Bits under a budget (kvgguf.policy.allocation): pure functions, no model."""

import pytest

from kvgguf.policy.allocation import Candidate, allocate, average_bits, hull


def curve(*points):
    return [Candidate(f"c{b}", b, e) for b, e in points]


def test_hull_keeps_only_upgrades_that_pay_at_a_falling_rate():
    c = curve((2, 1.0), (3, 0.2), (4, 0.15), (3.5, 0.5), (5, 0.16), (6, 0.14), (8, 0.0))
    kept = hull(c)
    assert [x.bits for x in kept] == [2, 3, 4, 8]  # 3.5 errs more than 3, 5 more than 4; 6 lies above the 4-8 chord
    rates = [(a.error - b.error) / (b.bits - a.bits) for a, b in zip(kept, kept[1:])]
    assert rates == sorted(rates, reverse=True)


def test_allocation_meets_the_budget_and_spends_where_error_falls_most():
    curves = {"a": curve((2, 1.0), (4, 0.1)), "b": curve((2, 0.05), (4, 0.04))}
    weights = {"a": 1, "b": 1}
    plan = allocate(curves, weights, 3.0)
    assert plan["a"].bits == 4 and plan["b"].bits == 2
    assert average_bits(plan, weights) <= 3.0
    assert allocate(curves, weights, 2.0) == {"a": curves["a"][0], "b": curves["b"][0]}
    assert average_bits(allocate(curves, weights, 4.0), weights) == 4.0


def test_more_budget_never_raises_the_summed_error():
    curves = {i: curve((2, 1.0 / (i + 1)), (3, 0.4 / (i + 1)), (4, 0.1 / (i + 1)), (16, 0.0)) for i in range(6)}
    weights = {i: 64 if i % 2 else 32 for i in range(6)}
    errors = []
    for budget in (2.0, 2.5, 3.0, 3.5, 4.0, 8.0, 16.0):
        plan = allocate(curves, weights, budget)
        assert average_bits(plan, weights) <= budget + 1e-9
        errors.append(sum(c.error for c in plan.values()))
    assert errors == sorted(errors, reverse=True) and errors[-1] == 0.0


def test_a_budget_below_the_cheapest_plan_is_refused():
    with pytest.raises(ValueError, match="below the cheapest plan"):
        allocate({"a": curve((2, 1.0))}, {"a": 1}, 1.5)


def test_a_plan_codec_pays_for_its_plan_over_the_context():
    """wfq's plan (3 float32 per coordinate of each KV head, one per sequence) costs 96 / context
    bits per value: over 4,096 tokens wfq3 fits a budget it cannot fit over 256."""
    from kvgguf.enums import Kind
    from kvgguf.policy.calibration_plan import Calibration, plan_bits

    cands = [
        Candidate("rotq2", 2.25, 0.05),
        Candidate("wfq3", 3.0, 0.008),
        Candidate("rotq3", 3.25, 0.01),
        Candidate("rotq4", 4.25, 0.004),
        Candidate("f16", 16.0, 0.0),
    ]
    keys = [(0, Kind.K), (0, Kind.V)]
    cal = Calibration({}, {k: list(cands) for k in keys}, {k: 192 for k in keys}, {}, 96, 32)
    assert plan_bits("wfq3", 4096) == 96 / 4096 and plan_bits("rotq3", 64) == 0.0
    long = cal.plan(3.05, context=4096)
    assert [c.codec for c in long.values()] == ["wfq3", "wfq3"]
    assert average_bits(long, cal.weights) == pytest.approx(3.0 + 96 / 4096)
    short = cal.plan(3.05, context=256)
    assert [c.codec for c in short.values()] != ["wfq3", "wfq3"]
    assert average_bits(short, cal.weights) <= 3.05
    assert cal.plan(3.05) == long  # the context a plan assumes when it is not told: 4,096 tokens
    with pytest.raises(ValueError, match="context"):
        cal.plan(3.05, context=-1)


def test_a_plan_can_leave_codec_families_out():
    """The calibrated "tiered" plans without tcq and wfq (kv_codec.PRESET_SLOW_FAMILIES)."""
    from kvgguf.enums import Kind
    from kvgguf.policy.calibration_plan import Calibration

    cands = [Candidate("rotq2", 2.25, 0.05), Candidate("tcq3", 3.25, 0.006), Candidate("rotq3", 3.25, 0.01)]
    keys = [(0, Kind.K), (0, Kind.V)]
    cal = Calibration({}, {k: list(cands) for k in keys}, {k: 192 for k in keys}, {}, 96, 32)
    assert [c.codec for c in cal.plan(3.25).values()] == ["tcq3", "tcq3"]
    assert [c.codec for c in cal.plan(3.25, exclude=("tcq", "wfq")).values()] == ["rotq3", "rotq3"]
    with pytest.raises(ValueError, match="no codec"):
        cal.plan(3.25, exclude=("rotq", "tcq"))


def test_a_plan_can_hold_keys_at_a_floor_of_bits_taken_from_the_values():
    """The calibrated "tiered" gives keys at least kv_codec.PRESET_KEY_BITS bits, paid by the
    values, where the budget holds that; below, the plan without the floor."""
    from kvgguf.enums import Kind
    from kvgguf.policy import kv_codec
    from kvgguf.policy.calibration_plan import Calibration

    cands = [Candidate("rotq2", 2.25, 0.05), Candidate("rotq3", 3.25, 0.01), Candidate("rotq4", 4.25, 0.004)]
    keys = [(il, kind) for il in range(2) for kind in Kind]
    cal = Calibration({}, {k: list(cands) for k in keys}, {k: 192 for k in keys}, {}, 96, 32)
    # the keys' errors as measured: smaller than the values', so a KL-optimal plan gives keys 3 bits
    cal.curves[0, Kind.K] = [
        Candidate("rotq2", 2.25, 0.02),
        Candidate("rotq3", 3.25, 0.004),
        Candidate("rotq4", 4.25, 0.003),
    ]
    plain = cal.plan(3.75)
    assert plain[0, Kind.K].codec == "rotq3"
    floored = cal.plan(3.75, key_bits=kv_codec.PRESET_KEY_BITS)
    assert [floored[il, Kind.K].codec for il in range(2)] == ["rotq4", "rotq4"]
    assert average_bits(floored, cal.weights) <= 3.75
    # 3.0 bits cannot hold 4-bit keys (with 2-bit values they average 3.25): the plan without
    assert cal.plan(3.0, key_bits=4) == cal.plan(3.0)
