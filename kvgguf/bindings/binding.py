"""Loads libkvgguf with cffi (ABI mode) and turns its status codes into exceptions.

The cdef is not a copy: it is the region between ``// cffi-begin`` and ``// cffi-end`` of the
installed public header ``kvgguf/include/kvgguf.h``, so Python and C cannot drift apart.

Environment overrides (full paths to the files):

- ``KVGGUF_LIB``: the shared library (default ``kvgguf/lib/libkvgguf.so`` in the package,
  ``.dylib`` on macOS, ``.dll`` on Windows);
- ``KVGGUF_HEADER``: the header (default ``kvgguf/include/kvgguf.h`` in the package).

:func:`get_ffi` and :func:`get_lib` load the library on first use and cache it; loading checks
that the library's ABI version (``kvg_abi_version()``) is the header's ``KVG_ABI_VERSION``.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

from ..files import installed_file

__all__ = [
    "KvgError",
    "KvgValueError",
    "KvgCorruptError",
    "KvgMemoryError",
    "KvgUnsupportedError",
    "KvgLoadError",
    "check",
    "get_ffi",
    "get_lib",
    "header_path",
    "library_path",
    "cdef_source",
]

LIB_ENV = "KVGGUF_LIB"
HEADER_ENV = "KVGGUF_HEADER"
_CDEF_BEGIN = "// cffi-begin"
_CDEF_END = "// cffi-end"

if sys.platform == "darwin":
    _LIB_NAMES = ("libkvgguf.dylib", "libkvgguf.so")
elif sys.platform == "win32":
    _LIB_NAMES = ("kvgguf.dll", "libkvgguf.dll")
else:
    _LIB_NAMES = ("libkvgguf.so",)


class KvgLoadError(ImportError):
    """The native library or its header could not be found or loaded."""


class KvgError(RuntimeError):
    """A libkvgguf call failed; ``status`` is its KVG_ERR_* code."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


class KvgValueError(KvgError, ValueError):
    """Bad argument, shape, buffer size, NaN/Inf or out-of-f16-range input, or unknown codec."""


class KvgCorruptError(KvgError):
    """Encoded bytes that no encoder writes (e.g. a NaN or negative stored norm or scale)."""


class KvgMemoryError(KvgError, MemoryError):
    """The native library could not allocate memory."""


class KvgUnsupportedError(KvgError):
    """The requested SIMD level is not supported by this CPU or build."""


# KVG_ERR_* values (enum kvg_status in kvgguf.h); test_native_header checks them against C.
_STATUS_CLASS = {
    -1: KvgValueError,  # INVALID_ARG
    -2: KvgValueError,  # UNKNOWN_CODEC
    -3: KvgValueError,  # SHAPE
    -4: KvgValueError,  # BUFFER_SIZE
    -5: KvgValueError,  # NONFINITE
    -6: KvgCorruptError,  # CORRUPT
    -7: KvgMemoryError,  # NO_MEMORY
    -8: KvgValueError,  # RANGE
    -9: KvgUnsupportedError,  # UNSUPPORTED
}

_lock = threading.Lock()
_ffi = None
_lib = None


def _package_file(*parts: str) -> Path:
    return installed_file(*parts)


def header_path() -> Path:
    """The kvgguf.h whose cffi region is the cdef (``KVGGUF_HEADER`` overrides)."""
    override = os.environ.get(HEADER_ENV)
    if override:
        return Path(override)
    return _package_file("include", "kvgguf.h")


def library_path() -> Path:
    """The libkvgguf file to load (``KVGGUF_LIB`` overrides)."""
    override = os.environ.get(LIB_ENV)
    if override:
        return Path(override)
    lib_dir = _package_file("lib")
    for name in _LIB_NAMES:
        candidate = lib_dir / name
        if candidate.exists():
            return candidate
    return lib_dir / _LIB_NAMES[0]


def cdef_source(path: Path | None = None) -> str:
    """The declarations between ``// cffi-begin`` and ``// cffi-end`` of the header."""
    path = header_path() if path is None else Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise KvgLoadError(
            f"kvgguf's C header is not readable at {path} ({e.strerror}); reinstall kvgguf "
            f"or set {HEADER_ENV} to the full path of kvgguf.h"
        ) from e
    return "".join(marked_regions(text, _CDEF_BEGIN, _CDEF_END, str(path)))


def marked_regions(text: str, begin: str, end: str, where: str) -> list[str]:
    """The text between each line that holds `begin` and the next `end`, in order (the marker
    lines left out): what a header gives cffi (kvgguf.h's one region, kvg_cuda.h's several)."""
    parts, pos = [], 0
    while (b := text.find(begin, pos)) >= 0:
        start = text.find("\n", b) + 1
        e = text.find(end, start)
        if start == 0 or e < 0:
            raise KvgLoadError(f"{where}: a '{begin}' without its '{end}'")
        parts.append(text[start:e])
        pos = e + len(end)
    if not parts:
        raise KvgLoadError(f"{where} has no '{begin}' ... '{end}' region to give cffi")
    return parts


def _load():
    global _ffi, _lib
    with _lock:
        if _lib is not None:
            return _ffi, _lib
        from cffi import FFI

        ffi = FFI()
        ffi.cdef(cdef_source())
        path = library_path()
        if not path.exists():
            raise KvgLoadError(
                f"kvgguf's native library is not at {path}; build and install kvgguf "
                f"(pip install .) or set {LIB_ENV} to the full path of {_LIB_NAMES[0]}"
            )
        try:
            lib = ffi.dlopen(str(path))
        except OSError as e:
            raise KvgLoadError(
                f"cannot load kvgguf's native library {path} (set by {LIB_ENV} or the package): {e}"
            ) from e
        _check_abi(lib, path)
        _ffi, _lib = ffi, lib
        return ffi, lib


def _check_abi(lib, path: Path) -> None:
    """The library must be built from the header whose declarations cffi just parsed: a call
    through a declaration that no longer matches would pass wrong arguments, not raise."""
    expected = int(lib.KVG_ABI_VERSION)  # from the header
    try:
        built = int(lib.kvg_abi_version())
    except AttributeError:  # a library from before kvg_abi_version existed
        built = None
    if built != expected:
        raise KvgLoadError(
            f"kvgguf's native library {path} was built for ABI version {built if built is not None else '1 or older'}, "
            f"but the header {header_path()} declares ABI version {expected}; reinstall kvgguf "
            f"(pip install .) or point {LIB_ENV} and {HEADER_ENV} at a library and header built together"
        )


def get_ffi():
    """The cffi FFI holding kvgguf.h's declarations (loads the library on first use)."""
    return _load()[0]


def get_lib():
    """The loaded libkvgguf (cached)."""
    return _load()[1]


def error_message(status: int) -> str:
    """kvg_last_error() of this thread if set, else kvg_strerror(status)."""
    ffi, lib = _load()
    detail = ffi.string(lib.kvg_last_error()).decode("utf-8", "replace")
    return detail or ffi.string(lib.kvg_strerror(status)).decode("utf-8", "replace")


def check(status: int, context: str | None = None) -> int:
    """Returns status if it is KVG_OK (0), else raises the matching KvgError subclass.

    The message is the library's detail for this thread's last failure (or kvg_strerror),
    followed by ``context`` in parentheses when given. Call it right after the failing call,
    on the same thread.
    """
    if status == 0:
        return status
    message = error_message(status)
    if context:
        message = f"{message} ({context})"
    cls = _STATUS_CLASS.get(status, KvgError)
    raise cls(message, status)
