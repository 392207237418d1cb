"""The pages agree with the repository: every relative link resolves (the file, and the heading
its #anchor names), and every script or benchmark a page names exists."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Generated result tables and the history are records, not pages a reader follows.
SKIP = ("benchmarks/results/", "CHANGELOG.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
NAMED = re.compile(r"\b((?:scripts|benchmarks)/[A-Za-z0-9_]+\.(?:py|sh))\b")


def pages() -> list[Path]:
    found = [p for p in ROOT.rglob("*.md") if not any(part in (".venv", "build", ".git") for part in p.parts)]
    return sorted(p for p in found if not str(p.relative_to(ROOT)).startswith(SKIP) and "node_modules" not in p.parts)


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
    outside = []
    for ext in ("md", "py", "sh", "cmake", "toml", "txt"):
        for path in ROOT.rglob(f"*.{ext}"):
            rel = path.relative_to(ROOT)
            if (
                rel.parts[0] in (".venv", "build", ".git", ".gpu-kit")
                or str(rel).startswith(SKIP)
                or rel == Path(__file__).relative_to(ROOT)
            ):
                continue
            if re.search(r"\.\./shared\b", path.read_text(encoding="utf-8", errors="replace")):
                outside.append(str(rel))
    assert not outside, f"these name ../shared, outside the repository: {outside}"
