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
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterable, Optional, Sequence, Union

from kvgguf.evaluation import provenance as _provenance
from kvgguf.evaluation.provenance import (  # noqa: F401 (the benchmarks' names for them)
    LLAMA_CPP_COMMITS,
    cpu_model,
    gpu_names,
    llama_build,
    provenance_line,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


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
    """The command line a result quotes: the script's path in the checkout (`benchmarks/NAME.py`,
    or `scripts/NAME.py` for one outside benchmarks/) and ARGS (sys.argv[1:] when argv is None),
    after `.venv/bin/python` when `python`."""
    path = Path(script).resolve()
    where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else f"benchmarks/{path.name}"
    words = [where, *(sys.argv[1:] if argv is None else argv)]
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


# --- provenance (kvgguf/evaluation/provenance.py, which kvgguf eval's results record too) ----------


def checkout_state(checkout: Path = ROOT) -> dict:
    return _provenance.checkout_state(checkout)


def installed_kvgguf_matches(checkout: Path = ROOT) -> Optional[bool]:
    return _provenance.installed_kvgguf_matches(checkout)


def provenance(threads: Optional[int] = None, checkout: Path = ROOT) -> dict:
    """kvgguf.evaluation.provenance.provenance for this checkout of the benchmarks."""
    return _provenance.provenance(threads, checkout)


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
