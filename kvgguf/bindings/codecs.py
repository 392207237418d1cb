"""KV-cache codecs of libkvgguf, on numpy arrays.

A block is a float32 array of shape ``(n_tokens, n_heads, head_dim)`` (or
``(n_tokens, head_dim)`` for one head): rows of llama.cpp's K or V cache. Encoding gives
bytes with no header; decoding needs the same codec, shape and kind::

    from kvgguf import codecs
    c = codecs.get("rotq3")
    buf = c.encode(k_rows, kind="k")            # numpy uint8, exactly c.encoded_size(...) bytes
    k_hat = c.decode(buf, k_rows.shape, kind="k")
    c.bits_per_value(k_rows.shape)               # measured on this shape: every stored byte

Codecs (see native/include/kvgguf.h for the byte layouts):

- ``f16``: IEEE half precision, 16 bits per value.
- ``kivi2/3/4/8`` (KIVI, Liu et al. 2024): min/max integer codes; keys per channel over
  ``group_size`` tokens, values per token over ``group_size`` channels; B + 32/G bits per value.
- ``rotq1..4`` (TurboQuant, Zandieh et al. 2025): random-sign Hadamard rotation, Lloyd-Max
  codes, one f16 norm per head vector; B + 16/head_dim bits per value. head_dim must be a
  power of two in [2, 4096].
- ``tcq2/3/4``: rotq's rotation and norm, then a bitshift trellis code: B bits per value of a
  stream where each value is the trained level of the 8-bit window ending with its own bits,
  chosen per head vector by a Viterbi search; B + 16/head_dim bits per value, as rotq.
- ``pq2``, ``vq8``: rotq's rotation and norm, then one byte per sub-vector naming the nearest
  of 256 centroids of a trained codebook (:func:`train_book`; the store trains one per layer
  and kind): pq2 codes 4 coordinates per byte (2 bits per value), vq8 a whole head vector.
  ``vq8f``: vq8 with TSC part II's fp16 fallback: per block the 1/32 of head vectors it codes
  worst are kept in f16 (flagged in a bitmask), about 0.52 bits per value more.
  Pass the codebook as ``get("pq2", book=...)``.

Input dtypes: float32 is used as is (zero-copy when C-contiguous); other floating dtypes
(float16, float64) are converted to float32; integer, bool and complex arrays are rejected
with TypeError. NaN/Inf, values beyond the f16 range (|x| > 65504), bad shapes or sizes raise
ValueError; corrupt encoded bytes raise :class:`KvgCorruptError`.
"""

from __future__ import annotations

import contextlib
import functools
import numbers
from dataclasses import dataclass, field
from typing import Iterator, Sequence

import numpy as np

from ..enums import Kind
from . import binding
from .binding import KvgCorruptError, KvgError, KvgUnsupportedError, KvgValueError, check

__all__ = [
    "Codec",
    "CodecInfo",
    "KvgCorruptError",
    "KvgError",
    "KvgUnsupportedError",
    "KvgValueError",
    "bits_per_value",
    "decode",
    "decode_into",
    "encode",
    "encoded_size",
    "force_simd",
    "get",
    "info",
    "names",
    "rotq_codebook",
    "simd_level",
    "simd_levels",
    "simd_max_level",
    "tcq_levels",
    "train_book",
]

# Rows per block of the live cache (TieredConfig.block): where the codecs that keep side data per
# block (delta, outliers, low-rank, QJL, PQ/VQ) state their bits.
BLOCK_ROWS = 64

# Codecs whose blocks need a book kept beside them (per layer and kind in the store), in enum
# order, read from the library (CodecInfo.book) on first use: CODEBOOK_CODECS hold k-means
# codebooks (pq2, vq8, vq8f), PLAN_CODECS wfq's plans (bits and scales per coordinate of each KV
# head), BOOK_CODECS both.
_BOOK_LISTS = {"CODEBOOK_CODECS": ("codebook",), "PLAN_CODECS": ("plan",), "BOOK_CODECS": ("codebook", "plan")}


