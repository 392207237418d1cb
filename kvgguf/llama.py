"""`kvgguf.Llama`: llama_cpp.Llama whose KV cache can hold old tokens compressed."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import sys
import threading
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

import llama_cpp
import numpy as np

from .runtime.call_lock import CallLock, holding
from .runtime.live_cache import FUSED_MAX_TOKENS, LiveCache
from .runtime.memory import KVMemory, TierMemory
from .model.gguf_file import read_metadata
from .model.registry import calibration_path
from .model.shape import MAX_LAYERS, KVShape
from .policy import calibration_plan

from .bindings import codecs
from .policy import codec_spec
from .policy.kv_codec import Request, parse as parse_kv_codec, parse_auto
from .policy.tiered import TieredConfig, sized_for_model
from .session import session
from .files import write_atomic
from .session.prompt_cache import CompressedCache
from .session.session import SessionInfo
from .session.fingerprint import ModelFingerprint
from .session.state import SessionState
from .llamacpp import hooks, support
from .errors import CalibrationError, UnsupportedModelError

# llama.cpp's own cache types, by the names its CLI uses (-ctk/-ctv).
CACHE_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "bf16": 30,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q5_1": llama_cpp.GGML_TYPE_Q5_1,
    "q5_0": llama_cpp.GGML_TYPE_Q5_0,
    "q4_1": llama_cpp.GGML_TYPE_Q4_1,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
    "iq4_nl": llama_cpp.GGML_TYPE_IQ4_NL,
}
# The preset where rotations cannot take the head dim (not a power of two: 80, 96, 100, 112):
# KIVI's integer codes take any head dim, at the preset's bits (warm 4, archive V 2).
KIVI_PRESET = {"warm": "kivi4", "archive": ("kivi4", "kivi2")}
# flash_attn where a kv_codec is set and the caller gives none (llama-cpp-python's default is off).
# Generation takes the fused path either way, but with it off llama.cpp stores V transposed, which
# the fused path reads strided. Measured on the Llama-3.2-1B shape, tiered with it off against on
# (benchmarks/results/shapes/llama-3.2-1b_fa0.md): decode 13.1 against 16.6 tok/s at 4K and 12.4
# against 14.5 at 8K, prefill no faster, prefill scratch 283 against 129 MiB at 8K.
FLASH_ATTN_DEFAULT = True


def cache_type(value: Union[str, int, None], name: str) -> Optional[int]:
    """A llama.cpp cache type from its name ("q8_0") or its ggml type number."""
    if value is None or isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value in CACHE_TYPES:
        return CACHE_TYPES[value]
    raise ValueError(f"{name} {value!r} is unknown; choose one of: {', '.join(CACHE_TYPES)}")


def unsupported_setting(
    *, n_ctx: int = 512, type_k=None, type_v=None, vocab_only: bool = False, **_other
) -> Optional[str]:
    """Why llama_cpp.Llama settings cannot take a kv_codec, or None: the one rule that the facade
    (which refuses them) and install() (which falls back to stock) share."""
    if vocab_only:
        return "vocab_only loads no KV cache to compress"
    if n_ctx <= 0:
        return f"n_ctx={n_ctx} holds no logical context (a kv_codec needs n_ctx > 0)"
    for name, t in (("type_k", type_k), ("type_v", type_v)):
        if cache_type(t, name) not in (None, llama_cpp.GGML_TYPE_F16):
            return f"kv_codec keeps llama.cpp's hot window in f16; {name} must be f16 or None (got {_type_name(t)!r})"
    return None


def _type_name(value: Union[str, int]) -> Union[str, int]:
    """A cache type as the user knows it: its name where a ggml number has one in CACHE_TYPES."""
    names = {number: name for name, number in CACHE_TYPES.items()}
    return names.get(value, value) if isinstance(value, int) else value


def _config_for_model(config: TieredConfig, preset: bool, model_path: str) -> tuple[TieredConfig, KVShape]:
    """The config fitted to the model's sliding window, and the model's KV shape (one read of
    the GGUF's metadata for both)."""
    meta = read_metadata(model_path, max_array=MAX_LAYERS)
    try:
        shape = KVShape.from_metadata(meta, model_path)
    # keys an attention model has are missing (a recurrent model), or a layout kvgguf cannot read
    except ValueError as e:
        raise _refusal(model_path, meta.get("general.architecture", "?"), str(e)) from None
    try:
        return config.fit_window(shape.n_swa, strict=not preset), shape
    except ValueError as e:
        raise ValueError(f"{model_path}: {e}") from None


def _refusal(model_path: str, arch: str, why: str) -> UnsupportedModelError:
    return UnsupportedModelError(
        f"kv_codec cannot hold the cache of {model_path} ('{arch}'): {why}. "
        "Use kv_codec=None for llama.cpp's own cache."
    )


def _unfit(shape: KVShape, *specs) -> dict[str, str]:
    """The codecs of these specs that this model's head dims cannot take ({codec: why})."""
    out = {}
    for spec in specs:
        if spec is not None:
            out.update(codec_spec.unfit(spec, shape.n_layer, shape.full_layers, shape.head_dim))
    return out


def _fit_codecs(
    config: TieredConfig, shape: KVShape, model_path: str, *, tiered_preset: bool, request, verbose: bool
) -> tuple[TieredConfig, object]:
    """Config and calibration request as this model's head dims allow, decided before any token:
    the presets switch to KIVI_PRESET (a calibration measures rotations, so "tiered" skips it and
    "auto" is refused); a codec the user named that cannot take them is refused, naming why."""
    unfit = _unfit(shape, config.warm, config.archive)
    if request is not None and request.required and _unfit(shape, "rotq4"):
        raise ValueError(
            f"{model_path}: kv_codec='auto' calibrates codecs that rotate rows, and this model's head dims "
            f"(K {shape.head_dim_k}, V {shape.head_dim_v}) are not powers of two; use 'tiered' "
            f"(KIVI on this model) or a kivi codec"
        )
    if not unfit:
        return config, request
    if not tiered_preset:
        fitting = [name for name in codecs.names() if not _unfit(shape, name)]
        raise ValueError(
            f"{model_path}: {'; '.join(unfit.values())}. Codecs this model's head dims take: {', '.join(fitting)}"
        )
    if verbose:
        print(
            f"kvgguf: {os.path.basename(model_path)} has head dims K {shape.head_dim_k} / V {shape.head_dim_v}, "
            f"which rotations cannot take: the tiered preset holds warm {KIVI_PRESET['warm']}, archive "
            f"K {KIVI_PRESET['archive'][0]} / V {KIVI_PRESET['archive'][1]} on this model",
            file=sys.stderr,
        )
    return replace(config, **KIVI_PRESET), None


def calibrated_config(
    model_path: str,
    request: Union[Request, float],
    *,
    base: Optional[TieredConfig] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    context: Optional[int] = None,
) -> tuple[TieredConfig, Optional[Path]]:
    """The config a Request (or a budget: "auto:BITS") gets on this model, and the calibration
    file it follows (None: base, the fixed preset, as it is). The model's calibration from the
    cache folder is allocated for the budget, codecs with a plan paying for it over `context`
    tokens (the Llama's n_ctx; None: calibration_plan.PLAN_CONTEXT); a required request
    ("auto") measures the model when it has none and keeps the result; "tiered" never
    measures, and keeps base with a warning when the model's file cannot be used."""
    if not isinstance(request, Request):
        request = Request(float(request))
    base = base or TieredConfig()
    path = calibration_path(model_path)  # hashes the GGUF's metadata: once per call
    try:
        cal = calibration_plan.load_for(model_path, path)
    except CalibrationError as e:
        if request.required:
            raise
        warnings.warn(f"kv_codec='tiered' keeps the fixed preset: {e}", stacklevel=3)
        return base, None
    if cal is None:
        if not request.required:
            return base, None
        # The one import of a higher layer (tests/test_layers.py): "auto" measures the model on
        # first use, which runs it through this facade.
        from .evaluation.calibration import calibrate

        cal = calibrate(model_path, progress=progress)
        cal.save(path)
    note = cal.unmeasured_note(model_path)
    if note:  # a file kept from an older kvgguf: it loads, but its plans miss newer codecs
        warnings.warn(f"kvgguf: the calibration {path} was {note}", stacklevel=3)
    return cal.config(request.budget, base, context, request.exclude), path


def _calibration_progress(model_path: str, verbose: bool):
    """A progress callback for the first use of "auto" on a model (minutes): a bar on a terminal,
    and where stderr is not one (a server's log, a notebook) a line at every tenth of the lists."""
    bar, said = None, -1

    def progress(done: int, total: int) -> None:
        nonlocal bar, said
        if not verbose:
            return
        if bar is None and said < 0:
            print(
                f"kvgguf: calibrating {os.path.basename(model_path)} for kv_codec='auto' (once; kept in "
                f"{calibration_path(model_path)})",
                file=sys.stderr,
                flush=True,
            )
            said = 0
            if sys.stderr.isatty():
                from tqdm import tqdm

                bar = tqdm(total=total, desc="calibrating", unit="list", leave=False)
        if bar is not None:
            bar.update(done - bar.n)
            if done >= total:
                bar.close()
            return
        tenth = 10 * done // max(total, 1)
        if tenth > said:
            said = tenth
            print(f"kvgguf: calibrating: {done}/{total} lists measured ({10 * tenth}%)", file=sys.stderr, flush=True)

    return progress


def decode_batch(n_batch: Optional[int], n_ctx: int, config: TieredConfig, verbose: bool = False) -> int:
    """Tokens per llama_decode call with a kv_codec: the caller's n_batch where it fits the hot
    window, else the config's ubatch. A longer batch (llama-cpp-python's default is 512) is
    split, never refused: llama.cpp's f16 cells hold the hot window plus one decode batch, so
    decoding 512 at a time would make them hot + 512."""
    if n_batch is None:
        return min(config.ubatch, n_ctx)
    if n_batch <= config.hot:
        return n_batch
    if verbose:
        print(
            f"kvgguf: n_batch={n_batch} is longer than the hot window ({config.hot} tokens): evaluations "
            f"reach llama.cpp in batches of {min(config.ubatch, n_ctx)} tokens",
            file=sys.stderr,
        )
    return min(config.ubatch, n_ctx)


def _serialized(method):
    """Runs a method of Llama as one call (its _calls lock: other threads' calls wait) that
    changes or reads the cache (its _kv_lock: close() waits for it)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._calls, self._kv_lock:
            return method(self, *args, **kwargs)

    return run


def _one_call(method):
    """Runs a method of Llama as one call: another thread's calls wait until it returns, or,
    where it returns a generator (a stream), until the generator ends or is closed."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):
        with self._calls:
            out = method(self, *args, **kwargs)
        return holding(self._calls, out) if isinstance(out, Iterator) else out

    return run


class Llama(llama_cpp.Llama):
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
        folder: see ``kvgguf calibrate``); or a :class:`TieredConfig`.
    n_ctx: the logical context. With a kv_codec, llama.cpp's own f16 cache holds only the
        hot window plus one batch; older tokens live compressed in kvgguf's store.
    n_batch: tokens per llama_decode call. With a kv_codec it defaults to TieredConfig.ubatch, and
        a value longer than the hot window (llama-cpp-python's 512, say) is split into batches of
        TieredConfig.ubatch (said on stderr when verbose), so llama.cpp's f16 buffer holds the hot
        window plus one batch: ``self.n_batch`` is the batch llama.cpp gets (decode_batch).
    type_k, type_v: llama.cpp's cache types, as names ("q8_0", "q4_0", ...) or ggml numbers.
        With a kv_codec they must stay f16 (the hot window is exact).
    flash_attn: with a kv_codec it defaults to True (generation reads the hot window faster and
        prefill needs less scratch; see FLASH_ATTN_DEFAULT); without one, to stock's False.
    kv_attention: how attention reads the compressed rows. "fused" (default): ubatches of up
        to FUSED_MAX_TOKENS tokens (generation) score and sum the rows from their codes, never
        expanding them; larger ones (prefill) expand them to f16 for llama.cpp's attention.
        "expand": every ubatch expands them (what llama.cpp's own kernels see; f16 cold rows
        then give bit-identical logits to stock llama.cpp).
    """

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
        self._shape: Optional[KVShape] = None  # kv_shape and kv_fingerprint, read on first use
        self._fingerprint: Optional[ModelFingerprint] = None
        self.kv_calibration = None
        self.tokens_evaluated = 0  # tokens run through llama_decode so far (a prompt cache hit saves them)
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
            return

        why = unsupported_setting(n_ctx=n_ctx, type_k=type_k, type_v=type_v, **kwargs)
        if why is not None:
            raise ValueError(f"{why}: pass kv_codec=None for llama.cpp's own cache")
        kwargs.setdefault("flash_attn", FLASH_ATTN_DEFAULT)
        if not os.path.isfile(model_path):  # the exception stock raises, before kvgguf reads the file
            raise ValueError(f"Model path does not exist or is not a file: {model_path}")
        preset = isinstance(kv_codec, str)
        config, request = parse_kv_codec(kv_codec)  # request: "auto[:BITS]" or "tiered", calibration decides
        if kv_attention not in ("fused", "expand"):
            raise ValueError(f"kv_attention must be 'fused' or 'expand', got {kv_attention!r}")
        config, shape = _config_for_model(config, preset, model_path)
        if preset:  # the presets' hot window and batch follow the model's size (policy.tiered.WIDE_SHARE)
            config = sized_for_model(config, 2 * shape.values_per_token, os.path.getsize(model_path))
        tiered_preset = preset and kv_codec.split(":")[0] == "tiered"  # "tiered", "tiered:fixed", "tiered:keep=..."
        config, request = _fit_codecs(
            config, shape, model_path, tiered_preset=tiered_preset, request=request, verbose=kwargs.get("verbose", True)
        )
        calibrated = None
        if request is not None:
            config, calibrated = calibrated_config(
                model_path,
                request,
                base=config,
                progress=_calibration_progress(model_path, kwargs.get("verbose", True)),
                context=n_ctx,
            )
            if not request.required and kwargs.get("verbose", True):
                print(
                    "kvgguf: kv_codec='tiered' "
                    + (
                        f"follows this model's calibration ({calibrated})"
                        if calibrated
                        else "holds the fixed preset (no calibration for this model: `kvgguf calibrate` measures one)"
                    ),
                    file=sys.stderr,
                )
        n_batch = decode_batch(n_batch, n_ctx, config, verbose=kwargs.get("verbose", True))
        if not preset and config.hot >= n_ctx:
            warnings.warn(
                f"kvgguf: the hot window ({config.hot} tokens) covers the whole context (n_ctx={n_ctx}): every "
                f"token stays f16 in llama.cpp's cells and nothing is compressed; lower TieredConfig.hot, or "
                f"use kv_codec=None for llama.cpp's own cache",
                stacklevel=2,
            )
        # llama.cpp's cells: the hot window plus one batch (it pads this to a multiple of 256;
        # LiveCache evicts against config.hot, not against the padded size). Sliding-window
        # layers hold as many cells (llama.cpp's default swa_full): measured on Gemma-3, ctx
        # 1024, batches of 256, swa_full off costs KL 0.0027 on its own (kvgguf eval's
        # "f16 (swa window)" row) for 256 fewer cells per sliding layer.
        physical = min(n_ctx, config.hot + n_batch)
        super().__init__(
            model_path,
            n_ctx=physical,
            n_batch=n_batch,
            n_ubatch=min(n_ubatch, n_batch),
            type_k=type_k,
            type_v=type_v,
            **kwargs,
        )
        self._shape = shape
        self.kv_calibration: Optional[Path] = calibrated  # the calibration file kv_config follows, if any
        try:
            why = support.why_not(self._model.model, self._ctx.ctx, shape)
            if why:
                raise _refusal(model_path, shape.arch, why)
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

    def n_ctx(self) -> int:
        return self._n_ctx if self._kv else super().n_ctx()

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
            if self._kv is None or not str(e).startswith("Requested tokens"):
                raise
            raise ValueError(re.sub(r"context window of \d+", f"context window of {self.n_ctx()}", str(e))) from None

    def _begin_eval(self, n_new: int) -> None:
        """Refuses tokens past the logical context, and drops compressed rows past n_tokens
        (what llama-cpp-python's truncation does to llama.cpp's own cells)."""
        if self.n_tokens + n_new > self.n_ctx():
            raise ValueError(f"{self.n_tokens} tokens in context + {n_new} new exceed n_ctx={self.n_ctx()}")
        if self._kv is not None:
            self._kv.truncate(self.n_tokens)

    @_one_call
    def eval(self, tokens: Sequence[int]):
        self._check_open("eval")
        if self._kv is not None and self._kv.wants_logits:
            # The surprisal signal needs every position's logits: eval_logits hands them to it.
            for n_past, logits in self.eval_logits(tokens):
                if self._logits_all:
                    self.scores[n_past : n_past + len(logits), :] = logits
            return
        self.tokens_evaluated += len(tokens)
        if self._kv is None:
            with self._kv_lock:
                return super().eval(tokens)
        with self._kv_lock:
            self._begin_eval(len(tokens))
        for i in range(0, len(tokens), self.n_batch):
            batch = tokens[i : i + self.n_batch]
            self._run_batch("eval", batch, lambda n_past: llama_cpp.Llama.eval(self, batch))

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
                self._kv.after_batch(len(batch))
            return n_past, logits

    def _batch_done(self, before: tuple[int, int, int], n_past: int) -> None:
        """Undoes a batch whose cold rows could not be read (LiveCache.check_batch)."""
        try:
            self._kv.check_batch(before, n_past)
        except RuntimeError:
            self.n_tokens = n_past
            raise

    def eval_logits(self, tokens: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
        """Evaluates tokens in batches of n_batch, yielding (position of the batch's first
        token, its logits [n, n_vocab]) per batch, without keeping them (llama.cpp's buffer,
        valid until the next batch). For scoring long texts with large vocabularies. Holds
        the Llama (other threads' calls wait) until the generator ends or is closed."""
        self._check_open("eval_logits")
        return holding(self._calls, self._eval_logits(tokens))

    def _eval_logits(self, tokens: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
        with self._kv_lock:
            self._begin_eval(len(tokens))
            self.tokens_evaluated += len(tokens)
            self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for i in range(0, len(tokens), self.n_batch):
            batch = tokens[i : i + self.n_batch]
            yield self._run_batch("eval_logits", batch, lambda n_past: self._decode_logits(batch, n_past))

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

    @_serialized
    def reset(self):
        super().reset()
        if self._kv is not None:
            self._kv.clear()

    @_one_call
    def generate(self, *args, **kwargs):
        return super().generate(*args, **kwargs)

    @_one_call
    def create_chat_completion(self, *args, **kwargs):
        return super().create_chat_completion(*args, **kwargs)

    @_one_call
    def create_embedding(self, *args, **kwargs):
        return super().create_embedding(*args, **kwargs)

    @_one_call
    def sample(self, *args, **kwargs):
        """llama_cpp.Llama.sample, with the sampler chain it builds for one call freed when the
        call returns. llama-cpp-python's LlamaSampler keeps itself in a reference cycle (its
        close callback), so each call's chain (native buffers included) would wait for a full
        garbage collection: tens of MiB held and freed in waves over a long generation
        (benchmarks/soak.py; tests/test_live_cache.py)."""
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

    @_serialized
    def embed(self, *args, **kwargs):
        if self._kv is not None:
            self._kv.clear()  # embed clears llama.cpp's cache; cold rows must go with it
            self.n_tokens = 0
        return super().embed(*args, **kwargs)

    # --- sessions -------------------------------------------------------------------------

    @_serialized
    def save_session(
        self,
        path,
        *,
        codec: Optional[session.CodecSpec] = None,
        exact: bool = False,
        entropy: bool = True,
        app: Optional[dict] = None,
    ) -> SessionInfo:
        """Writes the context (tokens and KV cache) to a .kvz file, atomically.

        Compressed rows are written as held. Rows llama.cpp holds exactly (the hot window,
        or the whole stock cache) are encoded with `codec`: a codec name, a (K, V) pair of
        names, {layer: name or pair, "default": ...}, or "auto[:BITS]" (this model's
        calibrated plan, as kv_codec="auto[:BITS]" takes it); by default the warm codec (the
        tiered cache) or kvgguf.session.DEFAULT_STOCK_CODEC. exact=True keeps them bit for
        bit. entropy=True zstd-codes the file's sections. app: JSON data stored with it,
        returned by load_session (the chat keeps its messages there).
        """
        self._check_open("save_session")
        budget = parse_auto(codec)
        if budget is not None:
            codec = calibrated_config(
                self.model_path,
                budget,
                progress=_calibration_progress(self.model_path, self.verbose),
                context=max(self.n_tokens, 1),  # a session's exact rows fit a plan of their own
            )[0].warm
        data, info = session.dump(
            self._session_view(drop_dead_rows=True), codec=codec, exact=exact, entropy=entropy, app=app
        )
        write_atomic(path, data)
        return info

    @_serialized
    def load_session(self, path) -> SessionInfo:
        """Restores a context saved by save_session. A file that is damaged, from another
        model or for another cache raises a SessionError and leaves this context as it was."""
        with open(path, "rb") as f:
            data = f.read()
        return self._load_session_bytes(data)

    def _load_session_bytes(self, data: bytes) -> SessionInfo:
        live = self._session_view()
        restored = session.parse(live, data)
        session.apply(live, restored)
        n = len(restored.tokens)
        self.input_ids[:n] = restored.tokens
        self.n_tokens = n
        self._requires_eval = True  # llama-cpp-python replays the last token before sampling
        meta = restored.meta
        app = meta.get("app")
        return SessionInfo(
            meta["n_tokens"], meta["n_cold"], len(data), meta["codec"], app if isinstance(app, dict) else None
        )

    def _session_view(self, drop_dead_rows: bool = False) -> session.LiveContext:
        """This context as the session code sees it. drop_dead_rows: first remove cache rows past
        n_tokens (llama-cpp-python drops them lazily, at the next eval), so the cache holds
        exactly the tokens a session records."""
        self._check_open("sessions and states")
        n = int(self.n_tokens)
        if drop_dead_rows:
            self._ctx.kv_cache_seq_rm(-1, n, -1)
            if self._kv is not None:
                self._kv.truncate(n)
        return session.LiveContext(
            self._ctx.ctx,
            self._kv,
            self.kv_shape,
            self.kv_fingerprint,
            self.input_ids[:n].copy(),
            self.n_ctx(),
            self.n_vocab(),
        )

    def set_cache(self, cache) -> None:
        """llama-cpp-python's prompt cache; a shared one (CompressedRedisCache) is keyed by this
        model's fingerprint and codec from here on."""
        super().set_cache(cache)
        if isinstance(cache, CompressedCache):
            cache.attach(self)

    @_serialized
    def save_state(self):
        """llama-cpp-python's state; with a kv_codec or a compressed prompt cache, a
        SessionState holding .kvz bytes (encoded with the cache's codec)."""
        cache = self.cache if isinstance(self.cache, CompressedCache) else None
        self._check_open("save_state")
        if self._kv is None and cache is None:
            return super().save_state()
        codec = cache.codec if cache is not None else None
        data, _info = session.dump(
            self._session_view(drop_dead_rows=True),
            codec=codec,
            exact=cache is None,
            entropy=cache.entropy if cache is not None else False,
        )
        return SessionState(self.input_ids[: self.n_tokens].copy(), data, self._seed)

    @_serialized
    def load_state(self, state):
        self._check_open("load_state")
        if isinstance(state, SessionState):
            self._load_session_bytes(state.llama_state)
            if state.seed is not None:  # None: a state read back from disk
                self._seed = state.seed
            return
        if self._kv is not None:
            raise TypeError("with a kv_codec, load_state takes the SessionState that save_state returns")
        return super().load_state(state)

    @_serialized
    def kv_attention_mass(self, reset: bool = False) -> np.ndarray:
        """How much attention the compressed rows get: a float64 array [n_layer, granules] whose
        entry [il, g] is the softmax weight that cold rows (positions) [64 g, 64 g + 64) of layer
        il received, summed over query heads and over the tokens evaluated on the fused path
        (generation, and prefill ubatches of up to FUSED_MAX_TOKENS = 512 tokens; larger ones
        expand rows instead and are not counted) since the cache was made, cleared or last reset. Each token adds at most n_head
        per layer, shared between these rows and the hot window. Layers without cold rows
        (sliding-window ones) read 0. ``reset=True`` zeroes the counters after reading."""
        self._check_open("kv_attention_mass")
        if self._kv is None:
            raise ValueError("kv_attention_mass needs a kv_codec: llama.cpp's own cache has no cold rows")
        return self._kv.attention_mass(reset)

    @_serialized
    def kv_memory(self) -> KVMemory:
        """Bytes held for the KV cache now, per tier, and bits per value."""
        self._check_open("kv_memory")
        if self._kv is None:
            hot = TierMemory("hot", "llama.cpp", int(hooks.kv_bytes(self._ctx.ctx)))
            return KVMemory((hot,), 0, self.n_tokens, self._values_per_token(), int(hooks.compute_bytes(self._ctx.ctx)))
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


# Every public method that reaches llama.cpp: on a closed Llama its model and context are freed,
# and calling into them would crash the process, so each raises _check_open's ValueError first.
_NEEDS_OPEN = (
    "tokenize",
    "detokenize",
    "tokenizer",
    "n_ctx",
    "n_embd",
    "n_vocab",
    "token_bos",
    "token_eos",
    "token_nl",
    "pooling_type",
    "reset",
    "eval",
    "eval_logits",
    "sample",
    "generate",
    "embed",
    "create_embedding",
    "create_completion",
    "__call__",
    "create_chat_completion",
    "save_state",
    "load_state",
    "save_session",
    "load_session",
    "kv_memory",
    "kv_attention_mass",
)


def _refused_when_closed(name: str, method):
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        self._check_open(name)
        return method(self, *args, **kwargs)

    return run


for _name in _NEEDS_OPEN:
    setattr(Llama, _name, _refused_when_closed(_name, getattr(Llama, _name)))
del _name
