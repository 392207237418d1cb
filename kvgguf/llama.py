"""`kvgguf.Llama`: llama_cpp.Llama whose KV cache can hold old tokens compressed."""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import llama_cpp
import numpy as np

from .runtime.call_lock import CallLock, holding, one_call, open_only, serialized
from .runtime.live_cache import FUSED_MAX_TOKENS, LiveCache
from .runtime.memory import KVMemory, TierMemory
from .model.shape import KVShape
from .policy import calibration_plan
from .policy.resolve import (
    cache_type,
    refusal,
    resolve,
    unsupported_setting,
)
from .policy.tiered import CACHE_TYPES, TieredConfig
from .session.fingerprint import ModelFingerprint
from .session.llama_calls import SessionCalls
from .llamacpp import hooks, support
from .llamacpp.support import cell_settings

# flash_attn where a kv_codec is set and the caller gives none (llama-cpp-python's default is off).
# Generation takes the fused path either way, but with it off llama.cpp stores V transposed, which
# the fused path reads strided. Measured on the Llama-3.2-1B shape, tiered with it off against on
# (benchmarks/results/speed/shapes/llama-3.2-1b_fa0.md): decode 13.1 against 16.6 tok/s at 4K and 12.4
# against 14.5 at 8K, prefill no faster, prefill scratch 283 against 129 MiB at 8K.
FLASH_ATTN_DEFAULT = True
DEFAULT_N_KEEP = 4  # a context shift's kept tokens on llama.cpp's own cache: the attention sinks' count
_UNBOUNDED = 2**31 - 1  # a completion's bound with context_shift (llama-cpp-python reads it as n_ctx)


def _calibrate(model_path: str, progress):
    """Measures a model for "auto" on first use: the one import of a higher layer
    (tests/project/test_layers.py), lazily, since it runs the model through this facade."""
    from .evaluation.calibration import calibrate

    return calibrate(model_path, progress=progress)


def _on_gpu(kwargs) -> bool:
    """Whether llama.cpp will keep layers' KV cells on a GPU that kvgguf's fused path can use."""
    if kwargs.get("n_gpu_layers", 0) == 0 or not kwargs.get("offload_kqv", True):
        return False
    from .bindings import cuda_store

    return cuda_store.unavailable() is None


def shift_cells(llm: llama_cpp.Llama, p0: int, p1: int) -> None:
    """llama.cpp's own context shift of a llama_cpp.Llama's cells (sequence 0): positions
    [p0, p1) removed, the later ones moved back by p1 - p0 (their keys rotated at the next
    decode)."""
    mem = llama_cpp.llama_get_memory(llm._ctx.ctx)
    llama_cpp.llama_memory_seq_rm(mem, 0, p0, p1)
    llama_cpp.llama_memory_seq_add(mem, 0, p1, -1, -(p1 - p0))


def shift_tokens(llm: llama_cpp.Llama, p0: int, p1: int) -> None:
    """What llama-cpp-python keeps of a context after a shift out of [p0, p1): its tokens and
    (logits_all) their logits moved back, n_tokens down by p1 - p0."""
    n, d = llm.n_tokens, p1 - p0
    llm.input_ids[p0 : n - d] = llm.input_ids[p1:n].copy()
    if llm._logits_all:
        llm.scores[p0 : n - d, :] = llm.scores[p1:n, :].copy()
    llm.n_tokens = n - d


