"""The native store of compressed K/V rows (native/src/store/store.c), seen from Python."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..enums import Kind, Tier
from . import codecs
from .binding import check, get_ffi, get_lib

_ALL_TIERS = len(Tier)  # KVG_TIER_COUNT: kvg_store_bytes over every tier
MASS_ROWS = 64  # KVG_MASS_ROWS: rows per attention-mass counter (tests check the header agrees)


@dataclass(frozen=True)
class TierBytes:
    bytes: int  # encoded rows held (codes, scales, zero points, norms)
    values: int  # K/V values those bytes stand for


@dataclass(frozen=True)
class EncodedBlock:
    n_rows: int
    codec: str
    tier: int
    data: bytes


class KVStore:
    """Compressed rows [0, n_rows) of one sequence, per layer and kind, in blocks and tiers."""

    def __init__(
        self,
        n_layer: int,
        n_head_kv: int,
        head_dim_k: int,
        head_dim_v: int,
        *,
        group_size: int = 32,
        seed: int | None = None,
    ):
        ffi, lib = get_ffi(), get_lib()
        params = ffi.new("kvg_store_params *")
        lib.kvg_store_default_params(params)
        params.n_layer, params.n_head_kv = n_layer, n_head_kv
        params.head_dim_k, params.head_dim_v = head_dim_k, head_dim_v
        params.codec.group_size = group_size
        if seed is not None:
            params.codec.seed = seed
        out = ffi.new("kvg_store **")
        check(lib.kvg_store_init(params, out), "kvg_store_init")
        self._ptr = ffi.gc(out[0], lib.kvg_store_free)
        self.n_layer, self.n_head_kv = n_layer, n_head_kv
        self.head_dim = (head_dim_k, head_dim_v)
        self.group_size, self.seed = group_size, int(params.codec.seed)

    @property
    def address(self) -> int:
        """The kvg_store pointer, for llama.cpp's hooks (valid while this object lives)."""
        return int(get_ffi().cast("uintptr_t", self._ptr))

    def width(self, kind: int) -> int:
        return self.n_head_kv * self.head_dim[kind]

    def set_layer_enabled(self, il: int, enabled: bool) -> None:
        check(get_lib().kvg_store_set_layer_enabled(self._ptr, il, int(enabled)), f"layer {il}")

    def set_threads(self, n_threads: int) -> None:
        """Threads a retier (aging) may re-encode lists on at once, 1 to 64: the same bytes
        whatever the count, each list coded by one thread."""
        check(get_lib().kvg_store_set_threads(self._ptr, int(n_threads)), "set_threads")

    def append(self, il: int, kind: int, tier: int, codec: str, rows: np.ndarray) -> None:
        rows = np.ascontiguousarray(rows, dtype=np.float32)
        n_rows = rows.shape[0]
        codec_type = codecs.get(codec).type
        ffi = get_ffi()
        check(
            get_lib().kvg_store_append(
                self._ptr, il, kind, tier, codec_type, ffi.from_buffer("float[]", rows), rows.size, n_rows
            ),
            f"append {n_rows} rows to layer {il} {'KV'[kind]} as {codec}",
        )

    def append_encoded(self, il: int, kind: int, block: "EncodedBlock") -> None:
        """Appends a block's encoded bytes as they are (checked to decode before it is linked)."""
        ffi = get_ffi()
        check(
            get_lib().kvg_store_append_encoded(
                self._ptr,
                il,
                kind,
                block.tier,
                codecs.get(block.codec).type,
                block.n_rows,
                ffi.from_buffer(block.data),
                len(block.data),
            ),
            f"encoded block of {block.n_rows} rows for layer {il} {'KV'[kind]}",
        )

    def blocks(self, il: int, kind: int, r0: int = 0, r1: int | None = None) -> list["EncodedBlock"]:
        """The blocks of (il, kind) that start in rows [r0, r1) (default: all), in row order,
        with copies of their encoded bytes."""
        ffi, lib = get_ffi(), get_lib()
        n = ffi.new("int64_t *")
        check(lib.kvg_store_n_blocks(self._ptr, il, kind, n))
        info = ffi.new("kvg_block_info *")

        def row0(bi: int) -> int:
            check(lib.kvg_store_block(self._ptr, il, kind, bi, info, ffi.NULL, 0))
            return int(info.row0)

        lo, hi = 0, int(n[0])  # the first block starting at r0 or later, by bisection (blocks are in row order)
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if row0(mid) < r0 else (lo, mid)
        out = []
        for bi in range(lo, int(n[0])):
            if r1 is not None and row0(bi) >= r1:
                break
            check(lib.kvg_store_block(self._ptr, il, kind, bi, info, ffi.NULL, 0))
            data = bytearray(info.n_bytes)
            check(lib.kvg_store_block(self._ptr, il, kind, bi, info, ffi.from_buffer(data), len(data)))
            codec = codecs.names()[info.codec]
            out.append(EncodedBlock(int(info.n_rows), codec, int(info.tier), bytes(data)))
        return out

    def copy_blocks(self, r0: int, r1: int) -> bytes:
        """Every list's blocks that start in rows [r0, r1), encoded bytes and all, in one buffer
        (kvg_store_copy_blocks) that append_blocks takes back."""
        ffi, lib = get_ffi(), get_lib()
        size = ffi.new("size_t *")
        check(lib.kvg_store_copy_blocks(self._ptr, r0, r1, ffi.NULL, 0, size), f"copy blocks of rows [{r0}, {r1})")
        data = bytearray(size[0])
        check(
            lib.kvg_store_copy_blocks(self._ptr, r0, r1, ffi.from_buffer(data), len(data), size),
            f"copy blocks of rows [{r0}, {r1})",
        )
        return bytes(data)

    def append_blocks(self, data: bytes) -> None:
        """Appends what copy_blocks returned, each block at the end of its list: all or none."""
        check(get_lib().kvg_store_append_blocks(self._ptr, get_ffi().from_buffer(data), len(data)), "append blocks")

    def codecs_held(self, il: int, kind: int) -> dict[int, set[str]]:
        """{tier: names of the codecs its blocks of (il, kind) hold} (block infos only, no bytes)."""
        ffi, lib = get_ffi(), get_lib()
        n = ffi.new("int64_t *")
        check(lib.kvg_store_n_blocks(self._ptr, il, kind, n))
        info, names, out = ffi.new("kvg_block_info *"), codecs.names(), {}
        for bi in range(int(n[0])):
            check(lib.kvg_store_block(self._ptr, il, kind, bi, info, ffi.NULL, 0))
            out.setdefault(int(info.tier), set()).add(names[info.codec])
        return out

    def book(self, il: int, kind: int, codec: str) -> np.ndarray | None:
        """A copy of the book (codecs.book_shape) that codec's blocks of (il, kind) are coded
        with; None until the store has trained one (on the first block it encodes there)."""
        ffi, lib = get_ffi(), get_lib()
        c, n = codecs.get(codec), ffi.new("size_t *")
        check(lib.kvg_store_book(self._ptr, il, kind, c.type, ffi.NULL, 0, n), f"codebook of layer {il} {'KV'[kind]}")
        if not n[0]:
            return None
        out = np.empty(int(n[0]), dtype=np.float32)
        check(
            lib.kvg_store_book(
                self._ptr, il, kind, c.type, ffi.from_buffer("float[]", out, require_writable=True), out.size, n
            )
        )
        return out.reshape(codecs.book_shape(codec, self.n_head_kv, self.head_dim[kind]))

    def set_book(self, il: int, kind: int, codec: str, book: np.ndarray) -> None:
        """Installs a codebook (a session's) before any block of that codec is appended there."""
        book = np.ascontiguousarray(book, dtype=np.float32)
        check(
            get_lib().kvg_store_set_book(
                self._ptr, il, kind, codecs.get(codec).type, get_ffi().from_buffer("float[]", book), book.size
            ),
            f"{codec} codebook for layer {il} {'KV'[kind]}",
        )

    def books(self) -> list[tuple[int, int, str, np.ndarray]]:
        """Every book held: (layer, kind, codec, book). None for a codec that cannot take the
        list's head dim (the store refuses the question)."""
        fits = {
            (kind, name): codecs.fits(name, self.head_dim[kind], kind) for kind in Kind for name in codecs.BOOK_CODECS
        }
        return [
            (il, kind, name, bk)
            for il in range(self.n_layer)
            for kind in Kind
            for name in codecs.BOOK_CODECS
            if fits[kind, name] and (bk := self.book(il, kind, name)) is not None
        ]

    def book_bytes(self) -> int:
        """Bytes of the codebooks held (float32, as allocated): part of what pq2/vq8 rows cost."""
        out = get_ffi().new("uint64_t *")
        check(get_lib().kvg_store_book_bytes(self._ptr, out))
        return int(out[0])

    def n_rows(self, il: int = 0, kind: int = Kind.K) -> int:
        out = get_ffi().new("int64_t *")
        check(get_lib().kvg_store_n_rows(self._ptr, il, kind, out))
        return int(out[0])

    def decode(self, il: int, kind: int, r0: int, r1: int) -> np.ndarray:
        dst = np.empty((r1 - r0, self.width(kind)), dtype=np.float32)
        check(get_lib().kvg_store_decode(self._ptr, il, kind, r0, r1, get_ffi().from_buffer("float[]", dst), dst.size))
        return dst

    def decode_f16(self, il: int, kind: int, r0: int, r1: int) -> np.ndarray:
        dst = np.empty((r1 - r0, self.width(kind)), dtype=np.float16)
        check(
            get_lib().kvg_store_decode_f16(
                self._ptr, il, kind, r0, r1, get_ffi().from_buffer("uint16_t[]", dst), dst.size
            )
        )
        return dst

    def attend(
        self,
        il: int,
        r0: int,
        r1: int,
        q: np.ndarray,
        scale: float,
        state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
        softcap: float = 0.0,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Attention of queries ``q`` [n_tokens, n_head, head_dim_k] over rows [r0, r1) of layer
        ``il``, scored and summed from the encoded rows (kvg_store_hook_attend), in online-softmax
        form: returns ``(m, l, acc)``, m and l [n_tokens, n_head], acc [n_tokens, n_head, head_dim_v],
        so that the attention output is ``acc / l[..., None]``. ``state`` is a previous
        ``(m, l, acc)`` to continue from (it is not modified); without it the rows are the only ones.
        ``softcap`` > 0 caps every score s to softcap * tanh(s / softcap) (Gemma 2's logit soft-capping).
        Raises KvgValueError (a ValueError) for bad arguments, as the other calls do."""
        q = np.ascontiguousarray(q, dtype=np.float32)
        if q.ndim != 3 or q.shape[2] != self.head_dim[Kind.K]:
            raise ValueError(f"attend: q must be [n_tokens, n_head, {self.head_dim[Kind.K]}], got shape {q.shape}")
        n_tokens, n_head = q.shape[:2]
        if state is None:
            m = np.full((n_tokens, n_head), -np.inf, dtype=np.float32)
            l = np.zeros((n_tokens, n_head), dtype=np.float32)
            acc = np.zeros((n_tokens, n_head, self.head_dim[Kind.V]), dtype=np.float32)
        else:
            m, l, acc = (np.array(x, dtype=np.float32, order="C", copy=True) for x in state)
            if m.shape != (n_tokens, n_head) or l.shape != m.shape or acc.shape != (*m.shape, self.head_dim[Kind.V]):
                raise ValueError(
                    f"attend: state shapes {m.shape}, {l.shape}, {acc.shape} do not fit "
                    f"{n_tokens} tokens of {n_head} heads"
                )
        ffi = get_ffi()
        check(
            get_lib().kvg_store_hook_attend_capped(
                self._ptr,
                il,
                r0,
                r1,
                ffi.from_buffer("float[]", q),
                n_tokens,
                n_head,
                float(scale),
                float(softcap),
                ffi.from_buffer("float[]", m),
                ffi.from_buffer("float[]", l),
                ffi.from_buffer("float[]", acc),
            ),
            f"attend over rows [{r0}, {r1}) of layer {il}",
        )
        return m, l, acc

    def retier(self, r0: int, r1: int, tier: int, codec: str, *, il: int = -1, kind: int = -1) -> None:
        """Re-encodes the blocks inside rows [r0, r1) into (tier, codec): of layer il and kind
        (-1: every layer, both kinds)."""
        what = (
            f"retier rows [{r0}, {r1}) to {codec}"
            + (f" in layer {il}" if il >= 0 else "")
            + (f" ({'KV'[kind]})" if kind in tuple(Kind) else "")
        )
        check(get_lib().kvg_store_retier_list(self._ptr, il, kind, r0, r1, tier, codecs.get(codec).type), what)

    def retier_lists(self, r0: int, r1: int, tier: int, table: dict[tuple[int, int], str]) -> None:
        """Re-encodes the blocks inside rows [r0, r1) into ``tier``, each (layer, kind) of ``table``
        into its own codec (lists not in it stay as they are), all lists or none."""
        types = [-1] * (2 * self.n_layer)
        for (il, kind), codec in table.items():
            if not (0 <= il < self.n_layer and kind in tuple(Kind)):
                raise ValueError(f"retier: no list ({il}, {kind}) in a store of {self.n_layer} layers")
            types[2 * il + kind] = codecs.get(codec).type
        check(
            get_lib().kvg_store_retier_lists(self._ptr, r0, r1, tier, get_ffi().new("int32_t[]", types), len(types)),
            f"retier rows [{r0}, {r1}) to tier {Tier(tier).label if tier in tuple(Tier) else tier}",
        )

    def truncate(self, n_rows: int) -> None:
        """Keeps rows [0, n_rows) of every list (all or nothing; a cut on a block boundary
        cannot fail)."""
        check(get_lib().kvg_store_truncate(self._ptr, n_rows), f"truncate to {n_rows} rows")

    def shift(self, p0: int, p1: int) -> None:
        """A context shift: drops rows [p0, p1) of every list and moves the later rows back by
        p1 - p0, their codes as they are (all or nothing: p0 and p1 must start blocks)."""
        check(get_lib().kvg_store_shift(self._ptr, p0, p1), f"shift out rows [{p0}, {p1})")

    def shifts(self, layer: int) -> list[tuple[int, int, int]]:
        """The runs (r0, r1, shift) of layer's cold rows a shift moved: keys rotated at row + shift."""
        ffi, lib = get_ffi(), get_lib()
        n = int(lib.kvg_store_hook_shifts(self._ptr, layer, 0, ffi.NULL, ffi.NULL, ffi.NULL))
        if n <= 0:
            return []
        r0, r1, sh = ffi.new("int64_t[]", n), ffi.new("int64_t[]", n), ffi.new("int32_t[]", n)
        n = int(lib.kvg_store_hook_shifts(self._ptr, layer, n, r0, r1, sh))
        return [(int(r0[i]), int(r1[i]), int(sh[i])) for i in range(n)]

    def set_shift(self, layer: int, r0: int, r1: int, shift: int) -> None:
        """Sets the shift of layer's blocks in rows [r0, r1) (whole blocks, K and V): a restored
        session's runs, as shifts() reported them."""
        check(get_lib().kvg_store_set_shift(self._ptr, layer, r0, r1, shift), f"set the shift of rows [{r0}, {r1})")

    def read_failures(self) -> tuple[int, int]:
        """(hook_decode calls that failed, hook_attend calls that left rows out) since the store
        was made: llama.cpp's two ways of reading the rows."""
        lib = get_lib()
        return int(lib.kvg_store_read_failures(self._ptr, 0)), int(lib.kvg_store_read_failures(self._ptr, 1))

    # --- failure injection, for tests (kvg_debug_fail_after, kvg_store_debug_fail_reads) ---

    @staticmethod
    def fail_after(n_steps: int) -> int:
        """Makes the (n_steps + 1)-th fallible step of a store mutation from now fail as out of
        memory, once (process-wide; negative: cancel). Returns the countdown it replaced
        (-1: none pending, or it fired)."""
        return int(get_lib().kvg_debug_fail_after(n_steps))

    def fail_reads(self, il: int, kind: int, row: int, on: bool = True) -> None:
        """Makes every read of the block of (il, kind) holding ``row`` fail (or work again)."""
        check(get_lib().kvg_store_debug_fail_reads(self._ptr, il, kind, row, int(on)), f"fail_reads row {row}")

    def clear(self) -> None:
        get_lib().kvg_store_clear(self._ptr)

    def held(self, tier: int | None = None) -> TierBytes:
        ffi = get_ffi()
        b, v = ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(get_lib().kvg_store_bytes(self._ptr, _ALL_TIERS if tier is None else tier, b, v, ffi.NULL))
        return TierBytes(int(b[0]), int(v[0]))

    def index_bytes(self) -> int:
        ffi = get_ffi()
        b, v, i = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
        check(get_lib().kvg_store_bytes(self._ptr, _ALL_TIERS, b, v, i))
        return int(i[0])

    def hook_functions(self) -> tuple[int, int, int]:
        """Addresses of the C entry points llama.cpp's hooks call (no Python on that path): n_cold,
        decode and shifts."""
        ffi, lib = get_ffi(), get_lib()
        return (
            int(ffi.cast("uintptr_t", lib.kvg_store_hook_n_cold)),
            int(ffi.cast("uintptr_t", lib.kvg_store_hook_decode)),
            int(ffi.cast("uintptr_t", lib.kvg_store_hook_shifts)),
        )

    def attend_function(self) -> int:
        """Address of the C entry point of llama.cpp's fused attention (llama_kvgguf_attend_fn)."""
        return int(get_ffi().cast("uintptr_t", get_lib().kvg_store_hook_attend_capped))

    @staticmethod
    def attend_f16_function() -> int:
        """Address of kvg_attend_f16, which llama.cpp's fused path calls for its hot cells
        (llama_kvgguf_attend_f16_fn): f16 rows under the mask, with the store's SIMD kernels."""
        return int(get_ffi().cast("uintptr_t", get_lib().kvg_attend_f16))

    def evict_plan(
        self, parts: list[tuple[int, int, int]], tables: dict[int, dict[tuple[int, int], str]]
    ) -> "EvictPlan":
        """The plan llama_kvgguf_evict hands each list's rows to (kvg_store_hook_append):
        parts (tier, a, b) of the rows handed over, each appended with tables[tier]'s codec."""
        return EvictPlan(self, parts, tables)

    @staticmethod
    def append_function() -> int:
        """Address of kvg_store_hook_append (llama_kvgguf_append_fn), the plan its user."""
        return int(get_ffi().cast("uintptr_t", get_lib().kvg_store_hook_append))

    # --- attention mass: the softmax weight cold rows receive, per granule of MASS_ROWS rows ---

    def mass_function(self) -> int:
        """Address of the C entry point llama.cpp's fused attention hands its softmax
        normalizers to (llama_kvgguf_mass_fn)."""
        return int(get_ffi().cast("uintptr_t", get_lib().kvg_store_hook_mass))

    def set_mass(self, on: bool) -> None:
        """Starts or stops noting, in attend calls, what the attention mass needs."""
        check(get_lib().kvg_store_set_mass(self._ptr, 1 if on else 0), "set_mass")

    def bring_in_mass(self, il: int, m: np.ndarray, l: np.ndarray) -> None:
        """Adds the mass of the attend calls on layer ``il`` since the last bring-in, given the
        final softmax max ``m`` and sum ``l`` [n_tokens, n_head] of their queries (what llama.cpp's
        merge does through mass_function())."""
        m = np.ascontiguousarray(m, dtype=np.float32)
        l = np.ascontiguousarray(l, dtype=np.float32)
        if m.ndim != 2 or l.shape != m.shape:
            raise ValueError(f"bring_in_mass: m and l must both be [n_tokens, n_head], got {m.shape} and {l.shape}")
        ffi = get_ffi()
        check(
            get_lib().kvg_store_hook_mass(
                self._ptr, il, m.shape[0], m.shape[1], ffi.from_buffer("float[]", m), ffi.from_buffer("float[]", l)
            ),
            f"attention mass of layer {il}",
        )

    def mass(self, il: int) -> np.ndarray:
        """Attention mass of layer ``il``'s rows: entry g is the softmax weight rows
        [g * MASS_ROWS, (g + 1) * MASS_ROWS) received, summed over queries (float64, one entry per
        granule of the rows held now)."""
        n = -(-self.n_rows(il, Kind.K) // MASS_ROWS)
        out = np.zeros(n, dtype=np.float64)
        ffi = get_ffi()
        check(get_lib().kvg_store_mass(self._ptr, il, ffi.from_buffer("double[]", out), n), f"mass of layer {il}")
        return out

    def clear_mass(self) -> None:
        get_lib().kvg_store_mass_clear(self._ptr)

    @property
    def mass_dropped(self) -> int:
        """Attend calls whose notes never reached a counter (see kvg_store_mass_dropped)."""
        return int(get_lib().kvg_store_mass_dropped(self._ptr))


class EvictPlan:
    """A kvg_evict_plan: where the rows of one eviction go, list by list (kept alive with it)."""

    def __init__(
        self, store: KVStore, parts: list[tuple[int, int, int]], tables: dict[int, dict[tuple[int, int], str]]
    ):
        if not 1 <= len(parts) <= _ALL_TIERS:
            raise ValueError(f"an eviction of {len(parts)} parts (1 to {_ALL_TIERS})")
        ffi = get_ffi()
        lists = [(il, kind) for il in range(store.n_layer) for kind in Kind]
        types = {}
        codes = []
        for tier, _, _ in parts:
            table = tables[tier]
            for key in lists:
                name = table.get(key)
                if name is not None and name not in types:
                    types[name] = codecs.get(name).type
                codes.append(-1 if name is None else types[name])
        self._store = store  # the plan points at it
        self._codecs = ffi.new("int32_t[]", codes)
        self.c = ffi.new("kvg_evict_plan *")
        self.c.store = store._ptr
        self.c.n_parts = len(parts)
        for i, (tier, a, b) in enumerate(parts):
            self.c.tier[i], self.c.row0[i], self.c.row1[i] = tier, a, b
        self.c.codecs = self._codecs

    @property
    def address(self) -> int:
        return int(get_ffi().cast("uintptr_t", self.c))

    def check(self, context: str) -> None:
        """Raises what the failing append raised (call it on the thread that evicted)."""
        check(self.c.status, context)
