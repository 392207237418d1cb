"""KL against bits held, one table and one plot per model and context: each codec family (rotq,
tcq, wfq, the calibrated mix, the presets) beside llama.cpp's cache types, from `kvgguf eval`
results.

    .venv/bin/python benchmarks/kl_curves.py RUN.json [RUN.json ...] --out benchmarks/results/quality/curves/NAME [--target BITS,KL]

Several runs may be merged when they scored the same model, context, chunks and batch (the eval
is deterministic: the same text, the same chunks); each row names the run it comes from, and a
cache measured by two runs is taken from the first one given.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Optional

from common import add_out_option, command, markdown_table, result_path

FAMILIES = (  # (pattern on the cache name, family); the first match wins
    (r"^rotq\d$", "rotq (rotation + Lloyd-Max)"),
    (r"^tcq\d$", "tcq (trellis)"),
    (r"^wfq\d$", "wfq (water-filled)"),
    (r"^auto:", "calibrated mix (auto:BITS)"),
    (r"^tiered", "preset"),
    (r"^kivi\d$", "kivi"),
)
SAME_RUN = ("model", "ctx", "chunks", "batch")
FLOOR = "kvgguf:f16"  # every cold row exact: what the arithmetic alone reads


def family(result: dict) -> str:
    if result["source"] == "llama.cpp":
        swa = re.search(r"\((swa \w+)\)", result["name"])
        return "llama.cpp" + (f" ({swa.group(1)})" if swa else "")
    return next((f for pattern, f in FAMILIES if re.search(pattern, result["name"])), result["name"])


def merge(paths: list[Path]) -> tuple[dict, list[str], list[dict]]:
    """(the runs' shared settings, their commands, every result with its run's number)."""
    runs = [json.loads(p.read_text()) for p in paths]
    settings = [{**{k: run[k] for k in SAME_RUN}, "model": Path(run["model"]).name} for run in runs]
    for path, other in zip(paths, settings):
        if other != settings[0]:
            raise SystemExit(f"{path} scored {other}, not {settings[0]}: only runs of the same settings merge")
    meta = settings[0]
    rows, seen = [], set()
    for number, run in enumerate(runs, 1):
        for r in run["results"]:
            if r["name"] not in seen:
                seen.add(r["name"])
                r = {**r, "source": r.get("source", r.get("kind")), "run": number}  # "kind" in older results
                rows.append({**r, "family": family(r)})
    order = list(dict.fromkeys(r["family"] for r in rows if r["source"] == "llama.cpp"))
    order += list(dict.fromkeys(f for _, f in FAMILIES))
    rows.sort(key=lambda r: (order.index(r["family"]) if r["family"] in order else len(order), r["bits_per_value"]))
    # the f16 reference's perplexity per run: equal when the runs scored the same logits
    refs = [next((r["ppl_ref"] for r in run["results"] if r.get("ppl_ref")), None) for run in runs]
    return meta, [f"`{run['command']}` (reference ppl {ref:.2f})" for run, ref in zip(runs, refs)], rows


def markdown(meta: dict, commands: list[str], rows: list[dict], made_by: str) -> str:
    head = [f"`{made_by}` over the `kvgguf eval` results below."]
    head += [f"{meta['model']}, ctx {meta['ctx']} x {meta['chunks']} chunks, batches of {meta['batch']}."]
    head += [f"[{i}] {c}" for i, c in enumerate(commands, 1)] if len(commands) > 1 else commands
    table = markdown_table(
        ["family", "cache", "bits/value held", "of which cold rows", "KL mean", "KL p99", "top-1", "ppl", "run"],
        [
            [
                r["family"],
                r["name"],
                f"{r['bits_per_value']:.2f}",
                _bits(r["cold_bits_per_value"]),
                f"{r['kl_mean']:.5f}",
                f"{r['kl_p99']:.4f}",
                f"{r['top1']:.3f}",
                f"{r['ppl']:.2f}",
                r["run"],
            ]
            for r in rows
        ],
    )
    return "\n\n".join(head) + "\n\n" + table + "\n"


def _bits(b) -> str:
    return "n/a" if b is None else f"{b:.2f}"


def plot(meta: dict, rows: list[dict], path: Path, target: Optional[tuple[float, float]] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # left: every byte held (where the f16 hot buffer counts); right: the compressed rows alone
    fig, axes = plt.subplots(1, 2, figsize=(13, 5), sharey=True)
    for ax, key, label in (
        (axes[0], "bits_per_value", "bits per value held (f16 hot buffer included)"),
        (axes[1], "cold_bits_per_value", "bits per compressed value (llama.cpp: per value)"),
    ):
        for r in rows:  # every row exact: the floor of the measurement, a line rather than a point far right
            if r["name"] == FLOOR and r["kl_mean"] > 0:
                ax.axhline(r["kl_mean"], color="grey", linestyle="--", linewidth=1, label=f"{FLOOR} (floor)")
        for fam in dict.fromkeys(r["family"] for r in rows):
            pts = [
                r for r in rows if r["family"] == fam and r["name"] != FLOOR and r["kl_mean"] > 0 and r[key] is not None
            ]
            if not pts:  # f16 has no place on a log scale
                continue
            lined = not fam.startswith("llama.cpp") and fam != "preset"
            ax.plot([r[key] for r in pts], [r["kl_mean"] for r in pts], "o-" if lined else "s", label=fam, markersize=5)
            for r in pts:
                ax.annotate(r["name"], (r[key], r["kl_mean"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_yscale("log")
        ax.set_xlabel(label)
        ax.grid(True, which="both", alpha=0.3)
    if target:  # a goal in bits held and KL: the curves must pass below and left of it
        axes[0].plot(*target, "k*", markersize=12, label=f"target: KL {target[1]} at {target[0]} bits held")
    axes[0].set_ylabel("KL(f16 || cache), mean")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{meta['model']}, ctx {meta['ctx']} x {meta['chunks']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="kvgguf eval result JSONs")
    add_out_option(ap, writes=".md and .png")
    ap.add_argument("--target", help="BITS,KL: a goal to mark on the plot of bits held (e.g. 3.0,0.012)")
    args = ap.parse_args()
    meta, commands, rows = merge(args.runs)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    made_by = command(__file__, python=True)
    result_path(args.out, ".md").write_text(markdown(meta, commands, rows, made_by))
    target = tuple(float(x) for x in args.target.split(",")) if args.target else None
    plot(meta, rows, result_path(args.out, ".png"), target)
    print(result_path(args.out, ".md").read_text())


if __name__ == "__main__":
    main()
