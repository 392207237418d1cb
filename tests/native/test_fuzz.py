"""A bounded run of the fuzz targets (scripts/fuzz.sh): every codec's decoder, the store's
append_encoded and the reads over it (libFuzzer, ASan+UBSan), and the .kvz session parser
(atheris), a few thousand inputs each from starting inputs made of real encoded blocks and sessions. This is
the extended checks' fuzzing run (scripts/extended_checks.sh, which CI runs); the million-input
run is scripts/fuzz_long.py."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUNS = 3000


def _clang_with_libfuzzer():
    """A clang that links -fsanitize=fuzzer, or None (scripts/clang_fuzzer.sh, which fuzz.sh uses)."""
    found = subprocess.run(["bash", str(ROOT / "scripts" / "clang_fuzzer.sh")], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else None


def _atheris() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def fuzz(targets: str, tmp: Path) -> list[dict]:
    lines = tmp / "fuzz.jsonl"
    env = {**os.environ, "PYTHON": sys.executable}
    proc = subprocess.run(
        [
            "bash",
            str(ROOT / "scripts" / "fuzz.sh"),
            "--runs",
            str(RUNS),
            "--fresh",
            "--targets",
            targets,
            "--work",
            str(tmp / "work"),
            "--json",
            str(lines),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, f"scripts/fuzz.sh failed:\n{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    return [json.loads(line) for line in lines.read_text().splitlines()]


@pytest.mark.slow
def test_native_decoders_and_store_survive_fuzzing(tmp_path):
    if _clang_with_libfuzzer() is None:
        pytest.skip(
            "no clang with libFuzzer: bash scripts/system_packages.sh (or apt-get install clang-14 libclang-rt-14-dev)"
        )
    rows = fuzz("decode store", tmp_path)
    assert [r["target"] for r in rows] == ["decode", "store"]
    for r in rows:
        assert r["crashes"] == 0 and r["exit_status"] == 0, r
        assert r["inputs"] >= RUNS, r
        assert r["cov"] > 100, r  # instrumented: the library's own code reports coverage


def _editable_install() -> bool:
    """kvgguf imported through scikit-build-core's editable hook (pip install -e .)."""
    import importlib.util

    return "ScikitBuild" in type(importlib.util.find_spec("kvgguf").loader).__name__


@pytest.mark.slow
def test_session_parser_survives_fuzzing(tmp_path):
    if not _atheris():
        pytest.skip("atheris is not installed: pip install atheris (it is in the [test] extra)")
    if _editable_install():  # the README's commands and CI install it as a wheel
        pytest.skip("atheris cannot instrument kvgguf through an editable install's import hook: pip install .")
    rows = fuzz("session", tmp_path)
    assert len(rows) == 1 and rows[0]["crashes"] == 0 and rows[0]["inputs"] >= RUNS, rows
