"""Atheris (libFuzzer for Python) target for the .kvz session loader, kvgguf.session.session.parse.

    python native/fuzz/fuzz_session.py --start DIR        # write the starting corpus, then check it parses
    python native/fuzz/fuzz_session.py -runs=N CORPUS...  # fuzz, libFuzzer flags

parse reads everything a session holds: the container (header, sections, CRCs, zstd frames),
the metadata JSON, tokens, llama.cpp's cell records, the store's encoded blocks (through
kvg_store_append_encoded, which checks them) and the exact rows (decoded with the codecs). It
asks llama.cpp three things only: which layers each of its caches holds (hooks.layer_info), the
types of each layer's cells (hooks.cells_of) and how many cells its cache has (llama_n_ctx). No
model is loaded here: those answers come
from a fake context of a made-up model (below), and so do the starting inputs, which are real sessions
written by session.dump from fake llama.cpp states and a real store of encoded rows. So the
whole of parse runs for real except llama.cpp's queries and apply() (which hands the
parsed state to llama.cpp, and is left out).

Input: byte 0 picks the model (bits 0-1) and whether the CRCs stay as they are (bit 7; else
they are recomputed, so mutations reach the parsers behind them); the rest is the .kvz file.
parse must return or raise SessionError; any other exception is a finding.

Byte-level mutations of a whole file mostly break the JSON metadata or a zstd frame, so half
of the mutations are made on the structure instead (mutate()): one section's payload through
libFuzzer's mutator, or one value of the metadata replaced by an awkward one, or sections
dropped, repeated or swapped, and the container packed again, raw or zstd-coded.
"""

from __future__ import annotations

import json
import os
import random
import struct
import sys
import zlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Optional

import atheris

with atheris.instrument_imports(include=["kvgguf"]):
    import numpy as np

    from gguf import GGMLQuantizationType, quants

    from kvgguf.errors import SessionError
    from kvgguf.llamacpp import state_format
    from kvgguf.model.shape import KVShape
    from kvgguf.bindings.store import KVStore
    from kvgguf.policy.tiered import TieredConfig
    from kvgguf.session import container
    from kvgguf.session import session as kvz
    from kvgguf.session.fingerprint import ModelFingerprint


GGML_Q8_0 = int(GGMLQuantizationType.Q8_0)


# --- a made-up model and llama.cpp context ---------------------------------------------------


@dataclass
class FakeContext:
    """What session.py asks llama.cpp about a context, answered without llama.cpp."""

    layer_kind: list[int]  # per layer: 1 full attention, 0 sliding window (hooks.layer_info)
    n_cells: int  # llama_n_ctx
    state: bytes = b""  # llama_state_seq_get_data, for dump
    cell_type: Optional[int] = None  # every layer's K/V cell type (hooks.cells_of); None: not asked


def _layer_info(ctx: FakeContext, il, _a, _b) -> int:
    return ctx.layer_kind[il]


def _cells_of(ctx: FakeContext, il: int):
    return None if ctx.cell_type is None else (ctx.cell_type, ctx.cell_type, 0)


# The llama.cpp modules session.py calls into, for this process only.
kvz.hooks = SimpleNamespace(layer_info=_layer_info, cells_of=_cells_of)
kvz.seq_state = SimpleNamespace(read=lambda ctx: ctx.state)
kvz.C = SimpleNamespace(llama_n_ctx=lambda ctx: ctx.n_cells)


@dataclass
class Model:
    shape: KVShape
    layer_kind: list[int]
    tiered: bool
    n_cells: int = 256
    n_vocab: int = 1000
    cell_type: Optional[int] = None  # FakeContext.cell_type

    @property
    def fingerprint(self) -> ModelFingerprint:
        s = self.shape
        return ModelFingerprint(
            s.arch, s.n_layer, s.n_head_kv, s.head_dim_k, s.head_dim_v, s.n_swa, self.n_vocab, "a" * 64, "b" * 64
        )

    @property
    def compressed_layers(self) -> list[int]:
        return [il for il, k in enumerate(self.layer_kind) if k == 1]

    def live(self, kv=None, state: bytes = b"", tokens=()) -> kvz.LiveContext:
        if kv is None and self.tiered:
            kv = SimpleNamespace(layers=self.compressed_layers)
        return kvz.LiveContext(
            FakeContext(self.layer_kind, self.n_cells, state, self.cell_type),
            kv,
            self.shape,
            self.fingerprint,
            np.asarray(tokens, dtype=np.intc),
            4096,
            self.n_vocab,
        )