def __getattr__(attr: str):
    # Lazily, so that importing kvgguf does not load the library.
    if attr in _BOOK_LISTS:
        value = tuple(n for n in names() if info(n).book in _BOOK_LISTS[attr])
        globals()[attr] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


def book_shape(name: str, n_heads: int, head_dim: int) -> tuple[int, ...]:
    """The shape of name's book on a list of n_heads KV heads of head_dim: [256, S] centroids for
    pq2/vq8/vq8f, [n_heads, 3, head_dim] for a wfq plan (source coordinate, scale, bits)."""
    book = info(name).book
    if book == "plan":
        return (n_heads, 3, head_dim)
    if book == "codebook":
        return (256, 4 if name == "pq2" else head_dim)
    books = [n for n in names() if info(n).book]
    raise ValueError(f"codec {name!r} keeps no codebook; {', '.join(books)} do")


_SIMD_LEVELS = {"scalar": 0, "avx2": 1, "neon": 2}  # enum kvg_simd
_MAX_DIM = 1 << 56  # the library's limit on values per block


def fits(name: str, head_dim: int, kind=Kind.K) -> bool:
    """Whether codec name can take head vectors of head_dim (rotations need a power of two, wfq
    16..512)."""
    try:
        get(name).encoded_size((1, 1, head_dim), kind)
    except ValueError:
        return False
    return True


def family(name: str) -> str:
    """A codec's family: the name without its bit width (``"rotq3"`` -> ``"rotq"``), ``"f16"`` itself."""
    return info(name).family


@dataclass(frozen=True)
class CodecInfo:
    """What the library's table says about a codec (``kvg_codec_info`` in kvgguf.h says more)."""

    name: str
    family: str
    bits: int  # the B of the name: bits per code (f16: 16; vq8, vq8f: 8 per head vector)
    rotated: bool  # coded as rotq's rotated head vectors (the fused attention rotates the queries)
    book: str | None  # None, "codebook" (pq2, vq8, vq8f) or "plan" (wfq)
    head_dim_pow2: bool
    head_dim_min: int
    head_dim_max: int | None  # None: no bound of its own
    # Bits per value of a long sequence: value_bits + vector_bits / head_dim + group_bits / G
    # (G: group_values, or the codec's group_size where that is 0); with block_side_data, a block's.
    value_bits: int
    vector_bits: int
    group_bits: int
    group_values: int
    block_side_data: bool
    fused_codes: bool  # the fused attention scores the codes (False: it decodes the block first)
    simd_levels: tuple[int, ...]  # enum kvg_simd levels with kernels for it (0: scalar)
    simd_ops: frozenset[str]  # of "encode", "decode", "score", "accumulate": those with SIMD kernels

    def takes_head_dim(self, head_dim: int) -> bool:
        """Whether head vectors of head_dim are a shape the codec takes (else KVG_ERR_SHAPE)."""
        return (
            head_dim >= self.head_dim_min
            and (self.head_dim_max is None or head_dim <= self.head_dim_max)
            and (not self.head_dim_pow2 or head_dim & (head_dim - 1) == 0)
        )


def _enum_names(ffi, enum: str, prefix: str) -> dict[int, str]:
    """{value: name} of a header enum, names lower-cased without their prefix."""
    return {v: n[len(prefix) :].lower() for v, n in ffi.typeof(f"enum {enum}").elements.items()}


