"""How far the fuzz targets of scripts/fuzz.sh go: inputs, crashes, time and corpus per target.

    .venv/bin/python scripts/fuzz_long.py [--inputs 1000000] [--targets "decode store session"] [--out DIR]

Runs every target (native/fuzz: fuzz_decode and fuzz_store, libFuzzer with ASan+UBSan over
libkvgguf's sources; fuzz_session, atheris over the .kvz parser) for --inputs inputs each, one
process at a time, from a fresh corpus started with real encoded blocks and sessions. Writes
DIR/fuzz.json (per target: inputs tried, crashes, seconds, inputs per second, corpus files and
bytes at the end, edges and features covered) and DIR/fuzz.md. Exits non-zero when any target
crashed (scripts/fuzz.sh has then printed the report and kept the input in build/fuzz/crashes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))  # the result helpers every benchmark writes with

from common import command, markdown_table, write_json  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=1_000_000, help="inputs per target")
    ap.add_argument("--targets", default="decode store session")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's random seed")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "checks" / "fuzz")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        lines = Path(tmp) / "fuzz.jsonl"
        start = time.time()
        proc = subprocess.run(
            [
                "bash",
                str(ROOT / "scripts" / "fuzz.sh"),
                "--runs",
                str(args.inputs),
                "--fresh",
                "--seed",
                str(args.seed),
                "--targets",
                args.targets,
                "--json",
                str(lines),
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)},
        )
        wall = time.time() - start
        rows = [json.loads(line) for line in lines.read_text().splitlines()] if lines.exists() else []
    for r in rows:
        r["inputs_per_second"] = round(r["inputs"] / r["seconds"]) if r["seconds"] else None

    result = {
        "inputs_per_target": args.inputs,
        "seed": args.seed,
        "targets": rows,
        "all_clean": proc.returncode == 0
        and len(rows) == len(args.targets.split())
        and all(r["crashes"] == 0 and r["inputs"] >= args.inputs for r in rows),
        "wall_seconds": round(wall, 1),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
        },
        "how": "bash scripts/fuzz.sh --runs N --fresh: one process per target, one at a time, "
        "-max_len=16384, -rss_limit_mb=2048, -timeout=30",
    }
    # one fuzzing process at a time, each on one thread
    write_json(args.out / "fuzz.json", result, threads=1, indent=2)
    md = [f"Command: `{command(__file__)}`", ""]
    what = {
        "decode": "kvg_decode, every codec (scalar and SIMD compared)",
        "store": "kvg_store_append_encoded, then decode / decode_f16 / hooks / attend / truncate / retier",
        "session": ".kvz parser (session.parse, llama.cpp's two queries faked)",
    }
    header = [
        "target",
        "what it reads",
        "inputs",
        "crashes",
        "seconds",
        "inputs/s",
        "corpus (files, KiB)",
        "edges / features",
    ]
    md.append(
        markdown_table(
            header,
            [
                [
                    r["target"],
                    what.get(r["target"], ""),
                    f"{r['inputs']:,}",
                    r["crashes"],
                    f"{r['seconds']:.0f}",
                    f"{r['inputs_per_second']:,}",
                    f"{r['corpus_files']}, {r['corpus_bytes'] / 1024:.0f}",
                    f"{r['cov']} / {r['features']}",
                ]
                for r in rows
            ],
            align=["---", "---"] + ["---:"] * 6,
        )
    )
    md.append("")
    md.append(
        f"{args.inputs:,} inputs per target from a fresh corpus (libFuzzer seed {args.seed}); "
        f"{os.cpu_count()} cores, one fuzzing process at a time. "
        f"{'No crashes.' if result['all_clean'] else 'NOT CLEAN: see scripts/fuzz.sh output.'}"
    )
    (args.out / "fuzz.md").write_text("\n".join(md) + "\n")
    print((args.out / "fuzz.md").read_text())
    return 0 if result["all_clean"] else 1


if __name__ == "__main__":
    sys.exit(main())
