"""clang-format over kvgguf's C, C++ and CUDA (native/), with the repository's .clang-format.

    python scripts/clang_format.py          # reformats the files in place (make format)
    python scripts/clang_format.py --check  # lists the files that differ; exit 1 if any do

clang-format comes from PyPI (the clang-format wheel, in the [test] extra), so every machine
formats with the same version. Generated files are left as their generator writes them.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = (".c", ".h", ".cpp", ".cu", ".cuh")
GENERATED = {Path("native/src/codecs/tcq_tables.h")}  # scripts/tcq_tables.py


def sources() -> list[Path]:
    found = (p for p in (ROOT / "native").rglob("*") if p.suffix in SUFFIXES and p.is_file())
    return sorted(p for p in found if p.relative_to(ROOT) not in GENERATED)


def find() -> str | None:
    """The clang-format beside this interpreter (the venv's wheel), else one on PATH."""
    return shutil.which("clang-format", path=str(Path(sys.executable).parent)) or shutil.which("clang-format")


def clang_format() -> str:
    exe = find()
    if exe is None:
        raise SystemExit("clang_format: no clang-format: pip install clang-format (it is in the [test] extra)")
    return exe


def differing(exe: str, files: list[Path]) -> list[Path]:
    out = []
    for path in files:
        formatted = subprocess.run([exe, "--style=file", str(path)], cwd=ROOT, capture_output=True, check=True).stdout
        if formatted != path.read_bytes():
            out.append(path)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list the files that differ, change nothing")
    args = parser.parse_args()
    exe, files = clang_format(), sources()
    if args.check:
        bad = differing(exe, files)
        for path in bad:
            print(f"clang_format: {path.relative_to(ROOT)} is not formatted (python scripts/clang_format.py)")
        return 1 if bad else 0
    subprocess.run([exe, "--style=file", "-i", *map(str, files)], cwd=ROOT, check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
