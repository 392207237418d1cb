"""Writes the generated sections of README.md and docs/*.md from the committed benchmark results,
so that every figure there is what a committed command wrote (the command heads each block).

    .venv/bin/python benchmarks/readme_sections.py

Each section sits between `<!-- NAME:begin -->` and `<!-- NAME:end -->` in the file that SECTIONS
(below) names for it; markers missing, or doubled, there stop the script with an error naming the
file. What each section is made from, under benchmarks/results/:

- usage:    usage_example.txt (scripts/usage_example.py)
- headline: rows of quality/preset_fast/smollm2-135m_ctx8192x1.md (kvgguf eval) and
            speed/preset/live_cache_4k_8k_cells.md (benchmarks/live_cache.py)
- live:     speed/live_cache_*.md (benchmarks/live_cache.py)
- profile:  speed/profile/*.md (benchmarks/profile_phase.py)
- quality:  quality/eval/*.md (kvgguf eval ... --out benchmarks/results/quality/eval)
- curves:   quality/curves/kl_*.md and .png (benchmarks/kl_curves.py over kvgguf eval runs)
- floor:    quality/floor/*.md (benchmarks/arithmetic_floor.py, swa_ring_floor.py)
- recall:   recall/retrieval_*.md (benchmarks/retrieval.py)
- preset:   quality/preset/*.md, speed/preset/*.md, recall/retrieval_preset_*.md (kvgguf eval,
            benchmarks/live_cache.py, benchmarks/retrieval.py with tiered:fixed and tiered)
- window:   quality/ubatch/*.md (kvgguf eval --hot H --ubatch U; benchmarks/live_cache.py)
- calibration: quality/calibration/*.md (benchmarks/calibration_proxy.py; kvgguf eval --codecs auto:...)
- keep:     quality/keep/*.md, speed/keep/*.md (kvgguf eval and benchmarks/live_cache.py with tiered:keep=...)
- sessions_auto: sessions/sessions_auto.md (benchmarks/sessions.py --codecs ...auto:BITS...)
- literature_claims: quality/literature_claims/*.md (benchmarks/literature_claims.py)

docs/results/sessions.md's `sessions` section is written by `benchmarks/sessions.py --readme docs/results/sessions.md`.

Under each result copied, a line says what measured it (commit, llama.cpp build, machine, threads)
from the result's JSON (the .md's sibling); a result from before provenance was recorded says so,
with the commit that last changed it.
"""

import json
import os
import re
from pathlib import Path

from common import markdown_table, provenance_line

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def usage(here: Path) -> str:
    out = (RESULTS / "usage_example.txt").read_text().rstrip()
    return (
        "Output of `.venv/bin/python scripts/usage_example.py` (the code above, run as written, on a "
        "model without a calibration: the fixed preset):\n\n```text\n" + out + "\n```"
    )


def provenance_note(md: Path) -> str:
    """The provenance line of the result whose table md is (from its sibling .json), or "" when
    that result recorded none."""
    result = md.with_suffix(".json")
    if not result.exists():
        return ""
    recorded = json.loads(result.read_text())
    if not isinstance(recorded, dict) or not isinstance(recorded.get("provenance"), dict):
        return ""
    return provenance_line(recorded["provenance"])


def result_text(md: Path) -> str:
    """A result's markdown as sections show it: its table, then its provenance line if it has one."""
    note = provenance_note(md)
    return md.read_text().strip() + (f"\n\n{note}" if note else "")