@functools.lru_cache(maxsize=None)
def info(name: str) -> CodecInfo:
    """The facts of codec ``name`` (``kvg_codec_describe``); ValueError for an unknown name."""
    ffi, lib = binding.get_ffi(), binding.get_lib()
    c = ffi.new("kvg_codec_info *")
    check(lib.kvg_codec_describe(get(name).type, c))
    ops = _enum_names(ffi, "kvg_codec_op", "KVG_OP_")
    return CodecInfo(
        name=ffi.string(c.name).decode(),
        family=ffi.string(c.family).decode(),
        bits=int(c.bits),
        rotated=bool(c.rotated),
        book=None if c.book == lib.KVG_BOOK_NONE else _enum_names(ffi, "kvg_book", "KVG_BOOK_")[c.book],
        head_dim_pow2=bool(c.head_dim_pow2),
        head_dim_min=int(c.head_dim_min),
        head_dim_max=int(c.head_dim_max) or None,
        value_bits=int(c.value_bits),
        vector_bits=int(c.vector_bits),
        group_bits=int(c.group_bits),
        group_values=int(c.group_values),
        block_side_data=bool(c.block_side_data),
        fused_codes=bool(c.fused_codes),
        simd_levels=tuple(lv for lv in sorted(_enum_names(ffi, "kvg_simd", "KVG_SIMD_")) if c.simd_levels >> lv & 1),
        simd_ops=frozenset(op for bit, op in ops.items() if c.simd_ops & bit),
    )


def names() -> list[str]:
    """Codec names in the order of ``enum kvg_codec_type``."""
    ffi, lib = binding.get_ffi(), binding.get_lib()
    return [ffi.string(lib.kvg_codec_name(i)).decode() for i in range(lib.kvg_codec_count())]


def _kind(kind) -> int:
    return int(Kind.of(kind))


def _shape3(shape: Sequence[int]) -> tuple[int, int, int]:
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(
            f"shape must be (n_tokens, n_heads, head_dim) or (n_tokens, head_dim), got {shape!r}"
        ) from None
    if len(dims) not in (2, 3):
        raise ValueError(f"shape must be (n_tokens, n_heads, head_dim) or (n_tokens, head_dim), got {dims!r}")
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral):
            raise ValueError(f"shape {dims!r} must hold integers")
        if not 0 < int(d) <= _MAX_DIM:
            raise ValueError(f"shape {dims!r}: every dimension must be > 0 (and at most 2^56)")
    dims = tuple(int(d) for d in dims)
    return (dims[0], 1, dims[1]) if len(dims) == 2 else dims


def _as_float32(x) -> np.ndarray:
    a = np.asarray(x)
    if a.dtype == np.float32 and a.flags.c_contiguous:
        return a
    if a.dtype.kind != "f":
        raise TypeError(
            f"codecs encode floating-point arrays (float32, or float16/float64 converted), got dtype {a.dtype}; "
            f"convert with x.astype(np.float32) if that is what you mean"
        )
    return np.ascontiguousarray(a, dtype=np.float32)


def _byte_buffer(buf):
    """A cffi uint8_t[] view of buf (bytes, bytearray, memoryview, numpy array) without copying."""
    ffi = binding.get_ffi()
    if isinstance(buf, np.ndarray) and not buf.flags.c_contiguous:
        buf = np.ascontiguousarray(buf)
    try:
        return ffi.from_buffer("uint8_t[]", buf)
    except TypeError:
        raise TypeError(
            f"encoded data must be bytes-like (bytes, bytearray, numpy uint8 array), got {type(buf).__name__}"
        ) from None


