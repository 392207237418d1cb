"""What can go wrong reading a session or a calibration file: each a ValueError the caller can catch as one."""

from __future__ import annotations


class SessionError(ValueError):
    """A session file kvgguf will not load; the live context is left as it was."""


class SessionCorruptError(SessionError):
    """The bytes are not what kvgguf wrote: truncated, a checksum fails, a field is impossible."""


class SessionVersionError(SessionError):
    """Written by a format version (or with a codec) this kvgguf does not know."""


class SessionMismatchError(SessionError):
    """A sound file for another model, or for a cache this Llama cannot hold."""


class CalibrationError(ValueError):
    """A calibration file that cannot be used: unreadable, another format version, or measured
    on another model."""


class UnsupportedModelError(ValueError):
    """A model whose KV cache kvgguf cannot hold (kvgguf.llamacpp.support says why); llama.cpp's own
    cache (kv_codec=None) runs it."""
