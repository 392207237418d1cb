"""Calibration (kvgguf.evaluation.calibration): measured once per model, a plan per budget, refused
for another model; kv_codec="auto" reads it."""

import json
import re
import warnings

import numpy as np
import pytest

import kvgguf
from kvgguf.bindings import codecs
from kvgguf.enums import Kind, Tier
from kvgguf.evaluation import calibration
from kvgguf.model.registry import calibration_path
from kvgguf.policy import calibration_plan
from kvgguf.policy import allocation, kv_codec

from conftest import CALIBRATION_TOKENS as N_TOKENS  # the measurement's text


@pytest.fixture(scope="module")
def text(smollm2_path):
    return calibration.self_text(str(smollm2_path), N_TOKENS, seed=0, threads=2)


@pytest.fixture(scope="module")
def cal(smollm2_calibration):
    return smollm2_calibration


def test_calibrate_prints_its_plans_and_inspect_shows_them(tmp_path, monkeypatch, capsys, smollm2_path, cal):
    from kvgguf.cli.main import main

    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    assert main(["inspect", str(smollm2_path)]) == 0
    assert "calibration:  none yet" in capsys.readouterr().out
    cal.save(calibration_path(str(smollm2_path)))
    assert main(["inspect", str(smollm2_path)]) == 0
    out = capsys.readouterr().out
    assert "self-written text" in out and re.search(r"\| auto:3 \| (2\.[89]\d|3\.00) \|", out), out


def test_the_self_written_text_is_the_same_for_a_seed_and_differs_across_seeds(smollm2_path, text):
    assert len(text) == N_TOKENS
    assert calibration.self_text(str(smollm2_path), N_TOKENS, seed=0, threads=2) == text
    assert calibration.self_text(str(smollm2_path), N_TOKENS, seed=1, threads=2) != text


def test_every_list_gets_a_curve_over_every_candidate(cal):
    assert sorted(cal.curves) == [(il, kind) for il in range(30) for kind in Kind]
    for key, cands in cal.curves.items():
        by = {c.codec: c for c in cands}
        assert set(by) == set(calibration.CANDIDATES)
        assert by["f16"].error == 0.0 and by["f16"].bits == 16.0
        assert by["rotq4"].bits < by["kivi4"].bits < by["kivi8"].bits
        assert by["rotq2"].error >= by["rotq4"].error >= 0.0
    sens = [next(c.error for c in cands if c.codec == calibration_plan.PROBE) for cands in cal.curves.values()]
    assert sum(s > 0 for s in sens) > len(sens) // 2  # the probe's KL stands clear of zero on most lists


@pytest.mark.slow
def test_a_list_measured_again_gives_the_same_curve(smollm2_path, text, cal):
    assert cal.text == {"source": "self", "tokens": N_TOKENS, "seed": 0}
    again = calibration.measure(str(smollm2_path), text, threads=2, only=[(7, Kind.V)])
    assert list(again.curves) == [(7, Kind.V)]
    assert again.curves[7, Kind.V] == cal.curves[7, Kind.V]


def test_plans_meet_their_budget_within_one_upgrade(cal):
    steps = max(c.bits for cands in cal.curves.values() for c in cands)  # the largest upgrade costs less
    total = sum(cal.weights.values())
    for budget in (2.5, 3.0, 4.0):
        plan = cal.plan(budget)
        bits = allocation.average_bits(plan, cal.weights)
        assert budget - steps * max(cal.weights.values()) / total <= bits <= budget + 1e-9
    kl = [sum(c.error for c in cal.plan(b).values()) for b in (2.5, 3.0, 4.0)]
    assert kl == sorted(kl, reverse=True)


def test_the_plan_is_what_the_store_holds(smollm2_path, cal, text):
    config = cal.config(3.0, kvgguf.TieredConfig(hot=96, block=32))  # the short text reaches the store
    choice = cal.plan(3.0)
    llm = kvgguf.Llama(str(smollm2_path), kv_codec=config, n_ctx=len(text), n_threads=2, verbose=False)
    try:
        llm.eval(text)
        for (il, kind), cand in choice.items():
            blocks = [b for b in llm.kv_cache.store.blocks(il, kind) if b.tier == Tier.WARM]
            assert blocks and {b.codec for b in blocks} == {cand.codec}, (il, kind)
    finally:
        llm.close()


