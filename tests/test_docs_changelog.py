"""CHANGELOG.md has the shape of Keep a Changelog (https://keepachangelog.com/en/1.1.0/): one `## [VERSION] - DATE`
section per version, newest first, the newest being `pyproject.toml`'s version; inside each, only the standard
`### Added / Changed / Deprecated / Removed / Fixed / Security` groups, each a list. The first release lists what it
brings (`### Added` only), with no change told against an earlier state of the project ("now", "no longer", "any
more", ...: the history test's kind)."""

from __future__ import annotations

import re

import pytest
import tomllib
from doc_blocks import ROOT
from test_docs_history import history_in

VERSION = re.compile(r"^## \[(?P<v>\d+\.\d+\.\d+|Unreleased)\](?: - (?P<d>\d{4}-\d{2}-\d{2}|Unreleased))?$")
GROUPS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def changelog_problems(text: str) -> list[str]:
    """What keeps `text` from a Keep a Changelog file whose last release is a first one."""
    lines = text.splitlines()
    problems = [] if lines and lines[0] == "# Changelog" else ["the first line is not `# Changelog`"]
    sections: list[tuple[str, list[str]]] = []
    for line in lines[1:]:
        if line.startswith("## "):
            m = VERSION.match(line)
            if not m:
                problems.append(f"{line!r} is not `## [X.Y.Z] - YYYY-MM-DD` (or `- Unreleased`)")
            sections.append((m.group("v") if m else line, []))
        elif sections:
            sections[-1][1].append(line)
    if not sections:
        return problems + ["no version section"]
    for version, body in sections:
        groups = [ln[4:].strip() for ln in body if ln.startswith("### ")]
        problems += [f"[{version}]: `### {g}` is not one of {sorted(GROUPS)}" for g in groups if g not in GROUPS]
        items = [ln for ln in body if ln.strip() and not ln.startswith("#")]
        if version != "Unreleased" and not groups:
            problems.append(f"[{version}]: no `### Added` (or other) group")
        if groups and any(not ln.startswith(("- ", "  ")) for ln in items[_first_group(body, items) :]):
            problems.append(f"[{version}]: a group holds a line that is not a list item")
    first_version, first_body = sections[-1]
    first_groups = [ln[4:].strip() for ln in first_body if ln.startswith("### ")]
    if first_groups and first_groups != ["Added"]:
        problems.append(f"[{first_version}] is the first release: it lists `### Added` only, not {first_groups}")
    for _, kind, words in history_in("\n".join(first_body)):
        if kind == "a change told as history":
            problems.append(f"[{first_version}] tells a change against an earlier state: {words!r}")
    return problems


def _first_group(body: list[str], items: list[str]) -> int:
    """The index in `items` of the first item after the first `###` heading (prose before it is the intro)."""
    head = next(i for i, ln in enumerate(body) if ln.startswith("### "))
    after = [ln for ln in body[head:] if ln.strip() and not ln.startswith("#")]
    return len(items) - len(after)


def test_the_changelog_is_keep_a_changelog_with_a_first_release():
    assert changelog_problems((ROOT / "CHANGELOG.md").read_text()) == []


def test_its_newest_version_is_the_packages():
    text = (ROOT / "CHANGELOG.md").read_text()
    newest = next(m.group("v") for ln in text.splitlines() if (m := VERSION.match(ln)) and m.group("v") != "Unreleased")
    assert newest == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


GOOD = "# Changelog\n\nIntro.\n\n## [0.1.0] - Unreleased\n\n### Added\n\n- **Engine**: the SLM hands off.\n"


@pytest.mark.parametrize(
    "bad, why",
    [
        (GOOD.replace("## [0.1.0] - Unreleased", "## 0.1.0 (unreleased)"), "is not `## [X.Y.Z]"),
        (GOOD.replace("### Added", "### New"), "is not one of"),
        (GOOD.replace("### Added", "### Changed"), "lists `### Added` only"),
        (GOOD.replace("the SLM hands off.", "`--relay` does nothing any more."), "against an earlier state"),
        (GOOD.replace("the SLM hands off.", "batches now decode together."), "against an earlier state"),
        (GOOD.replace("### Added\n\n", ""), "no `### Added`"),
        (GOOD + "First version.\n", "not a list item"),
    ],
)
def test_a_changelog_out_of_shape_is_caught(bad, why):
    assert changelog_problems(GOOD) == []
    assert any(why in p for p in changelog_problems(bad)), changelog_problems(bad)
