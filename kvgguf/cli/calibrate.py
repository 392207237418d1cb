"""`kvgguf calibrate`: measure a model once (kvgguf.evaluation.calibration), show its plans."""

from __future__ import annotations

import sys
from pathlib import Path

BUDGETS = (2.5, 3.0, 3.5, 4.0)


def plan_table(cal, budgets=BUDGETS) -> list[str]:
    """A Markdown table: per budget and for the calibrated "tiered" preset, the average bits,
    the summed predicted KL and the codecs K and V get (how many lists each)."""
    from ..enums import Kind
    from ..policy import allocation, kv_codec

    lines = ["| kv_codec | bits/value (compressed rows) | predicted KL | K | V |", "|---|---|---|---|---|"]
    rows = [(f"auto:{b:g}", b, (), 0) for b in budgets]
    rows.append(("tiered", kv_codec.PRESET_BUDGET, kv_codec.PRESET_SLOW_FAMILIES, kv_codec.PRESET_KEY_BITS))
    for name, budget, exclude, key_bits in rows:
        try:
            choice = cal.plan(budget, exclude=exclude, key_bits=key_bits)
        except ValueError as e:
            lines.append(f"| {name} | {e} | | | |")
            continue
        cells = []
        for kind in Kind:
            names = [c.codec for (il, k), c in sorted(choice.items()) if k == kind]
            cells.append(", ".join(f"{n} x{names.count(n)}" for n in sorted(set(names), key=names.index)))
        lines.append(
            f"| {name} | {allocation.average_bits(choice, cal.weights):.2f} | "
            f"{sum(c.error for c in choice.values()):.4f} | {cells[0]} | {cells[1]} |"
        )
    return lines


def run(args) -> int:
    import kvgguf

    from ..evaluation import calibration
    from ..model.registry import calibration_path
    from ..policy import calibration_plan

    path = str(kvgguf.models.path(args.model))
    out = Path(args.out) if args.out else calibration_path(path)
    if args.text and not Path(args.text).is_file():
        raise FileNotFoundError(f"--text {args.text} does not exist")
    from tqdm import tqdm

    bar = tqdm(desc="calibrating", unit="list", disable=not sys.stderr.isatty(), leave=False)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)

    print(
        f"kvgguf: measuring {Path(path).name} on {args.tokens or calibration.default_tokens(path)} tokens of "
        f"{'its own text (seed %d)' % args.seed if not args.text else args.text}",
        file=sys.stderr,
    )
    cal = calibration.calibrate(
        path, n_tokens=args.tokens, seed=args.seed, text_file=args.text, threads=args.threads, progress=progress
    )
    bar.close()
    cal.save(out)
    command = "kvgguf calibrate " + " ".join(sys.argv[2:] if args.argv is None else args.argv[1:])
    text = "its own text, seed %d" % args.seed if not args.text else Path(args.text).name
    print(
        f"`{command}` ({Path(path).name}, {cal.text['tokens']} tokens of {text}; predicted KL: the sum over "
        f"(layer, K/V) lists of each one's measured cost, see docs/calibration.md; wfq's plans counted over "
        f"{calibration_plan.PLAN_CONTEXT} tokens)\n"
    )
    print("\n".join(plan_table(cal, sorted(set(BUDGETS + ((args.budget,) if args.budget else ()))))))
    print(f"calibration: {out} (kv_codec='auto' or 'auto:BITS' reads it)", file=sys.stderr)
    return 0
