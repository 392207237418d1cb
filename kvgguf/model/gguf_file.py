"""The one reader of GGUF metadata in kvgguf (GGUF v2/v3), without loading weights.

It walks the key/value section of the memory-mapped file once per call: scalars and strings
are decoded, arrays (the tokenizer's vocabulary) are skipped unless asked for, and each record's
raw bytes are available for hashing. The ``gguf`` package's GGUFReader was measured for this and
refused: it makes a numpy memmap view of every array element (about 4 million on Gemma-3's
262,144-token vocabulary), 5.7-6.0 s per read on SmolLM2 and 23 s on Gemma-3 (2 idle cores),
where this walk takes 0.05 s and 0.14 s, and a Llama reads the metadata each time it is built.
Its records span the same bytes: metadata_digests over GGUFReader's fields (from field.offset to
the end of its last part) gave the same two digests on both models.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from pathlib import Path
from typing import Iterator, Union

_SCALARS = {  # GGUF value type -> struct format
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_STRING, _ARRAY = 8, 9
_MAX_STRING = 1 << 24  # a metadata string longer than 16 MiB is a corrupt length


class GGUFError(ValueError):
    """The file is not a GGUF file kvgguf can read."""


def _value_end(buf, off: int, vtype: int) -> int:
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


def _records(path, buf) -> Iterator[tuple[str, int, int, int, int]]:
    """(key, value type, record start, value start, record end) of every metadata entry."""
    if bytes(buf[:4]) != b"GGUF":
        raise GGUFError(f"{path} is not a GGUF file")
    version, _n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise GGUFError(f"{path}: GGUF version {version} is not supported")
    off = 24
    for _ in range(n_kv):
        start = off
        (n,) = struct.unpack_from("<Q", buf, off)
        if n > _MAX_STRING:
            raise GGUFError(f"{path}: metadata key of {n} bytes (corrupt?)")
        key = bytes(buf[off + 8 : off + 8 + n]).decode("utf-8", "replace")
        (vtype,) = struct.unpack_from("<I", buf, off + 8 + n)
        value = off + 12 + n
        off = _value_end(buf, value, vtype)
        if off > len(buf):
            raise struct.error("past the end")
        yield key, vtype, start, value, off


def _walk(path: Union[str, Path], visit) -> None:
    """Calls visit(key, vtype, buf, start, value, end) for every entry of the mapped file."""
    with open(path, "rb") as f:
        try:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file cannot be mapped
            raise GGUFError(f"{path} is not a GGUF file (it is empty)") from None
        with m:  # read through the mmap itself: a memoryview left in a traceback would keep it open
            try:
                if len(m) < 24:
                    raise GGUFError(f"{path} is not a GGUF file (shorter than its header)")
                for key, vtype, start, value, end in _records(path, m):
                    visit(key, vtype, m, start, value, end)
            except struct.error:
                raise GGUFError(f"{path} ends inside its metadata (truncated?)") from None


def read_metadata(path: Union[str, Path], *, max_array: int = 0) -> dict:
    """Scalar and string key/values of a GGUF file's header. Arrays are left out, except arrays
    of scalars of at most max_array elements (per-layer settings), which come as lists."""
    out = {}

    def visit(key, vtype, buf, _start, value, end):
        if vtype in _SCALARS:
            out[key] = struct.unpack_from("<" + _SCALARS[vtype], buf, value)[0]
        elif vtype == _ARRAY:
            etype, n = struct.unpack_from("<IQ", buf, value)
            if etype in _SCALARS and n <= max_array:
                out[key] = list(struct.unpack_from(f"<{n}{_SCALARS[etype]}", buf, value + 12))
        elif vtype == _STRING:
            if end - value - 8 > _MAX_STRING:
                raise GGUFError(f"{path}: metadata string of {end - value - 8} bytes (corrupt?)")
            out[key] = bytes(buf[value + 8 : end]).decode("utf-8", "replace")

    _walk(path, visit)
    return out


def metadata_digests(path: Union[str, Path]) -> tuple[str, str]:
    """SHA-256 of a GGUF file's whole metadata section (every key/value as stored) and of its
    tokenizer.* entries alone: what a session file's model fingerprint compares."""
    meta, tok = hashlib.sha256(), hashlib.sha256()

    def visit(key, _vtype, buf, start, _value, end):
        meta.update(buf[start:end])
        if key.startswith("tokenizer."):
            tok.update(buf[start:end])

    _walk(path, visit)
    return meta.hexdigest(), tok.hexdigest()
