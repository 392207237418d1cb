"""The pages agree with the repository: every relative link resolves (the file, and the heading
its #anchor names), and every script or benchmark a page names exists."""

import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Generated result tables and the history are records, not pages a reader follows.
SKIP = ("benchmarks/results/", "CHANGELOG.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NAMED = re.compile(r"\b((?:scripts|benchmarks)/[A-Za-z0-9_]+\.(?:py|sh))\b")


# Not the repository's own text: environments, build outputs, the GPU kit.
PRUNE = {".venv", "build", ".git", ".gpu-kit", "__pycache__", ".pytest_cache"}


def files(*suffixes: str) -> list[Path]:
    """The repository's files with these suffixes, less PRUNE's folders and SKIP."""
    found = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in PRUNE]
        for name in names:
            path = Path(folder) / name
            if path.suffix in suffixes and not str(path.relative_to(ROOT)).startswith(SKIP):
                found.append(path)
    return sorted(found)


def pages() -> list[Path]:
    return files(".md")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*", "", heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, seen, fenced = set(), {}, False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if fenced or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def outside_code(text: str) -> str:
    return re.sub(r"```.*?```", "", text, flags=re.S)


def test_pages_are_found():
    names = {str(p.relative_to(ROOT)) for p in pages()}
    assert {"README.md", "docs/design.md", "docs/glossary.md", "patches/README.md"} <= names


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(outside_code(page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_named_scripts_exist(page):
    missing = sorted({n for n in NAMED.findall(page.read_text(encoding="utf-8")) if not (ROOT / n).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names {missing}, which are not in the repository"


def test_the_anchor_rule_matches_githubs():
    assert slug("KL against bits: every codec family beside llama.cpp's types (issue 28)") == (
        "kl-against-bits-every-codec-family-beside-llamacpps-types-issue-28"
    )
    assert slug("Tokens are not equal: `tiered:keep=SIGNAL`") == "tokens-are-not-equal-tieredkeepsignal"


def test_nothing_names_a_path_outside_the_repository():
    """A clone holds everything its pages, scripts and tests name (the GPU kit included:
    scripts/gpu_kit.sh makes it)."""
    outside = [
        str(path.relative_to(ROOT))
        for path in files(".md", ".py", ".sh", ".cmake", ".toml", ".txt")
        if path != Path(__file__).resolve()
        and re.search(r"\.\./shared\b", path.read_text(encoding="utf-8", errors="replace"))
    ]
    assert not outside, f"these name ../shared, outside the repository: {outside}"
