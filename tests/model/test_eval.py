"""`kvgguf eval`: the scoring math, the harness on the live path, and its errors."""

import json
import math

import llama_cpp
import numpy as np
import pytest

from kvgguf import TieredConfig
from kvgguf.evaluation import harness as evaluate
from kvgguf.evaluation.text import wikitext2_test

from test_cli import HERE, run_cli


def test_scoring_math_on_a_hand_computed_example():
    ref = np.array([[0.0, math.log(3.0)], [2.0, 0.0]], dtype=np.float32)  # p = (1/4, 3/4), (e^2, 1)/(e^2 + 1)
    test = np.array([[0.0, 0.0], [2.0, 0.0]], dtype=np.float32)  # q = (1/2, 1/2), same as ref
    kl, agree, nll_ref, nll_test = evaluate.score(ref, test, np.array([1, -1]))
    assert kl[0] == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5))
    assert kl[1] == pytest.approx(0.0, abs=1e-12)
    assert list(agree) == [False, True]  # ref picks token 1, test's tie picks token 0
    assert nll_ref[0] == pytest.approx(-math.log(0.75)) and nll_test[0] == pytest.approx(math.log(2.0))
    assert math.isnan(nll_ref[1]) and math.isnan(nll_test[1])  # next token unknown: no perplexity term


@pytest.mark.slow
def test_harness_gives_zero_for_the_reference_and_for_exact_cold_rows(smollm2_path):
    text = wikitext2_test()[:8000]
    tokens = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False).tokenize(text.encode())
    configs = evaluate.parse_configs("f16,kvgguf:f16,rotq4")
    # batches of 32 would take the fused path, whose f32 sums differ from llama.cpp's f16 ones:
    # exactness is a property of the expanding path (tests/model/test_fused_attention.py bounds the other)
    meta, results = evaluate.run_eval(
        str(smollm2_path), configs, tokens, ctx=512, chunks=2, batch=32, hot=64, kv_attention="expand"
    )
    by = {r.name: r for r in results}
    assert meta["scored_positions"] == 512
    assert by["f16"].kl_mean == 0.0 and by["f16"].top1 == 1.0 and by["f16"].ppl == by["f16"].ppl_ref
    assert by["kvgguf:f16"].source == "kvgguf" and by["kvgguf:f16"].kl_mean < 1e-5
    assert 0 < by["rotq4"].kl_mean < 0.1 and by["rotq4"].bits_per_value < by["kvgguf:f16"].bits_per_value
    md = evaluate.markdown(meta, results)
    assert "| rotq4 | kvgguf |" in md


def test_bad_arguments_give_clear_errors(smollm2_path, tmp_path):
    with pytest.raises(ValueError, match="cache 'rotq9' is unknown"):
        evaluate.parse_configs("f16,rotq9")
    with pytest.raises(ValueError, match="need 4096 tokens; the text has 10"):
        evaluate.run_eval(str(smollm2_path), evaluate.parse_configs("f16"), list(range(10)), ctx=1024, chunks=4)
    out = run_cli("eval", "--text", str(tmp_path / "missing.txt"))
    assert out.returncode == 2 and "missing.txt does not exist" in out.stderr
    out = run_cli("eval", "--codecs", "q9_9")
    assert out.returncode == 2 and "cache 'q9_9' is unknown" in out.stderr
    small = tmp_path / "small.txt"
    small.write_text("Just a few words.")
    out = run_cli("eval", "--text", str(small), "--ctx", "1024")
    assert out.returncode == 2 and "the text has" in out.stderr


def test_eval_refuses_a_cache_that_compresses_nothing(smollm2_path):
    # The preset keeps `hot` tokens exact and decodes `ubatch` at a time: in a chunk of
    # hot + ubatch tokens the last batch starts at token `hot`, so no row would ever leave.
    preset = TieredConfig()
    ctx = preset.hot + preset.ubatch
    tokens = list(range(1000, 1000 + ctx))
    with pytest.raises(ValueError, match=f"'tiered' compresses nothing at ctx {ctx}.*keeps {preset.hot} tokens exact"):
        evaluate.run_eval(str(smollm2_path), evaluate.parse_configs("f16,tiered"), tokens, ctx=ctx, chunks=1, batch=256)
    out = run_cli("eval", "--codecs", "f16,tiered", "--ctx", str(ctx), "--chunks", "1")
    assert out.returncode == 2 and "compresses nothing" in out.stderr


def test_sliding_window_models_run_llama_types_both_ways():
    configs = evaluate.parse_configs("f16,q4_0,rotq4")
    assert evaluate.split_sliding_window(configs, 0) == configs
    split = evaluate.split_sliding_window(configs, 512)
    assert [(c.name, c.swa_full) for c in split] == [
        ("f16 (swa full)", True),
        ("f16 (swa window)", False),
        ("q4_0 (swa full)", True),
        ("q4_0 (swa window)", False),
        ("rotq4", None),
    ]


def test_markdown_says_na_where_nothing_was_compressed():
    r = evaluate.Result("kvgguf:f16", "kvgguf", bits_per_value=16.0, cold_bits_per_value=None)
    meta = {"model": "m.gguf", "ctx": 512, "chunks": 1, "batch": 64, "scored_positions": 256}
    row = [line for line in evaluate.markdown(meta, [r]).splitlines() if line.startswith("| kvgguf:f16")][0]
    assert row.split("|")[4].strip() == "n/a"


@pytest.mark.model  # loads the model by name
def test_eval_writes_where_it_is_told_and_never_into_the_current_folder(tmp_path):
    before = sorted(p.name for p in HERE.iterdir())
    out = run_cli(
        "eval",
        "--codecs",
        "f16,rotq4",
        "--ctx",
        "256",
        "--chunks",
        "1",
        "--batch",
        "32",
        "--hot",
        "64",
        "--out",
        str(tmp_path / "res"),
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "res" / "smollm2-135m_ctx256x1.json").is_file()
    assert (tmp_path / "res" / "smollm2-135m_ctx256x1.md").is_file()
    assert "| rotq4 | kvgguf |" in out.stdout
    recorded = json.loads((tmp_path / "res" / "smollm2-135m_ctx256x1.json").read_text())["provenance"]
    assert recorded["threads"] is not None and recorded["cpu"] and recorded["kvgguf_patch_version"] is not None
    assert "commit" in recorded  # None where kvgguf runs outside a git checkout
    assert sorted(p.name for p in HERE.iterdir()) == before


def test_eval_puts_every_cache_and_the_reference_on_the_gpu_layers_asked_for(smollm2_path):
    """`kvgguf eval --n-gpu-layers N`: the reference's and each row's Llama get N (a CPU build runs
    them on the CPU all the same)."""
    for cfg in (None, evaluate.parse_configs("tiered")[0]):
        llm, _ = evaluate.make_llama(str(smollm2_path), cfg, 256, 32, 1, 64, n_gpu_layers=5)
        try:
            assert llm.model_params.n_gpu_layers == 5
        finally:
            llm.close()