class Llama(SessionCalls):
    """llama_cpp.Llama with a compressed KV cache.

    Takes every argument llama_cpp.Llama takes, keyword-only after the model path, plus:

    kv_codec: None for llama.cpp's own cache (stock behaviour); "tiered" for the preset
        (recent tokens exact, first tokens exact as attention sinks; on a model with a
        calibration in kvgguf's cache folder every older token at its (layer, K/V) list's
        calibrated codec, 4.0 bits per compressed value on average, as "auto:4.0"; without one, or with "tiered:fixed", the fixed preset: older tokens at 4 bits, the
        oldest with 4-bit keys and 2-bit values); "tiered:keep=SIGNAL[:FRACTION]" (the fixed
        preset, keeping the blocks a signal ranks highest warm instead of archiving them:
        TieredConfig.keep); a codec name such as "rotq3" or
        "kivi4" (every token outside the hot window uses it); "k:NAME,v:NAME" (the same with
        K and V apart); "auto" or "auto:BITS" (a codec per layer and K/V from this model's
        calibration, allocated for an average of BITS per compressed value, default 3.0; the
        first use measures the model, minutes on a laptop, and keeps the result in kvgguf's cache
        folder: see ``kvgguf calibrate``); "auto:held=BITS" (the same, BITS counting every value
        a full context holds, llama.cpp's cells included); or a :class:`TieredConfig`. Any string may end in
        ":window=TYPE" (e.g. "tiered:window=f16"): the type of the sliding-window layers' cells
        on Gemma 2/3, gpt-oss and the like (TieredConfig.window; default q8_0 where llama.cpp
        can hold it, else f16); and in ":budget=SIZE" (e.g. "tiered:budget=64MiB"): the most
        bytes the compressed rows may take, the blocks that received the least attention dropped
        to stay within it (TieredConfig.budget, .drop; ":drop=oldest" drops the oldest instead).
        Prompts and generations may then run past n_ctx as long as the budget holds fewer
        tokens than n_ctx (with context_shift, whatever it holds).
    n_ctx: the logical context. With a kv_codec, llama.cpp's own f16 cache holds only the
        hot window plus one batch; older tokens live compressed in kvgguf's store.
    n_batch: tokens per llama_decode call. With a kv_codec it defaults to TieredConfig.ubatch, and
        a value longer than the hot window (llama-cpp-python's 512, say) is split into batches of
        TieredConfig.ubatch (said on stderr when verbose), so llama.cpp's f16 buffer holds the hot
        window plus one batch: ``self.n_batch`` is the batch llama.cpp gets (decode_batch).
    type_k, type_v: llama.cpp's cache types, as names ("q8_0", "q4_0", ...) or ggml numbers.
        With a kv_codec they must stay f16: the kv_codec's ":hot=q8_0" (TieredConfig.hot_cells)
        chooses the hot cells' type.
    flash_attn: with a kv_codec it defaults to True (generation reads the hot window faster and
        prefill needs less scratch; see FLASH_ATTN_DEFAULT); without one, to stock's False.
    kv_attention: how attention reads the compressed rows. "fused" (default): ubatches of up
        to FUSED_MAX_TOKENS tokens (generation) score and sum the rows from their codes, never
        expanding them; larger ones (prefill) expand them to f16 for llama.cpp's attention.
        "expand": every ubatch expands them (what llama.cpp's own kernels see; f16 cold rows
        then give bit-identical logits to stock llama.cpp).
    context_shift: False (default, llama-cpp-python's behaviour): tokens past n_ctx raise
        ValueError. True: a context that would overflow shifts as llama.cpp's server does: the
        first n_keep tokens stay, half of the rest is dropped, and the later tokens move back
        (their keys rotated by llama.cpp's RoPE shift; compressed rows keep their codes, their
        queries rotated instead). Prompts and generations may then run past n_ctx, and a
        completion's max_tokens=None or <= 0 has no bound but an end-of-generation token.
    n_keep: tokens a context shift keeps at the front (None: the attention sinks,
        TieredConfig.sinks, 4 by default; a system prompt's length keeps the system prompt).
    """

    # Inherited calls that reach llama.cpp's model or context, refused once this Llama is closed
    # (runtime/call_lock.py); kvgguf's own methods below carry open_only, one_call or serialized.
    tokenize = open_only(llama_cpp.Llama.tokenize)
    detokenize = open_only(llama_cpp.Llama.detokenize)
    tokenizer = open_only(llama_cpp.Llama.tokenizer)
    n_embd = open_only(llama_cpp.Llama.n_embd)
    n_vocab = open_only(llama_cpp.Llama.n_vocab)
    token_bos = open_only(llama_cpp.Llama.token_bos)
    token_eos = open_only(llama_cpp.Llama.token_eos)
    token_nl = open_only(llama_cpp.Llama.token_nl)
    pooling_type = open_only(llama_cpp.Llama.pooling_type)
    create_completion = open_only(llama_cpp.Llama.create_completion)  # holds the Llama in _create_completion
    __call__ = open_only(llama_cpp.Llama.__call__)
    # Inherited calls that use the context, held as one call (a stream until it ends).
    create_chat_completion = one_call(llama_cpp.Llama.create_chat_completion)
    create_embedding = one_call(llama_cpp.Llama.create_embedding)
    _calibrate = staticmethod(_calibrate)  # "auto" measures a model through it (session calls too)

    def __init__(
        self,
        model_path: Union[str, os.PathLike],
        *,
        kv_codec: Union[str, TieredConfig, None] = None,
        n_ctx: int = 512,
        n_batch: Optional[int] = None,
        n_ubatch: int = 512,
        type_k: Union[str, int, None] = None,
        type_v: Union[str, int, None] = None,
        kv_attention: str = "fused",
        context_shift: bool = False,
        n_keep: Optional[int] = None,
        **kwargs,
    ):
        # Held around each llama_decode batch and every change of the cache (sessions, states,
        # reset, close): ctypes lets other threads run during llama_decode, and a session load
        # from one of them must wait rather than free rows llama.cpp's threads are reading.
        self._kv_lock = threading.RLock()
        # Held for the whole of each public call that uses the context (a completion is many
        # batches plus sampling; two interleaved ones abort llama.cpp): runtime/call_lock.py.
        self._calls = CallLock()
        type_k, type_v = cache_type(type_k, "type_k"), cache_type(type_v, "type_v")
        model_path = os.fspath(model_path)  # a pathlib.Path too (stock wants a str)
        self._kv: Optional[LiveCache] = None
        self.kv_cells: Optional[dict] = None  # with a kv_codec: llama.cpp's cell types, {"hot": ..., "window": ...}
        self._shape: Optional[KVShape] = None  # kv_shape and kv_fingerprint, read on first use
        self._fingerprint: Optional[ModelFingerprint] = None
        self.kv_calibration = None
        self.tokens_evaluated = 0  # tokens run through llama_decode so far (a prompt cache hit saves them)
        self.context_shift = bool(context_shift)
        if n_keep is not None and (not isinstance(n_keep, int) or n_keep < 0):
            raise ValueError(f"n_keep must be a non-negative int, got {n_keep!r}")
        if context_shift and kwargs.get("draft_model") is not None:
            raise ValueError("context_shift=True does not work with a draft_model (its tokens are not shifted)")
        self._n_keep = n_keep
        self.context_shifts = 0  # context shifts so far, the tokens they dropped, the last one's [p0, p1)
        self.tokens_shifted_out = 0
        self.last_shift: Optional[tuple[int, int]] = None
        self.tokens_dropped = 0  # positions a budget (TieredConfig.budget) dropped
        if kv_codec is None:
            super().__init__(
                model_path,
                n_ctx=n_ctx,
                n_batch=512 if n_batch is None else n_batch,
                n_ubatch=n_ubatch,
                type_k=type_k,
                type_v=type_v,
                **kwargs,
            )
            self._n_ctx = self.n_ctx()  # llama-cpp-python read it before its buffers were sized
            self._check_shift()
            return

        why = unsupported_setting(n_ctx=n_ctx, type_k=type_k, type_v=type_v, **kwargs)
        if why is not None:
            raise ValueError(f"{why}: pass kv_codec=None for llama.cpp's own cache")
        kwargs.setdefault("flash_attn", FLASH_ATTN_DEFAULT)
        if not os.path.isfile(model_path):  # the exception stock raises, before kvgguf reads the file
            raise ValueError(f"Model path does not exist or is not a file: {model_path}")
        if kv_attention not in ("fused", "expand"):
            raise ValueError(f"kv_attention must be 'fused' or 'expand', got {kv_attention!r}")
        verbose = kwargs.get("verbose", True)
        plan = resolve(
            model_path,
            kv_codec,
            n_ctx=n_ctx,
            n_batch=n_batch,
            verbose=verbose,
            calibrate=_calibrate,
            flash_attn=bool(kwargs["flash_attn"]),
            gpu=_on_gpu(kwargs),
        )
        config, shape, n_batch = plan.config, plan.shape, plan.n_batch
        # llama.cpp's cells: the hot window plus one batch (it pads this to a multiple of 256;
        # LiveCache evicts against config.hot, not against the padded size). Sliding-window
        # layers hold as many, unpadded: LiveCache evicts a position from every layer at once, so
        # they never hold more positions (Gemma-3's preset: 608 cells, where llama.cpp's
        # padding and its swa_full give 768).
        physical = min(n_ctx, config.hot + n_batch)
        # the cells' types resolve() decided and made sure llama.cpp can hold (the user's type_k /
        # type_v are f16 or None, checked above)
        self.kv_cells = {"hot": plan.hot_cells, "window": plan.window}
        window = plan.window or "f16"
        hot_type = CACHE_TYPES[plan.hot_cells]
        with cell_settings(CACHE_TYPES[window], physical):
            super().__init__(
                model_path,
                n_ctx=physical,
                n_batch=n_batch,
                n_ubatch=min(n_ubatch, n_batch),
                type_k=hot_type,
                type_v=hot_type,
                **kwargs,
            )
        self._shape = shape
        self.kv_calibration: Optional[Path] = plan.calibrated  # the calibration file kv_config follows, if any
        try:
            why = support.why_not(self._model.model, self._ctx.ctx, shape)
            if why:
                raise refusal(model_path, shape.arch, why)
            held = support.window_type(self._ctx.ctx, shape)
            if held not in (None, CACHE_TYPES[window]):
                raise ValueError(
                    f"llama.cpp could not hold this model's sliding-window cells in {window} (see its log)"
                )
            self._kv = LiveCache(
                self._ctx.ctx, shape, config, fused_max_tokens=FUSED_MAX_TOKENS if kv_attention == "fused" else 0
            )
            if config.codebooks == "calibration" and self._kv.book_lists():  # pq2/vq8/vq8f: the model's
                self._kv.use_books(calibration_plan.books_for(model_path))
        except BaseException:
            self.close()
            raise
        # The logical context: llama-cpp-python sizes its token and logit arrays by it, and llama.cpp
        # chooses LongRoPE's factors by it (padded to 256 cells, as llama.cpp pads its own n_ctx).
        self._n_ctx = n_ctx
        hooks.set_n_ctx(self._ctx.ctx, -(-n_ctx // 256) * 256)
        self.input_ids = np.ndarray((n_ctx,), dtype=np.intc)
        if self._logits_all:
            self.scores = np.ndarray((n_ctx, self._n_vocab), dtype=np.single)
        self._check_shift()

    def _check_shift(self) -> None:
        """Refuses context_shift, or a budget (which drops blocks as a shift does), before the
        first token where a shift could not be exact."""
        self._forget_shifts()
        if not self.moves:
            return
        what = "context_shift=True" if self.context_shift else f"kv_codec budget={self._kv.config.budget}"
        why = None
        can = (
            hooks.can_shift(self._ctx.ctx)
            if self._kv is not None
            else llama_cpp.llama_memory_can_shift(llama_cpp.llama_get_memory(self._ctx.ctx))
        )
        window = self._kv.shape.n_swa if self._kv is not None else 0
        if not can:
            why = "llama.cpp cannot shift this model's memory (M-RoPE, recurrent, or positions it cannot rotate)"
        elif self._kv is not None and self._kv.gpu is not None:
            why = "layers whose compressed rows live on a GPU cannot shift yet (pass n_gpu_layers=0)"
        elif not self.context_shift:
            pass
        elif self.n_keep >= self.n_ctx() // 2:
            why = f"n_keep={self.n_keep} leaves no room to shift in n_ctx={self.n_ctx()}"
        elif window and (self.n_ctx() - self.n_keep) // 2 - self._kv.config.block < window + self.n_keep:
            # what a shift keeps must stay a window ahead of the front, or a sliding layer's
            # queries would reach back to rows its cache no longer holds (LiveCache.shift)
            why = f"n_ctx={self.n_ctx()} is too short beside the sliding window of {window} (give it over {4 * window})"
        if why:
            self.close()
            raise ValueError(f"{what}: {why}")

    @property
    def _budget(self) -> bool:
        """Whether a budget bounds the compressed rows (TieredConfig.budget)."""
        kv = self.__dict__.get("_kv")
        return kv is not None and kv.config.budget is not None

    @property
    def moves(self) -> bool:
        """Whether this context can lose tokens to make room: context_shift, or a budget."""
        return self.context_shift or self._budget

    def history_index(self) -> np.ndarray:
        """For each token the context holds, its index in what was evaluated since the last
        reset (or session load): 0, 1, 2, ... until a context shift or a budget's drop leaves a
        gap where the tokens it dropped were."""
        return self._hist_pos[: self.n_tokens].copy()

    @property
    def n_keep(self) -> int:
        """The tokens a context shift keeps at the front."""
        if self._n_keep is not None:
            return self._n_keep
        return self._kv.config.sinks if self._kv is not None else DEFAULT_N_KEEP

    @property
    def _n_ctx(self) -> int:
        """llama-cpp-python's bound on a completion (its prompt and max_tokens): the logical
        context, or with context_shift or a budget none (the context shifts, or drops blocks)."""
        return _UNBOUNDED if self.__dict__.get("context_shift") or self._budget else self.__dict__["_n_ctx_logical"]

    @_n_ctx.setter
    def _n_ctx(self, value: int) -> None:
        self.__dict__["_n_ctx_logical"] = value

    @property
    def kv_config(self) -> Optional[TieredConfig]:
        return self._kv.config if self._kv else None

    @property
    def kv_cache(self) -> Optional[LiveCache]:
        """The live tiered cache (its store, blocks and codecs), None on llama.cpp's own cache:
        for inspection (calibration, the harness, the demo, tests); changing it behind this
        Llama's back is not supported."""
        return self._kv

    @property
    def kv_shape(self) -> KVShape:
        """The model's KV-cache shape, as kvgguf reads it from the GGUF (once)."""
        if self._shape is None:
            self._shape = KVShape.from_gguf(self.model_path)
        return self._shape

    @property
    def kv_fingerprint(self) -> ModelFingerprint:
        """What identifies the model for sessions and shared prompt caches (read once)."""
        if self._fingerprint is None:
            self._fingerprint = ModelFingerprint.read(self)
        return self._fingerprint

    @open_only
    def n_ctx(self) -> int:
        """The positions the context holds: the logical context with a kv_codec; else llama.cpp's,
        but no more than llama-cpp-python's token buffer, sized by the n_ctx asked for where
        llama.cpp pads its context up (to a multiple of 256)."""
        if self._kv:
            return self.__dict__["_n_ctx_logical"]
        ids = self.__dict__.get("input_ids")
        return super().n_ctx() if ids is None else min(super().n_ctx(), len(ids))

    def _check_open(self, what: str) -> None:
        """llama.cpp's context is freed by close(); calling into it then would crash the process."""
        ctx = getattr(self, "_ctx", None)
        if ctx is None or ctx.ctx is None:
            raise ValueError(f"{what}: this Llama is closed")

    def __getstate__(self):
        if self._kv is not None:  # the inherited state would rebuild a stock cache of the physical n_ctx
            raise TypeError(
                "a kvgguf.Llama with a kv_codec cannot be pickled or copied; save_state(), "
                "save_session() and a new kvgguf.Llama keep its context"
            )
        return super().__getstate__()

    def _create_completion(self, *args, **kwargs):
        """llama-cpp-python's, holding the Llama from its first step to its end (a stream: until
        the consumer finishes or closes it), with its context-window error naming the logical n_ctx
        (its message reads llama.cpp's physical one, the hot window plus a batch)."""
        return holding(self._calls, self._completion(*args, **kwargs))

    def _completion(self, *args, **kwargs):
        try:
            return (yield from super()._create_completion(*args, **kwargs))
        except ValueError as e:
            if not str(e).startswith("Requested tokens"):
                raise
            raise ValueError(
                re.sub(r"context window of \d+", f"context window of {self.n_ctx()}", str(e))
                + " (context_shift=True keeps going past it, as llama.cpp's server does)"
            ) from None

    def _begin_eval(self, tokens: Sequence[int]) -> Sequence[int]:
        """Refuses tokens past the logical context, and cuts the cache back to n_tokens (what
        llama-cpp-python's truncation does to llama.cpp's own cells) so that it holds what a
        fresh context would: returns the tokens to evaluate, with those of the context that
        must be evaluated again in front (LiveCache.rewind), n_tokens set back to match."""
        if self.n_tokens + len(tokens) > self.n_ctx() and not self.moves:
            raise ValueError(
                f"{self.n_tokens} tokens in context + {len(tokens)} new exceed n_ctx={self.n_ctx()} "
                "(context_shift=True keeps going past it, as llama.cpp's server does)"
            )
        if self._kv is None:
            return tokens
        start = self._kv.rewind(self.n_tokens)
        if start < self.n_tokens:
            tokens = [*self.input_ids[start : self.n_tokens].tolist(), *tokens]
            self.n_tokens = start
        return tokens

    def _batches(self, tokens: Sequence[int]) -> Iterator[Sequence[int]]:
        """tokens in batches of at most n_batch that never cross a multiple of n_batch (the
        positions where the live cache evicts), read as n_tokens advances."""
        i = 0
        while i < len(tokens):
            n = min(self.n_batch - self.n_tokens % self.n_batch, len(tokens) - i)
            while self._must_move(n):
                with self._kv_lock:
                    self._make_room(n)
                n = min(self.n_batch - self.n_tokens % self.n_batch, len(tokens) - i)  # n_tokens moved
            if self.n_tokens + n > self.n_ctx():  # a budget holds more tokens than n_ctx
                raise ValueError(
                    f"{self.n_tokens} tokens in context + {n} new exceed n_ctx={self.n_ctx()}: the budget holds "
                    "more tokens than that (context_shift=True keeps going past it)"
                )
            yield tokens[i : i + n]
            i += n

    def _must_move(self, n_new: int) -> bool:
        """Whether n_new tokens need a context shift or a budget's drop first."""
        if self.context_shift and self.n_tokens + n_new > self.n_ctx():
            return True
        return self._budget and bool(self._kv.drops_due(self.n_tokens, n_new))

    def _make_room(self, n_new: int) -> None:
        """A context shift where n_new tokens would overflow n_ctx, then the blocks a budget must
        drop before them. RuntimeError where neither moved anything (callers loop on _must_move)."""
        before = self.n_tokens
        self._shift_for(n_new)
        for r0, r1 in self._kv.drops_due(self.n_tokens, n_new) if self._budget else ():
            n_past = self.n_tokens
            try:
                self._kv.drop(n_past, r0, r1)
            except RuntimeError:
                self.n_tokens = 0  # the cache started over
                self._forget_shifts()
                raise
            self._note_dropped(r0, r1, n_past)
            shift_tokens(self, r0, r1)
            self.tokens_dropped += r1 - r0
        if self.n_tokens == before:
            raise RuntimeError(f"kvgguf: no shift or drop made room for {n_new} tokens at {before}")

    @one_call
    def eval(self, tokens: Sequence[int]):
        if self._kv is not None and self._kv.wants_logits:
            # The surprisal signal needs every position's logits: eval_logits hands them to it.
            for n_past, logits in self.eval_logits(tokens):
                if self._logits_all:
                    self.scores[n_past : n_past + len(logits), :] = logits
            return
        if self._kv is None:
            self.tokens_evaluated += len(tokens)
            with self._kv_lock:
                if not self.context_shift:
                    return super().eval(tokens)
                i, step = 0, min(self.n_batch, max(1, (self.n_ctx() - self.n_keep) // 2))
                while i < len(tokens):  # stock's eval in pieces that fit, a shift before each that would not
                    piece = tokens[i : i + step]
                    self._shift_for(len(piece))
                    super().eval(piece)
                    i += len(piece)
                return
        with self._kv_lock:
            tokens = self._begin_eval(tokens)
        self.tokens_evaluated += len(tokens)
        for batch in self._batches(tokens):
            self._run_batch("eval", batch, lambda n_past, batch=batch: llama_cpp.Llama.eval(self, batch))

    def _run_batch(
        self, what: str, batch: Sequence[int], decode: Callable[[int], Optional[np.ndarray]]
    ) -> tuple[int, Optional[np.ndarray]]:
        """One batch under the live cache's protocol, the same for eval and eval_logits: under the
        lock (another thread may save or load between batches, never during one), the cache makes
        room (before_batch), decode(n_past) runs llama_decode and advances n_tokens, a batch whose
        cold rows could not be read is undone, the logits (if decode returns them) feed the
        surprisal signal, and the rows that left the hot window are evicted (after_batch)."""
        with self._kv_lock:
            self._check_open(what)
            n_past = self.n_tokens
            if self._kv is not None:
                self._kv.before_batch(n_past, len(batch))
                before = self._kv.read_failures()
            logits = decode(n_past)
            if self._kv is not None:
                self._batch_done(before, n_past)
                if logits is not None and self._kv.wants_logits:
                    self._kv.note_logits(n_past, batch, logits)
                self._kv.after_batch(n_past, len(batch))
            return n_past, logits

    def _shift_for(self, n_new: int) -> None:
        """With context_shift, a shift before n_new tokens that would not fit (llama-server's
        rule: keep n_keep, drop half of the rest, at least enough for n_new)."""
        n_past = self.n_tokens
        if not self.context_shift or n_past + n_new <= self.n_ctx():
            return
        n_keep = min(self.n_keep, n_past)
        if n_keep + n_new > self.n_ctx():
            raise ValueError(f"{n_new} new tokens do not fit in n_ctx={self.n_ctx()} beside n_keep={n_keep}")
        n_discard = max((n_past - n_keep) // 2, n_past + n_new - self.n_ctx())
        if self._kv is not None:
            try:
                p0, p1 = self._kv.shift(n_past, n_keep, n_discard)
            except RuntimeError:
                self.n_tokens = 0  # the cache started over
                self._forget_shifts()
                raise
        else:
            p0, p1 = n_keep, n_keep + n_discard
            shift_cells(self, p0, p1)
        self._note_dropped(p0, p1, n_past)
        shift_tokens(self, p0, p1)
        self.context_shifts += 1
        self.tokens_shifted_out += p1 - p0
        self.last_shift = (p0, p1)

    def _forget_shifts(self) -> None:
        """The context is what its tokens say again (reset, a session loaded)."""
        self._hist_pos = np.arange(len(self.input_ids), dtype=np.int64)  # context position -> history index
        self._dropped = np.zeros(0, dtype=np.intc)  # history index -> token, for the tokens shifts dropped

    def _note_dropped(self, p0: int, p1: int, n_past: int) -> None:
        """Before a shift drops context positions [p0, p1): their tokens kept by history index,
        and the map moved as input_ids will be (the positions after n_past continue the history)."""
        h = self._hist_pos
        if p1 > p0:
            need = int(h[p1 - 1]) + 1
            if self._dropped.size < need:
                self._dropped = np.concatenate([self._dropped, np.zeros(need - self._dropped.size, np.intc)])
            self._dropped[h[p0:p1]] = self.input_ids[p0:p1]
        d = p1 - p0
        h[p0 : n_past - d] = h[p1:n_past].copy()
        self._continue_history(n_past - d)

    def _continue_history(self, n: int) -> None:
        """Positions from n on take the history indices after position n - 1's."""
        start = int(self._hist_pos[n - 1]) + 1 if n > 0 else 0
        self._hist_pos[n:] = start + np.arange(len(self._hist_pos) - n)

    def _history_match(self, tokens: list) -> tuple[int, int]:
        """For a prompt: (context positions to keep, prompt tokens they stand for).
        The conversation so far is the context's tokens at their history indices with the dropped
        ones between them; the prompt's common prefix with it (but its last token) decides: the
        context keeps the positions whose history lies in it, and the prompt's tokens after it
        are evaluated. A chat that sends its whole conversation each turn so reuses the shifted
        context, and evaluates only the new turn."""
        n = self.n_tokens
        h = self._hist_pos[:n]
        length = int(h[-1]) + 1 if n else 0
        history = np.zeros(length, dtype=np.intc)
        history[: min(length, self._dropped.size)] = self._dropped[:length]
        history[h] = self.input_ids[:n]
        prompt = np.asarray(tokens[:-1], dtype=np.intc)
        m = min(length, prompt.size)
        differ = np.nonzero(history[:m] != prompt[:m])[0]
        m = int(differ[0]) if differ.size else m
        return int(np.searchsorted(h, m)), m

    @one_call
    def generate(self, tokens: Sequence[int], *args, **kwargs):
        """llama_cpp.Llama.generate; with context_shift, a generation that shifts its context
        (_generate_shifting)."""
        if not self.moves:
            return llama_cpp.Llama.generate(self, tokens, *args, **kwargs)
        return self._generate_shifting(list(tokens), *args, **kwargs)

    def _generate_shifting(self, tokens: list, *args, **kwargs):
        """Stock generate never sees a shift: it keeps the position of the token to sample across
        its eval calls, and a shift inside one moves every position back. So the prompt but its
        last token is evaluated here (shifting as it goes), and stock generate runs from the
        context as it is with the tokens still to evaluate; before a token would not fit, that
        generator is closed, the context shifts, and a new one resumes from the shifted context
        (its prefix match evaluates only the pending tokens) with the first one's sampler chain,
        so that repetition penalties, a grammar, mirostat and the random state go on as if
        nothing had moved."""
        if not tokens:
            return
        if kwargs.get("reset", True):
            keep, m = self._history_match(tokens)  # before any shift: the common prefix, keep == m
            self.n_tokens = keep
            self._dropped = self._dropped[:m]
            self._hist_pos[keep:] = m + np.arange(len(self._hist_pos) - keep)
            self.eval(tokens[m:-1])
        else:
            self._continue_history(self.n_tokens)
            self.eval(tokens[:-1])
        kwargs["reset"] = True  # the new generator reuses the context as its prompt's prefix
        pending, chain = tokens[-1:], None
        while True:
            while self._must_move(len(pending)):
                with self._kv_lock:
                    self._make_room(len(pending))
            gen = llama_cpp.Llama.generate(self, [*self.input_ids[: self.n_tokens].tolist(), *pending], *args, **kwargs)
            if chain is not None:  # generate builds its chain when first run: give it the one in use
                self._init_sampler = lambda *_, **__: chain
            try:
                try:
                    token = next(gen)
                finally:
                    self.__dict__.pop("_init_sampler", None)
                chain = self._sampler
                while True:
                    sent = yield token
                    pending = [token, *(sent or [])]
                    if self._must_move(len(pending)):
                        gen.close()
                        break
                    token = gen.send(sent)
            except StopIteration:
                return

    def _batch_done(self, before: tuple[int, int, int], n_past: int) -> None:
        """Undoes a batch whose cold rows could not be read (LiveCache.check_batch)."""
        try:
            self._kv.check_batch(before, n_past)
        except RuntimeError:
            self.n_tokens = n_past
            raise

    @one_call
    def eval_logits(self, tokens: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
        """Evaluates tokens in batches of n_batch, yielding (position of the batch's first
        token, its logits [n, n_vocab]) per batch, without keeping them (llama.cpp's buffer,
        valid until the next batch). For scoring long texts with large vocabularies. Holds
        the Llama (other threads' calls wait) until the generator ends or is closed."""
        return self._eval_logits(tokens)

    def _eval_logits(self, tokens: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
        with self._kv_lock:
            start = self.n_tokens
            tokens = self._begin_eval(tokens)
            again = start - self.n_tokens  # a cut evaluates the context's last tokens again first
            self.tokens_evaluated += len(tokens)
            self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for batch in self._batches(tokens):
            n_past, logits = self._run_batch(
                "eval_logits", batch, lambda n_past, batch=batch: self._decode_logits(batch, n_past)
            )
            if again < len(batch):  # (positions, not counts: a shift or a drop moves them back)
                yield n_past + again, logits[again:]
            again = max(0, again - len(batch))

    def _decode_logits(self, batch: Sequence[int], n_past: int) -> np.ndarray:
        """llama_decode with every position's logits kept; advances n_tokens as stock eval does."""
        self._batch.set_batch(batch=batch, n_past=n_past, logits_all=True)
        self._ctx.decode(self._batch)
        n = len(batch)
        logits = np.ctypeslib.as_array(self._ctx.get_logits(), shape=(n * self._n_vocab,)).reshape(n, self._n_vocab)
        self.input_ids[n_past : n_past + n] = batch
        self.n_tokens += n
        self._requires_eval = False
        return logits

    @serialized
    def reset(self):
        super().reset()
        self._forget_shifts()
        if self._kv is not None:
            self._kv.clear()

    @one_call
    def sample(self, *args, **kwargs):
        """llama_cpp.Llama.sample, with the sampler chain it builds for one call freed when the
        call returns. llama-cpp-python's LlamaSampler keeps itself in a reference cycle (its
        close callback), so each call's chain (native buffers included) would wait for a full
        garbage collection: tens of MiB held and freed in waves over a long generation
        (benchmarks/soak.py; tests/model/test_live_cache.py)."""
        if self._sampler is not None:  # the caller's own chain (generate() sets one): theirs to keep
            return super().sample(*args, **kwargs)
        made = []
        build = self._init_sampler

        def build_and_keep(*a, **kw):
            made.append(build(*a, **kw))
            return made[-1]

        self._init_sampler = build_and_keep  # for this call only
        try:
            return super().sample(*args, **kwargs)
        finally:
            del self._init_sampler
            for chain in made:
                if chain is not self._sampler:
                    chain.close()

    @serialized
    def embed(self, *args, **kwargs):
        if self._kv is not None:
            self._kv.clear()  # embed clears llama.cpp's cache; cold rows must go with it
            self.n_tokens = 0
        return super().embed(*args, **kwargs)

    # --- what the cache holds (sessions: session/llama_calls.py) ------------------------------

    @serialized
    def kv_attention_mass(self, reset: bool = False) -> np.ndarray:
        """How much attention the compressed rows get: a float64 array [n_layer, granules] whose
        entry [il, g] is the softmax weight that cold rows (positions) [64 g, 64 g + 64) of layer
        il received, summed over query heads and over the tokens evaluated on the fused path
        (generation, and prefill ubatches of up to FUSED_MAX_TOKENS = 512 tokens; larger ones
        expand rows instead and are not counted) since the cache was made, cleared or last reset. Each token adds at most n_head
        per layer, shared between these rows and the hot window. Layers without cold rows
        (sliding-window ones) read 0. ``reset=True`` zeroes the counters after reading."""
        if self._kv is None:
            raise ValueError("kv_attention_mass needs a kv_codec: llama.cpp's own cache has no cold rows")
        return self._kv.attention_mass(reset)

    @serialized
    def kv_memory(self) -> KVMemory:
        """Bytes held for the KV cache now, per tier, and bits per value."""
        if self._kv is None:
            ctx = self._ctx.ctx
            hot = TierMemory("hot", "llama.cpp", int(hooks.kv_bytes(ctx)))
            on_device = bool(hooks.device_cells(ctx, range(llama_cpp.llama_model_n_layer(self._model.model))))
            return KVMemory(
                (hot,),
                0,
                self.n_tokens,
                self._values_per_token(),
                int(hooks.compute_bytes(ctx)),
                cells_on_device=on_device,
            )
        return self._kv.memory(self.n_tokens)

    def _values_per_token(self) -> int:
        """K and V values a token adds, from llama.cpp's own per-layer facts (any model stock
        llama.cpp runs: per-layer KV heads, layers without a cache), not kvgguf's shape reader."""
        k, v, total = ctypes.c_int32(), ctypes.c_int32(), 0
        for il in range(llama_cpp.llama_model_n_layer(self._model.model)):
            if hooks.layer_info(self._ctx.ctx, il, ctypes.byref(k), ctypes.byref(v)) >= 0:
                total += k.value + v.value
        return total

    def close(self) -> None:
        with getattr(self, "_kv_lock", None) or contextlib.nullcontext():  # waits for a batch in flight
            self._close()

    def _close(self) -> None:
        if getattr(self, "_kv", None) is not None:
            self._kv.close()
        if hasattr(self, "_stack"):  # absent when __init__ refused its arguments
            super().close()
