"""The two enums every layer shares, defined once for Python.

``Kind``: which rows, keys or values. ``Tier``: where the store keeps cold rows. C declares the
same numbers (``enum kvg_kind``, ``enum kvg_tier`` in ``native/include/kvgguf.h``);
``tests/native/test_native_header.py`` holds them equal. Imports nothing.
"""

from __future__ import annotations

import enum
import numbers


class Kind(enum.IntEnum):
    """Keys or values: the rows of one layer's K or V cache."""

    K = 0
    V = 1

    @property
    def letter(self) -> str:
        """'k' or 'v', as calibration files and codec calls spell it."""
        return self.name.lower()

    @classmethod
    def of(cls, kind) -> "Kind":
        """A Kind from itself, 0/1, or 'k'/'v'/'key'/'value' (any case)."""
        if isinstance(kind, str):
            found = _KIND_WORDS.get(kind.lower())
            if found is not None:
                return found
        elif isinstance(kind, numbers.Integral) and not isinstance(kind, bool) and int(kind) in (0, 1):
            return cls(int(kind))
        raise ValueError(f"kind {kind!r} is unknown; choose 'k' (keys) or 'v' (values)")


_KIND_WORDS = {"k": Kind.K, "v": Kind.V, "key": Kind.K, "value": Kind.V}


class Tier(enum.IntEnum):
    """Where the store keeps a block of cold rows: sinks (exact f16), warm, archive."""

    SINK = 0
    WARM = 1
    ARCHIVE = 2

    @property
    def label(self) -> str:
        """'sink', 'warm' or 'archive', as kv_memory() prints it."""
        return self.name.lower()