def test_a_calibration_file_round_trips_and_another_models_is_refused(
    tmp_path, monkeypatch, smollm2_path, gemma3_path, cal
):
    path = cal.save(tmp_path / "cal.json")
    assert calibration_plan.Calibration.load(path).curves == cal.curves
    calibration_plan.Calibration.load(path).require_model(str(smollm2_path))
    with pytest.raises(kvgguf.CalibrationError, match="another model"):
        calibration_plan.Calibration.load(path).require_model(str(gemma3_path))

    # Gemma-3's calibration where SmolLM2's belongs: kv_codec="auto" refuses it, the file stays
    from kvgguf.model.gguf_file import metadata_digests

    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path / "cache"))
    d = cal.to_json()
    d["model"]["metadata_sha256"], d["model"]["tokenizer_sha256"] = metadata_digests(gemma3_path)
    slot = calibration_path(str(smollm2_path))
    slot.parent.mkdir(parents=True)
    slot.write_text(json.dumps(d))
    with pytest.raises(kvgguf.CalibrationError, match="another model"):
        kvgguf.Llama(str(smollm2_path), kv_codec="auto", n_ctx=512, verbose=False)
    assert json.loads(slot.read_text()) == d


@pytest.mark.parametrize(
    "body,match",
    [
        ("not json", "cannot read"),
        ('{"format": "other"}', "not a kvgguf calibration"),
        ('{"format": "kvgguf-calibration", "version": 99}', "version 99"),
        ('{"format": "kvgguf-calibration", "version": 1}', "version 1"),
        (
            '{"format": "kvgguf-calibration", "version": %d, "lists": [{"layer": 0}]}' % calibration_plan.VERSION,
            "malformed",
        ),
    ],
)
def test_broken_calibration_files_are_refused_clearly(tmp_path, body, match):
    p = tmp_path / "cal.json"
    p.write_text(body)
    with pytest.raises(kvgguf.CalibrationError, match=match):
        calibration_plan.Calibration.load(p)


def test_auto_reads_the_models_calibration_for_its_budget(tmp_path, monkeypatch, smollm2_path, cal, text):
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    cal.save(calibration_path(str(smollm2_path)))
    prompt = text + text[1:]  # longer than the preset's hot window
    for spec, budget in (("auto", kv_codec.DEFAULT_BUDGET), ("auto:2.5", 2.5)):
        llm = kvgguf.Llama(str(smollm2_path), kv_codec=spec, n_ctx=len(prompt) + 16, n_threads=2, verbose=False)
        try:
            # the Llama pays for plans over its own n_ctx: the expectation must too, or a machine
            # whose calibration puts a planned codec near the margin reads another plan
            assert llm.kv_config == cal.config(budget, llm.kv_config, llm.n_ctx())
            out = llm.create_completion(prompt, max_tokens=4, temperature=0.0)
            assert out["usage"]["completion_tokens"] >= 1
            assert llm.kv_cache.n_cold > 0
        finally:
            llm.close()


@pytest.mark.parametrize(
    "kv_codec", ["auto:", "auto:x", "auto:0.5", "auto:17", "auto:held=", "auto:held=0.5", "auto:hold=3"]
)
def test_bad_budgets_are_refused(smollm2_path, kv_codec):
    with pytest.raises(ValueError, match="auto:BITS"):
        kvgguf.Llama(str(smollm2_path), kv_codec=kv_codec, n_ctx=512, verbose=False)


def test_a_session_saved_with_auto_holds_the_calibrated_codecs(tmp_path, monkeypatch, smollm2_path, cal, text):
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    cal.save(calibration_path(str(smollm2_path)))
    llm = kvgguf.Llama(str(smollm2_path), n_ctx=512, n_threads=2, verbose=False)
    try:
        llm.eval(text)
        info = llm.save_session(tmp_path / "s.kvz", codec="auto:3.0")
        from kvgguf.policy import codec_spec

        n_layer = 1 + max(il for il, _ in cal.plan(3.0))
        # save_session plans the exact rows over the tokens it saves (Llama.save_session)
        expected = cal.config(3.0, context=len(text)).warm
        assert info.codec == codec_spec.describe(codec_spec.choice(expected, n_layer))
        again = kvgguf.Llama(str(smollm2_path), n_ctx=512, n_threads=2, verbose=False)
        try:
            assert again.load_session(tmp_path / "s.kvz").n_tokens == len(text)
        finally:
            again.close()
    finally:
        llm.close()


