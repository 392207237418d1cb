"""The live tiered cache: moves rows that leave llama.cpp's hot window into the store.

Between decode chunks the oldest hot rows leave llama.cpp in one call (patched
llama_kvgguf_evict: each layer's rows handed to the store's C entry point, encoded, then
removed and the cells compacted); the patched attention brings them back through the store's
C hooks. Cold rows are exactly positions [0, n_cold) of the sequence; hot ones follow.
"""

from __future__ import annotations

import copy
import ctypes
import threading
import warnings

import llama_cpp.llama_cpp as C
import numpy as np

from ..llamacpp import hooks, seq_state, state_format
from .memory import REUSE, KVMemory, TierMemory
from .reuse import RecentRows
from .signals import TokenSignals
from ..model.shape import KVShape
from ..bindings import codecs, cuda_store
from ..bindings.binding import KvgError
from ..enums import Kind, Tier
from ..bindings.store import MASS_ROWS, KVStore
from ..policy import codec_spec, held, plan
from ..policy.tiered import CACHE_TYPES, TieredConfig, type_name

SEQ = 0  # one sequence per context (n_seq_max = 1)
# Ubatches of at most this many tokens attend over the store's rows fused (scored from their
# codes, the hot cells through kvg_attend_f16); larger ones expand the rows to f16 for llama.cpp's
# kernels. With many queries per KV head the store decodes each chunk of rows once and multiplies
# dense tiles, so prefill ubatches (256 on the 1-3B presets, llama-cpp-python's default 512) are
# fused too: benchmarks/results/speed/shapes/*_fused_prefill.md and live_cache_4k_8k_dense.md measure it
# (fused_switch.md, up to 64 tokens, predates the dense tiles).
FUSED_MAX_TOKENS = 512


