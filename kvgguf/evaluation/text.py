"""The evaluation text shipped with kvgguf: WikiText-2's test split (see data/README.md).

Shipped zstd-compressed inside the package, so ``kvgguf eval``, the tests and the benchmarks
work on any machine, with no data folder beside the checkout and no download.
"""

from __future__ import annotations

import functools
from importlib import resources

import zstandard

WIKITEXT_FILE = "wikitext-2-test.txt.zst"
WIKITEXT_BYTES = 1_287_656  # the uncompressed size (data/README.md): a bound for the reader


@functools.lru_cache(maxsize=1)
def wikitext2_test() -> str:
    """WikiText-2 (raw, v1) test split, one article line per line (CC BY-SA 3.0)."""
    blob = resources.files(__package__).joinpath("data", WIKITEXT_FILE).read_bytes()
    data = zstandard.ZstdDecompressor().decompress(blob, max_output_size=WIKITEXT_BYTES)
    if len(data) != WIKITEXT_BYTES:
        raise ValueError(
            f"kvgguf's packaged {WIKITEXT_FILE} holds {len(data)} bytes, expected {WIKITEXT_BYTES}; reinstall kvgguf"
        )
    return data.decode("utf-8")