def test_tiered_follows_the_models_calibration_once_it_has_one(tmp_path, monkeypatch, smollm2_path, cal, text):
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    prompt = text + text[1:]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fixed = kvgguf.Llama(str(smollm2_path), kv_codec="tiered", n_ctx=512, verbose=False)
    assert not [w for w in seen if "calibration" in str(w.message)]  # none is no reason to warn
    try:  # no calibration yet: the fixed preset, as "tiered:fixed" always is
        assert fixed.kv_config == kvgguf.TieredConfig() == kvgguf.TieredConfig.parse("tiered:fixed")
        assert fixed.kv_calibration is None
    finally:
        fixed.close()

    cal.save(calibration_path(str(smollm2_path)))
    llm = kvgguf.Llama(str(smollm2_path), kv_codec="tiered", n_ctx=len(prompt) + 16, n_threads=2, verbose=False)
    try:
        config = llm.kv_config
        assert llm.kv_calibration == calibration_path(str(smollm2_path))
        slow, key_bits = kv_codec.PRESET_SLOW_FAMILIES, kv_codec.PRESET_KEY_BITS
        assert config == cal.config(kv_codec.PRESET_BUDGET, kvgguf.TieredConfig(), len(prompt) + 16, slow, key_bits)
        assert config.archive is None and config.sinks == kvgguf.TieredConfig().sinks
        held = llm.kv_cache.codecs[Tier.WARM]
        plan = cal.plan(kv_codec.PRESET_BUDGET, len(prompt) + 16, slow, key_bits)
        assert all(held[key] == c.codec for key, c in plan.items())
        assert len(set(held.values())) > 1  # a plan, not one codec
        assert not [c for c in held.values() if codecs.family(c) in slow]  # the preset decodes on the fast kernels
        llm.eval(prompt)
        assert llm.kv_cache.n_cold > 0
    finally:
        llm.close()
    still_fixed = kvgguf.Llama(str(smollm2_path), kv_codec="tiered:fixed", n_ctx=512, verbose=False)
    try:
        assert still_fixed.kv_config == kvgguf.TieredConfig() and still_fixed.kv_calibration is None
    finally:
        still_fixed.close()


def test_tiered_keeps_the_fixed_preset_with_a_warning_when_the_calibration_is_broken(
    tmp_path, monkeypatch, smollm2_path
):
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    slot = calibration_path(str(smollm2_path))
    slot.parent.mkdir(parents=True)
    slot.write_text("not json")
    with pytest.warns(UserWarning, match="fixed preset: cannot read calibration"):
        llm = kvgguf.Llama(str(smollm2_path), kv_codec="tiered", n_ctx=512, verbose=False)
    try:
        assert llm.kv_config == kvgguf.TieredConfig()
    finally:
        llm.close()
    with pytest.raises(kvgguf.CalibrationError, match="cannot read"):  # "auto" needs it
        kvgguf.Llama(str(smollm2_path), kv_codec="auto", n_ctx=512, verbose=False)
    assert slot.read_text() == "not json"


def test_a_calibration_from_before_newer_candidates_loads_and_says_what_it_lacks(
    tmp_path, monkeypatch, smollm2_path, cal
):
    """A file kept from an older kvgguf (no wfq or tcq costs) still plans, and says why its plans
    can be poorer than a new measurement's."""
    from dataclasses import replace

    from kvgguf.policy.resolve import calibrated_config

    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    assert cal.unmeasured() == []
    old = replace(
        cal, curves={k: [c for c in v if codecs.family(c.codec) not in ("wfq", "tcq")] for k, v in cal.curves.items()}
    )
    assert old.unmeasured() == [c for c in calibration.CANDIDATES if codecs.family(c) in ("wfq", "tcq")]
    old.save(calibration_path(str(smollm2_path)))
    with pytest.warns(UserWarning, match=r"measured before wfq2, wfq3, wfq4, tcq2, tcq3, tcq4 joined"):
        config, path = calibrated_config(str(smollm2_path), kv_codec.Request(3.0))
    assert path == calibration_path(str(smollm2_path))
    assert config == old.config(3.0, kvgguf.TieredConfig())
    assert not [c for c in old.plan(3.0).values() if codecs.family(c.codec) in ("wfq", "tcq")]
    from kvgguf.cli.inspect import calibration_lines

    lines, _ = calibration_lines(smollm2_path)
    assert "measured before wfq2, wfq3, wfq4, tcq2, tcq3, tcq4 joined" in lines[1]


# --- pq2/vq8 codebooks --------------------------------------------------------------------