class LiveCache:
    def __init__(self, ctx, shape: KVShape, config: TieredConfig, *, fused_max_tokens: int = FUSED_MAX_TOKENS):
        self.ctx = ctx  # llama_context_p
        self.fused_max_tokens = fused_max_tokens
        self.shape = shape
        self.config = config
        self.capacity = C.llama_n_ctx(ctx)  # llama.cpp's cells: hot + one batch, padded
        # Evictions only before a batch that starts on a multiple of step (kvgguf.Llama splits
        # batches there), so what a context holds is a function of its tokens (plan.state_at).
        self.step = max(1, C.llama_n_batch(ctx))
        # Rows [0, canonical) are as a fresh evaluation of the tokens would hold them (not, say,
        # a session's hot rows restored through a lossy codec).
        self.canonical = 0
        self.n_held = 0  # positions [0, n_held) have rows here (cold) or in llama.cpp's cells
        # Aging (warm blocks past the warm window re-coded to the archive tier) follows the batch
        # after their eviction: at its end on the CPU; where every attended layer reads the
        # device copy, on a thread of its own while the GPU runs that batch (the result reaches the
        # copy at the next sync). Either way a batch attends over the same codes on both paths.
        # the batch start of the eviction whose aging is still to do (None: none is)
        self._aging_due: int | None = None
        self._aging: threading.Thread | None = None  # aging beside the GPU's batch
        self._aging_error: BaseException | None = None
        self._store = KVStore(
            shape.n_layer, shape.n_head_kv, shape.head_dim_k, shape.head_dim_v, group_size=config.group_size
        )
        self.layers = []  # layers that get cold rows (all but sliding-window ones)
        for il in range(shape.n_layer):
            attention = hooks.layer_info(ctx, il, None, None)  # 1: full attention, with a KV cache
            if attention == 1:
                self.layers.append(il)
            else:
                self._store.set_layer_enabled(il, False)
        if not self.layers:
            raise ValueError("this model has no full-attention layer with a KV cache to compress")
        # the hot cells' type as llama.cpp allocated it (f16, or q8_0: ggml converts them as they leave)
        cells = hooks.cells_of(ctx, self.layers[0])
        self.hot_type = cells[0] if cells else CACHE_TYPES["f16"]
        if self.hot_type not in (CACHE_TYPES["f16"], CACHE_TYPES["q8_0"]):
            raise ValueError(f"kvgguf reads hot cells of f16 or q8_0, not of ggml type {self.hot_type}")
        # {tier: {(layer, kind): codec}} for the tiers this config fills
        self.codecs = {
            tier: config.table(tier, shape.n_layer)
            for tier in (Tier.SINK, Tier.WARM, Tier.ARCHIVE)
            if tier != Tier.ARCHIVE or config.archive is not None
        }
        self.blocks: list[plan.Block] = []
        # (a budget that drops by mass ranks blocks by what the fused attention counts too)
        self.signals = TokenSignals(config.keep, config.sinks, mass=config.budget is not None and config.drop == "mass")
        self._sizes: dict[tuple[int, int], int] = {}  # (rows, tier) -> a block's bytes (_block_bytes)
        self.tokens_dropped = 0  # positions the budget dropped
        if config.budget is not None and config.budget < self.min_budget():
            raise ValueError(
                f"kv_codec budget={config.budget} bytes cannot hold the sinks and one eviction on this model: "
                f"give it at least {self.min_budget()}"
            )
        self.books: dict[tuple[int, int, str], np.ndarray] = {}  # use_books: given codebooks, kept across clears
        # (CUDA device, its layers) where the layers' cells live in a GPU's memory: their fused ops
        # run there, over a device copy of the store (device_store), synced before every batch
        self.gpu = self._gpu_layers()
        self.device_store: cuda_store.DeviceStore | None = None
        self.encode_on_gpu = config.gpu_encode  # evicted f16 cells coded where they lie
        self.rows_coded_on_gpu = 0  # (rows, one layer and kind each) that never left the GPU
        # What a cut needs to put back (TieredConfig.reuse); not on a GPU, whose device copy of
        # the store is not rebuilt in place: a cut into evicted rows evaluates again there.
        self.recent = RecentRows(config.reuse if self.gpu is None else 0, config.warm_tokens)
        self._read_range = seq_state.RangeReader(ctx)  # the rows an eviction keeps for reuse
        self._layers_of_cache = state_format.cache_layers(ctx, shape.n_layer, hooks.layer_info)
        if self.gpu is not None and self.fused_max_tokens > 0:
            # every ubatch fused: the expanding path's ops run on the CPU
            self.fused_max_tokens = max(self.fused_max_tokens, C.llama_n_ubatch(ctx))
        self._attach(self._store)

    @property
    def store(self) -> KVStore:
        """The store, once aging that runs beside the GPU's batch is done with it."""
        self._settle()
        return self._store

    @property
    def ages_beside(self) -> bool:
        """Whether aging runs on a thread of its own during the next batch (TieredConfig.age_beside):
        by default where every attended layer reads the device copy, so that the batch reads
        nothing of the host store and attends over the codes aging after it would leave."""
        if self.config.keep is not None:
            return False
        if self.config.age_beside is not None:
            return self.config.age_beside
        return self.device_store is not None and self.gpu is not None and set(self.layers) <= self.gpu[1]

    def _settle(self) -> None:
        """Waits for aging running beside the GPU; what it raised beyond a store error (which it
        reports as a warning, as aging does) is raised here, from the next access to the store."""
        if self._aging is None:
            return
        self._aging.join()
        self._aging = None
        error, self._aging_error = self._aging_error, None
        if error is not None:
            raise RuntimeError("kvgguf: aging beside the GPU's batch failed") from error

    def _gpu_layers(self) -> tuple[int, set[int]] | None:
        """(device, layers) of the layers whose cells a CUDA device holds, None where none does.
        Raises ValueError before the first token for what the GPU path cannot run."""
        where = hooks.device_cells(self.ctx, self.layers)
        names = set(where.values())
        if not names:
            return None
        cuda = sorted(n for n in names if n.startswith("CUDA") and n[4:].isdigit())
        why = (
            f"the layers' cells live in {sorted(names)}, and the GPU path takes one CUDA device"
            if len(cuda) != 1 or len(names) != 1
            else cuda_store.unavailable()
        )
        if why:
            warnings.warn(
                f"kvgguf: {why}; the GPU layers' attention over compressed rows runs on the CPU, "
                "their cells crossing the bus every layer (slow)",
                RuntimeWarning,
                stacklevel=3,
            )
            return None
        layers = set(where)
        for tier, table in self.codecs.items():
            for il in sorted(layers):
                for kind in Kind:
                    dim = self.shape.head_dim_k if kind == Kind.K else self.shape.head_dim_v
                    why = cuda_store.gpu_refuses(table[il, kind], self.shape.n_head_kv, dim)
                    if why:
                        raise ValueError(
                            f"layer {il} is on the GPU ({cuda[0]}), and its {Tier(tier).name.lower()} "
                            f"{kind.name} rows would be {table[il, kind]}: {why}; choose such codecs, or keep "
                            "this layer on the CPU (n_gpu_layers, offload_kqv=False)"
                        )
        k_codecs = {table[il, Kind.K] for table in self.codecs.values() for il in layers}
        slow = cuda_store.run_breaks(k_codecs, self.config.block, self.config.group_size)
        if slow:
            warnings.warn(f"kvgguf: {slow}", RuntimeWarning, stacklevel=3)
        if self.config.keep == "mass":
            raise ValueError(
                "keep='mass' counts the attention mass on the fused path, which GPU layers do not report "
                "yet; use another keep signal, or keep the layers on the CPU"
            )
        return int(cuda[0][4:]), layers

    def _attach_gpu(self, store: KVStore) -> cuda_store.DeviceStore | None:
        """A device copy of store, synced, with llama.cpp's CUDA hooks pointed at it."""
        if self.gpu is None:
            return None
        device, layers = self.gpu
        dev = cuda_store.DeviceStore(store, device)
        for il in range(self.shape.n_layer):
            if il not in layers:
                dev.set_layer(il, False)
        dev.sync()
        table = hooks.llama_kvgguf_cuda(dev.address, *dev.hook_functions())
        status = hooks.set_cuda(self.ctx, ctypes.byref(table))
        if status != 0:
            raise RuntimeError(
                "llama.cpp took no CUDA hooks for kvgguf's fused path "
                + ("(its CUDA backend does not run custom ops)" if status == -2 else f"(status {status})")
            )
        return dev

    def _attach(self, store: KVStore) -> None:
        """Points llama.cpp's hooks at store (the C entry points read it, no Python)."""
        self._settle()
        self._install_books(store)  # first: if it fails, the hooks still point at the old store
        device_store = self._attach_gpu(store)  # so is this
        n_cold_fn, decode_fn, shifts_fn = store.hook_functions()
        table = hooks.llama_kvgguf_hooks(store.address, n_cold_fn, decode_fn, 0, 0, shifts_fn)
        if hooks.set_hooks(self.ctx, ctypes.byref(table)) != 0:
            raise ValueError("llama.cpp refused kvgguf's hooks: this context's memory is not a KV cache")
        fused = self.fused_max_tokens > 0
        hooks.set_attend(self.ctx, store.attend_function() if fused else None, self.fused_max_tokens)
        hooks.set_attend_f16(self.ctx, store.attend_f16_function() if fused else None)
        # The fused path also counts the attention mass of cold rows (one add per row and query).
        store.set_mass(fused)
        hooks.set_mass(self.ctx, store.mass_function() if fused else None)
        self._store = store
        self.device_store = device_store
        # Aging codes on llama.cpp's batch threads, idle after a batch; beside a GPU's batch one
        # fewer, which leaves the thread launching the batch's kernels a core. (Every store this
        # cache holds, a restored session's too.)
        threads = max(1, min(64, C.llama_n_threads_batch(self.ctx)))
        store.set_threads(max(1, threads - 1) if self.ages_beside else threads)

    def use_books(self, books: dict[tuple[int, int, str], np.ndarray]) -> None:
        """pq2/vq8/vq8f codebooks ({(layer, kind, codec): book}, a calibration's) for the lists this
        config codes with them: every sequence starts from these instead of training its own on
        its first block. Held (and counted) only where a tier uses that codec on that list."""
        used = self.book_lists()
        self.books = {key: bk for key, bk in books.items() if key in used}
        self._install_books(self.store)

    def book_lists(self) -> set[tuple[int, int, str]]:
        """(layer, kind, codec) of every list a tier codes with a codebook codec (pq2, vq8, vq8f)."""
        return {
            (il, kind, name)
            for table in self.codecs.values()
            for (il, kind), name in table.items()
            if name in codecs.BOOK_CODECS and il in self.layers
        }

    def _install_books(self, store: KVStore) -> None:
        """Gives store the codebooks it lacks (a new, cleared or restored store; a session's own
        codebooks, which its rows were coded with, stay)."""
        for (il, kind, name), bk in self.books.items():
            if store.book(il, kind, name) is None:
                store.set_book(il, kind, name, bk)

    def snapshot(self) -> tuple:
        """The store, block list, keep signals and what is canonical now, for restore() to put
        back (without what a cut could put back: RecentRows starts over)."""
        state = (self.canonical, self.n_held, self._aging_due)
        return self.store, copy.deepcopy(self.blocks), copy.deepcopy(self.signals), state

    def restore(self, snapshot: tuple) -> None:
        store, blocks, signals, (canonical, n_held, aging_due) = snapshot
        self._attach(store)
        self.blocks, self.signals = blocks, signals
        self.canonical, self.n_held, self._aging_due = canonical, n_held, aging_due
        self.recent.clear()

    def adopt(self, store: KVStore, blocks: list[tuple[int, int, int]], n_tokens: int, exact: bool) -> None:
        """Replaces the compressed rows by another store's (a restored session's of n_tokens
        tokens, whose rows llama.cpp holds exactly were kept bit for bit where exact)."""
        self._attach(store)
        self.blocks = [plan.Block(*b) for b in blocks]
        due = plan.state_at(n_tokens, self.step, self.config)[1]
        self._aging_due = n_tokens - n_tokens % self.step if due else None
        self.n_held = n_tokens
        self.canonical = n_tokens if exact else self.n_cold  # coded exact rows are not a fresh context's
        # rows a shift or a budget moved were computed beside tokens the context no longer holds
        moved = [runs[0][0] for il in self.layers if (runs := store.shifts(il))]
        self.canonical = min([self.canonical, *moved])
        self.recent.clear()
        if self.config.keep is not None:
            # Warm blocks below the warm window were kept when they aged (the signals that
            # chose them are not saved): they stay warm.
            for b in plan.blocks_to_archive(self.blocks, self.config):
                b.kept = True
        self.signals.clear()

    @property
    def n_cold(self) -> int:
        return self.blocks[-1].r1 if self.blocks else 0

    def set_codecs(self, tier: int, table: dict[tuple[int, int], str]) -> None:
        """Another {(layer, kind): codec} table for a tier, for rows encoded from now on (rows
        already held keep theirs). Calibration swaps one list at a time between runs."""
        self._settle()  # aging reads the archive's table
        if tier not in self.codecs or tier == Tier.SINK:
            raise ValueError(f"tier {tier} holds no compressed rows in this config")
        if set(table) != set(self.codecs[tier]):
            raise ValueError("a codec table names every (layer, kind) of the model")
        for name in set(table.values()):
            codecs.get(name)  # unknown names fail here, before anything changes
        self.codecs[tier] = dict(table)

    def codec_name(self, tier: int) -> str:
        """A tier's codecs over the layers that hold cold rows: "rotq4", "K kivi4 / V rotq3", ..."""
        return self.codec_names()[tier]

    def codec_names(self) -> dict[int, str]:
        """Each tier's codecs, read from the blocks it holds (a restored session's rows keep the
        codec they were saved with, whatever this config says); for a tier without rows, the
        config's, which its next rows will get."""
        held: dict[int, dict] = {}
        for il in self.layers:
            for kind in Kind:
                for tier, names in self.store.codecs_held(il, kind).items():
                    held.setdefault(tier, {})[il, kind] = "+".join(sorted(names))
        out = {tier: codec_spec.describe(table) for tier, table in held.items()}
        for tier, table in self.codecs.items():
            if tier not in out:
                out[tier] = codec_spec.describe({key: c for key, c in table.items() if key[0] in self.layers})
        return out

    def close(self) -> None:
        try:
            self._settle()
        except RuntimeError as e:  # closing: the store goes anyway
            warnings.warn(str(e.__cause__ or e), RuntimeWarning, stacklevel=2)
        if self.ctx is not None:
            hooks.set_mass(self.ctx, None)
            hooks.set_cuda(self.ctx, None)
            hooks.set_attend(self.ctx, None, 0)
            hooks.set_hooks(self.ctx, None)
            self.ctx = None

    # --- writes -------------------------------------------------------------------------

    def before_batch(self, n_past: int, n_new: int) -> None:
        """Carries out the eviction plan before a batch of n_new tokens: the oldest hot rows
        beyond the configured window go to the store; warm blocks that aged go to archive after
        the batch (after_batch), or beside it on the GPU."""
        self._settle()
        aligned = n_past % self.step == 0
        if n_past % self.step + n_new > self.step:
            raise ValueError(f"kvgguf: a batch of {n_new} tokens at {n_past} crosses a multiple of n_batch={self.step}")
        if aligned and self._aging_due is not None and n_past > self._aging_due:
            # aging not done yet (the batch that ended here failed)
            self._aging_due = None
            self._age()
        n_cold = self.n_cold
        n_evict = self._n_evict(n_past, n_new)
        if n_past - n_cold - n_evict + n_new > self.capacity:
            raise ValueError(
                f"a batch of {n_new} tokens does not fit beside the hot window "
                f"({self.config.hot} tokens) in llama.cpp's {self.capacity} cells"
            )
        if n_evict:
            self._evict(n_cold, n_cold + n_evict)
            self._aging_due = n_past
        if self.device_store is not None:
            # what changed since the last batch (evictions, aging, a truncation, a clear)
            self.device_store.sync()
        if self._aging_due is not None and self.ages_beside and (n_past + n_new) % self.step == 0:
            self._aging_due = None
            # not a daemon: an interpreter that exits mid-aging waits for it before freeing the store
            self._aging = threading.Thread(target=self._age_beside, name="kvgguf-aging", daemon=False)
            self._aging.start()

    def _n_evict(self, n_past: int, n_new: int) -> int:
        """The rows before_batch evicts before a batch of n_new tokens at n_past: at a multiple of
        step (a context shift moves n_past off them: then where the batch needs the room)."""
        due = n_past % self.step == 0 or n_past - self.n_cold + n_new > self.capacity
        return plan.rows_to_evict(n_past, self.n_cold, self.config) if due else 0

    def _age_beside(self) -> None:
        try:
            self._age()
        except BaseException as e:  # raised by _settle, at the next access to the store
            self._aging_error = e

    @property
    def wants_logits(self) -> bool:
        """Whether kvgguf.Llama must hand every position's logits to note_logits."""
        return self.signals.wants_logits

    def note_logits(self, n_past: int, tokens, logits: np.ndarray) -> None:
        self.signals.note_logits(n_past, tokens, logits)

    def after_batch(self, n_past: int, n_tokens: int) -> None:
        """Notes what the batch of n_tokens at n_past just decoded tells the keep signal; where it
        ends on a multiple of step, ages the blocks the last eviction pushed out of the warm
        window (a fresh prefill's batch after the eviction attends over them unaged too)."""
        if self.signals.wants_mass and self.blocks and 0 < n_tokens <= self.fused_max_tokens:
            self.signals.note_mass(self.attention_mass(reset=True), n_tokens, n_past + (n_tokens + 1) / 2)
        if n_past <= self.canonical:
            self.canonical = max(self.canonical, n_past + n_tokens)
        self.n_held = n_past + n_tokens
        if self._aging_due is not None and (n_past + n_tokens) % self.step == 0:
            self._aging_due = None
            self._age()

    def read_rows(self, il: int, kind: int, p0: int, p1: int) -> np.ndarray:
        """Rows of positions [p0, p1) that llama.cpp holds exactly on list (il, kind), as float32
        (converted from the cells' type by ggml, in llama.cpp)."""
        rows = np.empty((p1 - p0, self.store.width(kind)), dtype=np.float32)
        got = hooks.read_rows_f32(
            self.ctx, SEQ, il, kind, p0, p1, rows.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), rows.size
        )
        if got != p1 - p0:
            raise RuntimeError(
                f"kvgguf: llama.cpp could not read positions [{p0}, {p1}) of layer {il} (status {got}); "
                + ("it holds other rows: the cache was changed behind kvgguf's back" if got == -2 else "")
            )
        return rows

    def _evict(self, p0: int, p1: int) -> None:
        """Moves positions [p0, p1) into the store, all layers and both kinds, or nothing: the
        appended blocks all start at p0, so cutting back to p0 undoes them and cannot fail. One
        llama.cpp call reads every list out, codes it into the store through a plan made here
        once, removes the positions and compacts the cells (no Python per layer)."""
        parts = plan.evicted_parts(p0, p1, self.config)
        store = self.store
        try:
            on_device, read_out = [], []  # lists coded where they lie on the GPU; layers read out
            for il in self.layers:
                items = [self._device_items(il, kind, p0, p1, parts) for kind in Kind]
                if all(items):
                    on_device += items[0] + items[1]
                else:
                    read_out.append(il)
            if on_device:
                self.device_store.encode_many(on_device)
                self.rows_coded_on_gpu += sum(item[-1] for item in on_device)
            if self.recent.reach:
                self.recent.keep_rows(self._read_range(p0, p1), self._layers_of_cache, p0, p1)
            evict_plan = store.evict_plan(parts, self.codecs)
            layers = (ctypes.c_int32 * len(read_out))(*read_out)
            rc = hooks.evict(self.ctx, SEQ, p0, p1, layers, len(read_out), store.append_function(), evict_plan.address)
            if rc == hooks.EVICT_APPEND_FAILED:
                evict_plan.check(f"evict positions [{p0}, {p1})")
            if rc not in (0, hooks.EVICT_COMPACT_FAILED):
                raise RuntimeError(
                    f"kvgguf: llama.cpp could not evict positions [{p0}, {p1}) (status {rc}: "
                    + (
                        "its rows are not the positions in order; the cache was changed behind kvgguf's back)"
                        if rc == -2
                        else "see llama_kvgguf_evict)"
                    )
                )
        except BaseException:
            store.truncate(p0)
            self.recent.forget_from(p0)
            raise
        for tier, a, b in parts:
            self.blocks.append(plan.Block(p0 + a, p0 + b, tier))
        self.recent.forget_older(self.n_cold)
        # Hot rows are back in position order at the front (the call compacts): attention then
        # sums in the same order as a cache that never wrapped, and new tokens follow the old
        # ones. (It fails only for caches kvgguf refuses when it attaches; the rows are
        # consistent either way.)
        if rc == hooks.EVICT_COMPACT_FAILED:
            raise RuntimeError("kvgguf: llama.cpp could not compact its KV cache after an eviction")

    def _device_items(self, il: int, kind: int, p0: int, p1: int, parts) -> list[tuple]:
        """DeviceStore.encode_many's items that code the cells of [p0, p1) on the GPU where they lie,
        so that only their codes reach the host store (the bytes its CPU encoders would write); none
        where they must be read out (a CPU layer, q8_0 cells, cells not in one run)."""
        if self.device_store is None or il not in self.gpu[1] or not self.encode_on_gpu:
            return []
        view = hooks.view_cells(self.ctx, SEQ, il, kind, p0, p1)
        if view is None or view.is_host or view.n_rows != p1 - p0 or view.type != CACHE_TYPES["f16"]:
            return []
        return [
            (
                il,
                kind,
                tier,
                self.codecs[tier][il, kind],
                view.data + 2 * a * view.row_stride,  # f16: 2 bytes
                view.row_stride,
                view.col_stride,
                b - a,
            )
            for tier, a, b in parts
        ]

    def _age(self) -> None:
        """Warm blocks that left the warm window go to the archive tier: each block in one
        store call over every layer and kind (all of them or none), its tier noted after. Reads
        _store, not store: it may run beside the GPU's batch, which store would wait for."""
        table = self.codecs.get(Tier.ARCHIVE, {})
        aging = plan.blocks_to_archive(self.blocks, self.config)
        if aging and self.config.keep is not None:
            score = lambda b: self.signals.score(b.r0, b.r1)  # noqa: E731
            reference = [score(b) for b in self.blocks if b.tier != Tier.SINK]
            for b, keep in zip(aging, plan.kept([score(b) for b in aging], reference, self.config.keep_fraction)):
                b.kept = keep
            aging = [b for b in aging if not b.kept]
        lists = {(il, kind): table[il, kind] for il in self.layers for kind in Kind} if table else {}
        for b in aging:
            warm = self._store.copy_blocks(b.r0, b.r1) if self.recent.reach else None
            try:
                self._store.retier_lists(b.r0, b.r1, Tier.ARCHIVE, lists)
            except KvgError as e:
                # Not worth failing the batch over: warm rows are the better copy, and the next
                # eviction tries again.
                warnings.warn(
                    f"kvgguf: rows [{b.r0}, {b.r1}) could not move to the archive tier ({e}); they stay "
                    "warm for now (more memory, no loss)",
                    RuntimeWarning,
                    stacklevel=4,
                )
                return
            b.tier = Tier.ARCHIVE
            if warm is not None:
                self.recent.keep_warm(b.r0, b.r1, warm)
        self.recent.forget_older(self.n_cold)

    def truncate(self, n_tokens: int) -> None:
        """Forgets compressed rows at positions >= n_tokens (a new prompt diverged there)."""
        if n_tokens < self.n_cold:
            self.store.truncate(n_tokens)  # first: all or nothing, and the only step that can fail
            self.blocks = plan.truncated(self.blocks, n_tokens)
            self.recent.forget_from(n_tokens)
        self.signals.truncate(n_tokens)
        self.canonical = min(self.canonical, n_tokens)
        self.n_held = min(self.n_held, n_tokens)

    def shift(self, n_past: int, n_keep: int, n_discard: int) -> tuple[int, int]:
        """A context shift (llama-server's): drops the positions [p0, p1) that plan.shift_range
        picks (at least n_discard of them after the first n_keep, on block boundaries) and moves
        the later ones back by p1 - p0. Cold blocks keep their codes and are scored with queries
        rotated to match (kvg_store_shift); llama.cpp's cells shift by its own RoPE shift.
        Returns (p0, p1). A failure in llama.cpp empties the cache (RuntimeError): its tokens
        must be evaluated again."""
        self._settle()
        p0, p1 = plan.shift_range(self.blocks, n_past, n_keep, n_discard)
        if p1 > p0:
            self._move(n_past, p0, p1)
            self.signals.clear()
        return p0, p1

    def _move(self, n_past: int, p0: int, p1: int) -> None:
        """Drops positions [p0, p1) (on block boundaries) and moves the later ones back: the
        store's blocks keep their codes, llama.cpp's cells shift by its own RoPE shift."""
        window = self.shape.n_swa
        if window and n_past - (p1 - p0) - window < p0:
            # llama.cpp's window cells hold the hot rows only: a query must not see the kept front
            raise ValueError(
                f"kvgguf: a shift out of [{p0}, {p1}) would bring the first {p0} tokens inside the "
                f"sliding window of {window}; a longer n_ctx or a smaller n_keep shifts"
            )
        if p0 < self.n_cold:
            self.store.shift(p0, min(p1, self.n_cold))  # on the blocks' boundaries: fails only on bad input
        self.blocks = plan.shifted(self.blocks, p0, p1)
        rc = hooks.shift(self.ctx, SEQ, p0, p1)
        self.recent.clear()  # what a cut could put back was kept at the old positions
        self._aging_due = None
        self.n_held = max(0, min(self.n_held, n_past) - (p1 - p0))
        # a fresh evaluation of the tokens left would hold other rows past the kept ones
        self.canonical = min(self.canonical, p0)
        if rc != 0:
            self._start_over()
            raise RuntimeError(f"kvgguf: llama.cpp could not shift its cells out of [{p0}, {p1}) (status {rc})")

    # --- a budget (TieredConfig.budget) -----------------------------------------------------

    def cold_bytes(self) -> int:
        """Bytes the store's tiers hold: its codes and codebooks (what the budget bounds)."""
        return self.store.held().bytes + self.store.book_bytes()

    def _block_bytes(self, n_rows: int, tier: int) -> int:
        """Bytes a block of n_rows takes in tier on every attended layer, K and V."""
        key = (n_rows, tier)
        if key not in self._sizes:
            self._sizes[key] = held.block_bytes(self.shape, n_rows, self.codecs[tier], self.config.group_size)
        return self._sizes[key]

    def _evicted_bytes(self, p0: int, p1: int) -> int:
        return sum(self._block_bytes(b - a, tier) for tier, a, b in plan.evicted_parts(p0, p1, self.config))

    def min_budget(self) -> int:
        """The least budget a context can hold: its first eviction (the sinks and the warm rows
        after them) and the blocks of one batch's eviction beside it."""
        block = self.config.block
        first = -(-max(block, self.config.sinks) // block) * block
        return self._evicted_bytes(0, first) + -(-self.step // block) * self._block_bytes(block, Tier.WARM)

    def _drop_key(self, b: plan.Block) -> tuple:
        if self.config.drop == "oldest":
            return (b.r0,)
        m = self.signals.mass_per_query(b.r0, b.r1)
        return (0, m, b.r0) if m is not None else (1, 0.0, b.r0)  # blocks not seen yet last, oldest first

    def drops_due(self, n_past: int, n_new: int) -> list[tuple[int, int]]:
        """Under TieredConfig.budget: the cold ranges [r0, r1) to drop before a batch of n_new
        tokens at n_past, so that the store holds at most the budget once the batch's eviction is
        in. The fewest blocks the drop rule ranks first (never the sinks), merged where they
        touch, the last first (each one's positions are still right when it is dropped); []
        when nothing must go. ValueError where even dropping all of them would not do."""
        budget = self.config.budget
        if budget is None:
            return []
        self._settle()
        n_cold = self.n_cold
        need = self.cold_bytes() + self._evicted_bytes(n_cold, n_cold + self._n_evict(n_past, n_new)) - budget
        if need <= 0:
            return []
        chosen = []
        for b in sorted((b for b in self.blocks if b.tier != Tier.SINK), key=self._drop_key):
            if need <= 0:
                break
            chosen.append((b.r0, b.r1))
            need -= self._block_bytes(b.r1 - b.r0, b.tier)
        if need > 0:
            raise ValueError(
                f"kv_codec budget={budget} bytes cannot hold the sinks and one eviction ({budget + need} bytes); "
                f"give it at least {self.min_budget()}"
            )
        ranges: list[tuple[int, int]] = []
        for r0, r1 in sorted(chosen):
            if ranges and ranges[-1][1] == r0:
                ranges[-1] = (ranges[-1][0], r1)
            else:
                ranges.append((r0, r1))
        return ranges[::-1]

    def drop(self, n_past: int, r0: int, r1: int) -> None:
        """Drops the cold rows [r0, r1) (whole blocks) as a context shift does, for the budget:
        the later rows move back, what the signals noted about them with them."""
        self._settle()
        if not (0 <= r0 < r1 <= self.n_cold) or plan.shift_range(self.blocks, n_past, r0, r1 - r0) != (r0, r1):
            raise ValueError(f"kvgguf: rows [{r0}, {r1}) are not whole cold blocks to drop")
        self._move(n_past, r0, r1)
        self.signals.shift(r0, r1)
        self.tokens_dropped += r1 - r0

    def clear(self) -> None:
        self.store.clear()  # frees the codebooks too: given ones go back in
        self.tokens_dropped = 0
        self.blocks = []
        self._aging_due = None
        self.signals.clear()
        self.recent.clear()
        self.canonical = self.n_held = 0
        self._install_books(self.store)

    def rewind(self, n_tokens: int) -> int:
        """Cuts the context back to its first n_tokens tokens (a prompt that shares only those
        with it) so that it holds what a fresh context that evaluated them holds: returns r <=
        n_tokens, the tokens [r, n_tokens) to evaluate again. r = n_tokens where the rows and codes
        a fresh context holds are here or put back from RecentRows (r is then where a fresh
        prefill's last batch starts, at most n_batch - 1 back); else 0, the cache emptied.
        A cut among rows no fresh context holds (a session's exact rows restored from their codes)
        keeps them as they are: evaluating the context again is what the session saved."""
        self._settle()
        if n_tokens >= self.n_held:  # nothing to cut
            return n_tokens
        if n_tokens > self.canonical:
            self.truncate(n_tokens)
            return n_tokens
        # back to where a fresh prefill's batch starts: the tokens after it are evaluated again in
        # one batch with the new ones, as a fresh context evaluates them (another batch size sums
        # in another order: logits within the arithmetic floor, not equal)
        n = n_tokens - n_tokens % self.step
        # the batch at n starts with the eviction at n, which this context made too (the same rows,
        # so the same codes): the target is the state after it
        target, aging_due = plan.state_at(n + 1, self.step, self.config)
        c = target[-1].r1 if target else 0
        C.llama_memory_seq_rm(C.llama_get_memory(self.ctx), SEQ, n, -1)
        blocks = self._blocks_for(target) if self.n_cold >= c else None
        if blocks is None or not self._rows_kept(c, min(self.n_cold, n), n):
            self._start_over()
            return 0
        try:
            self._put_back(blocks, c, min(self.n_cold, n))
        except (KvgError, RuntimeError, MemoryError):
            self._start_over()
            return 0
        self.blocks, self._aging_due = blocks, (n if aging_due else None)
        self.recent.forget_from(c)
        self.signals.truncate(n)
        self.canonical = self.n_held = n
        return n

    def _rows_kept(self, p0: int, p1: int, n: int) -> bool:
        """Whether RecentRows holds the rows [p0, p1) that a fresh context of n tokens holds
        exact: every layer's, the sliding windows' where a query from n on still sees them."""
        if p1 <= p0:
            return True
        if not self.recent.covers(p0, p1):
            return False
        for i, layers in enumerate(self._layers_of_cache):
            sliding = layers and layers[0] not in self.layers
            lo = max(p0, n - self.shape.n_swa + 1) if sliding and self.shape.n_swa else p0
            if not self.recent.covers_cells(i, lo, p1):
                return False
        return True

    def _blocks_for(self, target: list[plan.Block]) -> list[plan.Block] | None:
        """The block list this context holds once cut to the fresh one's target (its kept
        blocks stay kept), or None where the codes cannot be made the same: other block
        boundaries, or an aged block that a fresh context holds warm and whose warm codes are
        not kept. Blocks to make warm again come back with tier WARM."""
        c = target[-1].r1 if target else 0
        held = plan.truncated(self.blocks, c)
        if len(held) != len(target):
            return None
        out = []
        for h, t in zip(held, target):
            if (h.r0, h.r1) != (t.r0, t.r1):
                return None
            if t.tier == Tier.ARCHIVE and h.tier == Tier.WARM and h.kept:  # the keep signal kept it
                out.append(plan.Block(h.r0, h.r1, Tier.WARM, kept=True))
            elif t.tier == h.tier or (t.tier == Tier.WARM and self.recent.warm(h.r0, h.r1)):
                out.append(plan.Block(t.r0, t.r1, t.tier))  # not aged yet in a fresh context
            else:
                return None
        return out

    def _put_back(self, blocks: list[plan.Block], c: int, p1: int) -> None:
        """The store cut to c rows with the warm codes of blocks[i] that aged put back, and
        llama.cpp's cells given the kept rows of positions [c, p1) before the ones they hold."""
        current = {(b.r0, b.r1): b.tier for b in self.blocks}
        unage = [b for b in blocks if b.tier == Tier.WARM and current.get((b.r0, b.r1)) == Tier.ARCHIVE]
        if unage:
            first = unage[0].r0
            # block by block, every list's codes: the warm ones kept, the others as the store has them
            codes = [
                self.recent.warm(b.r0, b.r1).blocks if b in unage else self.store.copy_blocks(b.r0, b.r1)
                for b in blocks
                if b.r0 >= first
            ]
            self.store.truncate(first)
            for encoded in codes:
                self.store.append_blocks(encoded)
        self.store.truncate(c)
        if p1 > c:
            state = seq_state.read(self.ctx)
            cells = self.recent.with_rows(state_format.parse(state, self._layers_of_cache), c, p1)
            if not seq_state.write(self.ctx, state_format.build(cells)):
                seq_state.write(self.ctx, state)
                raise RuntimeError("llama.cpp refused the rows a cut puts back")

    def _start_over(self) -> None:
        """Empties the cache, llama.cpp's cells too: its tokens are evaluated again."""
        self.clear()
        C.llama_memory_seq_rm(C.llama_get_memory(self.ctx), SEQ, -1, -1)

    def read_failures(self) -> tuple[int, int, int]:
        """Failed reads so far: the store's (expanded, fused) and every failed hook call llama.cpp
        counted (a hook other than the store's counts only there); compare before and after a batch."""
        # counters the hooks add to atomically: read beside aging, which touches none of them
        return (*self._store.read_failures(), int(hooks.n_errors(self.ctx)))

    def check_batch(self, before: tuple[int, int, int], n_past: int) -> None:
        """After llama_decode of the batch that started at n_past: a failed read of cold rows
        on the expanding path gave llama.cpp zero rows (which would still get softmax weight),
        so the batch's positions are removed again and RuntimeError says so; the fused path
        left the rows out of the softmax (as if masked), which a RuntimeWarning reports."""
        expanded, fused, counted = (after - b for after, b in zip(self.read_failures(), before))
        fused = max(fused, counted - expanded)
        if expanded:
            C.llama_memory_seq_rm(C.llama_get_memory(self.ctx), SEQ, n_past, -1)
            raise RuntimeError(
                f"kvgguf: compressed rows could not be read ({expanded} failed decode(s), out of memory?); "
                f"the batch was not evaluated and the context keeps its first {n_past} tokens"
            )
        if fused:
            warnings.warn(
                f"kvgguf: {fused} attention call(s) could not read some compressed rows and left them "
                "out of the softmax for this batch (out of memory?)",
                RuntimeWarning,
                stacklevel=3,
            )

    # --- reads --------------------------------------------------------------------------

    def attention_mass(self, reset: bool = False) -> np.ndarray:
        """[n_layer, ceil(n_cold / MASS_ROWS)] float64: the softmax weight each granule of cold
        rows received, summed over query heads and the ubatches that attended fused since the
        last reset (rows zero for layers without cold rows)."""
        n = -(-self.n_cold // MASS_ROWS)
        out = np.zeros((self.shape.n_layer, n), dtype=np.float64)
        for il in self.layers:
            got = self.store.mass(il)
            out[il, : min(n, got.size)] = got[:n]
        if reset:
            self.store.clear_mass()
        return out

    def memory(self, n_tokens: int) -> KVMemory:
        tiers = cell_tiers(self.ctx, self.shape)
        names = self.codec_names()
        for tier in (Tier.SINK, Tier.WARM, Tier.ARCHIVE):
            held = self.store.held(tier)
            if held.bytes or tier in self.codecs and tier != Tier.SINK:
                tiers.append(TierMemory(Tier(tier).label, names[tier], held.bytes))
        if books := self.store.book_bytes():  # pq2/vq8: one codebook per layer and kind, part of their cost
            tiers.append(TierMemory("books", "codebooks", books))
        if kept := self.recent.nbytes:  # what a cut puts back (TieredConfig.reuse)
            tiers.append(TierMemory(REUSE, "exact rows and warm codes", kept))
        return KVMemory(
            tuple(tiers),
            self.store.index_bytes(),
            n_tokens,
            self.shape.values_per_token,
            int(hooks.compute_bytes(self.ctx)),
            self.store.held().values,
            sum(self.device_store.bytes()) if self.device_store is not None else 0,
            self.gpu is not None,
            self.tokens_dropped,
        )


def cell_tiers(ctx, shape: KVShape) -> list[TierMemory]:
    """llama.cpp's buffers as tiers: "hot", the full-attention layers' cells, and on a model with
    sliding-window layers "window", theirs, each named by its cache type and counted at the bytes
    llama.cpp allocated."""
    total = int(hooks.kv_bytes(ctx))
    window, window_types, hot_types = 0, set(), set()
    for il in range(shape.n_layer):
        cells = hooks.cells_of(ctx, il)
        if cells is None:
            continue
        k, v, n_bytes = cells
        if il in shape.full_layers:
            hot_types |= {k, v}
        else:
            window += n_bytes
            window_types |= {k, v}

    def label(types) -> str:
        return "/".join(sorted(str(type_name(t)) for t in types)) or "f16"

    tiers = [TierMemory("hot", label(hot_types), total - window)]
    if window_types:
        tiers.append(TierMemory("window", label(window_types), window))
    return tiers
