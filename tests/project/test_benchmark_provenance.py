"""benchmarks/common.py, the module the benchmark scripts share: the provenance every result JSON
records, the line benchmarks/readme_sections.py prints under a table whose result has one (and
nothing for older results), and every script's options still parsing. No model runs."""

import datetime
import importlib
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import common  # noqa: E402
import readme_sections  # noqa: E402

KEYS = {
    "commit",
    "dirty",
    "changed_files",
    "installed_kvgguf_matches_checkout",
    "kvgguf_version",
    "llama_cpp_python",
    "llama_cpp_commit",
    "kvgguf_patch_version",
    "cpu",
    "cores",
    "cores_usable",
    "threads",
    "gpu",
    "os",
    "python",
    "date",
}

RECORDED = {
    "commit": "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b",
    "dirty": False,
    "changed_files": [],
    "installed_kvgguf_matches_checkout": True,
    "kvgguf_version": "0.1.0",
    "llama_cpp_python": "0.3.36",
    "llama_cpp_commit": "0c1e570",
    "kvgguf_patch_version": 10,
    "cpu": "AMD EPYC",
    "cores": 2,
    "cores_usable": 2,
    "threads": 2,
    "gpu": None,
    "os": "Linux",
    "python": "3.11.7",
    "date": "2026-05-01T12:00:00+00:00",
}


def test_provenance_names_the_commit_the_build_and_the_machine():
    import kvgguf
    from kvgguf.llamacpp import library

    p = common.provenance(threads=3)
    assert set(p) == KEYS
    json.dumps(p)  # it goes into the result JSON as it is
    assert p["threads"] == 3 and p["cpu"] and p["cores"] >= p["cores_usable"] >= 1
    assert p["llama_cpp_python"] == library.LLAMA_CPP_PYTHON_VERSION
    assert p["llama_cpp_commit"] == common.LLAMA_CPP_COMMITS[library.LLAMA_CPP_PYTHON_VERSION]
    assert p["kvgguf_patch_version"] == kvgguf.llama_patch_version() == library.PATCH_VERSION
    assert p["kvgguf_version"] == kvgguf.__version__
    assert p["python"] == platform.python_version()
    assert datetime.datetime.fromisoformat(p["date"]).tzinfo is not None
    if p["commit"] is not None:  # run from a git checkout
        assert re.fullmatch("[0-9a-f]{40}", p["commit"]) and isinstance(p["dirty"], bool)
        assert isinstance(p["installed_kvgguf_matches_checkout"], bool)


def test_outside_a_git_checkout_the_commit_is_none(tmp_path, monkeypatch):
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # git must not look above it
    p = common.provenance(threads=1, checkout=tmp_path)
    assert (p["commit"], p["dirty"], p["changed_files"]) == (None, None, None)
    assert p["installed_kvgguf_matches_checkout"] is None  # no kvgguf/ to compare with
    assert p["kvgguf_patch_version"] is not None  # the rest is still there


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_tree_is_dirty_by_its_tracked_files_not_its_results(tmp_path, monkeypatch):
    for who in ("AUTHOR", "COMMITTER"):  # a commit needs a name, whatever the user's git config holds
        monkeypatch.setenv(f"GIT_{who}_NAME", "t")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "t@t")
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    (repo / "code.py").write_text("x = 1\n")
    (repo / "benchmarks" / "results" / "r.json").write_text("{}\n")

    def git(*args):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)

    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "one")
    state = common.checkout_state(repo)
    assert re.fullmatch("[0-9a-f]{40}", state["commit"]) and state["dirty"] is False
    (repo / "benchmarks" / "results" / "r.json").write_text('{"rewritten": true}\n')  # a benchmark's own output
    (repo / "new.py").write_text("")  # untracked: not part of what was committed or changed
    assert common.checkout_state(repo)["dirty"] is False
    (repo / "code.py").write_text("x = 2\n")
    assert common.checkout_state(repo) == {"commit": state["commit"], "dirty": True, "changed_files": ["code.py"]}
    # a folder inside a checkout is not a checkout of its own
    assert common.checkout_state(repo / "benchmarks")["commit"] is None


