"""Calibration, the measurement: what each (layer, K/V) list's codec costs this model.

Measured once per model (``calibrate``), kept in kvgguf's cache folder as a
``kvgguf.policy.calibration_plan.Calibration`` (the data and its file), allocated for any
budget on use:

1. Text. By default the model writes it itself from a few neutral prompts (seeded sampling),
   so no dataset is needed; or the user's own text file.
2. Sensitivity. The text is run through the live cache with every cold row in f16 (the
   reference, exact), then once per list with only that list at the probe codec (rotq2, the
   coarsest); the KL of the final logits against the reference is that list's sensitivity.
3. Codec cost. Once per kind (K, V) and candidate codec, every list of that kind at that codec:
   the KL through the model says what each codec costs relative to the probe. A list's
   predicted KL at codec c is sensitivity * KL_kind(c) / KL_kind(probe): layers differ in how
   much they matter, codecs in how much they lose, each measured through the model. (Scaling by
   the rows' reconstruction error instead was tried first: centred rotation reconstructs keys
   better than rotation yet costs 4x the KL; `benchmarks/calibration_proxy.py` compares the
   prediction with single-list runs.)
4. Allocation (``allocation.allocate``) under an average of bits per value over the
   compressed rows.
5. Codebooks. pq2 and vq8 code rows against a k-means codebook per (layer, K/V) list; the
   calibration trains them on every row of the text (exact, from the reference run) and keeps
   them; a live cache with TieredConfig(codebooks="calibration") starts from the model's
   codebooks instead of training one on each sequence's first block (``calibration_plan.books_for``; the live
   cache still holds and counts them).

Two ways to use it: kv_codec="auto[:BITS]" (measures the model on first use: the facade's one
call into this layer, ``kvgguf.llama._calibrate``, through ``kvgguf.policy.resolve``) and kv_codec="tiered" on a model that
has a calibration (the plan at PRESET_BUDGET; a model without one keeps the fixed preset, and
"tiered" never measures: it must start at once).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from ..bindings import codecs
from ..bindings.binding import KvgValueError
from ..enums import Kind, Tier
from ..policy import allocation
from ..policy.calibration_plan import CANDIDATES, PROBE, SAME_BOOK, Calibration
from ..policy.tiered import TieredConfig

PROMPTS = (
    "The history of the town begins",
    "Here is a short explanation of how it works.",
    "Dear friend, I am writing to tell you",
    "The following recipe serves four people.",
    "In the first chapter of the book,",
)


def self_text(model_path: str, n_tokens: int, seed: int = 0, threads: Optional[int] = None) -> list[int]:
    """n_tokens the model writes itself (BOS, a neutral prompt, seeded sampling; the next
    prompt when it ends a text), with llama.cpp's own cache."""
    from ..llama import Llama

    llm = Llama(
        model_path,
        kv_codec=None,
        n_ctx=n_tokens + 64,
        n_batch=64,
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    llm.set_seed(seed)  # the constructor maps seed=0 to "random"
    try:
        tokens = [llm.token_bos()] if llm.token_bos() >= 0 else []
        for i in range(len(PROMPTS) * 4):
            if len(tokens) >= n_tokens:
                break
            tokens += llm.tokenize(
                ("\n\n" if len(tokens) > 1 else "").encode() + PROMPTS[i % len(PROMPTS)].encode(), add_bos=False
            )
            for t in llm.generate(tokens, temp=0.8, top_k=40, top_p=0.95, min_p=0.05, reset=True):
                if llm.token_eos() == t or len(tokens) >= n_tokens:
                    break
                tokens.append(t)
        return tokens[:n_tokens]
    finally:
        llm.close()


def _kl(ref_logp: np.ndarray, logits: np.ndarray) -> float:
    from .harness import log_softmax

    lt = log_softmax(logits.astype(np.float64))
    return float((np.exp(ref_logp) * (ref_logp - lt)).sum(axis=1).mean())


BLOCK = 32  # rows per store block while measuring (kivi's group)


def probe_hot(model_path: str) -> int:
    """The hot window calibration measures with: small, but covering a sliding window."""
    from ..model.shape import KVShape

    n_swa = KVShape.from_gguf(model_path).n_swa
    return n_swa + BLOCK if n_swa else 96


def default_tokens(model_path: str) -> int:
    """512 tokens, or enough for 320 cold rows past a sliding window."""
    return max(512, probe_hot(model_path) + 320)


class Probe:
    """One live Llama over a text, holding every cold row in f16 as the reference (exact):
    the KL of the final logits for any codec table."""

    def __init__(
        self,
        model_path: str,
        tokens: Sequence[int],
        threads: Optional[int] = None,
        reference: str = "f16",
        attention: str = "fused",
    ):
        from .harness import log_softmax
        from ..llama import Llama

        self.block = BLOCK
        self.hot = probe_hot(model_path)
        if len(tokens) < self.hot + 2 * self.block + 16:
            raise ValueError(
                f"calibration needs at least {self.hot + 2 * self.block + 16} tokens on this model, got {len(tokens)}"
            )
        config = TieredConfig(
            hot=self.hot, ubatch=32, sinks=0, warm=reference, warm_tokens=0, archive=None, block=self.block
        )
        self.tokens = list(tokens)
        self.llm = Llama(
            model_path,
            kv_codec=config,
            n_ctx=len(tokens),
            n_threads=threads,
            n_threads_batch=threads,
            flash_attn=True,
            kv_attention=attention,
            verbose=False,
        )
        try:
            self.kv = self.llm.kv_cache
            self.first = self.hot + self.block  # logits from here on see cold rows
            self.reference = dict(self.kv.codecs[Tier.WARM])
            self.lists = [(il, kind) for il in self.kv.layers for kind in Kind]
            self.ref_logp = log_softmax(self._run().astype(np.float64))
        except BaseException:
            self.llm.close()
            raise

    def _run(self) -> np.ndarray:
        self.llm.reset()
        out = []
        for p0, logits in self.llm.eval_logits(self.tokens):
            if p0 + len(logits) > self.first:
                out.append(logits[max(self.first - p0, 0) :].copy())
        return np.concatenate(out)

    def rows(self, il: int, kind: int) -> np.ndarray:
        """Every row of the text on list (il, kind), exact: (tokens, KV heads, head dim). Valid
        after the reference run (cold rows in the store in f16, the rest in llama.cpp's cells)."""
        store, n_cold = self.kv.store, self.kv.n_cold
        rows = np.concatenate(
            [store.decode(il, kind, 0, n_cold), self.kv.read_rows(il, kind, n_cold, len(self.tokens))]
        )
        shape = self.kv.shape
        return rows.reshape(len(rows), shape.n_head_kv, shape.head_dim_k if kind == Kind.K else shape.head_dim_v)

    def kl(self, overrides: dict[tuple[int, int], str]) -> float:
        """Mean KL against the reference with these lists at these codecs, the rest f16."""
        self.kv.set_codecs(Tier.WARM, {**self.reference, **overrides})
        try:
            return _kl(self.ref_logp, self._run())
        finally:
            self.kv.set_codecs(Tier.WARM, self.reference)

    def close(self) -> None:
        self.llm.close()


def train_books(probe: Probe) -> dict:
    """pq2 and vq8 codebooks for every list, by k-means on all of the text's rows, as the store
    would train them on a first block (codecs.train_book). A head size they cannot take gets none."""
    books = {}
    for il, kind in probe.lists:
        rows = probe.rows(il, kind)
        for name in codecs.CODEBOOK_CODECS:  # wfq fits its plan per sequence
            try:
                books[il, kind, name] = (
                    books[il, kind, SAME_BOOK[name]]
                    if name in SAME_BOOK
                    else codecs.train_book(name, rows, Kind(kind).letter)
                )
            except KvgValueError:
                pass  # e.g. a head dim that is not a power of two: pq2/vq8 refuse such lists anyway
            except KeyError:
                pass  # the codebook it shares was not trained
    return books


def measure(
    model_path: str,
    tokens: Sequence[int],
    *,
    threads: Optional[int] = None,
    text: Optional[dict] = None,
    progress: Optional[Callable[[int, int], None]] = None,
    only: Optional[Sequence[tuple[int, int]]] = None,
) -> Calibration:
    """The curves of every (layer, kind) list that holds cold rows (module docstring), or of
    the lists in ``only``."""
    from ..session.fingerprint import ModelFingerprint

    probe = Probe(model_path, tokens, threads)
    try:
        books = train_books(probe)  # first: the reference rows are still in place
        lists = probe.lists
        if only is not None:
            unknown = set(only) - set(lists)
            if unknown:
                raise ValueError(f"no cold rows on lists {sorted(unknown)}: (layer, kind) of full-attention layers")
            lists = [key for key in lists if key in set(only)]
        shape = probe.kv.shape
        width = {Kind.K: shape.n_head_kv * shape.head_dim_k, Kind.V: shape.n_head_kv * shape.head_dim_v}
        runs = len(lists) + 2 * (len(CANDIDATES) - 1)
        cost = {Kind.K: {"f16": 0.0}, Kind.V: {"f16": 0.0}}  # f16 is the reference itself
        for kind in Kind:
            every = [key for key in probe.lists if key[1] == kind]
            for c in CANDIDATES:
                if c != "f16":
                    if progress:
                        progress(sum(len(v) - 1 for v in cost.values()), runs)
                    cost[kind][c] = probe.kl({key: c for key in every})
        curves, weights = {}, {}
        for i, key in enumerate(lists):
            if progress:
                progress(runs - len(lists) + i, runs)
            sens = probe.kl({key: PROBE})
            per = cost[key[1]]
            head = (probe.block, shape.n_head_kv, shape.head_dim_k if key[1] == Kind.K else shape.head_dim_v)
            curves[key] = [
                allocation.Candidate(
                    c,
                    codecs.bits_per_value(c, head, Kind(key[1]).letter),
                    sens * per[c] / per[PROBE] if per[PROBE] else 0.0,
                )
                for c in CANDIDATES
            ]
            weights[key] = width[key[1]]
        if progress:
            progress(runs, runs)
        return Calibration(
            ModelFingerprint.of(probe.llm).to_json(),
            curves,
            weights,
            text or {"source": "given", "tokens": len(tokens)},
            probe.hot,
            probe.block,
            books,
        )
    finally:
        probe.close()


def calibrate(
    model_path: str,
    *,
    n_tokens: Optional[int] = None,
    seed: int = 0,
    text_file: Optional[str] = None,
    threads: Optional[int] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> Calibration:
    """Text (self-written unless text_file; n_tokens: ``default_tokens``), then ``measure``."""
    n_tokens = n_tokens or default_tokens(model_path)
    if text_file is None:
        tokens = self_text(model_path, n_tokens, seed, threads)
        text = {"source": "self", "tokens": len(tokens), "seed": seed}
    else:
        from ..llama import Llama

        vocab = Llama(model_path, kv_codec=None, vocab_only=True, verbose=False)
        try:
            body = Path(text_file).read_text(encoding="utf-8", errors="replace")
            tokens = vocab.tokenize(body.encode("utf-8"), add_bos=True)[:n_tokens]
        finally:
            vocab.close()
        text = {"source": Path(text_file).name, "tokens": len(tokens)}
    return measure(model_path, tokens, threads=threads, text=text, progress=progress)
