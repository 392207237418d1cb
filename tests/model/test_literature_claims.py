"""benchmarks/literature_claims.py: its verdict logic on made-up figures, and one small run through
the live cache so the script cannot rot."""

import json
import math
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import literature_claims as lc  # noqa: E402


def row(name, bits, kl, ppl=10.0, ref=10.0):
    return lc.Row(name, bits, kl, 0.9, ppl, ref)


def test_rotq_interpolation_is_log_linear_in_bits():
    rows = {"rotq2": row("rotq2", 2.0, 0.1), "rotq3": row("rotq3", 3.0, 0.01)}
    assert lc.rotq_at(rows, 2.5) == pytest.approx(math.sqrt(0.1 * 0.01))
    assert lc.rotq_at(rows, 2.0) == pytest.approx(0.1)
    assert lc.rotq_at(rows, 3.5) is None  # no extrapolation


def test_verdicts_follow_the_numbers():
    rows = {
        "rotq2": row("rotq2", 2.25, 0.10, 12.0),
        "rotq3": row("rotq3", 3.25, 0.03, 10.5),
        "lowrank2": row("lowrank2", 3.0, 0.02, 10.1),
    }
    v = lc.claim_lowrank(rows, {})
    assert v.verdict == "reproduced" and v.numbers["recovered_ppl"] == pytest.approx(0.95)
    rows["lowrank2"] = row("lowrank2", 3.0, 0.09, 11.8)
    assert lc.claim_lowrank(rows, {}).verdict == "refuted"
    rows["qjl3"] = row("qjl3", 3.5, 0.05)
    assert lc.claim_qjl(rows, {}).verdict == "refuted"  # worse than spending the bit in rotq3
    rows["delta4"] = row("delta4", 5.3, 0.002)
    v = lc.claim_delta(rows, {})
    assert v.verdict == "refuted" and v.numbers["x_fp32"] == pytest.approx(32 / 5.3)
    assert lc.claim_pq_vq(rows, {}).verdict == "not measured yet"
    rows["pq2"] = row("pq2", 2.4, 0.05)  # between rotq at its bits (~0.066) and rotq3 (0.03)
    v = lc.claim_pq_sq(rows, {})
    assert v.verdict == "partly" and v.numbers["pq2"]["rotq_same_bits_kl"] > 0.05
    rows["pq2"] = row("pq2", 2.4, 0.02)
    assert lc.claim_pq_sq(rows, {}).verdict == "reproduced"
    rows["vq8"] = row("vq8", 0.03, 1.0)  # 1067x fp32 at KL 1.0: VQ's claim met; pq2's 13x is not 219x
    v = lc.claim_pq_vq(rows, {})
    assert v.verdict == "partly" and v.numbers["vq8"]["x_fp32"] == pytest.approx(32 / 0.03)
    rows["vq8"] = row("vq8", 3.4, 0.6)  # KL under the claim's 1.09, but at 9x, not 1034x: not the claim
    assert lc.claim_pq_vq(rows, {}).verdict == "refuted"
    # calibrated codebooks: their own rows, reported beside the per-sequence ones; the better decides
    cal = "pq2" + lc.CAL
    rows["pq2"] = row("pq2", 2.4, 0.05)
    rows[cal] = lc.Row(cal, 2.4, 0.02, 0.9, 10.0, 10.0, book_bits=0.15)
    v = lc.claim_pq_sq(rows, {})
    assert v.verdict == "reproduced" and set(v.numbers) >= {"pq2", cal} and cal in v.ours
    v = lc.claim_pq_vq(rows, {})
    assert v.verdict == "refuted" and f"{32 / 2.25:.1f}x fp32 without them" in v.ours


def test_reused_rows_keep_their_origin():
    old = {"meta": {"command": "B", "reused": {"from": "a.json", "command": "A", "rows": ["rotq1", "rotq2"]}}}
    assert lc.reuse_groups(old, "b.json", {"rotq1", "pq2"}) == [
        {"from": "a.json", "command": "A", "rows": ["rotq1"]},
        {"from": "b.json", "command": "B", "rows": ["pq2"]},
    ]


