"""kvgguf.Llama's session calls: save_session / load_session (.kvz files) and save_state /
load_state (what llama-cpp-python's prompt caches keep), over the live cache or llama.cpp's own.
A mixin of the facade's class (kvgguf/llama.py), which supplies the context, the locks
(runtime/call_lock.py) and _calibrate (measuring a model for "auto")."""

from __future__ import annotations

from typing import Optional

import llama_cpp

from ..files import write_atomic
from ..policy.kv_codec import parse_auto
from ..policy.resolve import calibrated_config, calibration_progress
from ..runtime.call_lock import serialized
from . import session
from .prompt_cache import CompressedCache
from .session import SessionInfo
from .state import SessionState


class SessionCalls(llama_cpp.Llama):
    """The session methods of kvgguf.Llama (its first base class)."""

    @serialized
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
        budget = parse_auto(codec)
        if budget is not None:
            codec = calibrated_config(
                self.model_path,
                budget,
                progress=calibration_progress(self.model_path, self.verbose),
                context=max(self.n_tokens, 1),  # a session's exact rows fit a plan of their own
                calibrate=self._calibrate,
            )[0].warm
        data, info = session.dump(
            self._session_view(drop_dead_rows=True), codec=codec, exact=exact, entropy=entropy, app=app
        )
        write_atomic(path, data)
        return info

    @serialized
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
        self._forget_shifts()
        self._requires_eval = True  # llama-cpp-python replays the last token before sampling
        meta = restored.meta
        app = meta.get("app")
        return SessionInfo(
            meta["n_tokens"], meta["n_cold"], len(data), meta["codec"], app if isinstance(app, dict) else None
        )

    def _moved_blocks(self) -> bool:
        """Whether a context shift or a budget's drop moved compressed rows."""
        return self._kv is not None and any(self._kv.store.shifts(il) for il in self._kv.layers)

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

    @serialized
    def save_state(self):
        """llama-cpp-python's state; with a kv_codec or a compressed prompt cache, a
        SessionState holding .kvz bytes: the compressed rows as held, the rows llama.cpp holds
        exactly kept bit for bit with a kv_codec, else encoded with the cache's codec. With a
        compressed prompt cache attached, None for a context whose compressed rows a context shift
        or a budget moved (llama-cpp-python hands each completion's state to the cache, which keeps
        no None): a cache entry must hold what a fresh evaluation of its tokens holds, and this
        one's rows were computed beside tokens it no longer has."""
        cache = self.cache if isinstance(self.cache, CompressedCache) else None
        if self._kv is None and cache is None:
            return super().save_state()
        codec = cache.codec if cache is not None else None
        if cache is not None and self._moved_blocks():
            return None  # llama-cpp-python stores a completion's state in its cache: this one is not kept
        data, _info = session.dump(
            self._session_view(drop_dead_rows=True),
            codec=codec,
            # with a kv_codec the exact rows stay exact: a prompt cache's entry, restored and cut,
            # must hold what a fresh context holds (its cold rows are kept as held either way)
            exact=cache is None or self._kv is not None,
            entropy=cache.entropy if cache is not None else False,
        )
        return SessionState(self.input_ids[: self.n_tokens].copy(), data, self._seed)

    @serialized
    def load_state(self, state):
        if isinstance(state, SessionState):
            self._load_session_bytes(state.llama_state)
            if state.seed is not None:  # None: a state read back from disk
                self._seed = state.seed
            return
        if self._kv is not None:
            raise TypeError("with a kv_codec, load_state takes the SessionState that save_state returns")
        return super().load_state(state)
