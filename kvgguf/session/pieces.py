"""A .kvz cut into a skeleton and one piece per block of compressed tokens, so that a shared
store keeps the blocks that several cached prompts hold once.

A tiered session's compressed rows are the store's blocks as held: block j covers the same
tokens in every layer and kind (meta "blocks"). Piece j is block j's bytes of every layer and
kind, in section order; the skeleton is the session with those bytes left out (the block
headers, which give their lengths, stay) and a PIEC section naming the pieces by their SHA-256.
Two prompts that share a document share its blocks byte for byte when one was restored from
the other's entry (the blocks are adopted as held), or prefilled in the same ubatches.

join() checks each piece against its digest and puts the session back together; a session
without compressed blocks (llama.cpp's own cache) is its own skeleton with no pieces.
"""

from __future__ import annotations

import hashlib
import json
import struct

from ..errors import SessionCorruptError
from . import container
from .session import _BLOCK, _HOT, _SEGMENT

PIECES = b"PIEC"
_DIGEST = 32  # bytes of SHA-256


def digest(piece: bytes) -> bytes:
    return hashlib.sha256(piece).digest()


def split(data: bytes) -> tuple[bytes, list[bytes]]:
    """(skeleton, pieces) of a .kvz (its checksums checked); a session whose layers do not all
    hold the same blocks is kept whole (no pieces)."""
    sections = container.unpack(data)
    meta = json.loads(sections[0][1])
    n_blocks = len(meta.get("blocks") or [])
    if not n_blocks:
        return data, []
    pieces: list[list[bytes]] = [[] for _ in range(n_blocks)]
    out = []
    for tag, payload in sections:
        if tag[:1] == b"L":
            stripped = _walk_layer(payload, lambda j, block: pieces[j].append(block), n_blocks)
            if stripped is None:
                return data, []
            payload = stripped
        out.append((tag, payload))
    joined = [b"".join(p) for p in pieces]
    if not any(joined):
        return data, []
    out.append((PIECES, b"".join(digest(p) for p in joined)))
    return container.pack(out, entropy=True), joined


def digests(skeleton: bytes) -> list[bytes]:
    """The digests of the pieces a skeleton names, in order (none for a whole session)."""
    return names(container.unpack(skeleton))


def names(sections: list[tuple[bytes, bytes]]) -> list[bytes]:
    """digests() of a skeleton already unpacked (a shared cache unpacks it once per hit)."""
    listed = dict(sections).get(PIECES, b"")
    if len(listed) % _DIGEST:
        raise SessionCorruptError("the piece list is not a whole number of digests")
    return [listed[i : i + _DIGEST] for i in range(0, len(listed), _DIGEST)]


def join(skeleton: bytes, pieces: list[bytes]) -> bytes:
    """The .kvz that split() cut into skeleton and pieces; SessionCorruptError if a piece is
    not the one the skeleton names or the lengths do not add up."""
    sections = container.unpack(skeleton)
    if not sections or sections[-1][0] != PIECES:
        return skeleton  # a whole session
    return join_sections(sections, pieces)


def join_sections(sections: list[tuple[bytes, bytes]], pieces: list[bytes]) -> bytes:
    """join() of a skeleton already unpacked, whose last section names its pieces."""
    if not sections or sections[-1][0] != PIECES:
        raise SessionCorruptError("the cached session's piece list is not its last section")
    named = names(sections)
    if len(named) != len(pieces) or any(digest(p) != d for p, d in zip(pieces, named)):
        raise SessionCorruptError("a piece of the cached session is not the one its skeleton names")
    cursor = [0] * len(pieces)

    def take(j: int, n: int) -> bytes:
        if cursor[j] + n > len(pieces[j]):
            raise SessionCorruptError(f"piece {j} is shorter than its blocks")
        cursor[j] += n
        return pieces[j][cursor[j] - n : cursor[j]]

    out = []
    for tag, payload in sections[:-1]:
        if tag[:1] == b"L":
            payload = _fill_layer(payload, take, len(pieces))
        out.append((tag, payload))
    if cursor != [len(p) for p in pieces]:
        raise SessionCorruptError("a piece is longer than its blocks")
    return container.pack(out, entropy=False)


def _walk_layer(payload: bytes, keep, n_blocks: int):
    """The layer section without its blocks' bytes (keep(j, bytes) receives block j's), or
    None when this layer holds some blocks but not n_blocks of them."""
    view, off, out = memoryview(payload), 4, [payload[:4]]
    for _kind in range(2):
        (n,) = struct.unpack_from("<I", view, off)
        if n not in (0, n_blocks):
            return None
        out.append(payload[off : off + 4])
        off += 4
        for j in range(n):
            head = payload[off : off + _BLOCK.size]
            n_bytes = _BLOCK.unpack(head)[4]
            out.append(head)
            keep(j, payload[off + _BLOCK.size : off + _BLOCK.size + n_bytes])
            off += _BLOCK.size + n_bytes
        end = _hot_end(view, off)
        out.append(payload[off:end])
        off = end
    return b"".join(out)


def _fill_layer(payload: bytes, take, n_pieces: int) -> bytes:
    view, off, out = memoryview(payload), 4, [payload[:4]]
    try:
        for _kind in range(2):
            (n,) = struct.unpack_from("<I", view, off)
            if n not in (0, n_pieces):
                raise SessionCorruptError("a layer of the cached session holds another number of blocks")
            out.append(payload[off : off + 4])
            off += 4
            for j in range(n):
                head = payload[off : off + _BLOCK.size]
                out += [head, take(j, _BLOCK.unpack(head)[4])]
                off += _BLOCK.size
            end = _hot_end(view, off)
            out.append(payload[off:end])
            off = end
    except (struct.error, IndexError):
        raise SessionCorruptError("a layer of the cached session ends early") from None
    if off != len(payload):
        raise SessionCorruptError("a layer of the cached session has trailing bytes")
    return b"".join(out)


def _hot_end(view: memoryview, off: int) -> int:
    """Where the exact rows that start at off end (session._encode_hot's layout)."""
    if view[off] == 0:
        return off + 1
    n_segments = _HOT.unpack_from(view, off + 1)[3]
    off += 1 + _HOT.size
    for _ in range(n_segments):
        off += _SEGMENT.size + _SEGMENT.unpack_from(view, off)[4]
    return off
