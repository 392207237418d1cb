"""What the benchmark scripts share: their common options, where and how they write a result,
its provenance, markdown tables and the measuring helpers.

Every result JSON written through write_json carries a "provenance" key (provenance() below): the
kvgguf commit and whether the tree had uncommitted changes, the llama.cpp build, the machine and
the threads, so that a figure can be traced to what produced it. benchmarks/readme_sections.py
prints it under each table it copies (provenance_line).

The scripts import it as `from common import ...`: Python puts a script's own folder first on
sys.path; tests put benchmarks/ there themselves.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

# The llama.cpp commit each llama-cpp-python release vendors (kvgguf's patches/ target it); a
# version not listed records None rather than a guess.
LLAMA_CPP_COMMITS = {"0.3.36": "0c1e570"}


# --- options --------------------------------------------------------------------------------------


def add_threads_option(parser: argparse.ArgumentParser, default: int = 2) -> None:
    parser.add_argument(
        "-t", "--threads", type=int, default=default, help="threads for llama.cpp (default: %(default)s)"
    )


def add_out_option(
    parser: argparse.ArgumentParser, default: Optional[Path] = None, writes: str = ".json and .md"
) -> None:
    """--out: a path without suffix, to which the result files' suffixes are appended (see
    result_path); required where there is no default."""
    parser.add_argument(
        "--out",
        type=Path,
        default=default,
        required=default is None,
        help=f"path without suffix for the {writes}" + (" (default: %(default)s)" if default else ""),
    )


def command(script: str, argv: Optional[Sequence[str]] = None, python: bool = False) -> str:
    """The command line a result quotes: `benchmarks/NAME.py ARGS` (ARGS: sys.argv[1:] when argv
    is None), after `.venv/bin/python` when `python`."""
    words = [f"benchmarks/{Path(script).name}", *(sys.argv[1:] if argv is None else argv)]
    return " ".join([".venv/bin/python", *words] if python else words)


# --- results --------------------------------------------------------------------------------------


def result_path(out: Path, suffix: str) -> Path:
    """out with suffix appended; not Path.with_suffix, which would cut a name at its last dot."""
    return out.parent / (out.name + suffix)


def write_json(path: Path, result: dict, threads: Optional[int], indent: int = 1) -> dict:
    """Writes result with its provenance (taken now) under "provenance"; returns what it wrote."""
    written = {**result, "provenance": provenance(threads)}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(written, indent=indent) + "\n")
    return written


def write_result(out: Path, result: dict, md: str, threads: Optional[int], indent: int = 1) -> dict:
    """OUT.json (write_json) and OUT.md; returns the JSON's content."""
    written = write_json(result_path(out, ".json"), result, threads, indent)
    result_path(out, ".md").write_text(md)
    return written


def markdown_table(header: Sequence, rows: Iterable[Sequence], align: Union[str, Sequence[str]] = "---") -> str:
    """A markdown table: header, the alignment row (one of "---", "---:" for every column, or one
    per column), then rows. Cells stand between single spaces; an empty cell is one space."""
    aligns = [align] * len(header) if isinstance(align, str) else list(align)

    def line(cells: Sequence) -> str:
        return "|" + "|".join(f" {c} " if c != "" else " " for c in cells) + "|"

    return "\n".join([line(header), "|" + "|".join(aligns) + "|", *(line(r) for r in rows)])


# --- provenance -----------------------------------------------------------------------------------