@dataclass(frozen=True)
class Codec:
    """One codec with its parameters; obtain it with :func:`get`."""

    name: str
    type: int  # enum kvg_codec_type
    bits: int  # bits per code (16 for f16)
    group_size: int  # kivi G; kept (unused) for other codecs
    seed: int  # rotq sign seed; kept (unused) for other codecs
    book: np.ndarray | None = field(default=None, compare=False, repr=False)  # BOOK_CODECS: their book_shape

    @property
    def info(self) -> CodecInfo:
        """What the library says about the codec: :func:`info`."""
        return info(self.name)

    @property
    def family(self) -> str:
        """The name without its bit width (``"rotq"`` for rotq3): :attr:`CodecInfo.family`."""
        return self.info.family

    def __post_init__(self):
        # The C pointer into book, made once: it stays valid as long as this Codec holds book.
        buf = binding.get_ffi().from_buffer("float[]", self.book) if self.book is not None else None
        object.__setattr__(self, "_book_c", buf)

    def _params(self):
        p = binding.get_ffi().new("kvg_codec_params *")
        p.group_size = self.group_size
        p.seed = self.seed
        if self._book_c is not None:
            p.book, p.book_count = self._book_c, self.book.size
        return p

    def _context(self, kind: int, shape: tuple[int, int, int]) -> str:
        return f"kind {Kind(kind).name}, shape {shape}"

    def encoded_size(self, shape: Sequence[int], kind: str = "k") -> int:
        """Exact number of bytes :meth:`encode` writes for a block of this shape."""
        kind_id, (t, h, d) = _kind(kind), _shape3(shape)
        ffi, lib = binding.get_ffi(), binding.get_lib()
        out = ffi.new("size_t *")
        check(lib.kvg_encoded_size(self.type, kind_id, t, h, d, self._params(), out))
        return int(out[0])

    def bits_per_value(self, shape: Sequence[int], kind: str = "k") -> float:
        """Stored bits per value for this shape: encoded bytes * 8 / values (all bytes counted)."""
        t, h, d = _shape3(shape)
        return self.encoded_size(shape, kind) * 8 / (t * h * d)

    def nominal_bits_per_value(self, head_dim: int, kind: str = "k") -> float:
        """Bits per value for long sequences, by the library's rule (:class:`CodecInfo`): kivi
        B + 32/G, rotq B + 16/head_dim, f16 16, a book codec's without its book (the store's);
        the side-data codecs' at a 64-row block of one head."""
        self.encoded_size((1, 1, head_dim), kind)  # validates head_dim (rotq: power of two)
        i = self.info
        if i.block_side_data:
            # Side data per block (keyframes, channel lists, factors): the live cache's block, 64
            # rows of one head.
            return self.bits_per_value((BLOCK_ROWS, 1, head_dim), kind)
        return i.value_bits + i.vector_bits / head_dim + i.group_bits / (i.group_values or self.group_size)

    def encode(self, x, kind: str = "k") -> np.ndarray:
        """Encodes a (n_tokens, n_heads, head_dim) or (n_tokens, head_dim) block; returns uint8 bytes."""
        kind_id = _kind(kind)
        a = _as_float32(x)
        if a.ndim not in (2, 3):
            raise ValueError(
                f"{self.name} encode expects an array of shape (n_tokens, n_heads, head_dim) or "
                f"(n_tokens, head_dim), got shape {a.shape}"
            )
        shape = _shape3(a.shape)
        size = self.encoded_size(shape, kind)
        out = np.empty(size, dtype=np.uint8)
        ffi, lib = binding.get_ffi(), binding.get_lib()
        written = ffi.new("size_t *")
        st = lib.kvg_encode(
            self.type,
            kind_id,
            ffi.from_buffer("float[]", a),
            a.size,
            *shape,
            self._params(),
            ffi.from_buffer("uint8_t[]", out, require_writable=True),
            size,
            written,
        )
        check(st, self._context(kind_id, shape))
        if written[0] != size:  # the library promises exactly encoded_size bytes
            raise KvgError(f"{self.name} encode wrote {written[0]} bytes, expected {size}", -1)
        return out

    def decode_into(self, buf, out: np.ndarray, kind: str = "k") -> np.ndarray:
        """Decodes buf into the preallocated C-contiguous float32 array out (zero-copy); returns out."""
        kind_id = _kind(kind)
        if not isinstance(out, np.ndarray) or out.dtype != np.float32:
            raise TypeError(
                f"out must be a float32 numpy array, got {type(out).__name__} {getattr(out, 'dtype', '')}".rstrip()
            )
        if not out.flags.c_contiguous or not out.flags.writeable:
            raise ValueError("out must be C-contiguous and writeable")
        shape = _shape3(out.shape)
        src = _byte_buffer(buf)
        ffi, lib = binding.get_ffi(), binding.get_lib()
        st = lib.kvg_decode(
            self.type,
            kind_id,
            src,
            len(src),
            *shape,
            self._params(),
            ffi.from_buffer("float[]", out, require_writable=True),
            out.size,
        )
        check(st, self._context(kind_id, shape))
        return out

    def decode(self, buf, shape: Sequence[int], kind: str = "k") -> np.ndarray:
        """Decodes buf into a new float32 array of the given (2-D or 3-D) shape."""
        _shape3(shape)
        want = self.encoded_size(shape, kind)  # before allocating: a wrong shape must not cost its floats
        got = len(_byte_buffer(buf))
        if got != want:
            raise KvgValueError(
                f"{self.name} decode of shape {tuple(shape)} needs {want} bytes, got {got}",
                int(binding.get_lib().KVG_ERR_BUFFER_SIZE),
            )
        out = np.empty(tuple(int(d) for d in shape), dtype=np.float32)
        return self.decode_into(buf, out, kind)


