"""Helpers the codec and kernel tests share: inputs shaped like real K/V rows, the error
measure their bounds are stated in, the split of per-codec cases between the tiers, and the
tokenized text the model tests run on."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest


def kv_like(rng, shape, outliers: bool = True, random_channels: bool = False) -> np.ndarray:
    """Gaussian float32 rows with a few large-magnitude channels, as keys have (KIVI, fig. 2):
    every (head_dim // 4)-th channel x8 (rows of 8 or more values), or with random_channels one
    in 32 channels drawn at random."""
    x = rng.standard_normal(shape).astype(np.float32)
    if random_channels:
        x[..., rng.choice(shape[-1], max(1, shape[-1] // 32), replace=False)] *= 8.0
    elif outliers and x.shape[-1] >= 8:
        x[..., :: max(1, x.shape[-1] // 4)] *= 8.0
    return x


def rel_mse(x, y) -> float:
    """Squared error relative to the signal's energy, summed in float64."""
    x = np.asarray(x, dtype=np.float64)
    return float(np.sum((x - y) ** 2) / np.sum(x**2))


def one_per_family(names) -> list:
    """Parameters for per-codec model tests: each family's first codec runs in the README's test
    command, the family's others only in the extended checks (marked slow); the kernels of all of
    them are checked without a model in every tier."""
    from kvgguf import codecs

    seen, out = set(), []
    for name in names:
        family = codecs.family(name)
        out.append(name if family not in seen else pytest.param(name, marks=pytest.mark.slow))
        seen.add(family)
    return out


@functools.lru_cache(maxsize=None)
def _wikitext_tokens(model_path: str, chars: int) -> tuple[int, ...]:
    import llama_cpp

    from kvgguf.evaluation.text import wikitext2_test

    vocab = llama_cpp.Llama(model_path, vocab_only=True, verbose=False)
    try:
        return tuple(vocab.tokenize(wikitext2_test()[:chars].encode("utf-8")))
    finally:
        vocab.close()


def wikitext_tokens(model_path, chars: int) -> list[int]:
    """The first `chars` characters of WikiText-2's test text as the model tokenizes them (BOS
    first): the text the model tests run on, tokenized once per run and model."""
    return list(_wikitext_tokens(str(model_path), chars))


def sanitized_files() -> list[Path]:
    """The test files scripts/sanitize.sh runs (tests/sanitized.txt, less its comments), as paths."""
    root = Path(__file__).resolve().parent.parent
    listed = (root / "tests" / "sanitized.txt").read_text().splitlines()
    return [root / line for line in listed if line and not line.startswith("#")]
