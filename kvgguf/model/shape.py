"""The KV-cache shape of a loaded model: what every byte count in kvgguf is computed from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KVShape:
    arch: str
    n_layer: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_swa: int  # sliding-window size; 0 when every layer attends to the whole context

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

    @classmethod
    def of(cls, llm) -> "KVShape":
        """Reads the shape of a llama_cpp.Llama's model from llama.cpp and the GGUF metadata."""
        import llama_cpp.llama_cpp as C

        model = llm.model
        meta = llm.metadata
        arch = meta.get("general.architecture", "")
        n_head = C.llama_model_n_head(model)
        default_dim = C.llama_model_n_embd(model) // n_head
        head_dim_k = int(meta.get(f"{arch}.attention.key_length", default_dim))
        head_dim_v = int(meta.get(f"{arch}.attention.value_length", head_dim_k))
        return cls(
            arch=arch,
            n_layer=C.llama_model_n_layer(model),
            n_head_kv=C.llama_model_n_head_kv(model),
            head_dim_k=head_dim_k,
            head_dim_v=head_dim_v,
            n_swa=C.llama_model_n_swa(model),
        )
