"""What a context holds, in bytes, in closed form: llama.cpp's cells (the hot window, the
sliding-window layers') and the store's blocks, from the model's shape and the config alone
(`kvgguf inspect` prints it, tests/model/test_inspect.py holds it against live contexts); and the
budget of "auto:held=BITS", whose plan counts every one of those bytes.

llama.cpp 0c1e570 (src/llama-context.cpp and llama-kv-cache-iswa.cpp):

- llama.cpp pads n_ctx up to a multiple of 256 cells; full-attention layers hold that many;
- sliding-window layers hold as many with swa_full (llama.cpp's and llama-cpp-python's default),
  else GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256); the patched llama.cpp holds as many as
  kvgguf asks (llama_kvgguf_set_window_cells), within [n_swa + n_ubatch, the padded n_ctx];
- a cell of a layer holds n_head_kv x head_dim values of K and as many of V, in the cache
  type's blocks of 32 values;
- kvgguf.Llama(kv_codec=...) asks llama.cpp for min(n_ctx, hot + n_batch) cells (hot_cells, ubatch
  min(n_ubatch, n_batch)) and as many sliding-window cells (in TieredConfig.window, whatever
  swa_full says: it evicts a position from every layer at once) and holds older tokens of the
  full-attention layers in its store, laid out by the policy's own plans.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

from ..bindings import codecs
from ..enums import Kind, Tier
from ..model.shape import KVShape
from . import plan
from .tiered import TieredConfig

LLAMA_PAD = 256  # llama-context.cpp pads n_ctx (and the sliding-window cache) to a multiple of 256
# Bytes per block of 32 values of llama.cpp's cache types (ggml's block layouts).
LLAMA_BLOCK_BYTES = {
    "f32": 128,
    "f16": 64,
    "bf16": 64,
    "q8_0": 34,
    "q5_1": 24,
    "q5_0": 22,
    "q4_1": 20,
    "q4_0": 18,
    "iq4_nl": 18,
}
N_UBATCH = 512  # llama-cpp-python's (and kvgguf.Llama's) default


def pad(n: int) -> int:
    return -(-n // LLAMA_PAD) * LLAMA_PAD


def llama_cache_bytes(
    shape: KVShape,
    n_ctx: int,
    cache: str = "f16",
    *,
    swa_full: bool = True,
    n_ubatch: int = N_UBATCH,
    window: Optional[str] = None,
) -> int:
    """Bytes llama.cpp allocates for a context of n_ctx cells of one cache type (the
    sliding-window layers' cells of type window, where given). swa_full is llama.cpp's (and
    llama-cpp-python's) default; off, sliding-window layers hold their window plus one ubatch."""
    return sum(llama_cells_bytes(shape, n_ctx, cache, swa_full=swa_full, n_ubatch=n_ubatch, window=window))


def llama_cells_bytes(
    shape: KVShape,
    n_ctx: int,
    cache: str = "f16",
    *,
    swa_full: bool = True,
    n_ubatch: int = N_UBATCH,
    window: Optional[str] = None,
    window_cells: Optional[int] = None,
) -> tuple[int, int]:
    """(full-attention layers' bytes, sliding-window layers' bytes) of llama_cache_bytes;
    window_cells: the sliding-window cells a kvgguf context asks for (llama_kvgguf_set_window_cells),
    which swa_full then does not change."""
    cells = pad(n_ctx)
    if window_cells:
        swa_cells = min(cells, max(shape.n_swa + n_ubatch, window_cells))
    else:
        swa_cells = cells if swa_full else pad(min(cells, shape.n_swa + n_ubatch))
    full = set(shape.full_layers)

    def layer_bytes(il: int, n_cells: int, t: str) -> int:
        return n_cells * (shape.width(il, 0) + shape.width(il, 1)) // 32 * LLAMA_BLOCK_BYTES[t]

    return (
        sum(layer_bytes(il, cells, cache) for il in full),
        sum(layer_bytes(il, swa_cells, window or cache) for il in range(shape.n_layer) if il not in full),
    )


def block_bytes(shape: KVShape, rows: int, table: dict[tuple[int, int], str], group_size: int) -> int:
    """Encoded bytes of one block of rows on the full-attention layers, K and V, each list in its
    codec of table ({(layer, kind): codec}); codebooks not counted."""
    return sum(
        codecs.get(table[il, kind], group_size=group_size).encoded_size((rows, shape.n_head_kv, dim), role)
        for il in shape.full_layers
        for kind, dim, role in ((Kind.K, shape.head_dim_k, "k"), (Kind.V, shape.head_dim_v, "v"))
    )


def store_bytes(shape: KVShape, counts: dict[tuple[int, int], int], config: TieredConfig) -> int:
    """Encoded bytes of the store's blocks ({(rows, tier): how many}) on the full-attention layers,
    each in its tier's codec, plus a float32 book per (layer, kind) for each codec that keeps
    one (pq2, vq8, vq8f, wfq)."""
    tables = {tier: config.table(tier, shape.n_layer) for _, tier in counts}
    total, books = 0, set()
    for (rows, tier), n_blocks in counts.items():
        total += n_blocks * block_bytes(shape, rows, tables[tier], config.group_size)
        for il in shape.full_layers:
            for kind, dim in ((Kind.K, shape.head_dim_k), (Kind.V, shape.head_dim_v)):
                c = codecs.get(tables[tier][il, kind], group_size=config.group_size)
                if c.name in codecs.BOOK_CODECS and (il, kind, c.name) not in books:
                    books.add((il, kind, c.name))
                    total += math.prod(codecs.book_shape(c.name, shape.n_head_kv, dim)) * 4
    return total


def context_bytes(
    shape: KVShape,
    n_ctx: int,
    config: TieredConfig,
    *,
    n_batch: Optional[int] = None,
    n_ubatch: int = N_UBATCH,
    n_tokens: Optional[int] = None,
) -> dict:
    """What kv_memory() of kvgguf.Llama(kv_codec=config, n_ctx=n_ctx, n_batch=n_batch,
    n_ubatch=n_ubatch) holds after n_tokens (default n_ctx) were evaluated in
    batches of n_batch, for a config already fitted to the model (its hot window, batch and cell
    types decided: cli/inspect.py's fitted_config): llama.cpp's buffer (config.hot_cells) for the
    hot window plus one batch (n_batch defaults to TieredConfig.ubatch, as kvgguf.Llama's does),
    its sliding-window layers' cells as many, unpadded, in config.window ("window"), and the store's blocks,
    which the policy's own plans lay out (policy.plan.block_counts: closed form, any context).
    index: the store's block tables (index_bytes); n_cold: the rows the store then holds."""
    n_batch = min(config.ubatch, n_ctx) if n_batch is None else n_batch
    counts, n_cold = plan.block_counts(n_ctx if n_tokens is None else n_tokens, n_batch, config)
    physical = min(n_ctx, config.hot + n_batch)
    hot, window = llama_cells_bytes(
        shape,
        physical,
        config.hot_cells,
        n_ubatch=min(n_ubatch, n_batch),
        window=config.window,
        window_cells=physical,
    )
    store = store_bytes(shape, counts, config)
    n = n_ctx if n_tokens is None else n_tokens
    return {
        "hot": hot,
        "window": window,
        "store": store,
        "index": index_bytes(shape, counts),
        "reuse": reuse_bytes(shape, n, n_batch, config),
        "n_cold": n_cold,
    }


def reuse_bytes(shape: KVShape, n_tokens: int, n_batch: int, config: TieredConfig, *, windows: bool = True) -> int:
    """What runtime/reuse.py keeps after n_tokens in batches of n_batch (kv_memory()'s "reuse"):
    llama.cpp's bytes of the rows of every eviction that ended within config.reuse of the newest
    cold row (the full-attention layers' cells in hot_cells; with windows, the sliding ones' in
    window too: at most, since llama.cpp may have given a window cell to a newer position
    before the eviction, which then has no row to keep), and the warm codes of every block that
    aged and ends within as many of the aging limit, each block with its record
    (kvg_store_copy_blocks)."""
    if not config.reuse:
        return 0
    moved, due = plan.last_evictions(n_tokens, n_batch, config, config.reuse + config.warm_tokens)
    if not moved:
        return 0
    n_cold = moved[-1][1]
    floor = n_cold - config.reuse
    full = set(shape.full_layers)
    per_row = sum(
        (shape.width(il, 0) + shape.width(il, 1))
        // 32
        * LLAMA_BLOCK_BYTES[config.hot_cells if il in full else config.window]
        for il in range(shape.n_layer)
        if windows or il in full
    )
    total = per_row * sum(p1 - p0 for p0, p1 in moved if p1 > floor)
    if config.archive is None:
        return total
    # blocks aged so far: by the limit of the last eviction whose aging ran
    aged_at = moved[-2][1] if due and len(moved) > 1 else (0 if due else n_cold)
    limit = aged_at - config.warm_tokens
    table = config.table(Tier.WARM, shape.n_layer)
    for p0, p1 in moved:
        for tier, a, b in plan.evicted_parts(p0, p1, config):
            r0, r1 = p0 + a, p0 + b
            if tier == Tier.WARM and floor - config.warm_tokens < r1 <= limit:
                for il in shape.full_layers:
                    for kind, dim, role in ((Kind.K, shape.head_dim_k, "k"), (Kind.V, shape.head_dim_v, "v")):
                        c = codecs.get(table[il, kind], group_size=config.group_size)
                        total += c.encoded_size((r1 - r0, shape.n_head_kv, dim), role) + BLOCK_RECORD_BYTES
    return total


BLOCK_RECORD_BYTES = 40  # sizeof(kvg_block_record), native/include/kvgguf.h: each kept block's header


BLOCK_ENTRY_BYTES = 56  # sizeof(kvg_block), native/src/kvg_internal.h (a static assert there), on 64-bit machines


def index_bytes(shape: KVShape, counts: dict[tuple[int, int], int]) -> int:
    """The store's block tables for these blocks ({(rows, tier): how many} a layer): each
    full-attention layer's K and V lists grow by doubling from 16 entries (store.c's
    reserve_block); plus a bound on its fixed structs. kv_memory() counts them as index_bytes."""
    n_blocks, cap = sum(counts.values()), 0
    while cap < n_blocks:
        cap = cap * 2 if cap else 16
    # the store's fixed structs (its header, two lists a layer, a query scratch): a bound
    fixed = 1024 + 256 * shape.n_layer + 4 * max(shape.head_dim_k, shape.head_dim_v)
    return 2 * len(shape.full_layers) * cap * BLOCK_ENTRY_BYTES + fixed


def bits_held(shape: KVShape, n_ctx: int, config: TieredConfig, n_batch: Optional[int] = None) -> float:
    """Bits per value of the whole context (K and V of every layer) that a full context of n_ctx
    tokens holds, llama.cpp's cells, the store's block tables and what a cut puts back (reuse)
    included: what kv_memory() reports as bits held."""
    b = context_bytes(shape, n_ctx, config, n_batch=n_batch)
    return 8 * (b["hot"] + b["window"] + b["store"] + b["index"] + b["reuse"]) / (n_ctx * shape.values_per_token)


def compressed_bits(shape: KVShape, n_ctx: int, config: TieredConfig, n_batch: Optional[int] = None) -> float:
    """Bits per value of the store's rows (sinks and codebooks included) in a full context."""
    b = context_bytes(shape, n_ctx, config, n_batch=n_batch)
    per_row = sum(shape.width(il, 0) + shape.width(il, 1) for il in shape.full_layers)
    return 8 * b["store"] / (b["n_cold"] * per_row) if b["n_cold"] else 0.0


LOWEST_BUDGET = 1.0  # the lowest budget a plan takes (kv_codec "auto:BITS" refuses less)
HIGHEST_BUDGET = 16.0


def budget_for_held(
    bits: float,
    config_for: Callable[[float], TieredConfig],
    held_of: Callable[[TieredConfig], float],
    what: str,
    steps: int = 16,
) -> float:
    """The budget per compressed value whose plan (config_for; ValueError below the cheapest
    plan) holds at most `bits` per value in all (held_of): the largest one, found by bisection
    over [1, 16] (a plan spends no more as its budget falls). ValueError, naming what the
    cheapest plan holds, when even that holds more: the cells alone (the hot window, a sliding
    window) leave the rows too little at this context. `what` names the request in messages."""

    def plan(b: float) -> Optional[TieredConfig]:
        try:
            return config_for(b)
        except ValueError:  # below the cheapest plan
            return None

    if plan(HIGHEST_BUDGET) is None:
        raise ValueError(f"{what}: no plan of the calibration fits even {HIGHEST_BUDGET:g} bits per compressed value")
    lo, hi = LOWEST_BUDGET, HIGHEST_BUDGET  # the cheapest plan's budget lies in (lo, hi]
    if plan(lo) is None:
        for _ in range(steps):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if plan(mid) is None else (lo, mid)
        lo = hi
    cheapest = held_of(plan(lo))
    if cheapest > bits:
        raise ValueError(
            f"{what}: llama.cpp's cells and the compressed rows at the cheapest plan already hold "
            f"{cheapest:.2f} bits per value at this n_ctx; ask for more bits, a longer n_ctx (the cells are a "
            f"smaller share of it), or cells of a smaller type (':hot=TYPE', ':window=TYPE')"
        )
    hi = HIGHEST_BUDGET
    if held_of(plan(hi)) <= bits:
        return hi
    for _ in range(steps):  # held_of(plan(lo)) <= bits < held_of(plan(hi))
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if held_of(plan(mid)) <= bits else (lo, mid)
    return lo
