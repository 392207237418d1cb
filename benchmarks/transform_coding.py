"""Transform coding before any C (issue 28): what a calibrated basis with per-coordinate bits
would buy over rotq at equal bits, measured through the model.

A quantizer written here in numpy stands in for the codec: each evicted block is coded and
decoded at once and the store holds the result in f16 (half a bit of rounding at most, far
below a 2-4 bit code's error), so the KL through the model is what the codec would give; the
bits are counted from what the codec would store (codes, per-row scales). The basis and the bit
plan are fitted on the model's own calibration text (`kvgguf calibrate`'s self-written text)
and scored on WikiText-2 (held out), cold rows past a 96-token hot window, as calibration
measures. rotq, the native codec, runs in the same probe beside them, and a numpy copy of rotq
(a random rotation, the same Gaussian levels, a norm per row) checks that the stand-in
reproduces a native codec's KL (it does not quite: rotq's levels are fitted to its head dim's
coordinate law, these are Gaussian; compare the numpy rows with each other).

    .venv/bin/python benchmarks/transform_coding.py --tokens 2048 --bits 2.5,3,3.5 --families rot,pairk,klt1 \
        --sink --out benchmarks/results/quality/transform_coding

Quantizers (per layer, K/V and KV head; B bits per value on average, the per-row f16 scale
included): see FAMILIES. --sink keeps each list's first row (BOS) exact in every numpy
quantizer, as the preset keeps sinks; --fit-on-eval fits on the scored text (in-sample).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import kvgguf  # first: binds llama_cpp to kvgguf's patched llama.cpp
import llama_cpp
from kvgguf.evaluation import calibration
from kvgguf.evaluation.text import wikitext2_test
from kvgguf.bindings import codecs
from kvgguf.enums import Kind, Tier
from kvgguf.bindings.store import KVStore

from common import add_threads_option, command, markdown_table, write_json

MAX_BITS = 8
SCALE_BITS = 16  # an f16 norm or gain per row and head


# --- Lloyd-Max levels of a unit Gaussian ------------------------------------------------------

_GRID = np.linspace(-9.0, 9.0, 72001)
_PDF = np.exp(-0.5 * _GRID**2)
_LEVELS: dict[int, np.ndarray] = {}


def gauss_levels(bits: int) -> np.ndarray:
    """The 2^bits Lloyd-Max levels of N(0, 1) (Lloyd's iteration on a fine grid)."""
    if bits not in _LEVELS:
        n = 1 << bits
        cdf = np.cumsum(_PDF) / _PDF.sum()
        levels = _GRID[np.searchsorted(cdf, (np.arange(n) + 0.5) / n)]
        for _ in range(300 << max(bits - 4, 0)):
            edges = (levels[1:] + levels[:-1]) / 2
            cell = np.searchsorted(edges, _GRID)
            mass = np.bincount(cell, _PDF, n)
            levels = np.bincount(cell, _PDF * _GRID, n) / np.maximum(mass, 1e-300)
        _LEVELS[bits] = levels
    return _LEVELS[bits]


def gauss_mse(bits: int) -> float:
    """Mean squared error of the Lloyd-Max quantizer of N(0, 1) at this many bits (1 at 0)."""
    if bits == 0:
        return 1.0
    levels = gauss_levels(bits)
    q = levels[np.searchsorted((levels[1:] + levels[:-1]) / 2, _GRID)]
    return float((_PDF * (_GRID - q) ** 2).sum() / _PDF.sum())


def quantize(z: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Each column j of z (unit-variance coordinates) to its bits[j]-bit Gaussian levels (0 bits: 0)."""
    out = np.zeros_like(z)
    for b in np.unique(bits):
        if b == 0:
            continue
        cols = bits == b
        levels = gauss_levels(int(b))
        edges = (levels[1:] + levels[:-1]) / 2
        out[:, cols] = levels[np.searchsorted(edges, z[:, cols])]
    return out


def water_fill(variances: np.ndarray, total_bits: int, min_bits: int = 0) -> np.ndarray:
    """Integer bits per coordinate summing to total_bits, at least min_bits each, each next bit
    where it removes the most squared error (Lloyd-Max Gaussian distortions): reverse
    water-filling in whole bits."""
    gain = np.array([gauss_mse(b) - gauss_mse(b + 1) for b in range(MAX_BITS)] + [-np.inf])
    bits = np.full(len(variances), min_bits, dtype=np.int64)
    for _ in range(min(total_bits - int(bits.sum()), len(variances) * MAX_BITS)):
        bits[int(np.argmax(variances * gain[bits]))] += 1
    return bits


# --- the quantizers ---------------------------------------------------------------------------


class HeadCoder:
    """One KV head's transform: y = (x - mean) @ basis, z = y / (gain * sigma), codes per column."""

    def __init__(self, mean, basis, sigma, bits, mix=None):
        self.mean, self.basis, self.sigma, self.bits = mean, basis, sigma, bits
        self.mix = np.eye(len(bits)) if mix is None else mix  # orthogonal, within equal-bit coordinates
        self.ref = float(np.sqrt((sigma**2).sum()))  # the norm of a typical row in the basis

    def __call__(self, x: np.ndarray) -> np.ndarray:
        y = (x - self.mean) @ self.basis
        gain = np.linalg.norm(y, axis=1, keepdims=True) / self.ref
        gain = gain.astype(np.float16).astype(np.float64)  # stored in f16
        z = np.divide(y, gain * self.sigma, out=np.zeros_like(y), where=gain > 0) @ self.mix
        return ((quantize(z, self.bits) @ self.mix.T) * gain * self.sigma) @ self.basis.T + self.mean


def group_mix(bits: np.ndarray, seed: int) -> np.ndarray:
    """A random rotation of each set of coordinates that share a bit width (identity across sets):
    unit-variance coordinates mixed so that one row's heavy coordinate spreads over its set
    instead of clipping at the few levels it has."""
    rng = np.random.default_rng(seed)
    mix = np.eye(len(bits))
    for b in np.unique(bits):
        idx = np.flatnonzero(bits == b)
        q, _ = np.linalg.qr(rng.standard_normal((len(idx), len(idx))))
        mix[np.ix_(idx, idx)] = q
    return mix


def fit_rot(rows: np.ndarray, bits_per_value: float, seed: int) -> HeadCoder:
    d = rows.shape[1]
    basis, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((d, d)))
    per = round(bits_per_value - SCALE_BITS / d)
    return HeadCoder(np.zeros(d), basis, np.full(d, 1.0), np.full(d, per, dtype=np.int64))


def fit_klt(
    rows: np.ndarray, bits_per_value: float, min_bits: int = 0, mixed: bool = False, seed: int = 0
) -> HeadCoder:
    d = rows.shape[1]
    mean = rows.mean(0)
    c = rows - mean
    var, basis = np.linalg.eigh(c.T @ c / len(c))
    var, basis = np.maximum(var[::-1], 1e-12), basis[:, ::-1]
    bits = water_fill(var, int(round(bits_per_value * d)) - SCALE_BITS, min_bits)
    return HeadCoder(mean, basis, np.sqrt(var), bits, group_mix(bits, seed) if mixed else None)


FAMILIES = {
    "rot": "random rotation, equal bits, a norm per row (rotq's design)",
    "klt": "principal axes, water-filled bits (0 allowed), a gain per row",
    "klt1": "as klt, at least 1 bit a coordinate",
    "kltv": "values as klt1, keys as rot",
    "kltr": "as klt1, each set of coordinates with one bit width randomly rotated within itself",
    "kltrv": "values as kltr, keys as rot",
    "pairk": "keys: bits water-filled on the energy of each RoPE pair (adjacent coordinates), which "
    "no position changes, then mixed as kltr; values as rot",
    "pairk0": "as pairk without the mixing rotation",
    "chk": "keys: bits water-filled on each coordinate's energy (no pairing, no basis), mixed as kltr; values as rot",
    "pairkh": "as pairk, mixed by two overlapping random-signed Hadamards per set of equal bit width",
    "pair": "keys as pairk; values: bits water-filled on each coordinate's energy (no basis), mixed as kltr",
}


def fit_coder(family: str, kind: int, rows: np.ndarray, bits: float, seed: int, neox: bool) -> HeadCoder:
    if family in ("pairk", "pair", "pairk0", "pairkh") and kind == Kind.K:
        return fit_pairs(rows, bits, seed, neox, mix={"pairk0": None, "pairkh": "hadamard"}.get(family, "dense"))
    if family == "pair" or (family == "chk" and kind == Kind.K):
        return fit_channels(rows, bits, seed)
    if family in ("rot", "pairk", "pairk0", "pairkh", "chk") or (family.endswith("v") and kind == Kind.K):
        return fit_rot(rows, bits, seed)
    return fit_klt(rows, bits, min_bits=0 if family == "klt" else 1, mixed=family.startswith("kltr"), seed=seed)


def rope_pairs(d: int, neox: bool) -> np.ndarray:
    """The coordinate order that puts each RoPE pair side by side: llama.cpp's NeoX rope type
    pairs (i, i + d/2), the normal one (2i, 2i + 1)."""
    half = np.arange(d // 2)
    return np.stack([half, half + d // 2], 1).reshape(-1) if neox else np.arange(d)


def hadamard(n: int) -> np.ndarray:
    h = np.ones((1, 1))
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


def overlapping_mix(bits: np.ndarray, seed: int) -> np.ndarray:
    """Per run of equal bits (contiguous): signs then a Hadamard on its first 2^k coordinates,
    signs then one on its last 2^k (2^k the largest power of two in the run); as z = u @ mix."""
    rng = np.random.default_rng(seed)
    d = len(bits)
    f = np.eye(d)
    a = 0
    while a < d:
        g = 1
        while a + g < d and bits[a + g] == bits[a]:
            g += 1
        p = 1 << (g.bit_length() - 1)
        for lo in (a, a + g - p):
            stage = np.eye(d)
            stage[lo : lo + p, lo : lo + p] = hadamard(p) * rng.choice([-1.0, 1.0], p)[None, :]
            f = stage @ f
        a += g
    return f.T


def fit_pairs(rows: np.ndarray, bits_per_value: float, seed: int, neox: bool, mix="dense") -> HeadCoder:
    """Keys after RoPE: the energy of a pair does not depend on the position, its direction
    does, so bits go by pair energy (two at a time) and no basis is fitted."""
    d = rows.shape[1]
    order = rope_pairs(d, neox)
    energy = (rows[:, order] ** 2).mean(0).reshape(-1, 2).sum(1)
    # whole pairs: one bit more for a pair is one more for each of its two coordinates
    pair_bits = water_fill(energy, (int(round(bits_per_value * d)) - SCALE_BITS) // 2, 1)
    if mix == "hadamard":  # runs of equal bits made contiguous
        by = np.argsort(-pair_bits, kind="stable")
        pair_bits, energy = pair_bits[by], energy[by]
        order = order.reshape(-1, 2)[by].reshape(-1)
    bits = np.repeat(pair_bits, 2)
    sigma = np.sqrt(np.repeat(energy / 2, 2))
    m = {"dense": group_mix(bits, seed), "hadamard": overlapping_mix(bits, seed), None: None}[mix]
    return HeadCoder(np.zeros(d), np.eye(d)[:, order], np.maximum(sigma, 1e-6), bits, m)


def fit_channels(rows: np.ndarray, bits_per_value: float, seed: int) -> HeadCoder:
    """Values: bits water-filled on each coordinate's energy (at least 1), no basis fitted."""
    d = rows.shape[1]
    energy = (rows**2).mean(0)
    bits = water_fill(energy, int(round(bits_per_value * d)) - SCALE_BITS, 1)
    return HeadCoder(np.zeros(d), np.eye(d), np.sqrt(np.maximum(energy, 1e-12)), bits, group_mix(bits, seed))


def am_gm_bits(rows: np.ndarray) -> float:
    """Half the log2 of the arithmetic over the geometric mean of the principal variances: what
    transform coding saves per value over coding every coordinate alike, at equal error, in the
    high-rate limit."""
    c = rows - rows.mean(0)
    var = np.maximum(np.linalg.eigvalsh(c.T @ c / len(c)), 1e-12)
    return float(0.5 * np.log2(var.mean() / np.exp(np.log(var).mean())))


class Coded:
    """While active, the store keeps warm blocks as coders[(layer, kind)] decode them, in f16."""

    active: dict = {}
    sink = False  # the first row of each list (the BOS token, an attention sink) stays exact
    _append = KVStore.append

    @classmethod
    def install(cls):
        def append(store, il, kind, tier, codec, rows):
            coders = cls.active.get((il, kind))
            if tier == Tier.WARM and coders is not None:
                x = np.asarray(rows, dtype=np.float64).reshape(len(rows), len(coders), -1)
                y = np.stack([coders[h](x[:, h]) for h in range(len(coders))], 1)
                if cls.sink and store.n_rows(il, kind) == 0:
                    y[0] = x[0]
                codec = "f16"
                rows = y.reshape(len(rows), -1).astype(np.float32)
            return cls._append(store, il, kind, tier, codec, rows)

        KVStore.append = append


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2048, help="WikiText-2 tokens scored (cold rows past 96)")
    ap.add_argument(
        "--fit-tokens", type=int, default=1024, help="self-written calibration tokens the bases are fitted on"
    )
    ap.add_argument("--bits", default="2,2.5,3,3.5,4", help="bits per value held by the numpy quantizers")
    ap.add_argument("--rotq", default="rotq2,rotq3,rotq4", help="native codecs in the same probe")
    ap.add_argument("--families", default="rot,klt", help=", ".join(f"{k}: {v}" for k, v in FAMILIES.items()))
    ap.add_argument(
        "--sink", action="store_true", help="keep each list's first row (BOS) exact in the numpy quantizers"
    )
    ap.add_argument("--fit-on-eval", action="store_true", help="fit on the scored text itself (in-sample, a bound)")
    add_threads_option(ap)
    ap.add_argument("--out", type=Path, help="folder for results.json and results.md (default: print only)")
    args = ap.parse_args(argv)

    model = str(kvgguf.models.path(args.model))
    t0 = time.time()
    fit = calibration.Probe(model, calibration.self_text(model, args.fit_tokens, 0, args.threads), args.threads)
    try:
        rows = {key: fit.rows(*key).astype(np.float64) for key in fit.lists}
        shape = fit.kv.shape
        neox = llama_cpp.llama_model_rope_type(fit.llm.model) == llama_cpp.LLAMA_ROPE_TYPE_NEOX
    finally:
        fit.close()
    print(f"fitted on {args.fit_tokens} self-written tokens ({time.time() - t0:.0f} s)", file=sys.stderr)
    spread = {
        name: float(
            np.mean([am_gm_bits(r[:, h]) for (il, kind), r in rows.items() if kind == k for h in range(r.shape[1])])
        )
        for name, k in (("K", Kind.K), ("V", Kind.V))
    }

    probe_tokens = None
    model_llm = kvgguf.Llama(model, kv_codec=None, vocab_only=True, verbose=False)
    try:
        probe_tokens = model_llm.tokenize(wikitext2_test().encode("utf-8"), add_bos=True)[: args.tokens]
    finally:
        model_llm.close()
    Coded.install()
    Coded.sink = args.sink
    probe = calibration.Probe(model, probe_tokens, args.threads)
    results = []
    try:
        if args.fit_on_eval:  # in-sample: the scored text's own rows (the reference run's, exact)
            rows = {key: probe.rows(*key).astype(np.float64) for key in probe.lists}
        every = {key: "f16" for key in probe.lists}
        for name in [c for c in args.rotq.split(",") if c]:
            kl = probe.kl({key: name for key in every})
            bpv = codecs.bits_per_value(name, (calibration.BLOCK, shape.n_head_kv, shape.head_dim_k))
            results.append({"quantizer": name + " (native)", "bits": bpv, "kl": kl})
            print(f"{name:>12} (native) {bpv:.3f} bits  KL {kl:.5f}", file=sys.stderr)
        for bits in [float(b) for b in args.bits.split(",") if b]:
            for family in args.families.split(","):
                Coded.active = {
                    key: [fit_coder(family, key[1], r[:, h], bits, h + 7 * key[0], neox) for h in range(r.shape[1])]
                    for key, r in rows.items()
                }
                kl = probe.kl({})
                held = float(
                    np.mean(
                        [
                            np.mean([(c.bits.sum() + SCALE_BITS) / len(c.bits) for c in cs])
                            for cs in Coded.active.values()
                        ]
                    )
                )
                Coded.active = {}
                results.append({"quantizer": f"{family}-{bits:g}", "bits": held, "kl": kl})
                print(f"{family + '-' + format(bits, 'g'):>12} {held:.3f} bits  KL {kl:.5f}", file=sys.stderr)
    finally:
        probe.close()
    meta = {
        "model": args.model,
        "tokens": len(probe_tokens),
        "fit_tokens": args.fit_tokens,
        "hot": probe.hot,
        "rope_neox": neox,
        "am_gm_bits": spread,
        "command": command(__file__, argv or None),
    }
    lines = [
        f"# Transform coding through {args.model} ({len(probe_tokens)} WikiText-2 tokens, hot {probe.hot})",
        "",
        f"High-rate saving of transform coding (mean over heads, 1/2 log2 AM/GM of principal variances): "
        f"K {spread['K']:.2f} bits, V {spread['V']:.2f} bits per value",
        "",
        markdown_table(
            ["quantizer", "bits per value held", "KL"],
            [[r["quantizer"], f"{r['bits']:.3f}", f"{r['kl']:.5f}"] for r in results],
        ),
    ]
    text = "\n".join(lines) + f"\n\n`{meta['command']}`\n"
    print(text)
    if args.out:
        write_json(args.out / "results.json", {"meta": meta, "results": results}, args.threads)
        (args.out / "results.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
