"""KV memory as it is really held: llama.cpp's buffers plus the store's encoded rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

MIB = 2**20
LLAMA_TIERS = ("hot", "window")  # llama.cpp's cells; the other tiers are the store's
REUSE = "reuse"  # what a cut puts back (TieredConfig.reuse): copies, not the store's rows


@dataclass(frozen=True)
class TierMemory:
    name: str  # "hot", "window", "sink", "warm", "archive", "books", "reuse"
    codec: str
    bytes: int


@dataclass(frozen=True)
class KVMemory:
    """Bytes held for the KV cache of one context.

    ``hot`` is what llama.cpp allocated for its own cache (the whole buffer, used or not), and
    ``window`` the part of it that sliding-window layers hold, where a model has them;
    the other tiers are the store's encoded rows (and "books", the codebooks pq2 and vq8 rows
    are coded with, where they are used; "reuse", the copies a cut puts back, where a context
    has evicted rows: TieredConfig.reuse); ``index_bytes`` is the store's
    bookkeeping. ``bits_per_value`` divides all of it by the K/V values of the tokens held
    (docs/design.md, "The yardstick": tokens x layers x (n_embd_k_gqa + n_embd_v_gqa)).

    ``compute_bytes`` stands beside the total, not in it: llama.cpp's compute buffers, the
    transient scratch of its graphs at their peak so far (with cold rows, the f16 rows the
    attention expands them to; it grows with the context). Stock llama.cpp has one too.

    On a GPU (layers whose cells llama.cpp keeps in VRAM, ``cells_on_device``), ``device_bytes``
    is the store's copy there: its segments of coded rows with their room to grow, and the
    attention's scratch. It stands beside the total too, which counts the store's host bytes:
    ``vram_bytes`` and ``host_bytes`` say where the bytes are.

    Under a budget, ``dropped_tokens`` counts the positions it dropped to stay within it.
    """

    tiers: tuple[TierMemory, ...]
    index_bytes: int
    n_tokens: int
    values_per_token: int
    compute_bytes: int = 0
    cold_values: int = 0  # K/V values the store's tiers stand for
    device_bytes: int = 0  # the store's copy in VRAM (kvgguf.bindings.cuda_store)
    cells_on_device: bool = False  # llama.cpp's cells in VRAM
    dropped_tokens: int = 0  # positions a budget (TieredConfig.budget) dropped so far
    by_tier: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "by_tier", {t.name: t for t in self.tiers})

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.tiers) + self.index_bytes

    @property
    def cold_bytes(self) -> int:
        """Bytes of the store's tiers (everything but llama.cpp's own buffers and reuse's copies)."""
        return sum(t.bytes for t in self.tiers if t.name not in (*LLAMA_TIERS, REUSE))

    @property
    def cell_bytes(self) -> int:
        """llama.cpp's own buffers ("hot", "window")."""
        return sum(t.bytes for t in self.tiers if t.name in LLAMA_TIERS)

    @property
    def vram_bytes(self) -> int:
        """Bytes of the KV cache in GPU memory: llama.cpp's cells where it keeps them there, and
        the store's device copy."""
        return self.device_bytes + (self.cell_bytes if self.cells_on_device else 0)

    @property
    def host_bytes(self) -> int:
        """Bytes of the KV cache in host memory: the store (and llama.cpp's cells on a CPU)."""
        return self.total_bytes - (self.cell_bytes if self.cells_on_device else 0)

    @property
    def bits_per_value(self) -> float:
        values = self.n_tokens * self.values_per_token
        return self.total_bytes * 8 / values if values else float("nan")

    @property
    def cold_bits_per_value(self) -> Optional[float]:
        """Bits per value of the store alone: its codes and codebooks over the values they stand
        for (None while it holds none)."""
        return self.cold_bytes * 8 / self.cold_values if self.cold_values else None

    def __str__(self) -> str:
        parts = ", ".join(f"{t.name} {t.codec} {t.bytes / MIB:.2f}" for t in self.tiers)
        # n/a without tokens, or on a recurrent model (a state per sequence, no K/V values per token)
        bpv = f"{self.bits_per_value:.2f}" if self.n_tokens * self.values_per_token else "n/a"
        where = (
            f"; in VRAM {self.vram_bytes / MIB:.2f} MiB (the store's copy {self.device_bytes / MIB:.2f}), "
            f"on the host {self.host_bytes / MIB:.2f} MiB"
            if self.cells_on_device or self.device_bytes
            else ""
        )
        dropped = f"; {self.dropped_tokens} tokens dropped for the budget" if self.dropped_tokens else ""
        return (
            f"kv cache: size = {self.total_bytes / MIB:.2f} MiB ({parts}), {bpv} bits/value over "
            f"{self.n_tokens} tokens{dropped}; compute scratch {self.compute_bytes / MIB:.2f} MiB (peak){where}"
        )
