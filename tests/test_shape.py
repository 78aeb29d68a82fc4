"""The package's shape, counted with `ast`: few top-level modules, files and functions a reader can hold, no
single-letter module aliases. Each failure names every offender (path, name, lines) so what remains is visible.

    .venv/bin/pytest -q tests/test_shape.py
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pyrodash"
MAX_TOP_LEVEL_MODULES = 8  # besides __init__ and __main__
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 60
# files allowed past MAX_FILE_LINES, and why
LONG_FILES: dict[str, str] = {}
# functions allowed past MAX_FUNCTION_LINES ("path:qualified name"), and why: a trainer or a script that reads top
# to bottom and says so in its docstring
LONG_FUNCTIONS: dict[str, str] = {}


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def functions(tree: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and method, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, prefix + node.name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, prefix + node.name + ".")
        else:
            yield from functions(node, prefix)


def long_functions() -> dict[str, int]:
    """{"path:name": lines} of every function over MAX_FUNCTION_LINES (decorators not counted)."""
    out = {}
    for path in sources():
        for name, node in functions(ast.parse(path.read_text(), str(path))):
            n = node.end_lineno - node.lineno + 1
            if n > MAX_FUNCTION_LINES:
                out[f"{rel(path)}:{name}"] = n
    return out


def test_few_top_level_modules():
    top = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem not in ("__init__", "__main__"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, (
        f"{len(top)} top-level modules in pyrodash/ (at most {MAX_TOP_LEVEL_MODULES}): {', '.join(top)}; "
        "move the ones that belong to a part into its package"
    )


def test_no_file_over_the_limit():
    long = {rel(p): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    over = {p: n for p, n in long.items() if p not in LONG_FILES}
    assert not over, f"files over {MAX_FILE_LINES} lines (split them by what they hold):\n" + "\n".join(
        f"  {p}: {n}" for p, n in sorted(over.items(), key=lambda x: -x[1])
    )


def test_no_function_over_the_limit():
    over = {k: n for k, n in long_functions().items() if k not in LONG_FUNCTIONS}
    assert not over, f"{len(over)} functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(
        f"  {k}: {n}" for k, n in sorted(over.items(), key=lambda x: -x[1])
    )


def test_the_exceptions_are_still_needed_and_say_so():
    """Each listed exception exists, is still long, and says in its docstring that it reads top to bottom."""
    long = long_functions()
    stale = [k for k in LONG_FUNCTIONS if k not in long]
    stale += [p for p in LONG_FILES if len((ROOT / p).read_text().splitlines()) <= MAX_FILE_LINES]
    assert not stale, f"exceptions no longer needed (remove them from tests/test_shape.py): {stale}"
    silent = []
    for key in LONG_FUNCTIONS:
        path, name = key.split(":")
        node = dict(functions(ast.parse((ROOT / path).read_text())))[name]
        if "top to bottom" not in (ast.get_docstring(node) or ""):
            silent.append(key)
    assert not silent, f"long functions whose docstring does not say they read top to bottom: {silent}"


def test_no_single_letter_module_aliases():
    """`import x as B` / `from x import y as B` hide what a name holds; spell the module's name."""
    bad = []
    for path in sources():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bad += [
                    f"{rel(path)}:{node.lineno}: {ast.unparse(node)}"
                    for a in node.names
                    if a.asname is not None and len(a.asname) == 1
                ]
    assert not bad, "single-letter import aliases:\n" + "\n".join(f"  {b}" for b in bad)
