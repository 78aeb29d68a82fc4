"""Every `--help` text that points into the documentation points at something that exists: `docs/PAGE.md` is a page,
`docs/PAGE.md#anchor` one of its headings' anchors (as mkdocs makes them), and a quoted section after a page or the
README (`README 'Time'`, `docs/results.md "Time"`) one of its headings."""

from __future__ import annotations

import argparse
import importlib.util
import re

import pytest
from doc_blocks import ROOT
from markdown.extensions.toc import slugify

PAGE = re.compile(
    r"\b(?P<page>README(?:\.md)?|docs/[\w/.-]+\.md)(?:#(?P<anchor>[\w-]+)|,?\s*(?P<q>['\"])(?P<title>.+?)(?P=q))?"
)
FENCE = re.compile(r"^\s*(```|~~~)")


def headings(path) -> list[str]:
    """The titles of a markdown page's headings, outside fenced blocks."""
    out, fenced = [], False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)):
            out.append(m.group(1))
    return out


def broken_links(text: str) -> list[str]:
    """Each pointer into the docs in `text` that leads nowhere."""
    out = []
    for m in PAGE.finditer(" ".join(text.split())):
        page = ROOT / ("README.md" if m["page"].startswith("README") else m["page"])
        if not page.is_file():
            out.append(f"{m[0]!r}: no file {page.relative_to(ROOT)}")
            continue
        titles = headings(page)
        if m["anchor"] and m["anchor"] not in {slugify(t, "-") for t in titles}:
            out.append(f"{m[0]!r}: no heading of {page.relative_to(ROOT)} has the anchor #{m['anchor']}")
        if m["title"] and m["title"].lower() not in {t.lower() for t in titles}:
            out.append(f"{m[0]!r}: {page.relative_to(ROOT)} has no heading {m['title']!r}")
    return out


def _parsers():
    """(command, parser) for every `pyrodash` command and sub-command, as docs/reference/cli.md walks them."""
    spec = importlib.util.spec_from_file_location("doc_reference", ROOT / "scripts" / "doc_reference.py")
    ref = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ref)
    from pyrodash.cli import build_parser

    for name in ref._subcommands(build_parser()):
        parser = ref._subcommands(build_parser(only=name))[name]
        yield name, parser
        for sub, sp in ref._subcommands(parser).items():
            yield f"{name} {sub}", sp


def _help_texts(parser: argparse.ArgumentParser) -> list[str]:
    texts = [parser.description or "", parser.epilog or ""]
    return texts + [a.help for a in parser._actions if isinstance(a.help, str)]


HELP = [(name, text) for name, p in _parsers() for text in _help_texts(p) if PAGE.search(" ".join(text.split()))]


def test_some_help_texts_point_into_the_docs():
    assert len(HELP) >= 3, HELP


@pytest.mark.parametrize("name, text", HELP, ids=[f"{n}:{i}" for i, (n, _) in enumerate(HELP)])
def test_every_help_pointer_into_the_docs_resolves(name, text):
    assert broken_links(text) == [], f"pyrodash {name}: {text!r}"


@pytest.mark.parametrize(
    "text",
    [
        "see README 'Point it at your LLM'",  # a README section that does not exist
        "see docs/providers.md#no-such-section",
        "see docs/no-such-page.md",
        'docs/results.md "No such section"',
    ],
)
def test_a_pointer_that_leads_nowhere_is_caught(text):
    assert broken_links(text), text


@pytest.mark.parametrize(
    "text",
    [
        "see docs/providers.md#point-it-at-your-llm",
        "minutes: docs/world.md",
        "README 'Read the report'",
        'docs/results.md "Time"',
    ],
)
def test_a_pointer_that_resolves_passes(text):
    assert broken_links(text) == [], text
