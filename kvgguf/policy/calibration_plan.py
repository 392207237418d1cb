"""A model's calibration as data: the measured error curves per (layer, K/V) list, the plan
they give for a bit budget, the codebooks, and the file that keeps them.

The measurement that writes one (running the model) is ``kvgguf.evaluation.calibration``;
where a model's file lives is ``kvgguf.model.registry.calibration_path``. Nothing here runs a
model: loading, checking and allocating are pure Python over the file's numbers (codec names
are checked against the codec catalogue of the bindings).
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional, Union

import numpy as np

from ..bindings import codecs
from ..enums import Kind
from ..errors import CalibrationError
from ..files import write_atomic
from ..model.gguf_file import metadata_digests
from ..model.registry import calibration_path
from . import allocation
from .kv_codec import DEFAULT_BUDGET
from .tiered import TieredConfig

FORMAT = "kvgguf-calibration"
VERSION = 2  # 2: codec costs measured through the model (1 scaled by reconstruction error)
PROBE = "rotq2"  # the codec every list's sensitivity is measured at (the curves are relative to it)
# The codecs `kvgguf calibrate` measures on every list, in the order of its curves: a policy, not
# a codec fact (each costs two model runs). Every one is a codec the fused attention scores from
# its codes with SIMD kernels (codecs.info: fused_codes, simd_ops; tests/unit/test_codec_info.py holds
# that); rotq1 is left out for its 1 bit. wfq fits its plan on each sequence's first block of the
# list (as the live cache will), so its cost includes a plan fitted on little text. A file
# measured before a codec joined lacks its cost: Calibration.unmeasured() names it.
CANDIDATES = (
    "kivi2", "kivi3", "kivi4", "rotq2", "rotq3", "rotq4", "crotq2", "crotq3", "crotq4",
    "wfq2", "wfq3", "wfq4", "tcq2", "tcq3", "tcq4", "kivi8", "f16",
)  # fmt: skip
SAME_BOOK = {"vq8f": "vq8"}  # vq8f trains vq8's codebook: the file keeps it once
# Tokens a sequence's plans are spread over where the context is not known (`kvgguf calibrate`'s
# table): a wfq plan is 3 float32 per coordinate of each KV head, so 96 / context bits per value.
PLAN_CONTEXT = 4096


def plan_bits(codec: str, context: int) -> float:
    """Bits per value a list's book adds at a context of that many tokens (the store holds one
    per sequence): wfq's plans; 0 for codecs without one among the candidates."""
    return 96.0 / context if codec in codecs.PLAN_CODECS else 0.0


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

    def plan(
        self, budget: float, context: Optional[int] = None, exclude: tuple[str, ...] = (), key_bits: int = 0
    ) -> dict[tuple[int, int], allocation.Candidate]:
        """The cheapest-error codec per list for an average of budget bits per compressed value,
        each codec's bits counting its plan over a context of that many tokens (PLAN_CONTEXT
        when None or 0), codecs of the exclude families (codecs.family) left out. key_bits: the
        K lists only take codecs of at least that many bits per value (codecs.info's
        value_bits) where the budget can hold such keys; where it cannot, the plan without."""
        context = context or PLAN_CONTEXT
        if context < 1:
            raise ValueError(f"context must be a number of tokens >= 1, got {context}")
        curves = {
            key: [
                replace(c, bits=c.bits + plan_bits(c.codec, context))
                for c in cands
                if codecs.family(c.codec) not in exclude
            ]
            for key, cands in self.curves.items()
        }
        if any(not cands for cands in curves.values()):
            raise ValueError(f"leaving out {', '.join(exclude)} leaves a list of this calibration no codec")
        if key_bits:
            floored = {
                key: [c for c in cands if key[1] != Kind.K or codecs.info(c.codec).value_bits >= key_bits]
                for key, cands in curves.items()
            }
            if all(floored.values()):
                try:
                    return allocation.allocate(floored, self.weights, budget)
                except ValueError:
                    pass  # a budget below such keys: the plan without the floor
        return allocation.allocate(curves, self.weights, budget)

    def config(
        self,
        budget: float = DEFAULT_BUDGET,
        base: Optional[TieredConfig] = None,
        context: Optional[int] = None,
        exclude: tuple[str, ...] = (),
        key_bits: int = 0,
    ) -> TieredConfig:
        """The tiered config whose compressed rows follow the plan for budget (at context
        tokens, without the exclude families, keys of at least key_bits: see plan): sinks exact,
        every older token at its list's codec (one tier: the plan already spends bits where
        they matter), the preset's hot window."""
        choice = self.plan(budget, context, exclude, key_bits)
        layers = sorted({il for il, _ in choice})
        warm = {il: (choice[il, Kind.K].codec, choice[il, Kind.V].codec) for il in layers}
        most = max(set(warm.values()), key=list(warm.values()).count)
        spec = {"default": most, **{il: kv for il, kv in warm.items() if kv != most}}
        return replace(base or TieredConfig(), warm=spec, warm_tokens=0, archive=None)

    def require_model(self, model_path: str) -> None:
        """CalibrationError unless it was measured on this GGUF (same metadata and tokenizer)."""
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

    def unmeasured(self) -> list[str]:
        """Today's candidates this file has no cost for (it was measured before they joined
        calibration): its plans cannot choose them until the model is measured again."""
        have = {c.codec for cands in self.curves.values() for c in cands}
        return [c for c in CANDIDATES if c not in have]

    def unmeasured_note(self, model_path) -> Optional[str]:
        """What a user is told of unmeasured() (the warning of "auto" / "tiered", `kvgguf
        inspect`), or None when the file measured every candidate."""
        missing = self.unmeasured()
        if not missing:
            return None
        return (
            f"measured before {', '.join(missing)} joined calibration's candidates, so its plans cannot "
            f"use them: `kvgguf calibrate {model_path}` measures the model again"
        )

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
                if e["codec"] not in codecs.CODEBOOK_CODECS:
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


def load_for(model_path: Union[str, os.PathLike], path: Optional[Path] = None) -> Optional[Calibration]:
    """The model's calibration from kvgguf's cache folder (path: calibration_path(model_path),
    where the caller has it already), None when it has none; a file that is damaged, of another
    version or of another model raises CalibrationError."""
    path = calibration_path(model_path) if path is None else path
    if not path.exists():
        return None
    cal = Calibration.load(path)
    cal.require_model(os.fspath(model_path))
    return cal


def books_for(model_path: str) -> dict:
    """The codebooks of this model's calibration ({(layer, kind, codec): book}), or {} with a
    warning when it has none (no calibration, one measured before codebooks were, or another
    model's): pq2/vq8/vq8f then train their own per sequence."""
    path = calibration_path(model_path)
    try:
        cal = load_for(model_path, path)
    except CalibrationError as e:
        warnings.warn(f"kvgguf: pq2/vq8/vq8f train their codebooks per sequence: {e}", stacklevel=3)
        return {}
    if cal is None:
        warnings.warn(
            f"kvgguf: no calibration for {os.path.basename(model_path)} (`kvgguf calibrate` measures one): "
            "pq2/vq8/vq8f train their codebooks per sequence",
            stacklevel=3,
        )
        return {}
    if not cal.books:
        warnings.warn(
            f"kvgguf: {path} holds no codebooks (measured before kvgguf trained them; "
            "`kvgguf calibrate` again): pq2/vq8/vq8f train their codebooks per sequence",
            stacklevel=3,
        )
    return cal.books
