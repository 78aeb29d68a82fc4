"""The fenced shell blocks of README.md and docs/*.md, with the marker comment above each (see tests/test_docs.py).

A block is picked up by the test its marker names: `<!-- runs in: tests/test_readme_curl.py -->` on one of the three
lines above the fence puts that block under tests/test_readme_curl.py.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELL_LANGS = ("bash", "sh", "console", "shell")
MARKER = re.compile(r"<!--\s*(runs in|needs):\s*(.*?)\s*-->")
FENCE = re.compile(r"^```(\w*)\s*$")
LOOK_BACK = 3


@dataclass(frozen=True)
class Block:
    path: Path  # the markdown file
    line: int  # 1-based line of the opening fence
    section: str  # the title of the nearest heading above
    lang: str
    text: str
    marker: tuple[str, str] | None  # ("runs in", "tests/test_x.py") or ("needs", "a GPU ..."), or None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _marker(lines: list[str], fence: int) -> tuple[str, str] | None:
    """The marker comment on one of the LOOK_BACK non-blank lines above the fence at index `fence`."""
    seen = 0
    for line in reversed(lines[:fence]):
        if not line.strip():
            continue
        hit = MARKER.search(line)
        if hit:
            return hit.group(1), hit.group(2)
        seen += 1
        if seen >= LOOK_BACK:
            return None
    return None


def blocks(path: Path) -> list[Block]:
    """Every fenced block of one markdown file (any language)."""
    lines = path.read_text().splitlines()
    out, section, i = [], "", 0
    while i < len(lines):
        if lines[i].startswith("#") and not lines[i].startswith("#!"):
            section = lines[i].lstrip("#").strip()
        fence = FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        text = "\n".join(lines[i + 1 : end]) + "\n"
        out.append(Block(path, i + 1, section, fence.group(1), text, _marker(lines, i)))
        i = end + 1
    return out


def shell_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks(path) if b.lang in SHELL_LANGS]


def blocks_run_by(test_file: str) -> list[Block]:
    """The shell blocks whose marker says they run in `test_file` (a path from the repository root)."""
    return [b for b in shell_blocks() if b.marker == ("runs in", test_file)]


def commands(block: str, start: str) -> list[str]:
    """The commands of a shell block that begin with `start`, continuation lines and multi-line quotes joined."""
    out, cur = [], None
    for line in block.splitlines():
        if cur is None and not line.startswith(start):
            continue
        cur = line if cur is None else cur + "\n" + line
        try:
            shlex.split(cur)
        except ValueError:  # a quote still open
            continue
        if cur.endswith("\\"):
            continue
        out.append(cur)
        cur = None
    return out