def test_calibration_trains_a_pq2_and_a_vq8_codebook_per_list_and_the_file_keeps_them(tmp_path, cal):
    assert set(cal.books) == {(il, kind, name) for il, kind in cal.curves for name in codecs.CODEBOOK_CODECS}
    for (il, kind, name), bk in cal.books.items():
        assert bk.dtype == np.float32 and bk.shape == ((256, 4) if name == "pq2" else (256, 64))
        if name in calibration_plan.SAME_BOOK:  # vq8f codes with vq8's
            assert bk is cal.books[il, kind, calibration_plan.SAME_BOOK[name]]
        # trained (600 vectors, many repeated: layer 0)
        assert np.isfinite(bk).all() and len(np.unique(bk, axis=0)) > 16
    loaded = calibration_plan.Calibration.load(cal.save(tmp_path / "cal.json"))
    assert {e["codec"] for e in json.loads((tmp_path / "cal.json").read_text())["books"]} == {"pq2", "vq8"}
    for key, bk in cal.books.items():  # kept as f16 on disk
        assert np.array_equal(loaded.books[key], bk.astype(np.float16).astype(np.float32)), key
    # A file written before codebooks were trained still loads, without them.
    d = cal.to_json()
    del d["books"]
    (tmp_path / "old.json").write_text(json.dumps(d))
    assert calibration_plan.Calibration.load(tmp_path / "old.json").books == {}


@pytest.mark.parametrize(
    "damage,match",
    [
        (lambda e: e.update(f16="not base64!"), "malformed"),
        (lambda e: e.update(codec="rotq3"), "keeps none"),
        (lambda e: e.update(centroids=7), "malformed"),
        (
            lambda e: e.update(f16=__import__("base64").b64encode(np.full(1024, np.inf, "<f2").tobytes()).decode()),
            "not finite",
        ),
        (lambda e: e.pop("layer"), "malformed"),
    ],
)
def test_a_damaged_codebook_in_a_calibration_file_is_refused(tmp_path, cal, damage, match):
    d = cal.to_json()
    damage(d["books"][0])
    (tmp_path / "cal.json").write_text(json.dumps(d))
    with pytest.raises(kvgguf.CalibrationError, match=match):
        calibration_plan.Calibration.load(tmp_path / "cal.json")


def test_pq2_starts_from_the_models_codebooks_keeps_them_across_sequences_and_counts_them(
    tmp_path, monkeypatch, smollm2_path, cal, text
):
    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    prompt = text + text[1:]
    kw = dict(n_ctx=len(prompt) + 16, n_threads=2, verbose=False)
    calibrated = kvgguf.TieredConfig(sinks=0, warm="pq2", warm_tokens=0, archive=None, codebooks="calibration")

    def held(llm):
        return {(il, kind, name): bk for il, kind, name, bk in llm.kv_cache.store.books()}

    with pytest.raises(ValueError, match="codebooks"):
        kvgguf.TieredConfig(codebooks="model")
    # No calibration yet: a warning, and the sequence trains its own on its first block.
    with pytest.warns(UserWarning, match="no calibration"):
        own = kvgguf.Llama(str(smollm2_path), kv_codec=calibrated, **kw)
    try:
        assert held(own) == {}
        own.eval(prompt)
        trained = held(own)
        assert trained and all(name == "pq2" for _, _, name in trained)
    finally:
        own.close()

    books = calibration_plan.Calibration.load(cal.save(calibration_path(str(smollm2_path)))).books
    plain = kvgguf.Llama(str(smollm2_path), kv_codec="pq2", **kw)  # codebooks="sequence", the default
    try:
        assert held(plain) == {}
    finally:
        plain.close()
    llm = kvgguf.Llama(str(smollm2_path), kv_codec=calibrated, **kw)
    try:
        start = held(llm)
        lists = {(il, kind, "pq2") for il in llm.kv_cache.layers for kind in Kind}
        assert set(start) == lists  # pq2's only: vq8's are not held
        for key in lists:
            assert np.array_equal(start[key], books[key])
        assert llm.kv_memory().by_tier["books"].bytes == sum(bk.nbytes for bk in start.values())
        llm.eval(prompt)
        assert llm.kv_cache.n_cold > 0
        after = held(llm)
        assert all(np.array_equal(after[key], books[key]) for key in lists)  # coded with them, not retrained
        assert not np.array_equal(after[0, Kind.K, "pq2"], trained[0, Kind.K, "pq2"])
        llm.reset()  # a new sequence: the store is cleared, the model's codebooks come back
        assert all(np.array_equal(held(llm)[key], books[key]) for key in lists)
        out = llm.create_completion(prompt, max_tokens=4, temperature=0.0)
        assert out["usage"]["completion_tokens"] >= 1
    finally:
        llm.close()


