"""Every KVGGUF_* environment variable the package, its native library or its build reads is
named in docs/install.md's table; behaviour switches hidden in the code are not. The one the
tests read, KVGGUF_SANITIZED_LATER, names test files that exist."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Python: a string literal handed to os.environ / os.getenv (directly or through a constant).
PY_LITERAL = re.compile(r"[\"'](KVGGUF_[A-Z0-9_]+)[\"']")
# C, C++, CUDA: getenv("KVGGUF_..."); CMake: $ENV{KVGGUF_...}.
NATIVE_READ = re.compile(r"getenv\(\s*\"(KVGGUF_[A-Z0-9_]+)\"")
CMAKE_READ = re.compile(r"\$ENV\{(KVGGUF_[A-Z0-9_]+)\}")


def variables_read() -> dict[str, set[str]]:
    """{variable: the files that read it}."""
    found: dict[str, set[str]] = {}

    def scan(paths, pattern):
        for path in paths:
            for name in pattern.findall(path.read_text(encoding="utf-8")):
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))

    scan((ROOT / "kvgguf").rglob("*.py"), PY_LITERAL)
    native = [p for ext in ("c", "h", "cu", "cuh", "cpp") for p in (ROOT / "native").rglob(f"*.{ext}")]
    scan((p for p in native if "tests" not in p.relative_to(ROOT).parts), NATIVE_READ)
    scan([ROOT / "CMakeLists.txt", *(ROOT / "cmake").glob("*.cmake")], CMAKE_READ)
    return found


def documented() -> set[str]:
    text = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(KVGGUF_[A-Z0-9_]+)` \|", section, flags=re.MULTILINE))


def test_the_scan_finds_what_the_package_reads():
    found = variables_read()
    # one of each kind of read, so that a scan that finds nothing cannot pass the test below
    assert "kvgguf/installer.py" in found["KVGGUF_KV_CODEC"]
    assert "native/cuda/kvg_cuda_store.c" in found["KVGGUF_CUDA_GRAPHS"]
    assert "cmake/llama_source.cmake" in found["KVGGUF_LLAMA_SDIST"]


def test_every_variable_read_is_documented_and_every_documented_one_is_read():
    found, listed = variables_read(), documented()
    missing = {name: sorted(where) for name, where in found.items() if name not in listed}
    assert not missing, f"read but not in docs/install.md's table: {missing}"
    assert listed <= set(found), f"in docs/install.md's table but read nowhere: {sorted(listed - set(found))}"


def test_the_files_the_sanitizers_run_exist():
    from helpers import sanitized_files

    listed = sanitized_files()
    assert len(listed) >= 5 and all(path.is_file() for path in listed), listed
