"""Does calibration's cheap prediction track the KL it stands for?

Calibration measures one KL per (layer, K/V) list (that list alone at the probe codec, rotq2) and
predicts the others from the rows' reconstruction error (kvgguf/evaluation/calibration.py). Here
the same text runs through the model with one list at one codec for a sample of lists and
codecs (the KL the prediction stands for), and with whole plans at several budgets (is the
summed prediction the plan's KL, i.e. do lists add up?). On the calibration text itself: this
checks the model of the measurement, not quality on other text (that is `kvgguf eval`).

    .venv/bin/python benchmarks/calibration_proxy.py --model smollm2-135m --out benchmarks/results/quality/calibration/proxy_smollm2

writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from common import add_out_option, add_threads_option, command, markdown_table, write_result

HERE = Path(__file__).resolve().parent


def ranks(x) -> np.ndarray:
    r = np.empty(len(x))
    r[np.argsort(x, kind="stable")] = np.arange(len(x))
    return r


def spearman(a, b) -> float:
    return float(np.corrcoef(ranks(a), ranks(b))[0, 1])


def plan_row(name: str, r: dict) -> list[str]:
    return [name, f"{r['bits']:.2f}", f"{r['predicted']:.4f}", f"{r['measured']:.4f}"]


def main(argv=None) -> int:
    import kvgguf
    from kvgguf.enums import Kind
    from kvgguf.evaluation import calibration
    from kvgguf.policy import allocation

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="model name or GGUF path")
    p.add_argument("--tokens", type=int, default=None, help="tokens of self-written text (calibration's default)")
    p.add_argument("--lists", type=int, default=8, help="lists sampled (spread over layers, K and V)")
    p.add_argument("--codecs", default="kivi2,kivi4,rotq3,crotq3,rotq4", help="codecs tried on each sampled list")
    p.add_argument("--budgets", default="2.5,3.0,3.5,4.0")
    add_threads_option(p)
    add_out_option(p, HERE / "results" / "quality" / "calibration" / "proxy")
    args = p.parse_args(argv)
    path = str(kvgguf.models.path(args.model))
    t0 = time.time()
    tokens = calibration.self_text(path, args.tokens or calibration.default_tokens(path), 0, args.threads)
    cal = calibration.measure(
        path, tokens, threads=args.threads, text={"source": "self", "tokens": len(tokens), "seed": 0}
    )
    probe = calibration.Probe(path, tokens, args.threads)
    try:
        keys = sorted(cal.curves)
        step = max(1, len(keys) // args.lists)
        sample = keys[::step][: args.lists]
        pairs = []
        for key in sample:
            pred = {c.codec: c.error for c in cal.curves[key]}
            for codec in args.codecs.split(","):
                pairs.append(
                    {
                        "layer": key[0],
                        "kind": "k" if key[1] == Kind.K else "v",
                        "codec": codec,
                        "predicted": pred[codec],
                        "measured": probe.kl({key: codec}),
                    }
                )
                print(
                    f"  layer {key[0]:2d} {pairs[-1]['kind']} {codec:7s} predicted {pred[codec]:.5f} "
                    f"measured {pairs[-1]['measured']:.5f}",
                    file=sys.stderr,
                )
        plans = []
        for budget in [float(b) for b in args.budgets.split(",")]:
            choice = cal.plan(budget)
            plans.append(
                {
                    "budget": budget,
                    "bits": allocation.average_bits(choice, cal.weights),
                    "predicted": sum(c.error for c in choice.values()),
                    "measured": probe.kl({k: c.codec for k, c in choice.items()}),
                }
            )
            print(f"  plan {budget}: {plans[-1]}", file=sys.stderr)
        uniform = []
        for codec in args.codecs.split(","):
            choice = {k: next(c for c in cal.curves[k] if c.codec == codec) for k in keys}
            uniform.append(
                {
                    "codec": codec,
                    "bits": allocation.average_bits(choice, cal.weights),
                    "predicted": sum(c.error for c in choice.values()),
                    "measured": probe.kl({k: codec for k in keys}),
                }
            )
            print(f"  uniform {codec}: {uniform[-1]}", file=sys.stderr)
    finally:
        probe.close()
    pm = np.array([[r["predicted"], r["measured"]] for r in pairs])
    res = {
        "model": Path(path).name,
        "tokens": len(tokens),
        "command": command(__file__, argv or None),
        "spearman": spearman(pm[:, 0], pm[:, 1]),
        "median_ratio": float(np.median(pm[:, 0] / np.maximum(pm[:, 1], 1e-12))),
        "pairs": pairs,
        "plans": plans,
        "uniform": uniform,
        "seconds": time.time() - t0,
    }
    lines = [
        f"`{res['command']}` ({res['model']}, {res['tokens']} tokens of self-written text, the KL of the "
        "final logits against f16 cold rows on the same text)",
        "",
        f"One list at one codec, {len(pairs)} pairs: Spearman rank correlation of predicted and measured KL "
        f"{res['spearman']:.2f}; median predicted/measured {res['median_ratio']:.2f}.",
        "",
        markdown_table(
            ["plan", "bits/value (compressed rows)", "predicted KL (sum over lists)", "measured KL"],
            [plan_row(f"auto:{r['budget']:g}", r) for r in plans]
            + [plan_row(f"uniform {r['codec']}", r) for r in uniform],
        ),
    ]
    write_result(args.out, res, "\n".join(lines) + "\n", args.threads)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
