"""The README and the documentation site (docs/, mkdocs.yml) keep their promises.

The convention for shell blocks: every fenced `bash` / `sh` / `console` block in README.md and docs/*.md has, on one
of the three non-blank lines above its opening fence, one HTML comment (invisible on GitHub and in the site):
- `<!-- runs in: tests/test_x.py -->`: that test runs the block; the test collects the blocks marked with its own
  path through `doc_blocks.blocks_run_by("tests/test_x.py")`, so the marker is what puts a block under test;
- `<!-- runs in: .ci/run -->` (any file outside tests/): that file holds each of the block's commands verbatim;
- `<!-- needs: ... -->`: what the block needs to run, hardware first (`a CPU machine (2 cores: ~4 min)`, `4 GPUs`).
Also: README.md at most 200 lines, its two set-up commands first, its links to files that exist; every page in the
mkdocs nav and every nav entry a page; every `benchmarks/*` and `scripts/*` file the docs name exists; the map in
docs/architecture.md names every folder and every module of the package (each in its folder's entry).
`mkdocs build --strict` itself runs in the README's test command, not here.
"""

from __future__ import annotations

import re

import pytest
import yaml
from doc_blocks import ROOT, doc_files, shell_blocks

BLOCKS = shell_blocks()
README = (ROOT / "README.md").read_text()


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_the_readme_starts_with_the_two_setup_commands():
    first, second = [b for b in BLOCKS if b.path.name == "README.md"][:2]
    assert "pip install torch==2.13.0" in first.text and "pyrodash demo --quick" in first.text, first.text
    assert "pytest -q" in second.text and second.marker == ("runs in", ".ci/run"), second


def test_there_are_shell_blocks_of_both_kinds():
    kinds = {b.marker[0] for b in BLOCKS if b.marker}
    assert len(BLOCKS) >= 10 and kinds == {"runs in", "needs"}, [b.where for b in BLOCKS]


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.where)
def test_every_shell_block_runs_in_a_test_or_says_what_it_needs(block):
    assert block.marker is not None, (
        f"{block.where}: put <!-- runs in: tests/test_x.py --> or <!-- needs: <hardware> --> on a line above the block"
    )
    kind, value = block.marker
    assert value, f"{block.where}: an empty `{kind}:` marker"
    if kind == "needs":
        return
    target = ROOT / value
    assert target.is_file(), f"{block.where}: runs in {value}, which does not exist"
    source = target.read_text()
    if value.startswith("tests/"):
        assert f'blocks_run_by("{value}")' in source, f"{value} does not collect the blocks marked for it"
        return
    for line in block.text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            assert line.strip() in source, f"{block.where}: {value} does not hold {line.strip()!r}"


def test_every_script_the_docs_name_exists():
    named = set()
    for path in doc_files():
        named |= set(re.findall(r"\b((?:benchmarks|scripts)/[\w.-]+\.(?:py|sh))\b", path.read_text()))
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert named and not missing, missing


def test_the_readme_links_to_files_that_exist():
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [t for t in targets if "://" not in t]
    assert local, "the README links into the docs"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, missing


def _nav_pages(nav) -> list[str]:
    out = []
    for entry in nav:
        for value in entry.values() if isinstance(entry, dict) else [entry]:
            out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def test_every_docs_page_is_in_the_site_nav():
    nav = _nav_pages(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"])
    pages = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(nav) == pages


def test_the_architecture_map_names_every_part_of_the_package():
    """Every folder and every module of the package, walked: its name in the map's tree (a module of a folder in
    that folder's entry, which runs until the next entry at its depth or above)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    tree = text.split("```", 2)[1]
    package = ROOT / "pyrodash"
    folders = [p for p in package.rglob("*") if p.is_dir() and (p / "__init__.py").is_file()]
    missing = [f"{p.name}/" for p in folders if not re.search(rf"(?<![\w/]){re.escape(p.name)}/", tree)]
    for path in sorted(package.rglob("*.py")):
        if path.name in ("__init__.py", "__main__.py"):
            continue
        entry = _tree_entry(tree, path.parent.relative_to(package).parts)
        if not re.search(rf"(?<![\w/]){re.escape(path.name)}", entry):
            missing.append(path.relative_to(package).as_posix())
    assert not missing, f"docs/architecture.md does not name {missing}"


def _tree_entry(tree: str, folders: tuple[str, ...]) -> str:
    """The lines of the map's tree under `folders` (the package's top level for ()): from the line naming the
    innermost folder that has a line of its own to the next line naming something at its indentation or less."""
    lines, text = tree.splitlines(), tree
    for name in folders:
        start = next((i for i, line in enumerate(lines) if re.match(rf"\s*{re.escape(name)}/", line)), None)
        if start is None:  # a folder named inside its parent's entry (routing/ in eval/'s): that entry names its files
            break
        depth = len(lines[start]) - len(lines[start].lstrip())
        end = next(
            (i for i in range(start + 1, len(lines)) if lines[i].strip() and _is_entry(lines[i], depth)), len(lines)
        )
        lines = lines[start:end]
        text = "\n".join(lines)
    return text


def _is_entry(line: str, depth: int) -> bool:
    """Whether a tree line starts an entry (a name in the first column of names) at `depth` spaces or less."""
    indent = len(line) - len(line.lstrip())
    return indent <= depth and re.match(r"\s*[\w./<>-]+", line) is not None
