"""Compressed sessions (.kvz files) and the compressed prompt caches built on them."""

from ..errors import SessionCorruptError, SessionError, SessionMismatchError, SessionVersionError

__all__ = ["SessionError", "SessionCorruptError", "SessionMismatchError", "SessionVersionError"]