def get(name: str, *, group_size: int = 32, seed: int | None = None, book=None) -> Codec:
    """The codec called ``name`` (see :func:`names`).

    group_size: kivi's G (tokens per key group, channels per value group), > 0.
    seed: rotq's sign seed, 0 <= seed < 2^64; None for the library default.
    book: pq2/vq8's codebook, float32 [256, S] (:func:`train_book`); checked by the library.
    """
    ffi, lib = binding.get_ffi(), binding.get_lib()
    if not isinstance(name, str):
        raise TypeError(f"codec name must be a str, got {type(name).__name__}")
    if "\x00" in name:  # C would read the name only up to the NUL
        raise ValueError(f"codec {name!r} is unknown; choose one of: {', '.join(names())}")
    t = ffi.new("int *")
    if lib.kvg_codec_from_name(name.encode("utf-8", "replace"), t) != 0:
        raise ValueError(f"codec {name!r} is unknown; choose one of: {', '.join(names())}")
    if isinstance(group_size, bool) or not isinstance(group_size, numbers.Integral) or not 0 < group_size < 2**31:
        raise ValueError(f"group_size must be an integer in [1, 2^31), got {group_size!r}")
    if seed is None:
        p = ffi.new("kvg_codec_params *")
        lib.kvg_codec_default_params(p)
        seed = int(p.seed)
    elif isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an integer in [0, 2^64), got {seed!r}")
    bits = ffi.new("int *")
    check(lib.kvg_codec_bits(t[0], bits))
    if book is not None:
        book = np.ascontiguousarray(_as_float32(book))
    return Codec(name=name, type=int(t[0]), bits=int(bits[0]), group_size=int(group_size), seed=int(seed), book=book)


def train_book(name: str, x, kind: str = "k", *, seed: int | None = None) -> np.ndarray:
    """The book of a BOOK_CODECS codec fitted on the block ``x`` ((n_tokens, n_heads, head_dim)),
    as the store fits one on the first rows it encodes: a pq2, vq8 or vq8f codebook by k-means
    (float32 [256, S]), a wfq plan by water-filling each coordinate's energy ([n_heads, 3, head_dim])."""
    c = get(name, seed=seed)
    a = _as_float32(x)
    shape = _shape3(a.shape)
    ffi, lib = binding.get_ffi(), binding.get_lib()
    out = np.empty(book_shape(name, shape[1], shape[2]), dtype=np.float32)
    plan = info(name).book == "plan"
    train = lib.kvg_wfq_train if plan else lib.kvg_pq_train
    check(
        train(
            c.type,
            _kind(kind),
            ffi.from_buffer("float[]", a),
            a.size,
            *shape,
            c._params(),
            ffi.from_buffer("float[]", out, require_writable=True),
            out.size,
        ),
        f"{name} {'plan' if plan else 'codebook'}, shape {shape}",
    )
    return out


