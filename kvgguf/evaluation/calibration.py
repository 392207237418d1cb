"""Calibration: what each (layer, K/V) list's codec costs this model, and the plan for a budget.

Measured once per model, kept in kvgguf's cache folder, allocated for any budget on use:

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
   codebooks instead of training one on each sequence's first block (``books_for``; the live
   cache still holds and counts them).

Two ways to use it: kv_codec="auto[:BITS]" (measures the model on first use) and
kv_codec="tiered" on a model that has a calibration (the plan at PRESET_BUDGET; a model without
one keeps the fixed preset, and "tiered" never measures: it must start at once).
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

import numpy as np

from ..errors import CalibrationError
from ..bindings import codecs
from ..bindings.binding import KvgValueError
from ..enums import Kind, Tier
from ..policy import allocation
from ..policy.kv_codec import DEFAULT_BUDGET, PRESET_BUDGET, Request, is_kv_codec, parse, parse_auto  # noqa: F401
from ..policy.tiered import TieredConfig
from ..session.container import write_atomic

FORMAT = "kvgguf-calibration"
VERSION = 2  # 2: codec costs measured through the model (1 scaled by reconstruction error)
PROBE = "rotq2"
CANDIDATES = ("kivi2", "kivi3", "kivi4", "rotq2", "rotq3", "rotq4", "crotq2", "crotq3", "crotq4", "kivi8", "f16")
PROMPTS = (
    "The history of the town begins",
    "Here is a short explanation of how it works.",
    "Dear friend, I am writing to tell you",
    "The following recipe serves four people.",
    "In the first chapter of the book,",
)
SAME_BOOK = {"vq8f": "vq8"}  # vq8f trains vq8's codebook: the file keeps it once


@dataclass
class Calibration:
    """Measured curves of one model: {(layer, kind): [Candidate]} plus what they came from."""

    model: dict  # ModelFingerprint.to_json()
    curves: dict  # {(layer, kind): list[allocation.Candidate]}
    weights: dict  # {(layer, kind): values per row}
    text: dict  # {"source": "self" | file name, "tokens": n, "seed": s}
    hot: int
    block: int
    books: dict = field(default_factory=dict)  # {(layer, kind, codec): float32 [256, S]}: pq2/vq8 codebooks

    def plan(self, budget: float) -> dict[tuple[int, int], allocation.Candidate]:
        return allocation.allocate(self.curves, self.weights, budget)

    def config(self, budget: float = DEFAULT_BUDGET, base: Optional[TieredConfig] = None) -> TieredConfig:
        """The tiered config whose compressed rows follow the plan for budget: sinks exact,
        every older token at its list's codec (one tier: the plan already spends bits where
        they matter), the preset's hot window."""
        choice = self.plan(budget)
        layers = sorted({il for il, _ in choice})
        warm = {il: (choice[il, Kind.K].codec, choice[il, Kind.V].codec) for il in layers}
        most = max(set(warm.values()), key=list(warm.values()).count)
        spec = {"default": most, **{il: kv for il, kv in warm.items() if kv != most}}
        return replace(base or TieredConfig(), warm=spec, warm_tokens=0, archive=None)

    def require_model(self, model_path: str) -> None:
        """CalibrationError unless it was measured on this GGUF (same metadata and tokenizer)."""
        from ..model.gguf_file import metadata_digests

        meta, tok = metadata_digests(model_path)
        mine = self.model
        if (mine.get("metadata_sha256"), mine.get("tokenizer_sha256")) == (meta, tok):
            return
        raise CalibrationError(
            f"this calibration was measured on another model ({mine.get('arch')}, {mine.get('n_layer')} layers, "
            f"metadata {str(mine.get('metadata_sha256'))[:12]}); {model_path} has metadata {meta[:12]}: "
            f"run `kvgguf calibrate` for it"
        )

    def to_json(self) -> dict:
        return {
            "format": FORMAT,
            "version": VERSION,
            "model": dict(self.model),
            "text": dict(self.text),
            "hot": self.hot,
            "block": self.block,
            "probe": PROBE,
            "lists": [
                {
                    "layer": il,
                    "kind": Kind(kind).letter,
                    "values_per_row": self.weights[il, kind],
                    "candidates": [[c.codec, c.bits, c.error] for c in cands],
                }
                for (il, kind), cands in sorted(self.curves.items())
            ],
            # f16 on disk (half the bytes; the centroids are unit-scale coordinates)
            "books": [
                {
                    "layer": il,
                    "kind": Kind(kind).letter,
                    "codec": name,
                    "centroids": int(bk.shape[0]),
                    "f16": base64.b64encode(bk.astype("<f2").tobytes()).decode("ascii"),
                }
                for (il, kind, name), bk in sorted(self.books.items())
                if name not in SAME_BOOK
            ],
        }

    @classmethod
    def from_json(cls, d) -> "Calibration":
        try:
            if d["format"] != FORMAT:
                raise CalibrationError(f"not a kvgguf calibration file (format {d['format']!r})")
            if d["version"] != VERSION:
                raise CalibrationError(
                    f"calibration file version {d['version']}; this kvgguf reads version {VERSION}: run `kvgguf calibrate` again"
                )
            kinds = {k.letter: k for k in Kind}
            curves, weights = {}, {}
            for e in d["lists"]:
                key = (int(e["layer"]), kinds[e["kind"]])
                curves[key] = [allocation.Candidate(str(c), float(b), float(err)) for c, b, err in e["candidates"]]
                weights[key] = int(e["values_per_row"])
                for c in curves[key]:
                    codecs.get(c.codec)
            books = {}
            for e in d.get("books", []):  # absent from files written before codebooks were trained
                if e["codec"] not in codecs.BOOK_CODECS:
                    raise ValueError(f"codebook for {e['codec']!r}, which keeps none")
                raw = np.frombuffer(base64.b64decode(e["f16"], validate=True), dtype="<f2")
                n = int(e["centroids"])
                if n <= 0 or raw.size % n or not np.isfinite(raw).all():
                    raise ValueError(
                        f"codebook of layer {e['layer']} {e['kind']} {e['codec']}: {raw.size} values, "
                        f"{n} centroids, or not finite"
                    )
                books[int(e["layer"]), kinds[e["kind"]], e["codec"]] = raw.astype(np.float32).reshape(n, -1)
            for (il, kind, name), bk in list(books.items()):
                books.update({(il, kind, alias): bk for alias, same in SAME_BOOK.items() if same == name})
            return cls(dict(d["model"]), curves, weights, dict(d["text"]), int(d["hot"]), int(d["block"]), books)
        except (KeyError, TypeError, ValueError) as e:  # binascii.Error is a ValueError
            if isinstance(e, CalibrationError):
                raise
            raise CalibrationError(f"calibration file is malformed: {e!r}") from None

    def save(self, path: Path) -> Path:
        """Written whole or not at all, as session files are (write_atomic: regular files only,
        the umask's mode, errors naming the path)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(self.to_json(), indent=1).encode())
        return path

    @classmethod
    def load(cls, path: Path) -> "Calibration":
        try:
            d = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CalibrationError(f"cannot read calibration file {path}: {e}") from None
        return cls.from_json(d)


def default_path(model_path: str) -> Path:
    """Where a model's calibration lives: kvgguf's cache folder, keyed by its metadata digest
    (the one session fingerprints carry)."""
    from ..model.gguf_file import metadata_digests
    from ..model.registry import cache_dir

    meta, _ = metadata_digests(model_path)
    return cache_dir() / "calibration" / f"{meta[:24]}.json"


# --- measurement ---------------------------------------------------------------------------


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
        for name in codecs.BOOK_CODECS:
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


def books_for(model_path: str) -> dict:
    """The codebooks of this model's calibration ({(layer, kind, codec): book}), or {} with a
    warning when it has none (no calibration, one measured before codebooks were, or another
    model's): pq2/vq8/vq8f then train their own per sequence."""
    path = default_path(model_path)
    if not path.exists():
        warnings.warn(
            f"kvgguf: no calibration for {os.path.basename(model_path)} (`kvgguf calibrate` measures one): "
            "pq2/vq8/vq8f train their codebooks per sequence",
            stacklevel=3,
        )
        return {}
    try:
        cal = Calibration.load(path)
        cal.require_model(model_path)
    except CalibrationError as e:
        warnings.warn(f"kvgguf: pq2/vq8/vq8f train their codebooks per sequence: {e}", stacklevel=3)
        return {}
    if not cal.books:
        warnings.warn(
            f"kvgguf: {path} holds no codebooks (measured before kvgguf trained them; `kvgguf calibrate` "
            "again): pq2/vq8/vq8f train their codebooks per sequence",
            stacklevel=3,
        )
    return cal.books


def for_model(
    model_path: str,
    request: Union[Request, float],
    *,
    base: Optional[TieredConfig] = None,
    progress: Optional[Callable[[int, int], None]] = None,
) -> TieredConfig:
    """The config a Request (or a budget: "auto:BITS") gets on this model: its calibration from
    the cache folder, allocated for the budget. A required request measures the model when it
    has none (and keeps it); otherwise base (the fixed preset) is returned as it is, with a
    warning when the model's calibration file cannot be used."""
    if not isinstance(request, Request):
        request = Request(float(request))
    base = base or TieredConfig()
    path = default_path(model_path)
    if path.exists():
        try:
            cal = Calibration.load(path)
            cal.require_model(model_path)
        except CalibrationError as e:
            if request.required:
                raise
            warnings.warn(f"kv_codec='tiered' keeps the fixed preset: {e}", stacklevel=3)
            return base
    elif request.required:
        cal = calibrate(model_path, progress=progress)
        cal.save(path)
    else:
        return base
    return cal.config(request.budget, base)