def _shape(arch, n_layer, n_head_kv, dk, dv, n_swa=0, full=None) -> KVShape:
    full = tuple(range(n_layer)) if full is None else full
    return KVShape(arch, n_layer, 4 * n_head_kv, n_head_kv, dk, dv, n_swa, 0, full)


MODELS = [
    Model(_shape("llama", 2, 2, 64, 64), [1, 1], tiered=False),
    Model(_shape("llama", 2, 2, 64, 64), [1, 1], tiered=True),
    # Gemma-3-like: one full-attention layer (compressed) and two sliding ones (a second cache)
    # (its cells answer f16, so parse's check of the saved cell types runs)
    Model(_shape("gemma3", 3, 1, 32, 32, n_swa=8, full=(2,)), [0, 0, 1], tiered=True, cell_type=state_format.GGML_F16),
]


# --- starting inputs: real sessions written by session.dump --------------------------------------------


def _cache(rng, positions, layers, dims, v_trans=False, ggml_type=state_format.GGML_F16):
    """A llama.cpp cache record of the given cell positions, K/V rows in ggml_type."""
    cells = np.stack([np.asarray(positions), np.ones(len(positions)), np.zeros(len(positions))], 1)
    out = state_format.CacheState(cells.astype("<i4").tobytes(), len(positions), v_trans, [])
    for il in layers:
        rows = []
        for width in dims:
            x = rng.standard_normal((len(positions), width)).astype(np.float32)
            x[:, 3::16] += 8.0  # key-like outlier channels
            if ggml_type == state_format.GGML_F16:
                rows.append(x.astype(np.float16).view(np.uint8).reshape(len(positions), 2 * width))
            elif ggml_type == state_format.GGML_F32:
                rows.append(x.view(np.uint8).reshape(len(positions), 4 * width))
            elif ggml_type == GGML_Q8_0:  # q8_0 cells (TieredConfig.hot_cells): sessions code their values
                rows.append(quants.quantize(x, GGMLQuantizationType.Q8_0))  # gguf's copy of ggml's
            else:  # another quantized type: session files keep its bytes as they are
                rows.append(rng.integers(0, 256, (len(positions), width // 2 + 2), dtype=np.uint8))
        out.layers.append(state_format.LayerRows(il, ggml_type, rows[0], ggml_type, rows[1]))
    return out


def _store(rng, model: Model, blocks, codecs_kv) -> KVStore:
    s = model.shape
    store = KVStore(s.n_layer, s.n_head_kv, s.head_dim_k, s.head_dim_v, group_size=16, seed=1234)
    for il in range(s.n_layer):
        if il not in model.compressed_layers:
            store.set_layer_enabled(il, False)
            continue
        for (r0, r1, tier), (ck, cv) in zip(blocks, codecs_kv):
            for kind, codec, d in ((0, ck, s.head_dim_k), (1, cv, s.head_dim_v)):
                x = rng.standard_normal((r1 - r0, s.n_head_kv * d)).astype(np.float32)
                store.append(il, kind, tier, codec, x)
    return store


def _session(
    model: Model,
    *,
    n_tokens,
    n_cold=0,
    blocks=(),
    codecs_kv=(),
    codec=None,
    exact=False,
    entropy=False,
    v_trans=False,
    ggml_type=state_format.GGML_F16,
    seed=0,
) -> bytes:
    rng = np.random.default_rng(seed)
    s = model.shape
    dims = (s.n_head_kv * s.head_dim_k * 1, s.n_head_kv * s.head_dim_v)
    full = [il for il, k in enumerate(model.layer_kind) if k == 1]
    swa = [il for il, k in enumerate(model.layer_kind) if k == 0]
    caches = [_cache(rng, range(n_cold, n_tokens), full, dims, v_trans, ggml_type)]
    if swa:  # the sliding window keeps the newest positions (cell order need not be position order)
        caches.append(_cache(rng, list(range(max(0, n_tokens - s.n_swa), n_tokens))[::-1], swa, dims, True))
    kv = None
    if model.tiered:
        config = TieredConfig(hot=64, sinks=4, warm="rotq4", warm_tokens=16, archive="rotq2", block=8, group_size=16)
        kv = SimpleNamespace(
            config=config,
            store=_store(rng, model, blocks, codecs_kv) if n_cold else None,
            n_cold=n_cold,
            layers=model.compressed_layers,
            blocks=[SimpleNamespace(r0=a, r1=b, tier=t) for a, b, t in blocks],
        )
        if kv.store is None:
            kv.store = KVStore(s.n_layer, s.n_head_kv, s.head_dim_k, s.head_dim_v, group_size=16, seed=1234)
    tokens = rng.integers(0, model.n_vocab, n_tokens)
    live = model.live(kv, state_format.build(caches), tokens)
    data, _ = kvz.dump(live, codec=codec, exact=exact, entropy=entropy, app={"messages": ["hi"]} if seed % 2 else None)
    return data


def starting_inputs() -> list[tuple[str, int, bytes]]:
    """(name, model index, .kvz bytes)."""
    stock, tiered, gemma = MODELS
    blocks = [(0, 4, 0), (4, 16, 1), (16, 24, 2)]
    out = [
        ("stock-default", 0, _session(stock, n_tokens=16)),
        ("stock-exact-zstd", 0, _session(stock, n_tokens=10, exact=True, entropy=True, seed=1)),
        ("stock-kivi-vtrans", 0, _session(stock, n_tokens=13, codec=("kivi4", "kivi2"), v_trans=True, seed=2)),
        ("stock-f32-crotq", 0, _session(stock, n_tokens=9, codec="crotq3", ggml_type=state_format.GGML_F32, seed=3)),
        ("stock-q8", 0, _session(stock, n_tokens=12, ggml_type=GGML_Q8_0, seed=4)),
        ("stock-q8-exact", 0, _session(stock, n_tokens=12, exact=True, ggml_type=GGML_Q8_0, seed=4)),
        ("stock-q4-raw", 0, _session(stock, n_tokens=12, ggml_type=2, seed=4)),
        ("stock-empty", 0, _session(stock, n_tokens=0, seed=5)),
        (
            "tiered-rotq",
            1,
            _session(
                tiered,
                n_tokens=28,
                n_cold=24,
                blocks=blocks,
                codecs_kv=[("f16", "f16"), ("rotq4", "rotq3"), ("rotq2", "rotq1")],
                seed=6,
            ),
        ),
        (
            "tiered-mixed-zstd",
            1,
            _session(
                tiered,
                n_tokens=30,
                n_cold=24,
                blocks=blocks,
                entropy=True,
                codecs_kv=[("f16", "kivi8"), ("crotq4", "kivi4"), ("kivi2", "rotq2")],
                codec="kivi3",
                seed=7,
            ),
        ),
        ("tiered-nocold", 1, _session(tiered, n_tokens=6, seed=8)),
        (
            "gemma-tiered",
            2,
            _session(
                gemma,
                n_tokens=28,
                n_cold=16,
                blocks=[(0, 4, 0), (4, 16, 1)],
                codecs_kv=[("f16", "f16"), ("crotq3", "rotq4")],
                seed=9,
            ),
        ),
    ]
    return out


# --- the target -------------------------------------------------------------------------------


def recrc(data: bytes) -> bytes:
    """The same bytes with every container CRC recomputed (as far as the framing reads)."""
    b = bytearray(data)
    if len(b) < 20:
        return data
    b[16:20] = struct.pack("<I", zlib.crc32(bytes(b[:16])))
    off, n = 20, struct.unpack_from("<I", b, 12)[0]
    for _ in range(min(n, 1 << 16)):
        if off + 28 > len(b):
            break
        n_stored = struct.unpack_from("<Q", b, off + 8)[0]
        stored = bytes(b[off + 28 : off + 28 + n_stored])
        b[off + 24 : off + 28] = struct.pack("<I", zlib.crc32(stored, zlib.crc32(bytes(b[off : off + 24]))))
        off += 28 + n_stored
    return bytes(b)


def test_one_input(data: bytes) -> None:
    if not data:
        return
    model = MODELS[(data[0] & 3) % len(MODELS)]
    blob = data[1:] if data[0] & 0x80 else recrc(data[1:])
    try:
        kvz.parse(model.live(), blob)
    except SessionError:
        pass


# Values a field of the metadata is replaced by: wrong types, bounds, and numbers past every limit.
AWKWARD = [
    None,
    True,
    False,
    0,
    1,
    -1,
    2,
    3,
    255,
    256,
    2**31 - 1,
    2**31,
    2**32,
    2**63,
    2**64,
    -(2**63),
    1.5,
    float("nan"),
    "",
    "0",
    "18446744073709551616",
    "-1",
    "tiered",
    "stock",
    [],
    [0],
    [[0, 1, 0]],
    {},
]


def _mutate_json(value, rng: random.Random):
    """value with one entry somewhere inside it replaced, dropped or added."""
    if isinstance(value, dict) and value and rng.random() < 0.8:
        key = rng.choice(sorted(value, key=str))
        r = rng.random()
        if r < 0.1:
            del value[key]
        elif r < 0.4:
            value[key] = rng.choice(AWKWARD)
        else:
            value[key] = _mutate_json(value[key], rng)
        return value
    if isinstance(value, list) and value and rng.random() < 0.8:
        i = rng.randrange(len(value))
        r = rng.random()
        if r < 0.15:
            del value[i]
        elif r < 0.3:
            value.insert(i, value[i])
        else:
            value[i] = _mutate_json(value[i], rng)
        return value
    if isinstance(value, int) and not isinstance(value, bool) and rng.random() < 0.5:
        return value + rng.choice([-1, 1, -value, value, 1 << rng.randrange(64)])
    return rng.choice(AWKWARD)


def mutate(data: bytes, max_size: int, seed: int) -> bytes:
    """libFuzzer's custom mutator: half the time on the bytes, half on the sections."""
    rng = random.Random(seed)
    if len(data) < 2 or rng.random() < 0.5:
        return atheris.Mutate(data, max_size)
    try:
        sections = container.unpack(data[1:])
    except SessionError:
        return atheris.Mutate(data, max_size)
    r = rng.random()
    if r < 0.1 and sections:
        del sections[rng.randrange(len(sections))]
    elif r < 0.2 and sections:
        i = rng.randrange(len(sections))
        sections.insert(rng.randrange(len(sections) + 1), sections[i])
    elif r < 0.3 and len(sections) > 1:
        i, j = rng.sample(range(len(sections)), 2)
        sections[i], sections[j] = sections[j], sections[i]
    elif sections:
        i = rng.randrange(len(sections))
        tag, payload = sections[i]
        if tag == b"META" and rng.random() < 0.7:
            try:
                meta = json.loads(payload)
                payload = json.dumps(_mutate_json(meta, rng), sort_keys=True).encode()
            except ValueError:
                payload = atheris.Mutate(payload, len(payload) + 64)
        else:
            payload = atheris.Mutate(payload, len(payload) + 64)
        sections[i] = (tag, payload)
    out = data[:1] + container.pack(sections, entropy=rng.random() < 0.2)
    return out if len(out) <= max_size else atheris.Mutate(data, max_size)


def write_start(folder: str) -> None:
    os.makedirs(folder, exist_ok=True)
    made = starting_inputs()
    for name, mi, blob in made:
        kvz.parse(MODELS[mi].live(), blob)  # the fake context must take the real sessions it wrote
        with open(os.path.join(folder, name), "wb") as f:
            f.write(bytes([mi]) + blob)
    print(f"fuzz_session: {len(made)} starting inputs in {folder}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--start":
        write_start(sys.argv[2])
    else:
        atheris.Setup(sys.argv, test_one_input, custom_mutator=mutate)
        atheris.Fuzz()
