"""The .kvz container: a header, then sections, each with its own CRC-32.

    header   magic "KVGGUFZ\\0" | u32 format version | u32 section count | u32 crc32(the 16 bytes before)
    section  tag (4 ASCII bytes) | u32 flags | u64 stored length | u64 raw length | u32 crc32 | payload

A section's CRC covers its tag, flags, lengths and stored payload, so a flipped byte anywhere
is caught before any payload is interpreted. Flag bit 0: the payload is one zstd frame that
inflates to exactly raw length bytes. Nothing may follow the last section.
"""

from __future__ import annotations

import io
import struct
import zlib
from typing import Iterable, Union

import zstandard

from ..errors import SessionCorruptError, SessionVersionError

MAGIC = b"KVGGUFZ\x00"
FORMAT_VERSION = 2  # what this kvgguf writes; 2 lists the runs of moved rows (session.py)
READS = (1, 2)  # what it reads: a version 1 file has no moved rows
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
    if version not in READS:
        raise SessionVersionError(
            f"session format version {version}; this kvgguf reads versions {', '.join(map(str, READS))}"
        )
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
