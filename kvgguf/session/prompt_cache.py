"""Prompt caches holding compressed sessions: drop-in for llama-cpp-python's LlamaRAMCache
and LlamaDiskCache (longest-prefix lookup, least recently used out first), where capacity
counts the .kvz bytes really held."""

from __future__ import annotations

import hashlib
import os
import warnings
from collections import OrderedDict
from pathlib import Path
from typing import Optional, Sequence, Tuple, Union

import llama_cpp
import numpy as np
from llama_cpp.llama_cache import BaseLlamaCache

from ..bindings import codecs
from . import container
from ..errors import SessionError
from ..files import write_atomic
from .state import SessionState

Key = Tuple[int, ...]


def token_digest(tokens: Sequence[int]) -> str:
    """A cached prompt's name: the hash of its token ids."""
    return hashlib.sha256(np.asarray(tokens, dtype="<i4").tobytes()).hexdigest()[:32]


def kvz_tokens(data: bytes) -> np.ndarray:
    """The token ids a .kvz holds (its CRCs checked); SessionError or KeyError if damaged."""
    return section_tokens(container.unpack(data))


def section_tokens(sections: list[tuple[bytes, bytes]]) -> np.ndarray:
    """kvz_tokens() of a .kvz already unpacked; KeyError without a token section."""
    return np.frombuffer(dict(sections)[b"TOKS"], dtype="<i4")


class CompressedCache(BaseLlamaCache):
    """What kvgguf.Llama.save_state looks for: the codec its states are encoded with."""

    def __init__(self, capacity_bytes: int, codec: Optional[str], entropy: bool):
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if codec is not None:
            codecs.get(codec)
        super().__init__(capacity_bytes)
        self.codec = codec  # None: the Llama's warm codec (rotq4 for the stock cache)
        self.entropy = entropy

    def attach(self, llm) -> None:
        """Called by kvgguf.Llama.set_cache: a cache shared between processes keys its entries by
        llm's model here; one process's own cache needs nothing."""

    @staticmethod
    def _longest_prefix(keys, key: Key) -> Optional[Key]:
        best, best_len = None, 0
        for k in keys:
            n = llama_cpp.Llama.longest_token_prefix(k, key)
            if n > best_len:
                best, best_len = k, n
        return best

    def __contains__(self, key: Sequence[int]) -> bool:
        return self._find_longest_prefix_key(tuple(key)) is not None

    @staticmethod
    def _check_state(value) -> SessionState:
        if not isinstance(value, SessionState):
            raise TypeError(
                "a compressed prompt cache holds the states of kvgguf.Llama (SessionState); "
                f"got {type(value).__name__}: set it with kvgguf.Llama.set_cache"
            )
        return value


class CompressedRAMCache(CompressedCache):
    """Compressed sessions in memory.

    capacity_bytes: the most .kvz bytes held; the least recently used go first.
    codec: codec for the rows llama.cpp holds exactly (None: the Llama's warm codec; "f16":
        lossless). entropy: zstd-code the sessions too (smaller, slower to store).
    """

    def __init__(self, capacity_bytes: int = 2 << 30, codec: Optional[str] = None, entropy: bool = False):
        super().__init__(capacity_bytes, codec, entropy)
        self.cache_state: "OrderedDict[Key, SessionState]" = OrderedDict()

    @property
    def cache_size(self) -> int:
        return sum(s.llama_state_size for s in self.cache_state.values())

    def _find_longest_prefix_key(self, key: Key) -> Optional[Key]:
        return self._longest_prefix(self.cache_state.keys(), key)

    def __getitem__(self, key: Sequence[int]) -> SessionState:
        k = self._find_longest_prefix_key(tuple(key))
        if k is None:
            raise KeyError("no cached prefix")
        self.cache_state.move_to_end(k)
        return self.cache_state[k]

    def __setitem__(self, key: Sequence[int], value: Optional[SessionState]) -> None:
        if value is None:  # a context save_state could not keep (one a context shift moved): not cached
            return
        value = self._check_state(value)
        key = tuple(key)
        self.cache_state.pop(key, None)
        self.cache_state[key] = value
        while self.cache_size > self.capacity_bytes and self.cache_state:
            self.cache_state.popitem(last=False)


class CompressedDiskCache(CompressedCache):
    """Compressed sessions as .kvz files in a folder, one per cached prompt (NAME.kvz with its
    key tokens in NAME.key), found again by a later process. Least recently used (file time)
    go first when the files pass capacity_bytes. A file that no longer loads is a miss and is
    removed."""

    def __init__(
        self,
        path: Union[str, os.PathLike] = ".cache/kvgguf_prompts",
        capacity_bytes: int = 2 << 30,
        codec: Optional[str] = None,
        entropy: bool = True,
    ):
        super().__init__(capacity_bytes, codec, entropy)
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self._keys: dict[Key, str] = {}
        self._write_failed = False  # warned once already
        for key_file in self.path.glob("*.key"):
            kvz = key_file.with_suffix(".kvz")
            if kvz.exists():
                self._keys[tuple(np.fromfile(key_file, dtype="<i4").tolist())] = key_file.stem

    def _file(self, name: str) -> Path:
        return self.path / f"{name}.kvz"

    @property
    def cache_size(self) -> int:
        return sum(self._file(n).stat().st_size for n in self._keys.values() if self._file(n).exists())

    def _find_longest_prefix_key(self, key: Key) -> Optional[Key]:
        return self._longest_prefix(self._keys.keys(), key)

    def __getitem__(self, key: Sequence[int]) -> SessionState:
        k = self._find_longest_prefix_key(tuple(key))
        if k is None:
            raise KeyError("no cached prefix")
        name = self._keys[k]
        try:
            data = self._file(name).read_bytes()
            tokens = kvz_tokens(data).astype(np.intc)
        except (OSError, SessionError, KeyError):
            self._remove(k)
            raise KeyError("the cached session no longer loads") from None
        os.utime(self._file(name))  # most recently used
        return SessionState(tokens, data, None)

    def __setitem__(self, key: Sequence[int], value: Optional[SessionState]) -> None:
        if value is None:  # a context save_state could not keep (one a context shift moved): not cached
            return
        value = self._check_state(value)
        key = tuple(key)
        name = token_digest(key)
        try:
            write_atomic(self._file(name), value.llama_state)
            write_atomic(self.path / f"{name}.key", np.asarray(key, dtype="<i4").tobytes())
        except OSError as e:
            # A cache write that fails (a full disk, a folder gone read-only) must not fail the
            # completion that produced it: the prompt is just not cached, and the user is told once.
            if key not in self._keys:  # a stray .kvz without its .key; an older entry stays whole
                self._unlink(name)
            if not self._write_failed:
                self._write_failed = True
                warnings.warn(
                    f"kvgguf: the prompt cache in {self.path} could not store a prompt ({e}); "
                    "completions go on without caching what does not fit",
                    RuntimeWarning,
                    stacklevel=2,
                )
            return
        self._keys[key] = name
        while self.cache_size > self.capacity_bytes and self._keys:
            oldest = min(self._keys, key=lambda k: self._mtime(self._keys[k]))
            self._remove(oldest)

    def _mtime(self, name: str) -> float:
        try:
            return self._file(name).stat().st_mtime_ns
        except FileNotFoundError:
            return -1

    def _remove(self, key: Key) -> None:
        self._unlink(self._keys.pop(key))

    def _unlink(self, name: str) -> None:
        for suffix in (".kvz", ".key"):
            try:
                (self.path / f"{name}{suffix}").unlink()
            except FileNotFoundError:
                pass
