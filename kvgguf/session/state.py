"""SessionState: what kvgguf.Llama.save_state returns when its cache is compressed."""

from __future__ import annotations

from typing import Optional

import llama_cpp
import numpy as np


class SessionState(llama_cpp.LlamaState):
    """A llama_cpp.LlamaState whose llama_state is a .kvz session (compressed KV rows and
    their tokens) instead of llama.cpp's raw state; llama_state_size is its length, the
    bytes a prompt cache holds for it. No logits: a restored context replays its last token."""

    def __init__(self, input_ids: np.ndarray, kvz: bytes, seed: Optional[int]):
        super().__init__(
            input_ids=input_ids,
            scores=np.empty((0, 0), dtype=np.single),
            n_tokens=len(input_ids),
            llama_state=kvz,
            llama_state_size=len(kvz),
            seed=seed,
        )
