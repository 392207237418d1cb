"""Scalar metadata of a GGUF file, read without loading weights (GGUF v2/v3 layout).

Reading only what the cache policy needs (architecture, sliding window) before llama.cpp
builds its context; arrays (the tokenizer's vocabulary) are skipped, not decoded.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from pathlib import Path
from typing import Union

_SCALARS = {  # GGUF value type -> struct format
    0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d",
}
_STRING, _ARRAY = 8, 9


class GGUFError(ValueError):
    """The file is not a GGUF file kvgguf can read."""


def _read(f, n: int) -> bytes:
    b = f.read(n)
    if len(b) != n:
        raise GGUFError("file ends inside its metadata (truncated?)")
    return b


def _u64(f) -> int:
    return struct.unpack("<Q", _read(f, 8))[0]


def _string(f) -> str:
    n = _u64(f)
    if n > 1 << 24:
        raise GGUFError(f"metadata string of {n} bytes (corrupt?)")
    return _read(f, n).decode("utf-8", "replace")


def _skip_value(f, vtype: int) -> None:
    if vtype in _SCALARS:
        f.seek(struct.calcsize("<" + _SCALARS[vtype]), 1)
    elif vtype == _STRING:
        f.seek(_u64(f), 1)
    elif vtype == _ARRAY:
        etype, n = struct.unpack("<IQ", _read(f, 12))
        if etype in _SCALARS:
            f.seek(n * struct.calcsize("<" + _SCALARS[etype]), 1)
        else:
            for _ in range(n):
                _skip_value(f, etype)
    else:
        raise GGUFError(f"unknown GGUF value type {vtype}")


def read_metadata(path: Union[str, Path]) -> dict:
    """Scalar and string key/values of a GGUF file's header (arrays are left out)."""
    out = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        version, _n_tensors, n_kv = struct.unpack("<IQQ", _read(f, 20))
        if version not in (2, 3):
            raise GGUFError(f"{path}: GGUF version {version} is not supported")
        for _ in range(n_kv):
            key = _string(f)
            (vtype,) = struct.unpack("<I", _read(f, 4))
            if vtype in _SCALARS:
                fmt = "<" + _SCALARS[vtype]
                out[key] = struct.unpack(fmt, _read(f, struct.calcsize(fmt)))[0]
            elif vtype == _STRING:
                out[key] = _string(f)
            else:
                _skip_value(f, vtype)
    return out


def metadata_digests(path: Union[str, Path]) -> tuple[str, str]:
    """SHA-256 of a GGUF file's whole metadata section (every key/value as stored) and of its
    tokenizer.* entries alone: what a session file's model fingerprint compares."""
    meta, tok = hashlib.sha256(), hashlib.sha256()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file")
        buf = memoryview(m)
        try:
            version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
            if version not in (2, 3):
                raise GGUFError(f"{path}: GGUF version {version} is not supported")
            off = 24
            for _ in range(n_kv):
                start = off
                (n,) = struct.unpack_from("<Q", buf, off)
                key = bytes(buf[off + 8 : off + 8 + n])
                (vtype,) = struct.unpack_from("<I", buf, off + 8 + n)
                off = _value_end(buf, off + 12 + n, vtype)
                meta.update(buf[start:off])
                if key.startswith(b"tokenizer."):
                    tok.update(buf[start:off])
        except struct.error:
            raise GGUFError(f"{path} ends inside its metadata (truncated?)") from None
        finally:
            del buf
    return meta.hexdigest(), tok.hexdigest()


def _value_end(buf: memoryview, off: int, vtype: int) -> int:
    if vtype in _SCALARS:
        return off + struct.calcsize("<" + _SCALARS[vtype])
    if vtype == _STRING:
        return off + 8 + struct.unpack_from("<Q", buf, off)[0]
    if vtype == _ARRAY:
        etype, n = struct.unpack_from("<IQ", buf, off)
        off += 12
        if etype in _SCALARS:
            return off + n * struct.calcsize("<" + _SCALARS[etype])
        for _ in range(n):
            off = _value_end(buf, off, etype)
        return off
    raise GGUFError(f"unknown GGUF value type {vtype}")
