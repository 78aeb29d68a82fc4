"""README.md and docs/ describe the product, not how it was made: no issue numbers, sessions, commit hashes, periods
of work or "this machine". What changed from one version to the next goes in CHANGELOG.md (not checked here).

Each pattern is a kind of development history a user cannot act on; the test names every file:line that has one.
"""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT

PATTERNS = {
    "an issue": r"\bissues?\b",
    "a session": r"\bsessions?\b",
    "a commit": r"\bcommits?\b|\bfresh clone of\b|\bmain [0-9a-f]{7}",
    "a commit hash": r"(?<![\w/.-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w/-])",
    "the development machine": r"\bthis (?:2-core |shared |quiet )*machine\b|\bdevelopment machine\b"
    r"|\b(?:installed|reachable|measured|tested|trained|pretrained) here\b",
    "a period of work": r"\bthis work\b|\bthe session's\b|\bearlier versions? of this page\b|\bthis page's commits\b",
}
HISTORY = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(PATTERNS.values())), re.I)
KINDS = list(PATTERNS)


def pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def history_in(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, the words) of every development-history phrase in `text`."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        for m in HISTORY.finditer(line):
            kind = KINDS[int(next(k for k, v in m.groupdict().items() if v is not None)[1:])]
            out.append((n, kind, m.group(0)))
    return out


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_page_has_no_development_history(path):
    found = [f"{path.relative_to(ROOT)}:{n}: {kind} ({words!r})" for n, kind, words in history_in(path.read_text())]
    assert not found, "restate as a fact about the product, or move it to CHANGELOG.md:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, kind",
    [
        ("as issue 39 asked", "an issue"),
        ("the issue that asked for relay", "an issue"),
        ("quick demo once per session", "a session"),
        ("from a fresh clone of c619845", "a commit"),
        ("the tree at 7e2690d gave", "a commit hash"),
        ("Docker is installed here", "the development machine"),
        ("on this 2-core machine (shared)", "the development machine"),
        ("no real provider is reachable here", "the development machine"),
        ("the one GPU call of this work", "a period of work"),
        ("in earlier versions of this page", "a period of work"),
    ],
)
def test_each_kind_is_caught(line, kind):
    assert kind in [k for _, k, _ in history_in(line)], line


@pytest.mark.parametrize(
    "line",
    [
        "limits: {max_body_bytes: 1048576}",
        "a 2-core Intel Xeon (AVX-512), torch 2.13.0+cpu",
        "Here Gemma is the SLM",
        "runs/demo-quick/stage3-lambda0.6",
        "`pyrodash/world/checkpoints/seed0/`",
    ],
)
def test_product_facts_pass(line):
    assert history_in(line) == [], line
