"""Saving and restoring one Llama's whole KV cache as a .kvz session.

What a session holds, section by section (container.py frames them):

    META  JSON: model fingerprint, mode ("stock" or "tiered"), token count, compressed-row
          blocks and the runs of them a context shift or a budget moved ({layer: [[r0, r1,
          shift], ...]}: keys rotated at row + shift; format version 2), codecs and their
          parameters, the layout of llama.cpp's cache records
    TOKS  the token ids (int32)
    CELL  llama.cpp's cell records (positions), verbatim
    BOOK  (only where the store holds pq2, vq8, vq8f or wfq rows) their codebooks and plans: per
          (layer, kind, codec) a record <IIII> (layer, kind, codec number, floats) and the
          float32 values
    Lnnn  per model layer nnn: K then V, each = the store's compressed blocks (as held, not
          re-encoded) + the rows llama.cpp holds exactly, encoded with the session codec
          (f16 when exact: bit for bit; a codec with a book writes the book fitted on those
          rows before their codes) or kept raw for quantized llama.cpp cache types

Restoring checks and decodes everything into new objects first, then swaps them in; if
llama.cpp still refuses, the previous state is put back. A bad file never half-applies.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass
from typing import Optional

import llama_cpp.llama_cpp as C
import numpy as np

from ..errors import SessionCorruptError, SessionError, SessionMismatchError, SessionVersionError
from ..llamacpp import hooks, seq_state, state_format
from . import q8_0
from ..model.shape import KVShape
from ..bindings import codecs
from ..bindings.binding import KvgError
from ..enums import Kind
from ..bindings.store import EncodedBlock, KVStore
from ..policy import codec_spec
from ..policy.codec_spec import CodecSpec
from ..policy.tiered import type_name
from ..runtime.live_cache import LiveCache
from . import container
from .fingerprint import ModelFingerprint

FORMAT = "kvgguf-session"
SEQ = 0
RAW = 0xFF  # hot rows kept as llama.cpp's bytes (quantized cache types)
_BLOCK = struct.Struct("<IBBHQ")  # n_rows, codec, tier, 0, n_bytes
_BOOK = struct.Struct("<IIII")  # layer, kind, codec, floats
_HOT = struct.Struct("<iIII")  # ggml type, n_rows, row bytes, segments
_SEGMENT = struct.Struct("<IBBHQ")  # n_rows, codec (or RAW), flags (SEG_BOOK), 0, n_bytes
# A segment of a codec with a book (wfq's plan, pq2's codebook) starts with the book fitted on
# its own rows (float32, codecs.book_shape), then the codes: the exact rows of a session have
# no store list whose book they could share.
SEG_BOOK = 1
SINKS = 4  # first positions kept exact in every session (attention sinks)
# Keeping the newest positions exact too was measured and dropped: on SmolLM2 at 600 tokens,
# 128 exact recent rows moved KL from 0.030 to 0.026 for 60% more bytes.


@dataclass(frozen=True)
class SessionInfo:
    """What a save wrote or a load restored."""

    n_tokens: int
    n_cold: int  # tokens that were in the store (cold rows: f16 sinks and compressed tiers)
    file_bytes: int
    codec: str  # the codec of the rows llama.cpp held exactly
    app: Optional[dict] = None  # what the application stored with it (the chat: its messages)


# --- save ----------------------------------------------------------------------------------


@dataclass
class LiveContext:
    """What a session reads from and restores into, handed over by the facade (kvgguf.Llama):
    the session code never reaches into a Llama's private fields."""

    ctx: object  # llama_context_p
    kv: Optional[LiveCache]  # the tiered cache; None for llama.cpp's own cache
    shape: KVShape
    fingerprint: ModelFingerprint
    tokens: np.ndarray  # the token ids in context (a copy)
    n_ctx: int  # the logical context
    n_vocab: int


