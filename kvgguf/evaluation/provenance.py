"""What produced a result: the kvgguf checkout and the installed kvgguf, the llama.cpp build, the
machine and the threads. `kvgguf eval` and the benchmark scripts (benchmarks/common.py) record it
in every result JSON; benchmarks/readme_sections.py prints provenance_line under each table."""

from __future__ import annotations

import datetime
import importlib.metadata
import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Optional

# The llama.cpp commit each llama-cpp-python release vendors (kvgguf's patches/ target it); a
# version not listed records None rather than a guess.
LLAMA_CPP_COMMITS = {"0.3.36": "0c1e570"}


def default_checkout() -> Path:
    """The git checkout kvgguf's Python files come from (an editable install), else the folder
    the command runs in."""
    source = Path(importlib.util.find_spec("kvgguf").origin).resolve().parent.parent
    return source if (source / ".git").exists() else Path.cwd()


def _git(checkout: Path, *args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def checkout_state(checkout: Path) -> dict:
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


def installed_kvgguf_matches(checkout: Path) -> Optional[bool]:
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


def provenance(threads: Optional[int] = None, checkout: Optional[Path] = None) -> dict:
    """What produced a result: the kvgguf checkout and the installed kvgguf, the llama.cpp build,
    the machine, the threads the benchmark ran with, when (UTC, as it is written). Never raises
    for a missing piece: that piece is None."""
    checkout = default_checkout() if checkout is None else Path(checkout)
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
    """One italic line for under a table: commit, llama.cpp build, machine, threads. A result
    written before results recorded this is marked `"recorded": false`, with the commit that
    last changed it (it was measured there or before, on a machine not recorded)."""
    if p.get("recorded") is False:
        return f"_provenance not recorded: committed in {p.get('committed_in')} on {p.get('committed_on')}_"
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