def encode(name: str, x, kind: str = "k", **params) -> np.ndarray:
    """``get(name, **params).encode(x, kind)``."""
    return get(name, **params).encode(x, kind)


def decode(name: str, buf, shape: Sequence[int], kind: str = "k", **params) -> np.ndarray:
    """``get(name, **params).decode(buf, shape, kind)``."""
    return get(name, **params).decode(buf, shape, kind)


def decode_into(name: str, buf, out: np.ndarray, kind: str = "k", **params) -> np.ndarray:
    """``get(name, **params).decode_into(buf, out, kind)``."""
    return get(name, **params).decode_into(buf, out, kind)


def encoded_size(name: str, shape: Sequence[int], kind: str = "k", **params) -> int:
    """``get(name, **params).encoded_size(shape, kind)``."""
    return get(name, **params).encoded_size(shape, kind)


def bits_per_value(name: str, shape: Sequence[int], kind: str = "k", **params) -> float:
    """``get(name, **params).bits_per_value(shape, kind)``."""
    return get(name, **params).bits_per_value(shape, kind)


def rotq_codebook(bits: int, head_dim: int) -> np.ndarray:
    """The 2^bits Lloyd-Max centroids rotq uses for head_dim (unit-variance coordinates)."""
    ffi, lib = binding.get_ffi(), binding.get_lib()
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 1 <= bits <= 4:
        raise ValueError(f"bits must be 1..4, got {bits!r}")
    out = np.empty(1 << int(bits), dtype=np.float32)
    check(
        lib.kvg_rotq_codebook(
            int(bits), int(head_dim), ffi.from_buffer("float[]", out, require_writable=True), out.size
        )
    )
    return out


def tcq_levels(bits: int) -> np.ndarray:
    """The 256 trained levels tcqB reads by window (unit-variance coordinates, as rotq's)."""
    ffi, lib = binding.get_ffi(), binding.get_lib()
    if isinstance(bits, bool) or not isinstance(bits, numbers.Integral) or not 2 <= bits <= 4:
        raise ValueError(f"bits must be 2..4, got {bits!r}")
    out = np.empty(256, dtype=np.float32)
    check(lib.kvg_tcq_table(int(bits), ffi.from_buffer("float[]", out, require_writable=True), out.size))
    return out


def simd_level() -> int:
    """SIMD level in use: 0 scalar, 1 AVX2 (x86-64), 2 NEON (AArch64)."""
    return int(binding.get_lib().kvg_simd_level())


def simd_max_level() -> int:
    """Best SIMD level this CPU and build support (0 where there is none)."""
    return int(binding.get_lib().kvg_simd_max_level())


def simd_levels() -> list[int]:
    """The levels ``force_simd`` accepts here: scalar, then this build's SIMD level if the CPU has it.

    A build carries one set of SIMD kernels (AVX2 on x86-64, NEON on AArch64), so the levels are
    not ordered: on an AArch64 build ``[0, 2]``, never 1.
    """
    best = simd_max_level()
    return [0] + ([best] if best != 0 else [])


@contextlib.contextmanager
def force_simd(level) -> Iterator[int]:
    """Runs the block with the native SIMD level set to ``level`` (0/"scalar", 1/"avx2", 2/"neon").

    The level is process-wide: do not use it while other threads encode or decode.
    Raises ValueError for a level that does not exist, KvgUnsupportedError if this CPU or build
    lacks it (see ``simd_levels()``).
    """
    lvl = _SIMD_LEVELS.get(level, level) if isinstance(level, str) else level
    if lvl not in _SIMD_LEVELS.values() or isinstance(lvl, bool):
        names = ", ".join(f"{v}/{k!r}" for k, v in _SIMD_LEVELS.items())
        raise ValueError(f"SIMD level must be one of {names}, got {level!r}")
    lib = binding.get_lib()
    old = lib.kvg_simd_level()
    check(lib.kvg_set_simd_level(lvl), "force_simd")
    try:
        yield lvl
    finally:
        lib.kvg_set_simd_level(old)
