"""The generated references pair each field with its own note (`scripts/doc_reference.py`, `_comments`).

A field's note in the source is the comment lines right above it and its trailing comment. Checked two ways: on a
class written for the test (each layout the code uses, with the note each field must get), and on every class the
references document: a field's trailing comment is in its own row and in no other, and a field without one gets the
comment line right above it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import io
import tokenize

import pytest
from doc_blocks import ROOT


@pytest.fixture(scope="module")
def ref():
    spec = importlib.util.spec_from_file_location("doc_reference", ROOT / "scripts" / "doc_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass
class Layouts:
    # Above: a note that opens with a capital
    above: int = 0
    trailing: int = 1  # a trailing note
    # | going on with the trailing note above
    goes_on: str = "x"  # its own trailing note
    after_trailing: int = 2  # another trailing note
    # a lowercase note of the field below, which has no trailing comment
    # over two lines
    below_lowercase: float = 0.2
    split: str = "a"  # a trailing note that goes
    # on here
    # Then the note of the next field
    next_one: bool = False
    bare: int = 3


def test_each_layout_gives_each_field_its_own_note(ref):
    notes = ref._comments(Layouts)
    assert notes == {
        "above": "Above: a note that opens with a capital",
        "trailing": "a trailing note | going on with the trailing note above",
        "goes_on": "its own trailing note",
        "after_trailing": "another trailing note",
        "below_lowercase": "a lowercase note of the field below, which has no trailing comment over two lines",
        "split": "a trailing note that goes on here",
        "next_one": "Then the note of the next field",
        "bare": "",
    }


def _documented(ref) -> list[type]:
    from pyrodash.data.example import Example
    from pyrodash.record import Record

    classes = [cls for _, cls, _, _ in ref.config_sections() if dataclasses.is_dataclass(cls)]
    return [*classes, Example, Record]


def _source_notes(cls: type) -> dict[str, tuple[str | None, str | None]]:
    """field -> (its trailing comment, the comment line right above it), read from the source directly."""
    source = inspect.getsource(cls)
    comments = {
        t.start[0]: t.string.lstrip("#").strip()
        for t in tokenize.generate_tokens(io.StringIO(source).readline)
        if t.type == tokenize.COMMENT
    }
    lines = source.splitlines()
    names = {f.name for f in dataclasses.fields(cls)}
    out = {}
    for i, line in enumerate(lines, 1):
        name = line.strip().split(":", 1)[0]
        if line.startswith("    ") and not line.startswith("     ") and name in names and name not in out:
            above = lines[i - 2].strip() if i >= 2 else ""
            out[name] = (comments.get(i), comments.get(i - 1) if above.startswith("#") else None)
    return out


def test_every_documented_field_has_its_own_note(ref):
    wrong = []
    for cls in _documented(ref):
        notes = {}
        for klass in reversed(cls.__mro__):
            if klass.__module__.startswith("pyrodash"):
                notes.update(ref._comments(klass))
        source = _source_notes(cls)
        for name, (trailing, above) in source.items():
            mine = notes.get(name, "")
            if trailing and trailing not in mine:
                wrong.append(f"{cls.__name__}.{name}: its trailing comment is not in its note {mine!r}")
            if not trailing and above and above not in mine:
                wrong.append(f"{cls.__name__}.{name}: the comment right above it is not in its note {mine!r}")
            own = [c for c in (trailing, None if trailing else above) if c]
            for other, text in notes.items():
                theirs = [c for c in source.get(other, ()) if c]
                wrong += [
                    f"{cls.__name__}.{other}: carries {name}'s comment {c!r}"
                    for c in own
                    if other != name and c in text and not any(c in t for t in theirs)
                ]
    assert not wrong, "\n".join(wrong)


def test_neighbouring_fields_keep_their_own_rows(ref):
    """Rows of the generated pages where a note above a field follows another's trailing comment: curation's
    `heldout_limit` and `val_share`, the record's `slm_cached_in` and `llm_failures`, each with its own meaning."""
    text = "".join((ROOT / "docs" / "reference" / f).read_text() for f in ("configs.md", "formats.md"))
    rows = {ln.split("|")[1].strip(): ln.split("|")[4].strip() for ln in text.splitlines() if ln.startswith("| `")}
    assert rows["`heldout_limit`"] == "first N held-out examples"
    assert (
        rows["`val_share`"].startswith("your own data") and "carved into DIR/curated/val.jsonl" in rows["`val_share`"]
    )
    assert "failed LLM attempt" not in rows["`slm_cached_in`"]
    assert rows["`llm_failures`"].startswith("every failed LLM attempt")