def test_write_json_adds_the_provenance(tmp_path):
    written = common.write_json(tmp_path / "deep" / "r.json", {"rows": [1, 2]}, threads=2)
    data = json.loads((tmp_path / "deep" / "r.json").read_text())
    assert data == written and data["rows"] == [1, 2] and data["provenance"]["threads"] == 2
    assert set(data["provenance"]) == KEYS
    # a name with a dot keeps it: the suffix is appended, not substituted
    assert common.result_path(tmp_path / "kl_0.5", ".json").name == "kl_0.5.json"


def test_the_provenance_line():
    assert common.provenance_line(RECORDED) == (
        "_measured at 1a2b3c4 (clean) on 2026-05-01, llama.cpp 0c1e570 + kvgguf patches v10, AMD EPYC, "
        "2 cores, 2 threads_"
    )
    other = dict(
        RECORDED,
        dirty=True,
        installed_kvgguf_matches_checkout=False,
        gpu="NVIDIA H100",
        cores=16,
        cores_usable=4,
        threads=1,
    )
    assert common.provenance_line(other) == (
        "_measured at 1a2b3c4 (uncommitted changes) on 2026-05-01, installed kvgguf differs from the checkout, "
        "llama.cpp 0c1e570 + kvgguf patches v10, AMD EPYC, NVIDIA H100, 4 of 16 cores, 1 thread_"
    )
    outside = dict(RECORDED, commit=None, dirty=None, llama_cpp_commit=None, kvgguf_patch_version=None, threads=None)
    assert common.provenance_line(outside) == (
        "_measured outside a git checkout on 2026-05-01, llama-cpp-python 0.3.36, AMD EPYC, 2 cores_"
    )


def test_readme_sections_prints_each_results_provenance_or_that_it_was_not_recorded(tmp_path):
    table = "`benchmarks/x.py`\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    new, old, bare = tmp_path / "new.md", tmp_path / "old.md", tmp_path / "bare.md"
    for md in (new, old, bare):
        md.write_text(table)
    new.with_suffix(".json").write_text(json.dumps({"rows": [], "provenance": RECORDED}))
    marked = {"recorded": False, "committed_in": "55f64cd", "committed_on": "2026-11-26"}
    old.with_suffix(".json").write_text(json.dumps({"rows": [], "provenance": marked}))  # from before provenance
    assert readme_sections.result_text(new) == table.strip() + "\n\n" + common.provenance_line(RECORDED)
    assert readme_sections.result_text(old) == (
        table.strip() + "\n\n_provenance not recorded: committed in 55f64cd on 2026-11-26_"
    )
    assert readme_sections.result_text(bare) == table.strip()  # no JSON beside it (usage_example.txt's kind)


def test_markdown_table():
    assert common.markdown_table(["", "a", "b"], [["x", 1, ""]], align=["---", "---", "---:"]) == (
        "| | a | b |\n|---|---|---:|\n| x | 1 | |"
    )


SCRIPTS = sorted(p.stem for p in BENCHMARKS.glob("*.py") if "ArgumentParser(" in p.read_text())


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_still_parses_its_options(script, monkeypatch, capsys):
    module = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--help"])
    with pytest.raises(SystemExit) as stop:
        module.main()
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out
    if "add_threads_option" in (BENCHMARKS / f"{script}.py").read_text():
        assert "-t THREADS, --threads THREADS" in out


def test_the_quoted_command_names_the_script_where_it_lives():
    root = BENCHMARKS.parent
    assert common.command(str(BENCHMARKS / "live_cache.py"), ["--ctx", "4096"]) == "benchmarks/live_cache.py --ctx 4096"
    assert common.command(str(root / "scripts" / "fuzz_long.py"), [], python=True) == (
        ".venv/bin/python scripts/fuzz_long.py"
    )


@pytest.mark.parametrize(
    "result", sorted(p.relative_to(BENCHMARKS).as_posix() for p in (BENCHMARKS / "results").rglob("*.json"))
)
def test_every_result_records_its_provenance_or_is_marked(result):
    p = json.loads((BENCHMARKS / result).read_text())["provenance"]
    if p.get("recorded") is False:  # from before results recorded it: the commit that last changed it
        assert set(p) == {"recorded", "committed_in", "committed_on"}
        assert re.fullmatch(r"[0-9a-f]{7}", p["committed_in"]) and datetime.date.fromisoformat(p["committed_on"])
    else:
        assert KEYS <= set(p) and p["date"], result