def test_auto_held_counts_the_cells_the_context_holds(monkeypatch, tmp_path, smollm2_path, cal):
    """ "auto:held=BITS" plans the compressed rows for what llama.cpp's hot cells leave: a full
    context holds at most BITS per value, and the plan is the largest budget that does; "auto:BITS"
    spends BITS on the compressed rows alone and holds more."""
    from dataclasses import replace

    from kvgguf.model.shape import KVShape
    from kvgguf.policy import held

    monkeypatch.setenv("KVGGUF_CACHE_DIR", str(tmp_path))
    cal.save(calibration_path(str(smollm2_path)))
    shape, n_ctx = KVShape.from_gguf(smollm2_path), 2048
    for bits in (3.5, 4.5):
        llm = kvgguf.Llama(str(smollm2_path), kv_codec=f"auto:held={bits}", n_ctx=n_ctx, n_threads=1, verbose=False)
        plain = kvgguf.Llama(str(smollm2_path), kv_codec=f"auto:{bits}", n_ctx=n_ctx, n_threads=1, verbose=False)
        try:
            cells = replace(llm.kv_config, hot_cells=llm.kv_cells["hot"])
            n_batch = llm.n_batch

            def held_of(c, cells=cells, n_batch=n_batch):
                return held.bits_held(shape, n_ctx, replace(c, hot_cells=cells.hot_cells), n_batch)

            def config_for(b, base=llm.kv_config):
                return cal.config(b, base, n_ctx)

            budget = held.budget_for_held(bits, config_for, held_of, "test")
            assert llm.kv_config == config_for(budget)
            assert held_of(llm.kv_config) <= bits
            assert budget == 16.0 or held_of(config_for(budget + 0.01)) > bits  # the largest that fits
            assert held_of(plain.kv_config) > bits  # the cells on top of BITS per compressed value
            if bits == 3.5:  # and the live context, full, holds no more (kv_memory counts every byte)
                llm.eval([int(t) for t in np.random.default_rng(0).integers(100, 40000, n_ctx)])
                assert llm.kv_memory().bits_per_value <= bits
        finally:
            llm.close()
            plain.close()
    with pytest.raises(ValueError, match="cheapest plan already hold"):
        kvgguf.Llama(str(smollm2_path), kv_codec="auto:held=1.5", n_ctx=n_ctx, verbose=False)


def test_budget_for_held_finds_the_largest_budget_that_fits():
    from kvgguf.policy import held
    from kvgguf.policy.tiered import TieredConfig

    def config_for(b):  # plans in whole bits from 2 (cheaper budgets have none), like a calibration's steps
        if b < 2.0:
            raise ValueError("below the cheapest plan")
        return TieredConfig(warm=f"rotq{min(int(b), 4)}")

    def held_of(c):  # cells worth 0.5 bits on top of the rows' bits
        return int(c.warm[-1]) + 0.5

    assert held.budget_for_held(3.7, config_for, held_of, "t") == pytest.approx(4.0, abs=1e-3)
    assert held.budget_for_held(9.0, config_for, held_of, "t") == 16.0
    assert held.budget_for_held(2.5, config_for, held_of, "t") == pytest.approx(3.0, abs=1e-3)
    with pytest.raises(ValueError, match="2.50 bits per value"):
        held.budget_for_held(2.4, config_for, held_of, "t")


# Calibration progress where stderr is not a terminal


def test_calibration_progress_prints_lines_into_a_log(capsys, smollm2_path):
    from kvgguf.policy.resolve import calibration_progress

    progress = calibration_progress(str(smollm2_path), verbose=True)
    for done in range(0, 61, 3):
        progress(done, 60)
    err = capsys.readouterr().err  # captured: not a terminal, as under a server or in a notebook log
    assert f"calibrating {smollm2_path.name} for kv_codec='auto'" in err
    lines = [line for line in err.splitlines() if "lists measured" in line]
    assert lines[0].endswith("6/60 lists measured (10%)") and lines[-1].endswith("60/60 lists measured (100%)")
    assert len(lines) == 10
    quiet = calibration_progress(str(smollm2_path), verbose=False)
    quiet(30, 60)
    assert capsys.readouterr().err == ""