@pytest.mark.parametrize("style", ["norm", "neox"])
def test_unrope_undoes_rope(style):
    import numpy as np

    rng = np.random.default_rng(0)
    x, pos, n_rot = rng.standard_normal((7, 2, 8)), np.arange(7) * 13, 6  # the last two channels unrotated
    i = np.arange(n_rot // 2)
    theta = pos[:, None] * 1e4 ** (-2.0 * i / n_rot)
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    a, b = (2 * i, 2 * i + 1) if style == "norm" else (i, i + n_rot // 2)
    y = x.copy()
    y[..., a], y[..., b] = x[..., a] * c - x[..., b] * s, x[..., a] * s + x[..., b] * c
    assert np.allclose(lc.unrope(y, pos, 1e4, n_rot, style), x)
    assert not np.allclose(lc.unrope(y, pos, 1e4, n_rot, "neox" if style == "norm" else "norm"), x)


@pytest.mark.slow
def test_small_run_gives_a_verdict_per_claim(tmp_path):
    out = tmp_path / "claims"
    assert (
        lc.main(
            [
                "--ctx",
                "128",
                "--chunks",
                "1",
                "--hot",
                "32",
                "--surprisal-tokens",
                "128",
                "--codecs",
                "rotq1,rotq2,rotq3,rotq4,kivi2,delta4,pdelta4,outl2,lowrank2,qjl3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    # and a second run measuring only pq2 and vq8, the first run's rows standing for the others
    out2 = tmp_path / "claims2"
    assert (
        lc.main(
            [
                "--ctx",
                "128",
                "--chunks",
                "1",
                "--hot",
                "32",
                "--codecs",
                "pq2,vq8",
                "--reuse",
                str(out.with_suffix(".json")),
                "--out",
                str(out2),
            ]
        )
        == 0
    )
    data = json.loads(out2.with_suffix(".json").read_text())
    assert data["meta"]["reused"][0]["rows"] == sorted(json.loads(out.with_suffix(".json").read_text())["rows"])
    # keys rotated back before RoPE: layer 0 gives a recurring token its key back (f16 rounding apart)
    rope = data["surprisal"]["rope"]
    assert rope["check_pairs"] > 10 and rope["check_pre"] < 0.01 < 0.1 < rope["check_post"]
    assert "Keys before RoPE" in next(v for v in data["verdicts"] if v["key"] == "tsc1_delta")["ours"]
    verdicts = {v["key"]: v for v in data["verdicts"]}
    assert len(verdicts) == len(lc.CLAIMS)
    for key in (
        "tsc1_delta",
        "tsc2_pq_vq",
        "tqpp_pq",
        "tqpp_lowrank",
        "tqpp_outliers",
        "tq_qjl",
        "seq_surprisal",
        "adr_archive",
    ):
        assert verdicts[key]["verdict"] in lc.VERDICTS[:3], key  # measured
        assert verdicts[key]["ours"]
    for r in data["rows"].values():
        assert r["bits"] > 0 and math.isfinite(r["kl"]) and r["kl"] >= 0
    md = out2.with_suffix(".md").read_text()
    assert md.count("**") == 2 * len(lc.CLAIMS)


def test_pq2_on_the_models_calibrated_codebooks_is_its_own_row(
    tmp_path, monkeypatch, smollm2_path, smollm2_calibration
):
    from kvgguf.model.registry import calibration_path

    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path / "cache"))
    args = [
        "--ctx",
        "128",
        "--chunks",
        "1",
        "--hot",
        "32",
        "--surprisal-tokens",
        "128",
        "--codecs",
        "rotq3,pq2",
        "--codebooks",
        "calibration",
        "--out",
        str(tmp_path / "cal"),
    ]
    with pytest.raises(SystemExit):  # no calibration yet
        lc.main(args)
    smollm2_calibration.save(calibration_path(str(smollm2_path)))
    assert lc.main(args) == 0
    data = json.loads((tmp_path / "cal.json").read_text())
    assert data["meta"]["codebooks"] == "calibration" and set(data["rows"]) == {"rotq3", "pq2" + lc.CAL}
    assert 0 < data["rows"]["pq2" + lc.CAL]["book_bits"] < data["rows"]["pq2" + lc.CAL]["bits"]
    # by default each sequence trains its own, whatever the cache folder holds
    assert lc.main(args[:-4] + ["--out", str(tmp_path / "seq")]) == 0
    assert set(json.loads((tmp_path / "seq.json").read_text())["rows"]) == {"rotq3", "pq2"}
    assert os.environ["KVGGUF_CACHE_DIR"] == str(tmp_path / "cache")  # put back