def dump(
    live: LiveContext,
    *,
    codec: Optional[CodecSpec] = None,
    exact: bool = False,
    entropy: bool = True,
    app: Optional[dict] = None,
) -> tuple[bytes, SessionInfo]:
    """The .kvz bytes of a context (whose cache holds exactly its tokens)."""
    kv, shape, fp, ctx = live.kv, live.shape, live.fingerprint, live.ctx
    if exact:
        codec = "f16"
    elif codec is None:
        codec = kv.config.warm if kv is not None else DEFAULT_STOCK_CODEC
        if kv is None and codec_spec.unfit(codec, shape.n_layer, range(shape.n_layer), shape.head_dim):
            codec = ANY_HEAD_DIM_STOCK_CODEC
    n_tokens = len(live.tokens)
    layers_of_cache = state_format.cache_layers(ctx, shape.n_layer, hooks.layer_info)
    caches = state_format.parse(_seq_state(ctx), layers_of_cache)
    store = kv.store if kv is not None else None
    n_cold = kv.n_cold if kv is not None else 0
    _check_positions(caches, n_cold, n_tokens)
    choice = codec_spec.choice(codec, shape.n_layer)
    described = codec_spec.describe(choice)

    hot_rows, sink_rows = {}, {}
    for c in caches:
        n_sink = _sink_rows(c.cells)
        for layer in c.layers:
            hot_rows[layer.il], sink_rows[layer.il] = layer, n_sink
    cold_layers = list(kv.layers) if kv is not None and n_cold else []
    meta = {
        "format": FORMAT,
        "fingerprint": fp.to_json(),
        "mode": "tiered" if kv is not None else "stock",
        "n_tokens": n_tokens,
        "n_cold": n_cold,
        "blocks": [[b.r0, b.r1, b.tier] for b in kv.blocks] if kv is not None else [],
        "shifts": {str(il): [list(r) for r in runs] for il in cold_layers if (runs := store.shifts(il))},
        "cold_layers": cold_layers,
        "store": {"group_size": store.group_size, "seed": str(store.seed)} if store else None,
        "codec": described,
        # the layers of each cache record even when it holds no cells (an empty context)
        "caches": [
            {"n_cells": c.n_cells, "v_trans": c.v_trans, "layers": layers} for c, layers in zip(caches, layers_of_cache)
        ],
        "config": _jsonable(asdict(kv.config)) if kv is not None else None,
        "app": app,
    }
    params = {"group_size": store.group_size, "seed": store.seed} if store else {}
    sections = [
        (b"META", json.dumps(meta, sort_keys=True).encode()),
        (b"TOKS", np.asarray(live.tokens, dtype="<i4").tobytes()),
        (b"CELL", b"".join(c.cells for c in caches)),
    ]
    books = store.books() if store is not None and cold_layers else []
    if books:
        sections.append(
            (
                b"BOOK",
                b"".join(
                    _BOOK.pack(il, kind, codecs.get(name).type, bk.size) + bk.astype("<f4").tobytes()
                    for il, kind, name, bk in books
                ),
            )
        )
    for il in sorted(set(hot_rows) | set(cold_layers)):
        parts = [struct.pack("<I", il)]
        for kind in Kind:
            blocks = store.blocks(il, kind) if il in cold_layers else []
            parts.append(struct.pack("<I", len(blocks)))
            for b in blocks:
                parts += [_BLOCK.pack(b.n_rows, codecs.get(b.codec).type, b.tier, 0, len(b.data)), b.data]
            parts.append(
                _encode_hot(hot_rows.get(il), kind, shape, codecs.get(choice[il, kind], **params), sink_rows.get(il, 0))
            )
        sections.append((f"L{il:03d}".encode(), b"".join(parts)))
    data = container.pack(sections, entropy=entropy)
    return data, SessionInfo(n_tokens, n_cold, len(data), described, app)


