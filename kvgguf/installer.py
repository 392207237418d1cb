"""`kvgguf.install()`: every plain `llama_cpp.Llama(...)` gets kvgguf's compressed cache.

Frameworks (LangChain, LlamaIndex, llama-cpp-python's own server) construct `llama_cpp.Llama`
themselves and cannot pass `kv_codec`. `install()` gives `llama_cpp.Llama` a `__new__` that
builds a `kvgguf.Llama` instead, so code that did `from llama_cpp import Llama` long before
still gets it. Scope, exactly:

- only `llama_cpp.Llama` itself is redirected: its other subclasses (a framework's own) stay
  stock, and `kvgguf.Llama` keeps taking its arguments as given;
- the caller's keyword arguments win over the installed defaults (a `kv_codec=None` passed
  explicitly means llama.cpp's own cache);
- `n_batch` is taken as kvgguf.Llama takes it: one longer than the hot window (llama-cpp-python's
  default is 512) is split into the config's ubatch (`kvgguf.llama.decode_batch`);
- a model or a setting the compressed cache does not support (a model kvgguf.Llama refuses:
  recurrent, MLA, ...; `vocab_only`, a quantized `type_k`/`type_v`, `embedding=True`, `n_ctx=0`) falls back
  to llama.cpp's own cache with a RuntimeWarning and a line on stderr that say why;
- an unknown codec name is refused by `install()` itself.

`KVGGUF_KV_CODEC=tiered` in the environment runs `install(kv_codec="tiered")` at
`import kvgguf` (as Ollama reads OLLAMA_KV_CACHE_TYPE); `uninstall()` restores stock.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import Optional, Union

import llama_cpp

from .llama import Llama
from .policy.resolve import unsupported_setting
from .model.gguf_file import read_metadata
from .policy.kv_codec import parse as parse_kv_codec
from .policy.tiered import TieredConfig

ENV_VAR = "KVGGUF_KV_CODEC"

_STOCK = llama_cpp.Llama
_defaults: Optional[dict] = None  # kvgguf.Llama keyword defaults while installed


def installed() -> Optional[dict]:
    """The defaults install() was given, or None when llama_cpp.Llama is stock."""
    return dict(_defaults) if _defaults is not None else None


def _why_stock(model_path: str, kwargs: dict) -> Optional[str]:
    """Why this construction must keep llama.cpp's own cache, or None."""
    if kwargs.get("embedding"):  # not a refusal: install()'s choice, an embedding context is short-lived
        return "embedding models keep llama.cpp's own cache"
    try:
        why = unsupported_setting(**kwargs)  # the facade's own rule
    except ValueError as e:  # an unknown type name: stock says what is wrong with it
        why = str(e)
    if why is not None:
        return why
    try:
        read_metadata(model_path)
    except Exception as e:  # an unreadable file: let llama.cpp say what is wrong with it
        return f"its metadata could not be read ({e})"
    return None  # a model kvgguf cannot hold is refused by kvgguf.Llama itself (support.why_not)


class InstalledLlama(Llama):
    """What `llama_cpp.Llama(...)` builds while kvgguf is installed."""

    def __init__(self, model_path: str, **kwargs):
        defaults = _defaults or {}
        shift_by_default = "context_shift" not in kwargs and bool(defaults.get("context_shift"))
        for key, value in defaults.items():
            kwargs.setdefault(key, value)
        if kwargs.get("kv_codec") is not None:
            why = _why_stock(model_path, kwargs)
            if why is not None:
                _say_stock(model_path, why)
                kwargs["kv_codec"] = None
        try:
            try:
                super().__init__(model_path, **kwargs)
            except ValueError as e:
                # a model that cannot shift (M-RoPE, recurrent) stops at n_ctx, as without the default
                if not (shift_by_default and str(e).startswith("context_shift=True:")):
                    raise
                print(f"kvgguf: {model_path}: {e}; it stops at n_ctx", file=sys.stderr)
                kwargs["context_shift"] = False
                super().__init__(model_path, **kwargs)
        except ValueError as e:
            # kvgguf refused this model (a shape, a head dim its codec cannot take): a framework
            # that asked for llama_cpp.Llama gets stock's, never an error stock would not raise.
            if kwargs.get("kv_codec") is None:
                raise
            _say_stock(model_path, str(e))
            kwargs["kv_codec"] = None
            super().__init__(model_path, **kwargs)


def _say_stock(model_path: str, why: str) -> None:
    why = why.rstrip(". ")
    if model_path not in why:
        why = f"{model_path}: {why}"
    msg = f"kvgguf: {why}; this Llama uses llama.cpp's own KV cache, not kvgguf's"
    print(msg, file=sys.stderr)
    warnings.warn(msg, RuntimeWarning, stacklevel=4)


def _new(cls, *args, **kwargs):
    if cls is _STOCK and _defaults is not None:
        cls = InstalledLlama
    return object.__new__(cls)


def install(kv_codec: Union[str, TieredConfig] = "tiered", **defaults) -> None:
    """From now on `llama_cpp.Llama(...)` builds a kvgguf.Llama with ``kv_codec`` and the other
    keyword ``defaults`` (e.g. ``kv_attention``) unless the caller passes them. Calling it again
    replaces the defaults."""
    global _defaults
    parse_kv_codec(kv_codec)  # an unknown codec name fails here, not in some library later
    _defaults = {"kv_codec": kv_codec, **defaults}
    _STOCK.__new__ = _new


def uninstall() -> None:
    """`llama_cpp.Llama(...)` builds stock Llamas again (ones built meanwhile keep their cache).
    The `__new__` stays and passes construction through: deleting it would leave CPython's
    object.__new__ refusing the constructor's arguments."""
    global _defaults
    _defaults = None


def install_from_environment() -> None:
    """`import kvgguf` calls this: KVGGUF_KV_CODEC (if set and not empty) installs that codec."""
    value = os.environ.get(ENV_VAR, "").strip()
    if not value:
        return
    try:
        install(kv_codec=value)
    except ValueError as e:
        raise ValueError(f"{ENV_VAR}={value!r}: {e}") from None
