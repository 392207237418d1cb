"""kvgguf's layers import downward only: bindings, enums and errors, then model, policy, llamacpp,
runtime, session, the facade (llama.py, installer.py), evaluation, cli. Any import at any depth
(a function's lazy import too) of a higher layer fails this test, but for the one named in
UPWARD, which says why it stays."""

from __future__ import annotations

import ast
from pathlib import Path

import kvgguf

RANK = {
    "bindings": 0,
    "enums": 0,
    "errors": 0,
    "model": 1,
    "policy": 2,
    "llamacpp": 3,
    "runtime": 4,
    "session": 5,
    "llama": 6,
    "installer": 6,
    "evaluation": 7,
    "cli": 8,
}
UPWARD = {
    # "auto" measures the model on first use (kvgguf.llama.calibrated_config), lazily
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