def _jsonable(value):
    """A config as JSON can sort it: a per-layer codec spec is keyed by layer numbers and
    "default" (json.dumps(sort_keys=True) cannot order int and str keys), so keys become str."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# Measured (benchmarks/sessions.py, SmolLM2 2K): keys need the 4th bit far more than values.
DEFAULT_STOCK_CODEC = ("rotq4", "rotq3")
# Where rotations cannot take the head dim (not a power of two): KIVI, at 4 bits.
ANY_HEAD_DIM_STOCK_CODEC = "kivi4"


def _seq_state(ctx) -> bytes:
    return seq_state.read(ctx)


def _check_positions(caches, n_cold: int, n_tokens: int) -> None:
    """The full-attention cache must hold exactly positions [n_cold, n_tokens)."""
    pos = state_format.cell_records(caches[0].cells)[:, 0]
    if not np.array_equal(np.sort(pos), np.arange(n_cold, n_tokens)):
        raise SessionError(
            f"llama.cpp's cache holds positions other than [{n_cold}, {n_tokens}): the context was "
            f"changed behind kvgguf.Llama's back (or a sequence other than 0 is in use)"
        )


def _sink_rows(cells: bytes) -> int:
    """Leading rows (cell order) that hold the attention sinks (positions < SINKS), kept exact
    in the file; only where llama.cpp holds the rows in position order (it does after
    kvgguf's compaction), else 0."""
    pos = state_format.cell_records(cells)[:, 0]
    if np.any(np.diff(pos) <= 0):
        return 0
    return int(np.searchsorted(pos, SINKS))


def _encode_hot(layer: Optional[state_format.LayerRows], kind: int, shape: KVShape, codec, n_sink: int) -> bytes:
    """Exact rows of one layer and kind: ggml type, count, row bytes, then segments (the
    attention sinks in f16, the rest with codec; q8_0 cells: the sinks raw, the rest dequantized
    and coded, quantized back when restored; exact sessions and other quantized types raw)."""
    if layer is None:
        return b"\x00"
    ggml_type, rows = (layer.k_type, layer.k) if kind == Kind.K else (layer.v_type, layer.v)
    n, row_bytes = rows.shape
    segments = []
    q8 = ggml_type == q8_0.GGML_Q8_0 and codec.name != "f16"  # exact sessions keep q8_0 cells raw
    if q8 and n_sink:  # the sinks as llama.cpp holds them
        segments.append((n_sink, RAW, 0, rows[:n_sink].tobytes()))
    if ggml_type in (state_format.GGML_F16, state_format.GGML_F32) or q8:
        if q8:  # the rest as values, in the session's codec; restored, quantized back to q8_0
            x = q8_0.dequantize(rows, shape.width(layer.il, kind))
        else:
            x = rows.view(np.float16 if ggml_type == state_format.GGML_F16 else np.float32).astype(np.float32)
        x = x.reshape(n, shape.kv_heads(layer.il), shape.head_dim(layer.il, kind))
        f16 = codecs.get("f16")
        sinks = x[:0] if q8 else x[:n_sink]  # q8_0 sinks went in raw above
        for c, part in ((f16, sinks), (codec, x[n_sink:])):
            if len(part) and c.name in codecs.BOOK_CODECS:
                book = codecs.train_book(c.name, part, Kind(kind).letter, seed=c.seed)
                c = codecs.get(c.name, group_size=c.group_size, seed=c.seed, book=book)
                data = book.astype("<f4").tobytes() + c.encode(part, kind).tobytes()
                segments.append((len(part), c.type, SEG_BOOK, data))
            elif len(part):
                segments.append((len(part), c.type, 0, c.encode(part, kind).tobytes()))
    elif n:
        segments.append((n, RAW, 0, rows.tobytes()))
    out = [b"\x01", _HOT.pack(ggml_type, n, row_bytes, len(segments))]
    for n_rows, codec_id, flags, data in segments:
        out += [_SEGMENT.pack(n_rows, codec_id, flags, 0, len(data)), data]
    return b"".join(out)


# --- load ----------------------------------------------------------------------------------


@dataclass
class _Restored:
    meta: dict
    tokens: np.ndarray
    state: bytes  # for llama_state_seq_set_data
    store: Optional[KVStore]
    blocks: list  # (r0, r1, tier) of the store's blocks


def _json(payload: bytes) -> dict:
    try:
        meta = json.loads(payload.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SessionCorruptError("session metadata is not JSON") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise SessionCorruptError("session metadata is not a kvgguf session's")
    return meta


def _field(meta: dict, key: str, kind, check=lambda v: True):
    v = meta.get(key)
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool or not check(v):
        raise SessionCorruptError(f"session metadata field {key!r} is missing or impossible")
    return v


def parse(live: LiveContext, data: bytes) -> _Restored:
    """Checks a session against a context and decodes it into new objects; changes nothing."""
    sections = container.unpack(data)
    tags = [t for t, _ in sections]
    if tags[:3] != [b"META", b"TOKS", b"CELL"]:
        raise SessionCorruptError("a session starts with META, TOKS and CELL sections")
    meta = _json(sections[0][1])
    ModelFingerprint.from_json(meta.get("fingerprint")).require_same(live.fingerprint)
    mode = _field(meta, "mode", str, lambda v: v in ("stock", "tiered"))
    live_mode = "tiered" if live.kv is not None else "stock"
    if mode != live_mode:
        raise SessionMismatchError(
            f"the session was saved from a Llama with {'a kv_codec' if mode == 'tiered' else 'kv_codec=None'}; "
            f"load it into one with {'a kv_codec' if mode == 'tiered' else 'kv_codec=None'}"
        )
    n_tokens = _field(meta, "n_tokens", int, lambda v: v >= 0)
    n_cold = _field(meta, "n_cold", int, lambda v: 0 <= v <= n_tokens)
    _field(meta, "codec", str)
    if n_tokens > live.n_ctx:
        raise SessionMismatchError(f"the session holds {n_tokens} tokens; this Llama's n_ctx is {live.n_ctx}")
    if len(sections[1][1]) % 4:
        raise SessionCorruptError("the session's token section is not a whole number of int32 ids")
    tokens = np.frombuffer(sections[1][1], dtype="<i4")
    if len(tokens) != n_tokens or (n_tokens and (tokens.min() < 0 or tokens.max() >= live.n_vocab)):
        raise SessionCorruptError("the session's token ids do not match its metadata or the vocabulary")

    shape = live.shape
    layers_of_cache = state_format.cache_layers(live.ctx, shape.n_layer, hooks.layer_info)
    caches = _caches_from_meta(meta, layers_of_cache, sections[2][1])
    _check_positions(caches, n_cold, n_tokens)
    hot_n = n_tokens - n_cold
    if hot_n > C.llama_n_ctx(live.ctx):
        raise SessionMismatchError(
            f"the session's {hot_n} exact rows do not fit this Llama's llama.cpp cache "
            f"({C.llama_n_ctx(live.ctx)} cells): use the hot window it was saved with"
        )
    store, blocks = _new_store(live.kv, meta, shape, n_cold) if mode == "tiered" else (None, [])
    cold_layers = set(meta.get("cold_layers") or []) if n_cold else set()
    hot_of = {il: c for c, layers in zip(caches, layers_of_cache) if c.n_cells for il in layers}
    expect = sorted(set(hot_of) | cold_layers)
    first = 3
    if tags[3:4] == [b"BOOK"]:
        if store is None:
            raise SessionCorruptError("a session without compressed rows holds codebooks")
        _read_books(sections[3][1], store)
        first = 4
    got = [t for t in tags[first:]]
    if got != [f"L{il:03d}".encode() for il in expect]:
        raise SessionCorruptError("the session's layer sections do not match its metadata")
    params = {"group_size": store.group_size, "seed": store.seed} if store else {}
    for (tag, payload), il in zip(sections[first:], expect):
        try:
            _read_layer(payload, il, il in cold_layers, store, hot_of.get(il), shape, params, n_cold)
        except KvgError as e:  # the codecs refuse bytes no encoder writes, or sizes that do not fit
            raise SessionCorruptError(f"layer {il}: {e}") from None
    if store is not None:
        _read_shifts(meta, store, cold_layers)
    elif meta.get("shifts"):
        raise SessionCorruptError("a session without compressed rows lists moved ones")
    _check_cell_types(caches, live.ctx)
    state = state_format.build(caches)
    return _Restored(meta, tokens.astype(np.intc), state, store, [tuple(b) for b in blocks])


def _read_shifts(meta: dict, store: KVStore, cold_layers: set) -> None:
    """Gives the restored blocks the shifts the session lists (none in a version 1 file)."""
    shifts = meta.get("shifts", {})
    if not isinstance(shifts, dict):
        raise SessionCorruptError("session metadata field 'shifts' is not a mapping")
    for key, runs in shifts.items():
        if not key.isdigit() or int(key) not in cold_layers or not isinstance(runs, list):
            raise SessionCorruptError(f"session metadata lists moved rows of layer {key!r}, which holds none")
        for run in runs:
            if not isinstance(run, list) or len(run) != 3 or not all(type(x) is int for x in run):
                raise SessionCorruptError(f"layer {key}: a moved run is not [r0, r1, shift]")
            r0, r1, shift = run
            if not (0 <= r0 < r1 and shift != 0 and -(2**31) <= shift < 2**31):
                raise SessionCorruptError(f"layer {key}: moved run {run} is out of range")
            try:
                store.set_shift(int(key), r0, r1, shift)
            except KvgError as e:
                raise SessionCorruptError(f"layer {key}: moved run {run}: {e}") from None


def _check_cell_types(caches: list[state_format.CacheState], ctx) -> None:
    """llama.cpp takes a state only in its cells' own types: a session whose cells were saved in
    another type (TieredConfig.window, .hot_cells) is refused, naming both."""
    for c in caches:
        for layer in c.layers:
            held = hooks.cells_of(ctx, layer.il)
            saved = (layer.k_type, layer.v_type)
            if held is not None and saved != held[:2]:
                said, holds = ("/".join(dict.fromkeys(str(type_name(t)) for t in ts)) for ts in (saved, held[:2]))
                raise SessionMismatchError(
                    f"layer {layer.il}'s cells were saved in {said} and this Llama holds them in {holds}: open it "
                    f"with the cell types it was saved with (a kv_codec's ':window=TYPE' and ':hot=TYPE')"
                )


def _caches_from_meta(meta: dict, layers_of_cache, cells: bytes) -> list[state_format.CacheState]:
    described = meta.get("caches")
    if not isinstance(described, list) or len(described) != len(layers_of_cache):
        raise SessionMismatchError("the session's llama.cpp cache layout differs from this model's")
    caches, off = [], 0
    for d, layers in zip(described, layers_of_cache):
        if not isinstance(d, dict) or d.get("layers") != layers:
            raise SessionMismatchError("the session's llama.cpp cache layout differs from this model's")
        n = _field(d, "n_cells", int, lambda v: v >= 0)
        v_trans = _field(d, "v_trans", bool)
        size = 12 * n
        if off + size > len(cells):
            raise SessionCorruptError("the session's cell records are shorter than its metadata says")
        rec = state_format.cell_records(cells[off : off + size])
        if n and (np.any(rec[:, 1] != 1) or np.any(rec[:, 2] != 0)):
            raise SessionCorruptError("the session's cell records are not sequence 0's")
        caches.append(state_format.CacheState(cells[off : off + size], n, v_trans, []))
        off += size
    if off != len(cells):
        raise SessionCorruptError("the session's cell records are longer than its metadata says")
    return caches


def _new_store(kv: LiveCache, meta: dict, shape: KVShape, n_cold: int):
    params = meta.get("store")
    if not isinstance(params, dict):
        raise SessionCorruptError("a tiered session without store parameters")
    group_size = _field(params, "group_size", int, lambda v: 0 < v < 2**31)
    seed = _field(params, "seed", str, lambda v: v.isdigit() and int(v) < 2**64)
    store = KVStore(
        shape.n_layer, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v, group_size=group_size, seed=int(seed)
    )
    live_layers = list(kv.layers)
    for il in range(shape.n_layer):
        if il not in live_layers:
            store.set_layer_enabled(il, False)
    if n_cold and meta.get("cold_layers") != live_layers:
        raise SessionMismatchError("the session compresses other layers than this Llama does")
    blocks = meta.get("blocks")
    if not isinstance(blocks, list):
        raise SessionCorruptError("session metadata field 'blocks' is missing")
    end = 0
    for b in blocks:
        if (
            not isinstance(b, list)
            or len(b) != 3
            or not all(type(x) is int for x in b)
            or b[0] != end
            or b[1] <= b[0]
            or b[2] not in (0, 1, 2)
        ):
            raise SessionCorruptError("session block list is not contiguous from row 0")
        end = b[1]
    if end != n_cold:
        raise SessionCorruptError("session block list does not cover its compressed rows")
    return store, blocks


def _read_books(payload: bytes, store: KVStore) -> None:
    """Installs the BOOK section's codebooks in the new store (before any block needs them)."""
    names, off = codecs.names(), 0
    while off < len(payload):
        if off + _BOOK.size > len(payload):
            raise SessionCorruptError("the codebook section ends early")
        il, kind, codec_id, n = _BOOK.unpack_from(payload, off)
        off += _BOOK.size
        if codec_id >= len(names) or names[codec_id] not in codecs.BOOK_CODECS or kind > Kind.V or il >= store.n_layer:
            raise SessionCorruptError(f"codebook record ({il}, {kind}, codec {codec_id}) names no codebook")
        if off + 4 * n > len(payload):
            raise SessionCorruptError("the codebook section ends early")
        book = np.frombuffer(payload, dtype="<f4", count=n, offset=off).astype(np.float32)
        off += 4 * n
        try:
            store.set_book(il, kind, names[codec_id], book)
        except KvgError as e:
            raise SessionCorruptError(f"codebook of layer {il}: {e}") from None


def _read_layer(payload: bytes, il: int, has_cold: bool, store, cache, shape, params: dict, n_cold: int) -> None:
    view, off = memoryview(payload), 0

    def take(n: int) -> memoryview:
        nonlocal off
        if n < 0 or off + n > len(view):
            raise SessionCorruptError(f"layer {il}'s section ends early")
        off += n
        return view[off - n : off]

    if struct.unpack("<I", take(4))[0] != il:
        raise SessionCorruptError(f"section of layer {il} names another layer")
    names = codecs.names()
    for kind in Kind:
        (n_blocks,) = struct.unpack("<I", take(4))
        if n_blocks and not has_cold:
            raise SessionCorruptError(f"layer {il} holds compressed rows the metadata does not list")
        for _ in range(n_blocks):
            n_rows, codec_id, tier, _z, n_bytes = _BLOCK.unpack(take(_BLOCK.size))
            if codec_id >= len(names):
                raise SessionVersionError(f"layer {il}: codec number {codec_id} is unknown to this kvgguf")
            store.append_encoded(il, kind, EncodedBlock(n_rows, names[codec_id], tier, bytes(take(n_bytes))))
        if has_cold and store.n_rows(il, kind) != n_cold:
            raise SessionCorruptError(f"layer {il} holds {store.n_rows(il, kind)} compressed rows, not {n_cold}")
        (has_hot,) = take(1)
        if bool(has_hot) != (cache is not None) or has_hot > 1:
            raise SessionCorruptError(f"layer {il}'s exact rows do not match the cache layout")
        if has_hot:
            _read_hot(take, il, kind, cache, shape, params)
    if off != len(view):
        raise SessionCorruptError(f"layer {il}'s section has trailing bytes")


def _read_hot(take, il: int, kind: int, cache, shape: KVShape, params: dict) -> None:
    ggml_type, n, row_bytes, n_segments = _HOT.unpack(take(_HOT.size))
    if n != cache.n_cells or n_segments > n:
        raise SessionCorruptError(f"layer {il} holds {n} exact rows in {n_segments} parts, the cache {cache.n_cells}")
    width = shape.width(il, kind)
    el = {state_format.GGML_F16: 2, state_format.GGML_F32: 4}.get(ggml_type)
    names = codecs.names()
    parts = []
    for _ in range(n_segments):
        n_rows, codec_id, flags, _zero, n_bytes = _SEGMENT.unpack(take(_SEGMENT.size))
        data = take(n_bytes)
        if n_rows == 0 or n_rows > n:
            raise SessionCorruptError(f"layer {il}: a part of {n_rows} exact rows")
        if flags not in (0, SEG_BOOK) or (flags == SEG_BOOK) != (
            codec_id < len(names) and names[codec_id] in codecs.BOOK_CODECS
        ):
            raise SessionCorruptError(f"layer {il}: a part of codec {codec_id} with flags {flags}")
        if codec_id == RAW:
            if n_bytes != n_rows * row_bytes:
                raise SessionCorruptError(f"layer {il}: raw rows of the wrong size")
            parts.append(np.frombuffer(data, dtype=np.uint8).reshape(n_rows, row_bytes))
            continue
        if codec_id >= len(names):
            raise SessionVersionError(f"layer {il}: codec number {codec_id} is unknown to this kvgguf")
        q8 = ggml_type == q8_0.GGML_Q8_0 and row_bytes == q8_0.row_bytes(width)
        if not q8 and (el is None or row_bytes != width * el):
            raise SessionCorruptError(f"layer {il}: exact rows of an impossible type or width")
        rows_shape = (n_rows, shape.kv_heads(il), shape.head_dim(il, kind))
        book = None
        if flags == SEG_BOOK:
            book_shape = codecs.book_shape(names[codec_id], rows_shape[1], rows_shape[2])
            n_book = int(np.prod(book_shape)) * 4
            if n_book > len(data):
                raise SessionCorruptError(f"layer {il}: a part shorter than its {names[codec_id]} book")
            book = np.frombuffer(data, dtype="<f4", count=n_book // 4).astype(np.float32).reshape(book_shape)
            data = data[n_book:]
        x = codecs.get(names[codec_id], **params, book=book).decode(data, rows_shape, kind).reshape(n_rows, width)
        parts.append(q8_0.quantize(x) if q8 else x.astype(np.float16 if el == 2 else np.float32).view(np.uint8))
    rows = np.concatenate(parts) if parts else np.empty((0, row_bytes), np.uint8)
    if rows.shape != (n, row_bytes):
        raise SessionCorruptError(f"layer {il}: its parts hold {rows.shape[0]} rows, not {n}")
    layer = next((l for l in cache.layers if l.il == il), None)
    if layer is None:
        layer = state_format.LayerRows(il, 0, np.empty((0, 0), np.uint8), 0, np.empty((0, 0), np.uint8))
        cache.layers.append(layer)
    if kind == Kind.K:
        layer.k_type, layer.k = ggml_type, rows
    else:
        layer.v_type, layer.v = ggml_type, rows


def apply(live: LiveContext, restored: _Restored) -> None:
    """Swaps a parsed session's cache rows into the context; puts the previous rows back if
    llama.cpp refuses. The caller then takes restored.tokens as the context's tokens."""
    kv = live.kv
    before = _seq_state(live.ctx)
    old_store = kv.snapshot() if kv is not None else None
    try:
        if kv is not None:
            kv.adopt(restored.store, restored.blocks, len(restored.tokens), exact=restored.meta["codec"] == "f16")
        _set_seq_state(live.ctx, restored.state)
    except BaseException:
        if kv is not None:
            kv.restore(old_store)
        _set_seq_state(live.ctx, before)
        raise


def _set_seq_state(ctx, state: bytes) -> None:
    if not seq_state.write(ctx, state):
        raise SessionMismatchError("llama.cpp refused the session's cache rows (its cache is too small?)")
