"""Which model a session belongs to: enough to refuse any other model's K/V."""

from __future__ import annotations

import weakref
from dataclasses import asdict, dataclass, fields

from ..model.gguf_file import metadata_digests
from ..model.shape import KVShape
from ..errors import SessionCorruptError, SessionMismatchError


@dataclass(frozen=True)
class ModelFingerprint:
    arch: str
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_swa: int
    n_vocab: int
    tokenizer_sha256: str  # the GGUF's tokenizer.* entries
    metadata_sha256: str  # every metadata entry (name, quantization, hyperparameters, tokenizer)

    @classmethod
    def of(cls, llm) -> "ModelFingerprint":
        """A Llama's: a kvgguf.Llama's own (``kv_fingerprint``); for llama-cpp-python's Llama read
        once and kept here, beside it (nothing is set on it)."""
        own = getattr(llm, "kv_fingerprint", None)
        if isinstance(own, ModelFingerprint):
            return own
        found = _FINGERPRINTS.get(llm)
        if found is None:
            found = _FINGERPRINTS[llm] = cls.read(llm)
        return found

    @classmethod
    def read(cls, llm) -> "ModelFingerprint":
        """Read from the Llama's GGUF (every metadata entry hashed) and its vocabulary."""
        shape = KVShape.of(llm)
        meta, tok = metadata_digests(llm.model_path)
        return cls(
            shape.arch,
            shape.n_layer,
            shape.n_head_kv,
            shape.head_dim_k,
            shape.head_dim_v,
            shape.n_swa,
            int(llm.n_vocab()),
            tok,
            meta,
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d) -> "ModelFingerprint":
        try:
            values = {f.name: d[f.name] for f in fields(cls)}
        except (KeyError, TypeError):
            raise SessionCorruptError("session metadata lacks a complete model fingerprint") from None
        for f in fields(cls):
            if type(values[f.name]).__name__ != f.type:
                raise SessionCorruptError(f"model fingerprint field {f.name} has the wrong type")
        return cls(**values)

    def describe(self) -> str:
        return (
            f"{self.arch}, {self.n_layer} layers, {self.n_head_kv} KV heads x {self.head_dim_k}, "
            f"vocabulary {self.n_vocab}"
        )

    def require_same(self, live: "ModelFingerprint") -> None:
        """SessionMismatchError naming what differs when this (the file's) is not `live`."""
        if self == live:
            return
        if (self.arch, self.n_layer, self.n_head_kv, self.head_dim_k, self.head_dim_v, self.n_vocab) != (
            live.arch,
            live.n_layer,
            live.n_head_kv,
            live.head_dim_k,
            live.head_dim_v,
            live.n_vocab,
        ):
            raise SessionMismatchError(
                f"the session is for another model ({self.describe()}); this one is {live.describe()}"
            )
        what = "tokenizer" if self.tokenizer_sha256 != live.tokenizer_sha256 else "GGUF metadata"
        raise SessionMismatchError(
            f"the session is for another model of the same shape ({self.describe()}): its {what} "
            f"differs (another fine-tune or quantization); its K/V would not fit this model's weights"
        )


_FINGERPRINTS: "weakref.WeakKeyDictionary[object, ModelFingerprint]" = weakref.WeakKeyDictionary()
