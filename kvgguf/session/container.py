"""The .kvz container: a header, then sections, each with its own CRC-32.

    header   magic "KVGGUFZ\\0" | u32 format version | u32 section count | u32 crc32(the 16 bytes before)
    section  tag (4 ASCII bytes) | u32 flags | u64 stored length | u64 raw length | u32 crc32 | payload

A section's CRC covers its tag, flags, lengths and stored payload, so a flipped byte anywhere
is caught before any payload is interpreted. Flag bit 0: the payload is one zstd frame that
inflates to exactly raw length bytes. Nothing may follow the last section.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import tempfile
import zlib
from pathlib import Path
from typing import Iterable, Union

import zstandard

from ..errors import SessionCorruptError, SessionVersionError

MAGIC = b"KVGGUFZ\x00"
FORMAT_VERSION = 1
FLAG_ZSTD = 1
ZSTD_LEVEL = 3  # measured: higher levels gain <1% on codes and cost several times the time

_HEADER = struct.Struct("<8sII")
_SECTION = struct.Struct("<4sIQQ")
_CRC = struct.Struct("<I")
_MAX_SECTIONS = 1 << 16
_MAX_RAW = 1 << 36  # 64 GiB: no section of a real session comes near; guards absurd lengths


def pack(sections: Iterable[tuple[bytes, bytes]], *, entropy: bool) -> bytes:
    """The container bytes for (tag, payload) pairs; entropy=True zstd-codes each payload
    (kept raw where zstd would not make it smaller)."""
    sections = list(sections)
    out = io.BytesIO()
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, len(sections))
    out.write(head + _CRC.pack(zlib.crc32(head)))
    cctx = zstandard.ZstdCompressor(level=ZSTD_LEVEL) if entropy else None
    for tag, payload in sections:
        if len(tag) != 4:
            raise ValueError(f"section tag {tag!r} is not 4 bytes")
        stored, flags = payload, 0
        if cctx is not None and payload:
            z = cctx.compress(payload)
            if len(z) < len(payload):
                stored, flags = z, FLAG_ZSTD
        fields = _SECTION.pack(tag, flags, len(stored), len(payload))
        out.write(fields + _CRC.pack(zlib.crc32(stored, zlib.crc32(fields))))
        out.write(stored)
    return out.getvalue()


def unpack(data: Union[bytes, bytearray, memoryview]) -> list[tuple[bytes, bytes]]:
    """The (tag, payload) pairs of a container; SessionCorruptError / SessionVersionError
    for anything kvgguf did not write."""
    view = memoryview(data)
    if len(view) < _HEADER.size + 4:
        raise SessionCorruptError(f"{len(view)} bytes: too short for a kvgguf session header")
    magic, version, n_sections = _HEADER.unpack_from(view, 0)
    if magic != MAGIC:
        raise SessionCorruptError("not a kvgguf session file (bad magic)")
    (crc,) = _CRC.unpack_from(view, _HEADER.size)
    if crc != zlib.crc32(view[: _HEADER.size]):
        raise SessionCorruptError("session header checksum mismatch")
    if version != FORMAT_VERSION:
        raise SessionVersionError(f"session format version {version}; this kvgguf reads version {FORMAT_VERSION}")
    if n_sections > _MAX_SECTIONS:
        raise SessionCorruptError(f"header claims {n_sections} sections")
    off = _HEADER.size + 4
    out = []
    for i in range(n_sections):
        if off + _SECTION.size + 4 > len(view):
            raise SessionCorruptError(f"file ends in the header of section {i + 1} of {n_sections} (truncated)")
        tag, flags, n_stored, n_raw = _SECTION.unpack_from(view, off)
        (crc,) = _CRC.unpack_from(view, off + _SECTION.size)
        start = off + _SECTION.size + 4
        if n_stored > len(view) - start:
            raise SessionCorruptError(f"file ends inside section {i + 1} of {n_sections} (truncated)")
        stored = view[start : start + n_stored]
        if crc != zlib.crc32(stored, zlib.crc32(view[off : off + _SECTION.size])):
            raise SessionCorruptError(f"checksum mismatch in section {i + 1} of {n_sections}")
        if flags & ~FLAG_ZSTD or n_raw > _MAX_RAW or (not flags and n_raw != n_stored):
            raise SessionCorruptError(f"section {i + 1} has impossible flags or lengths")
        payload = _inflate(stored, n_raw) if flags & FLAG_ZSTD else bytes(stored)
        out.append((bytes(tag), payload))
        off = start + n_stored
    if off != len(view):
        raise SessionCorruptError(f"{len(view) - off} unexpected bytes after the last section")
    return out


def _inflate(stored: memoryview, n_raw: int) -> bytes:
    """Inflates one zstd frame, reading no more than n_raw + 1 bytes (no decompression bomb)."""
    out = bytearray()
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(stored), read_across_frames=False) as r:
            while len(out) <= n_raw:
                chunk = r.read(min(1 << 20, n_raw + 1 - len(out)))
                if not chunk:
                    break
                out += chunk
    except zstandard.ZstdError as e:
        raise SessionCorruptError(f"a compressed section does not inflate: {e}") from None
    if len(out) != n_raw:
        raise SessionCorruptError(f"a compressed section inflates to {len(out)} bytes, not {n_raw}")
    return bytes(out)


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
