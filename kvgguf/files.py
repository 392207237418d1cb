"""Files written whole or not at all (sessions, prompt caches, calibrations), and the files the
build installed beside the package (its libraries and header).

Imports nothing from kvgguf: every layer that writes a file uses it.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import tempfile
from pathlib import Path
from typing import Union


def installed_file(*parts: str) -> Path:
    """A file the build installed into the package (``lib``, ``include``). A regular install has
    one package folder; an editable one (``pip install -e .``) has two, the installed files in
    site-packages and the Python sources in the checkout: the first folder that holds the file
    wins, else the path in the first folder (for the caller's message)."""
    spec = importlib.util.find_spec("kvgguf")
    folders = list(spec.submodule_search_locations or []) if spec else []
    candidates = [Path(folder).joinpath(*parts) for folder in folders] or [Path(__file__).parent.joinpath(*parts)]
    return next((c for c in candidates if c.exists()), candidates[0])


def write_atomic(path: Union[str, os.PathLike], data: bytes) -> None:
    """Writes data to path through a temporary file in the same folder and a rename, so a crash
    leaves either the old file or the new one under that name, never a part of one.

    Only files: a target that exists and is not a regular file (a device such as /dev/null, a
    folder, a pipe) is refused, since the rename would replace it. A symbolic link is followed
    (the file it names is replaced, the link stays). The new file gets the mode an existing one
    had, else 0o666 less the umask, as open() would give. Errors name the path given, never the
    temporary file."""
    shown = os.fspath(path)
    if not shown:
        raise ValueError("the file path is empty: name a file to write")
    path = Path(os.path.realpath(shown))
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise _naming(e, shown) from None
    if mode is not None and not stat.S_ISREG(mode):
        raise ValueError(
            f"{shown} exists and is not a regular file (a device, folder or pipe): "
            f"kvgguf writes only files; name another path"
        )
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _naming(e, shown) from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), stat.S_IMODE(mode) if mode is not None else 0o666 & ~_umask())
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):
            raise _naming(e, shown) from None
        raise


def _naming(e: OSError, path: str) -> OSError:
    """The same error (errno, type) about the path the caller gave."""
    return type(e)(e.errno, e.strerror, path) if e.errno is not None else e


def _umask() -> int:
    """The process's umask, read without changing it where Linux tells it (os.umask can only be
    read by setting it, which other threads would see)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
