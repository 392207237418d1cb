"""kvgguf's layers import downward only, in the order docs/design.md's layer table gives (read
here as RANK). Any import at any depth (a function's lazy import too) of a higher layer fails this
test, but for the one named in UPWARD, which says why it stays; every module of the package belongs
to a documented layer, and the package docstring names them in the same order."""

from __future__ import annotations

import ast
from pathlib import Path

import kvgguf

DESIGN = Path(__file__).resolve().parents[2] / "docs" / "design.md"


def documented_ranks() -> dict[str, int]:
    """{layer: rank} from docs/design.md's layer table, the one description of the layers."""
    text = DESIGN.read_text()
    table = text[text.index("<!-- layers:begin -->") : text.index("<!-- layers:end -->")]
    ranks = {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) == 4 and cells[0].isdigit():
            for name in cells[1].split(","):
                ranks[name.strip()] = int(cells[0])
    return ranks


RANK = documented_ranks()
UPWARD = {
    # "auto" measures the model on first use (kvgguf.llama._calibrate, which policy.resolve calls), lazily
    ("kvgguf.llama", "kvgguf.evaluation"),
}


def imports(path: Path, package: str, *, top_level_only: bool = False):
    """(line, module) of every kvgguf import in the file, relative ones resolved (top_level_only:
    those that run when the module is imported, not inside a function)."""
    tree = ast.parse(path.read_text())
    for node in tree.body if top_level_only else ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else [node.names[0].name]))
            elif (node.module or "").startswith("kvgguf"):
                yield node.lineno, node.module
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("kvgguf"):
                    yield node.lineno, alias.name


def layer(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def test_every_layer_imports_downward_only():
    root = Path(kvgguf.__file__).parent
    wrong = []
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__")
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for line, target in imports(path, package):
            a, b = layer(module), layer(target)
            if a in RANK and b in RANK and RANK[b] > RANK[a] and (module, f"kvgguf.{b}") not in UPWARD:
                wrong.append(f"{module}:{line} imports {target} ({a} -> {b})")
    assert not wrong, "\n".join(wrong)


def test_the_check_sees_a_lazy_upward_import(tmp_path):
    bad = tmp_path / "tiered.py"
    bad.write_text("def f():\n    from ..runtime import live_cache\n")
    assert [t for _, t in imports(bad, "kvgguf.policy")] == ["kvgguf.runtime"]


def test_the_one_upward_import_is_lazy():
    """The facade's call into evaluation happens only when "auto" measures a model: importing
    kvgguf.llama must not import the evaluation layer."""
    root = Path(kvgguf.__file__).parent
    for module, target in UPWARD:
        path = root.parent.joinpath(*module.split(".")).with_suffix(".py")
        eager = [t for _, t in imports(path, module.rsplit(".", 1)[0], top_level_only=True) if t.startswith(target)]
        assert not eager, f"{module} imports {eager} when it is imported"


def test_every_module_belongs_to_a_documented_layer():
    root = Path(kvgguf.__file__).parent
    top = {p.stem for p in root.glob("*.py") if p.stem != "__init__"} | {
        p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }
    assert RANK, "docs/design.md lost its layer table"
    assert top - set(RANK) == set(), f"undocumented layers: {sorted(top - set(RANK))}"
    assert set(RANK) - top == set(), f"documented layers that do not exist: {sorted(set(RANK) - top)}"


def test_the_package_docstring_names_the_layers_in_the_documented_order():
    doc = kvgguf.__doc__
    named = [name for name in sorted(RANK, key=RANK.get, reverse=True) if f"``kvgguf.{name}``" in doc]
    assert set(named) == set(RANK), f"missing from kvgguf's docstring: {sorted(set(RANK) - set(named))}"
    positions = [doc.index(f"``kvgguf.{name}``") for name in named]
    assert positions == sorted(positions), "kvgguf's docstring lists the layers in another order than design.md"