def _git(checkout: Path, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def checkout_state(checkout: Path = ROOT) -> dict:
    """The commit checked out at `checkout` and the tracked files that differ from it (results
    excluded: a benchmark rewriting its own result file does not make the tree dirty); None for
    both outside a git checkout of that folder (a copy without .git, git missing)."""
    none = {"commit": None, "dirty": None, "changed_files": None}
    top = _git(checkout, "rev-parse", "--show-toplevel")
    if top is None or Path(top.strip()).resolve() != checkout.resolve():  # not a checkout, or one around it
        return none
    commit = _git(checkout, "rev-parse", "--verify", "HEAD")
    status = _git(checkout, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)benchmarks/results")
    if commit is None or status is None:
        return none
    changed = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": commit.strip(), "dirty": bool(changed), "changed_files": changed}


def installed_kvgguf_matches(checkout: Path = ROOT) -> Optional[bool]:
    """Whether the kvgguf that imports is the checkout's: the same Python files, byte for byte
    (`pip install .` copies them, so a checkout edited since runs the older copy). The compiled
    libraries are not compared. None when either side is missing."""
    spec = importlib.util.find_spec("kvgguf")
    source = checkout / "kvgguf"
    if spec is None or spec.origin is None or not source.is_dir():
        return None
    installed = Path(spec.origin).resolve().parent
    if installed == source.resolve():
        return True
    ours = {p.relative_to(source) for p in source.rglob("*.py")}
    theirs = {p.relative_to(installed) for p in installed.rglob("*.py")}
    return ours == theirs and all((source / p).read_bytes() == (installed / p).read_bytes() for p in ours)


def llama_build() -> dict:
    """llama-cpp-python's version, the llama.cpp commit it vendors and the kvgguf patch version
    compiled into the libllama that loads (None where it does not load)."""
    try:
        version = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        version = None
    try:
        import kvgguf

        patches, kvgguf_version = kvgguf.llama_patch_version(), kvgguf.__version__
    except (ImportError, OSError):
        patches, kvgguf_version = None, None
    return {
        "kvgguf_version": kvgguf_version,
        "llama_cpp_python": version,
        "llama_cpp_commit": LLAMA_CPP_COMMITS.get(version),
        "kvgguf_patch_version": patches,
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()  # other systems, and ARM's /proc/cpuinfo


def gpu_names() -> Optional[str]:
    """The NVIDIA GPUs nvidia-smi lists (comma-separated), or None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    return ", ".join(names) if out.returncode == 0 and names else None


def provenance(threads: Optional[int] = None, checkout: Path = ROOT) -> dict:
    """What produced a result: the kvgguf checkout and the installed kvgguf, the llama.cpp build,
    the machine, the threads the benchmark ran with, when (UTC, as it is written). Never raises
    for a missing piece: that piece is None."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        **checkout_state(checkout),
        "installed_kvgguf_matches_checkout": installed_kvgguf_matches(checkout),
        **llama_build(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": usable,
        "threads": threads,
        "gpu": gpu_names(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def provenance_line(p: dict) -> str:
    """One italic line for under a table: commit, llama.cpp build, machine, threads."""
    if p.get("commit"):
        where = f"measured at {p['commit'][:7]} ({'uncommitted changes' if p.get('dirty') else 'clean'})"
    else:
        where = "measured outside a git checkout"
    if p.get("date"):
        where += f" on {p['date'][:10]}"
    parts = [where]
    if p.get("installed_kvgguf_matches_checkout") is False:
        parts.append("installed kvgguf differs from the checkout")
    if p.get("llama_cpp_commit"):
        build = f"llama.cpp {p['llama_cpp_commit']}"
    else:
        build = f"llama-cpp-python {p.get('llama_cpp_python')}"
    if p.get("kvgguf_patch_version") is not None:
        build += f" + kvgguf patches v{p['kvgguf_patch_version']}"
    parts.append(build)
    parts.append(p.get("cpu") or "unknown CPU")
    if p.get("gpu"):
        parts.append(p["gpu"])
    cores, usable = p.get("cores"), p.get("cores_usable")
    parts.append(f"{usable} of {cores} cores" if usable and cores and usable != cores else f"{cores} cores")
    if p.get("threads") is not None:
        parts.append(f"{p['threads']} thread{'s' if p['threads'] != 1 else ''}")
    return "_" + ", ".join(parts) + "_"


# --- measuring ------------------------------------------------------------------------------------


def rss_bytes(pid: Union[int, str] = "self") -> int:
    """Resident memory of a process (this one by default), from /proc/PID/statm."""
    with open(f"/proc/{pid}/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def busy_cpus(seconds: float = 1.0) -> float:
    """CPUs busy with other work over the next second (from /proc/stat; the load average would
    still count the previous configuration's own run)."""

    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait

    t0, i0 = sample()
    time.sleep(seconds)
    t1, i1 = sample()
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(t1 - t0, 1))


def best_of(fn: Callable[[], object], repeat: int, warm_up: bool = True, before: Optional[Callable] = None) -> float:
    """Fastest of `repeat` timed calls of fn, in seconds: this machine's speed drifts, and the
    fastest call is the one least disturbed. One untimed call first when warm_up; `before`
    runs untimed ahead of each timed call (to reset what the call changes)."""
    if warm_up:
        fn()
    best = float("inf")
    for _ in range(repeat):
        if before is not None:
            before()
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def progress(message: str, stream=None) -> None:
    """A line of progress with the time of day, on stderr unless told otherwise."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=stream or sys.stderr, flush=True)
