"""The KV-cache shape of a model, from its GGUF metadata: what every byte count in kvgguf is
computed from (the live cache, sessions, inspect)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

from .gguf_file import GGUFError, read_metadata

# Sliding-window layer patterns llama.cpp applies when the GGUF states none: every n-th layer
# attends to the whole context (src/llama-model.cpp: LLM_ARCH_GEMMA3 6, LLM_ARCH_GEMMA2 2).
DEFAULT_SWA_PATTERN = {"gemma3": 6, "gemma2": 2}


@dataclass(frozen=True)
class KVShape:
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_swa: int  # sliding-window size; 0 when every layer attends to the whole context
    swa_pattern: int  # every n-th layer attends to the whole context; 0 without a window
    n_ctx_train: int = 0

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_head_kv * self.head_dim_k

    @property
    def n_embd_v_gqa(self) -> int:
        return self.n_head_kv * self.head_dim_v

    @property
    def values_per_token(self) -> int:
        """K and V values one token adds to the cache, all layers."""
        return self.n_layer * (self.n_embd_k_gqa + self.n_embd_v_gqa)

    @property
    def full_layers(self) -> list[int]:
        """Layers that attend to the whole context (all of them without a sliding window)."""
        if not self.n_swa:
            return list(range(self.n_layer))
        return [il for il in range(self.n_layer) if (il + 1) % self.swa_pattern == 0]

    @classmethod
    def from_metadata(cls, meta: dict, source: str = "the model") -> "KVShape":
        arch = meta.get("general.architecture")
        if not arch:
            raise GGUFError(f"{source} has no general.architecture")

        def get(key, default=None):
            value = meta.get(f"{arch}.{key}", default)
            if value is None:
                raise GGUFError(f"{source} ({arch}) has no scalar {arch}.{key}")
            return int(value)

        n_head = get("attention.head_count")
        head_dim_k = get("attention.key_length", get("embedding_length") // n_head)
        n_swa = get("attention.sliding_window", 0)
        pattern = get("attention.sliding_window_pattern", 0) or (DEFAULT_SWA_PATTERN.get(arch, 1) if n_swa else 0)
        return cls(
            arch=arch,
            n_layer=get("block_count"),
            n_head=n_head,
            n_head_kv=get("attention.head_count_kv", n_head),
            head_dim_k=head_dim_k,
            head_dim_v=get("attention.value_length", head_dim_k),
            n_swa=n_swa,
            swa_pattern=pattern,
            n_ctx_train=get("context_length", 0),
        )

    @classmethod
    def from_gguf(cls, path: Union[str, Path]) -> "KVShape":
        return cls.from_metadata(read_metadata(path), str(path))

    @classmethod
    def of(cls, llm) -> "KVShape":
        """The shape of a llama_cpp.Llama's model (read once per Llama)."""
        shape = getattr(llm, "_kvgguf_shape", None)
        if shape is None:
            shape = cls.from_gguf(llm.model_path)
            llm._kvgguf_shape = shape
        return shape
