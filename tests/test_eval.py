"""`kvgguf eval`: the scoring math, the harness on the live path, and its errors."""

import math

import llama_cpp
import numpy as np
import pytest

from kvgguf import evaluate

from conftest import SHARED
from test_cli import run_cli


def test_scoring_math_on_a_hand_computed_example():
    ref = np.array([[0.0, math.log(3.0)], [2.0, 0.0]], dtype=np.float32)  # p = (1/4, 3/4), (e^2, 1)/(e^2 + 1)
    test = np.array([[0.0, 0.0], [2.0, 0.0]], dtype=np.float32)  # q = (1/2, 1/2), same as ref
    kl, agree, nll_ref, nll_test = evaluate.score(ref, test, np.array([1, -1]))
    assert kl[0] == pytest.approx(0.25 * math.log(0.5) + 0.75 * math.log(1.5))
    assert kl[1] == pytest.approx(0.0, abs=1e-12)
    assert list(agree) == [False, True]  # ref picks token 1, test's tie picks token 0
    assert nll_ref[0] == pytest.approx(-math.log(0.75)) and nll_test[0] == pytest.approx(math.log(2.0))
    assert math.isnan(nll_ref[1]) and math.isnan(nll_test[1])  # next token unknown: no perplexity term


def test_harness_gives_zero_for_the_reference_and_for_exact_cold_rows(smollm2_path):
    text = (SHARED / "data" / "wikitext-2-test.txt").read_text(encoding="utf-8")[:8000]
    tokens = llama_cpp.Llama(str(smollm2_path), vocab_only=True, verbose=False).tokenize(text.encode())
    configs = evaluate.parse_configs("f16,kvgguf:f16,rotq4")
    meta, results = evaluate.run_eval(str(smollm2_path), configs, tokens, ctx=512, chunks=2, batch=32, hot=64)
    by = {r.name: r for r in results}
    assert meta["scored_positions"] == 512
    assert by["f16"].kl_mean == 0.0 and by["f16"].top1 == 1.0 and by["f16"].ppl == by["f16"].ppl_ref
    assert by["kvgguf:f16"].kind == "kvgguf" and by["kvgguf:f16"].kl_mean < 1e-5
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
