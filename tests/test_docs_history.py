"""README.md and docs/ describe the product, not how it was made: no issue numbers, sessions, commit hashes, periods
of work, "this machine", or past tense about the project's own changes ("used to", "now", "no longer", "was
changed"). What changed from one version to the next goes in CHANGELOG.md (its shape: tests/test_docs_changelog.py).

The pages are read a paragraph at a time (lines joined up to the next blank line), so a phrase broken across two
lines ("pretrained on this" / "machine") is one phrase. Each pattern is a kind of development history a user cannot
act on; the test names every file:line that has one.
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
    "the development machine": r"\bthis (?:project's )?(?:2-core |shared |quiet |CI-like )*(?:machine|box)\b"
    r"|\bdevelopment machine\b|\bthe shared 2-core box\b"
    r"|\b(?:installed|reachable|measured|tested|trained|pretrained) here\b",
    "a period of work": r"\bthis work\b|\bthe session's\b|\bearlier versions? of this page\b|\bthis page's commits\b",
    "a change told as history": r"(?<!\bis )(?<!\bare )(?<!\bbe )(?<!\bbeen )(?<!\bbeing )(?<!\bwas )(?<!\bwere )"
    r"\bused to\b|\bnow\b|\bno longer\b|\bany ?more\b|\b(?:was|were|has been|have been) (?:changed|renamed|replaced)\b"
    r"|\b(?:the|an|its) earlier (?:recipe|cache|placement|engine|version|[\w-]+ size)\b"
    r"|\btest-era\b|\btoday\b",
}
HISTORY = re.compile("|".join(f"(?P<k{i}>{p})" for i, p in enumerate(PATTERNS.values())), re.I)
KINDS = list(PATTERNS)


def pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def paragraphs(text: str) -> list[tuple[list[int], str]]:
    """Each paragraph of `text` (lines up to a blank one) as one line of words, with the 1-based line of each of
    its characters."""
    out, lines, joined = [], [], []

    def close():
        if joined:
            text = " ".join(joined)
            where = [n for n, part in zip(lines, joined) for _ in range(len(part) + 1)]
            out.append((where, text))
        lines.clear(), joined.clear()

    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            close()
            continue
        lines.append(n)
        joined.append(line.strip())
    close()
    return out


def history_in(text: str) -> list[tuple[int, str, str]]:
    """(line, kind, the words) of every development-history phrase in `text`, read a paragraph at a time."""
    out = []
    for where, para in paragraphs(text):
        for m in HISTORY.finditer(para):
            kind = KINDS[int(next(k for k, v in m.groupdict().items() if v is not None)[1:])]
            out.append((where[m.start()], kind, m.group(0)))
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
        ("Measured on this project's 2-core CI-like machine", "the development machine"),
        ("measured 1.012 at 5 ms on the shared 2-core box", "the development machine"),
        ("the one GPU call of this work", "a period of work"),
        ("in earlier versions of this page", "a period of work"),
        # the cross-line case: a phrase broken over two lines of one paragraph
        ("Its world's models, pretrained on this\n  machine, fail follow-up turns", "the development machine"),
        ("the relay oracle's row is the one measured with the engine as it is\nnow", "a change told as history"),
        # past tense and "now" about the project's own changes
        ("Each stream used to decode alone behind the model's lock", "a change told as history"),
        ("Now requests that arrive while the model decodes wait in a queue", "a change told as history"),
        ("Masked, λ 0.6 no longer drifts toward handing off", "a change told as history"),
        ("`--relay` does nothing any more", "a change told as history"),
        ("the default was changed to 10 epochs", "a change told as history"),
        ("measured at bias −3 with the earlier recipe", "a change told as history"),
        ("the test-era gaps below were measured", "a change told as history"),
        ("with the recipe as it is now", "a change told as history"),
        ("the engine packs the trace as it does today", "a change told as history"),
        ("those of its earlier 40-conversation size", "a change told as history"),
    ],
)
def test_each_kind_is_caught(line, kind):
    assert kind in [k for _, k, _ in history_in(line)], line


def test_a_phrase_across_lines_is_named_at_its_first_line():
    text = "A first paragraph.\n\nIts world's models, pretrained on this\nmachine, fail.\n"
    assert [(n, k) for n, k, _ in history_in(text)] == [(3, "the development machine")]


def test_a_blank_line_ends_the_paragraph():
    """Two paragraphs are not read as one: "this" ending one and "machine" opening the next are no phrase."""
    assert history_in("It runs on this\n\nmachine learning stack.") == []


@pytest.mark.parametrize(
    "line",
    [
        "limits: {max_body_bytes: 1048576}",
        "a 2-core Intel Xeon (AVX-512), torch 2.13.0+cpu",
        "Here Gemma is the SLM",
        "runs/demo-quick/stage3-lambda0.6",
        "`pyrodash/world/checkpoints/seed0/`",
        "the span is used to price the handoff",
        "the seed that was used to pick it",
        "a known answer, acknowledged",
        "the policy hands off on fewer problems",
    ],
)
def test_product_facts_pass(line):
    assert history_in(line) == [], line
