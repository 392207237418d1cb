"""Writes README.md's quality section from the committed `kvgguf eval` results.

    .venv/bin/python benchmarks/readme_quality.py
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BEGIN, END = "<!-- quality:begin -->", "<!-- quality:end -->"


def main() -> None:
    parts = []
    for md in sorted((ROOT / "benchmarks" / "results" / "eval").glob("*.md")):
        parts.append(md.read_text().strip() + f"\n\n![KL against bits per value]({md.with_suffix('.png').relative_to(ROOT)})")
    readme = ROOT / "README.md"
    text = readme.read_text()
    block = BEGIN + "\n" + "\n\n".join(parts) + "\n" + END
    text = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S)
    readme.write_text(text)


if __name__ == "__main__":
    main()
