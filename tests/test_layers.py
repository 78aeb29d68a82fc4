"""The package's layering holds by itself: the import-linter contracts of pyproject.toml (layers, sources, no module
or folder cycle, imports inside functions counted) and own-package imports at module top, so no cycle hides in a
function body."""

from __future__ import annotations

import ast
from pathlib import Path

from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pyrodash"
# own modules that exist to wrap a heavy library, imported where they are used so that start-up stays light
LAZY = {"pyrodash.backends.hf.backend": "in-process transformers and torch: serving HTTP models never loads them"}


def test_import_contracts_hold(capsys):
    rc = lint_imports(config_filenames=(str(ROOT / "pyproject.toml"),), no_cache=True, no_logo=True)
    assert rc == 0, capsys.readouterr().out


def inner_imports(path: Path) -> list[str]:
    """`pyrodash` imports inside a function of `path`, as "line: statement"."""
    tree = ast.parse(path.read_text(), str(path))
    found = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(fn):
            own = (
                isinstance(node, ast.ImportFrom) and (node.level > 0 or (node.module or "").split(".")[0] == "pyrodash")
            ) or (isinstance(node, ast.Import) and any(a.name.split(".")[0] == "pyrodash" for a in node.names))
            if own and not (isinstance(node, ast.ImportFrom) and node.module in LAZY):
                found[node.lineno] = ast.unparse(node)
    return [f"{line}: {stmt}" for line, stmt in sorted(found.items())]


def test_own_package_imports_sit_at_module_top():
    """Inside a function only heavy third-party libraries are imported (vllm, torch/transformers/trl/datasets where
    start-up time matters); `pyrodash.cli` imports just the command being run, so `pyrodash --help` stays fast."""
    bad = {str(p.relative_to(ROOT)): lines for p in sorted(PACKAGE.rglob("*.py")) if (lines := inner_imports(p))}
    assert not bad, "own-package imports inside functions (move them to the module top):\n" + "\n".join(
        f"  {path}:{line}" for path, lines in bad.items() for line in lines
    )
