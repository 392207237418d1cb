"""Every benchmark by name, with the options they share.

    .venv/bin/python benchmarks/run.py list                       # what each measures, by kind
    .venv/bin/python benchmarks/run.py live_cache --contexts 4096,8192 --repeats 3 --out DIR/x
    .venv/bin/python benchmarks/run.py retrieval --model gemma3-270m -- --documents 4

Each benchmark stays a script of its own (benchmarks/NAME.py, which runs by itself too, with
its own options after `--`). The registry below says what each measures, the kind of figure it
writes (the folder its results belong in), and which of the shared options (--model,
--contexts, --threads, --repeats, --out) it takes under which of its flags. A shared option a
benchmark does not take is refused, naming the ones it does; every result is written by the
script, with its provenance (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
KINDS = ("speed", "quality", "recall", "sessions", "reliability", "gpu")
SHARED = ("model", "contexts", "threads", "repeats", "out")


@dataclass(frozen=True)
class Bench:
    kind: str  # one of KINDS
    what: str
    # shared option -> the script's flag; "contexts" whose flag takes one context only is in `single`
    flags: dict = field(default_factory=dict)
    single: frozenset = frozenset()


_M, _T, _O = {"model": "--model"}, {"threads": "--threads"}, {"out": "--out"}
_ONE_CTX = frozenset({"contexts"})

REGISTRY: dict[str, Bench] = {
    # speed
    "live_cache": Bench(
        "speed",
        "prefill and decode speed and KV held, against llama.cpp's caches",
        {**_M, "contexts": "--contexts", **_T, "repeats": "--repeats", **_O},
    ),
    "prefix_reuse": Bench(
        "speed",
        "a second question on the same document: the cut and what it evaluates again",
        {**_M, "contexts": "--contexts", **_T, "repeats": "--repeats", **_O},
    ),
    "fused_switch": Bench(
        "speed",
        "where attention over codes stops paying against expanding them",
        {**_M, "contexts": "--ctx", **_T, "repeats": "--reps", **_O},
        _ONE_CTX,
    ),
    "attend_kernels": Bench(
        "speed", "the store's fused attention per codec, one thread", {"repeats": "--repeat", **_O}
    ),
    "encode_cost": Bench("speed", "coding evicted rows per token, per codec", _O),
    "aging_cost": Bench("speed", "one eviction's aging on the host", {**_T, **_O}),
    "profile_phase": Bench(
        "speed", "perf record over one phase of one cache", {**_M, "contexts": "--ctx", **_T, **_O}, _ONE_CTX
    ),
    # quality
    "arithmetic_floor": Bench(
        "quality",
        "the KL between llama.cpp's own exact caches: the floor under every eval",
        {**_M, "contexts": "--ctx", **_T, **_O},
        _ONE_CTX,
    ),
    "swa_ring_floor": Bench(
        "quality",
        "where llama.cpp's sliding-window ring leaves its full-size cache",
        {**_M, "contexts": "--ctx", **_O},
        _ONE_CTX,
    ),
    "context_shift": Bench(
        "quality",
        "quality after context shifts, against stock shifted the same way",
        {**_M, "contexts": "--ctx", **_T, **_O},
        _ONE_CTX,
    ),
    "budget": Bench(
        "quality",
        "a budget's drops (H2O, oldest) against lower-bit codecs at equal bytes",
        {**_M, "contexts": "--ctx", **_T, **_O},
        _ONE_CTX,
    ),
    "shift_speed": Bench(
        "speed",
        "decode after 1, 4 and 16 context shifts against the same context unshifted",
        {**_M, "contexts": "--ctx", **_T, "repeats": "--repeats", **_O},
        _ONE_CTX,
    ),
    "endurance": Bench(
        "reliability",
        "a chat of 10 x n_ctx with context_shift: never raises, RSS levels off",
        {**_M, "contexts": "--ctx", **_T, **_O},
        _ONE_CTX,
    ),
    "calibration_proxy": Bench("quality", "whether calibration's cheap prediction tracks the KL", {**_M, **_T, **_O}),
    "literature_claims": Bench(
        "quality",
        "the literature's claims, measured on the live cache",
        {**_M, "contexts": "--ctx", **_T, **_O},
        _ONE_CTX,
    ),
    "transform_coding": Bench(
        "quality", "a calibrated basis with per-coordinate bits against rotq", {**_M, **_T, **_O}
    ),
    "code_entropy": Bench("quality", "the entropy of rotq's codes: what an entropy coder could save"),
    "kl_curves": Bench("quality", "KL against bits held, from `kvgguf eval` results", _O),
    # recall
    "retrieval": Bench(
        "recall",
        "facts planted at several depths, asked for at the end, beside llama.cpp's caches",
        {**_M, "contexts": "--contexts", **_T, **_O},
    ),
    # sessions and prompt caches
    "sessions": Bench(
        "sessions",
        "session files: size, save and load time, quality after restore",
        {**_M, "contexts": "--ctx", **_T, **_O},
        _ONE_CTX,
    ),
    "shared_cache": Bench("sessions", "a prompt cache shared on Redis: time to first token, bytes", {**_M, **_T, **_O}),
    # reliability
    "soak": Bench(
        "reliability", "a long generation, watching memory", {**_M, "contexts": "--ctx", **_T, **_O}, _ONE_CTX
    ),
    # gpu
    "gpu_profile": Bench(
        "gpu",
        "one configuration's time on a GPU, kernel by kernel",
        {**_M, "contexts": "--context", **_T},
        _ONE_CTX,
    ),
}


def command(name: str, shared: dict, rest: list[str]) -> list[str]:
    """The script's command line for benchmark `name` with the shared options given (None: not
    given) and the script's own options `rest`; ValueError says what does not fit."""
    if name not in REGISTRY:
        raise ValueError(f"no benchmark {name!r}; `benchmarks/run.py list` names them: {', '.join(sorted(REGISTRY))}")
    bench = REGISTRY[name]
    argv = [sys.executable, str(HERE / f"{name}.py")]
    for option in SHARED:
        value = shared.get(option)
        if value is None:
            continue
        if option not in bench.flags:
            takes = ", ".join(f"--{o}" for o in SHARED if o in bench.flags) or "none of them"
            raise ValueError(
                f"{name} takes no --{option} (of the shared options it takes {takes}); pass its own after --"
            )
        if option in bench.single and "," in str(value):
            raise ValueError(f"{name} measures one context at a time ({bench.flags[option]}); got --{option} {value}")
        argv += [bench.flags[option], str(value)]
    return argv + rest


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="a benchmark's name, or `list`")
    p.add_argument("--model", help="smollm2-135m, gemma3-270m, a shape of benchmarks/shapes.py or a GGUF path")
    p.add_argument("--contexts", help="logical contexts, comma-separated (one, where the benchmark takes one)")
    p.add_argument("-t", "--threads", help="threads for llama.cpp")
    p.add_argument("--repeats", type=int, help="runs of each configuration (speeds: their median)")
    p.add_argument("--out", help="where the result goes (a path without suffix, or a folder, as the script takes)")
    args = p.parse_args(argv)
    if args.name == "list":
        for kind in KINDS:
            print(f"{kind}:")
            for name, bench in REGISTRY.items():
                if bench.kind == kind:
                    takes = " ".join(f"--{o}" for o in SHARED if o in bench.flags)
                    print(f"  {name:18} {bench.what}" + (f"  [{takes}]" if takes else ""))
        return 0
    try:
        cmd = command(args.name, {o: getattr(args, o) for o in SHARED}, rest)
    except ValueError as e:
        p.error(str(e))
    return subprocess.run(cmd, cwd=HERE.parent).returncode


if __name__ == "__main__":
    raise SystemExit(main())
