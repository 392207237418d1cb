"""Writes README.md's generated sections from the committed benchmark results, so that every
figure there is what a committed command wrote (the command heads each block).

    .venv/bin/python benchmarks/readme_sections.py

- usage:   benchmarks/results/usage_example.txt   (benchmarks/usage_example.py)
- live:    benchmarks/results/live_cache_*.md      (benchmarks/live_cache.py)
- quality: benchmarks/results/eval/*.md            (kvgguf eval ... --out benchmarks/results/eval)
- recall:  benchmarks/results/retrieval_*.md       (benchmarks/retrieval.py)
- preset:  benchmarks/results/preset/*.md, retrieval_preset_*.md (kvgguf eval, benchmarks/retrieval.py
           with tiered:fixed and tiered)
- window:  benchmarks/results/ubatch/*.md          (kvgguf eval --hot H --ubatch U; benchmarks/live_cache.py)
- calibration: benchmarks/results/calibration/*.md (benchmarks/calibration_proxy.py; kvgguf eval --codecs auto:...)
- keep:    benchmarks/results/keep/*.md            (kvgguf eval and benchmarks/live_cache.py with tiered:keep=...)
- sessions_auto: benchmarks/results/sessions_auto.md (benchmarks/sessions.py --codecs ...auto:BITS...)
- seed_claims: benchmarks/results/seed_claims/*.md (benchmarks/seed_claims.py)
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def usage() -> str:
    out = (RESULTS / "usage_example.txt").read_text().rstrip()
    return ("Output of `.venv/bin/python benchmarks/usage_example.py` (the code above, run as written, on a "
            "model without a calibration: the fixed preset):\n\n```text\n" + out + "\n```")


LIVE_FIRST = ("live_cache_4k_8k_ubatch",)  # the current preset's run first, older days after


def live() -> str:
    mds = sorted(RESULTS.glob("live_cache_*.md"), key=lambda md: (md.stem not in LIVE_FIRST, md.stem))
    return "\n\n".join(md.read_text().strip() for md in mds)


def with_plots(mds) -> str:
    """Each result table, followed by its KL-vs-bits plot where kvgguf eval drew one."""
    parts = []
    for md in mds:
        part = md.read_text().strip()
        png = md.with_suffix(".png")
        if png.exists():
            part += f"\n\n![KL against bits per value]({png.relative_to(ROOT)})"
        parts.append(part)
    return "\n\n".join(parts)


def quality() -> str:
    return with_plots(sorted((RESULTS / "eval").glob("*.md")))


def recall() -> str:
    return "\n\n".join(md.read_text().strip() for md in sorted(RESULTS.glob("retrieval_*.md"))
                       if not md.stem.startswith("retrieval_preset"))


def preset() -> str:
    """Today's preset, fixed and calibrated: KL beside llama.cpp's types, then recall."""
    evals = sorted((RESULTS / "preset").glob("*.md"), key=lambda md: ("smollm2" not in md.stem, md.stem))
    recalls = sorted(RESULTS.glob("retrieval_preset_*.md"), key=lambda md: ("gemma" in md.stem, int(
        re.search(r"_(\d+)k", md.stem).group(1))))
    return with_plots(evals + recalls)


def window() -> str:
    return "\n\n".join(md.read_text().strip() for md in sorted((RESULTS / "ubatch").glob("*.md")))


def calibration() -> str:
    return "\n\n".join(md.read_text().strip() for md in sorted((RESULTS / "calibration").glob("*.md")))


def keep() -> str:
    return "\n\n".join(md.read_text().strip() for md in sorted((RESULTS / "keep").glob("*.md")))


def sessions_auto() -> str:
    return (RESULTS / "sessions_auto.md").read_text().strip()


def seed_claims() -> str:
    return "\n\n".join(md.read_text().strip() for md in sorted((RESULTS / "seed_claims").glob("*.md")))


def replace(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    if begin not in text or end not in text:
        raise SystemExit(f"README.md has no {begin} ... {end} markers")
    block = begin + "\n" + body + "\n" + end
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)


def main() -> None:
    readme = ROOT / "README.md"
    text = readme.read_text()
    for name, make in (("usage", usage), ("live", live), ("quality", quality), ("recall", recall), ("preset", preset),
                       ("window", window), ("calibration", calibration), ("keep", keep),
                       ("sessions_auto", sessions_auto), ("seed_claims", seed_claims)):
        text = replace(text, name, make())
    readme.write_text(text)


if __name__ == "__main__":
    main()
