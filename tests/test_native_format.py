"""The C, C++ and CUDA under native/ are as clang-format writes them with .clang-format
(scripts/clang_format.py; `make format` fixes them)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "clang_format.py"


def _clang_format() -> bool:
    return bool(shutil.which("clang-format", path=str(Path(sys.executable).parent)) or shutil.which("clang-format"))


def test_native_sources_are_formatted():
    if not _clang_format():
        pytest.skip("clang-format is not installed: pip install clang-format (it is in the [test] extra)")
    run = subprocess.run([sys.executable, str(SCRIPT), "--check"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr


def test_the_check_sees_a_file_out_of_format(tmp_path):
    if not _clang_format():
        pytest.skip("clang-format is not installed")
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import clang_format
    finally:
        sys.path.pop(0)
    (tmp_path / ".clang-format").write_bytes((ROOT / ".clang-format").read_bytes())
    bad, good = tmp_path / "bad.c", tmp_path / "good.c"
    bad.write_text("int  f( int x ){return x;}\n")
    good.write_text("int f(int x) {\n    return x;\n}\n")
    assert clang_format.differing(clang_format.clang_format(), [bad, good]) == [bad]
