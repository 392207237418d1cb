"""The C, C++ and CUDA under native/ are as clang-format writes them with .clang-format
(scripts/clang_format.py; `make format` fixes them)."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
import clang_format  # noqa: E402

EXE = clang_format.find()
needs_clang_format = pytest.mark.skipif(
    EXE is None, reason="clang-format is not installed: pip install clang-format (it is in the [test] extra)"
)


@needs_clang_format
def test_native_sources_are_formatted():
    bad = clang_format.differing(EXE, clang_format.sources())
    assert not bad, f"not formatted (python scripts/clang_format.py): {[str(p.relative_to(ROOT)) for p in bad]}"


@needs_clang_format
def test_the_check_sees_a_file_out_of_format(tmp_path):
    (tmp_path / ".clang-format").write_bytes((ROOT / ".clang-format").read_bytes())
    bad, good = tmp_path / "bad.c", tmp_path / "good.c"
    bad.write_text("int  f( int x ){return x;}\n")
    good.write_text("int f(int x) {\n    return x;\n}\n")
    assert clang_format.differing(EXE, [bad, good]) == [bad]
