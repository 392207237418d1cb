"""benchmarks/run.py runs every benchmark by name: each script is in its registry with a kind,
the flags it maps the shared options onto are ones the script defines, and an option a
benchmark cannot take is refused with a message that names the ones it can."""

import importlib.util
import re
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
HELPERS = {"common", "readme_sections", "shapes", "run"}  # used by the benchmarks, measure nothing


def _run_module():
    spec = importlib.util.spec_from_file_location("benchmarks_run", BENCHMARKS / "run.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is made
    spec.loader.exec_module(module)
    return module


run = _run_module()


def _flags(script: Path) -> set[str]:
    text = script.read_text()
    flags = set(re.findall(r'add_argument\(\s*(?:"-\w", )?"(--[\w-]+)"', text))
    if "add_threads_option(" in text:
        flags.add("--threads")
    if "add_out_option(" in text:
        flags.add("--out")
    return flags


def test_every_benchmark_script_is_registered_with_a_kind():
    scripts = {p.stem for p in BENCHMARKS.glob("*.py")} - HELPERS
    assert scripts == set(run.REGISTRY)
    assert {b.kind for b in run.REGISTRY.values()} <= set(run.KINDS)


@pytest.mark.parametrize("name", sorted(run.REGISTRY))
def test_the_mapped_flags_are_the_scripts_own(name):
    bench = run.REGISTRY[name]
    assert set(bench.flags) <= set(run.SHARED) and bench.single <= set(bench.flags)
    assert set(bench.flags.values()) <= _flags(BENCHMARKS / f"{name}.py"), name


def test_shared_options_become_the_scripts_flags_and_what_does_not_fit_is_refused():
    argv = run.command("fused_switch", {"contexts": "8192", "repeats": 3, "model": None}, ["--tokens", "64"])
    assert argv[1].endswith("benchmarks/fused_switch.py")
    assert argv[2:] == ["--ctx", "8192", "--reps", "3", "--tokens", "64"]
    with pytest.raises(ValueError, match="one context at a time"):
        run.command("fused_switch", {"contexts": "4096,8192"}, [])
    with pytest.raises(ValueError, match="takes no --model .* --repeats, --out"):
        run.command("attend_kernels", {"model": "smollm2-135m"}, [])
    with pytest.raises(ValueError, match="no benchmark 'nope'"):
        run.command("nope", {}, [])


def test_list_names_every_benchmark_under_its_kind(capsys):
    assert run.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(f"  {name} " in out for name in run.REGISTRY) and all(f"{k}:" in out for k in run.KINDS)