def table_rows(md: Path, key) -> tuple[str, dict]:
    """The command heading a result file (its first line, in backquotes) and its table's rows, as
    {key(row): {column: cell}}."""
    lines = md.read_text().splitlines()
    command = lines[0].split("`")[1]
    table = [line for line in lines if line.startswith("|")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    rows = {}
    for line in table[2:]:
        row = dict(zip(header, (cell.strip() for cell in line.strip("|").split("|"))))
        rows[key(row)] = row
    return command, rows


def pick(rows: dict, key, md: Path) -> dict:
    if key not in rows:
        raise SystemExit(f"{md.relative_to(ROOT)} has no row {key!r}; the headline table needs it")
    return rows[key]


HEADLINE_CACHES = ("f16", "q4_0", "tiered:fixed", "tiered (calibrated)")


def headline(here: Path) -> str:
    """The README's one table: memory and quality of the preset beside llama.cpp's cache types at 8K
    (one kvgguf eval run), with the decode and prefill speed of the same caches against stock f16
    at its best per phase (one benchmarks/live_cache.py run holding every one of them)."""
    quality_md = RESULTS / "quality" / "preset_fast" / "smollm2-135m_ctx8192x1.md"
    speed_md = RESULTS / "speed" / "preset" / "live_cache_4k_8k_cells.md"
    quality_cmd, quality = table_rows(quality_md, lambda r: r["cache"])
    speed_cmd, speed = table_rows(speed_md, lambda r: (r["context"], r["cache"]))
    body = []
    for cache in HEADLINE_CACHES:
        q = pick(quality, cache, quality_md)
        s = pick(speed, ("8K", cache), speed_md)
        body.append(
            [
                cache,
                q["from"],
                q["KV held (peak)"],
                q["bits/value held"],
                q["KL mean"],
                q["top-1"],
                s["prefill vs f16 best"],
                s["decode vs f16 best"],
            ]
        )
    header = [
        "cache",
        "from",
        "KV held",
        "bits/value held",
        "KL mean",
        "top-1",
        "prefill vs stock best",
        "decode vs stock best",
    ]
    four_k = {cache: speed.get(("4K", cache)) for cache in HEADLINE_CACHES}
    at_4k = "; ".join(
        f"{cache} {row['prefill vs f16 best']} / {row['decode vs f16 best']}" for cache, row in four_k.items() if row
    )
    lines = [
        f"SmolLM2-135M, 8,192 tokens of WikiText-2, 2 threads, flash attention on. Memory and quality: "
        f"`{quality_cmd}`; speed against stock f16 at its best (flash attention on or off, the faster "
        f"per phase), every cache in one run: `{speed_cmd}` (at 4K the same run reads, prefill / decode: {at_4k}).",
        "",
        markdown_table(header, body),
    ]
    # the table draws on two results: each one's provenance, named, where it has one
    for md in (quality_md, speed_md):
        note = provenance_note(md)
        if note:
            lines += ["", f"{md.relative_to(RESULTS).with_suffix('').as_posix()}: {note}"]
    return "\n".join(lines)


def in_folders(*folders: str) -> list[Path]:
    """The result tables of benchmarks/results/<folder> for each folder, in file name order."""
    return sorted((md for f in folders for md in (RESULTS / f).glob("*.md")), key=lambda md: md.name)


def folder_tables(*folders: str) -> str:
    """Every result table of those folders, in file name order."""
    return "\n\n".join(result_text(md) for md in in_folders(*folders))


def shapes_all(here: Path) -> str:
    return folder_tables("speed/shapes")


def profile(here: Path) -> str:
    return folder_tables("speed/profile")


# the current preset's run first, older days after
LIVE_FIRST = ("live_cache_4k_8k_dense", "live_cache_4k_8k_stock_best", "live_cache_4k_8k_ubatch")


def live(here: Path) -> str:
    mds = sorted((RESULTS / "speed").glob("live_cache_*.md"), key=lambda md: (md.stem not in LIVE_FIRST, md.stem))
    return "\n\n".join(result_text(md) for md in mds)


def with_plots(mds, here: Path) -> str:
    """Each result table, followed by its KL-vs-bits plot where kvgguf eval drew one (linked from
    the folder `here` of the file the section goes into)."""
    parts = []
    for md in mds:
        part = result_text(md)
        png = md.with_suffix(".png")
        if png.exists():
            part += f"\n\n![KL against bits per value]({Path(os.path.relpath(png, here)).as_posix()})"
        parts.append(part)
    return "\n\n".join(parts)


def quality(here: Path) -> str:
    return with_plots(sorted((RESULTS / "quality" / "eval").glob("*.md")), here)


def curves(here: Path) -> str:
    """KL against bits per model and context, every codec family beside llama.cpp's types."""
    mds = sorted((RESULTS / "quality" / "curves").glob("kl_*.md"), key=lambda md: ("gemma" in md.stem, md.stem))
    return with_plots(mds, here)


def floor(here: Path) -> str:
    """KL between exact caches that sum in another order: the floor under every eval row."""
    mds = sorted(
        (RESULTS / "quality" / "floor").glob("*.md"),
        key=lambda md: ("swa_ring" in md.stem, "gemma" in md.stem, md.stem),
    )
    return "\n\n".join(result_text(md) for md in mds)


def recall(here: Path) -> str:
    return "\n\n".join(
        result_text(md)
        for md in sorted((RESULTS / "recall").glob("retrieval_*.md"))
        if not md.stem.startswith("retrieval_preset")
    )


def preset(here: Path) -> str:
    """Today's preset, fixed and calibrated: KL beside llama.cpp's types, then recall."""
    evals = sorted(in_folders("quality/preset", "speed/preset"), key=lambda md: ("smollm2" not in md.stem, md.stem))
    recalls = sorted(
        (RESULTS / "recall").glob("retrieval_preset_*.md"),
        key=lambda md: ("gemma" in md.stem, int(re.search(r"_(\d+)k", md.stem).group(1))),
    )
    return with_plots(evals + recalls, here)


def window(here: Path) -> str:
    return folder_tables("quality/ubatch")


def calibration(here: Path) -> str:
    return folder_tables("quality/calibration")


def keep(here: Path) -> str:
    return folder_tables("quality/keep", "speed/keep")


def sessions_auto(here: Path) -> str:
    return result_text(RESULTS / "sessions" / "sessions_auto.md")


def literature_claims(here: Path) -> str:
    return folder_tables("quality/literature_claims")


def shared_cache(here: Path) -> str:
    return result_text(RESULTS / "sessions" / "shared_cache.md")


# marker name -> (the file, relative to the repository, that holds its markers; what writes its body)
SECTIONS = {
    "usage": ("README.md", usage),
    "headline": ("README.md", headline),
    "shapes_all": ("docs/results/speed.md", shapes_all),
    "profile": ("docs/results/speed.md", profile),
    "live": ("docs/results/speed.md", live),
    "window": ("docs/results/speed.md", window),
    "quality": ("docs/results/quality.md", quality),
    "curves": ("docs/results/quality.md", curves),
    "floor": ("docs/results/quality.md", floor),
    "recall": ("docs/results/recall.md", recall),
    "preset": ("docs/results/recall.md", preset),
    "keep": ("docs/results/recall.md", keep),
    "calibration": ("docs/results/calibration.md", calibration),
    "sessions_auto": ("docs/results/sessions.md", sessions_auto),
    "literature_claims": ("docs/results/literature.md", literature_claims),
    "shared_cache": ("docs/results/sessions.md", shared_cache),
}


def replace(text: str, name: str, body: str, where: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    counts = text.count(begin), text.count(end)
    if counts != (1, 1):
        raise SystemExit(
            f"{where} must hold {begin} ... {end} once each (found {counts[0]} and {counts[1]}): "
            f"benchmarks/readme_sections.py's SECTIONS says section {name!r} is written there"
        )
    block = begin + "\n" + body + "\n" + end
    return re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S)


def main() -> None:
    files: dict[str, list[str]] = {}
    for name, (where, _) in SECTIONS.items():
        files.setdefault(where, []).append(name)
    for where, names in files.items():
        path = ROOT / where
        if not path.exists():
            raise SystemExit(
                f"{where} does not exist: benchmarks/readme_sections.py's SECTIONS writes {', '.join(names)} there"
            )
        text = path.read_text()
        new = text
        for name in names:
            new = replace(new, name, SECTIONS[name][1](path.parent), where)
        if new != text:
            path.write_text(new)


if __name__ == "__main__":
    main()
