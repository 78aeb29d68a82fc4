"""No page quotes a measurement by hand: every measured figure in README.md and docs/ is rendered from a stored result
(`<!-- rendered: VIEW NAME -->...<!-- /rendered -->`, `scripts/render_docs.py` over docs/results/*.json) or is not
there. Prose may say what a figure shows, not restate it.

What counts as a measurement-like number, outside rendered spans, fenced blocks, inline code and HTML comments: a
percentage (`96.7%`), a decimal (`0.496`, `−0.011`; not a version such as 2.13.0 or a number inside a name such as
Qwen3.5-4B), a time (`170 s`, `1.11 ms`, `~3.5 min`, `50 GPU-hours`), a speed-up (`2×`) or a dollar amount (`$8,907`).
Allowed beside them:
- a span marked `<!-- estimate: ... -->...<!-- /estimate -->`: arithmetic on stated assumptions, said to be one;
- `ALLOWED`, a short list of constants (config defaults and criteria, prices, the paper's own figures), each with
  what it is.
Pages whose hand-written figures are still to be rendered or removed would be listed in `TO_RENDER`: their test is
expected to fail (strict), so a page that becomes clean must leave the list. It is empty: every page passes.
"""

from __future__ import annotations

import re

import pytest
from doc_blocks import ROOT

SPANS = [
    re.compile(r"<!-- rendered: .*?<!-- /rendered -->", re.S),
    re.compile(r"<!-- estimate: .*?<!-- /estimate -->", re.S),
    re.compile(r"^\s*(```|~~~).*?^\s*\1\s*$", re.S | re.M),  # fenced blocks: commands and configs
    re.compile(r"<!--.*?-->", re.S),
    re.compile(r"`[^`\n]*`"),  # inline code: keys, values, file names, command lines
    re.compile(r"\]\([^)]*\)"),  # link targets
    # a recipe's or a sweep's settings named in prose: λ 0.6, λ in {0.05, 0.6, 2, 4}, offload bias +1, share 0.25
    re.compile(
        r"(?:λ|bias|share|shares|temperature|lr)\s?(?:=|≤|<|≈|in|of)?\s?\{?[−+-]?\d[\d.]*"
        r"(?:(?:,\s?| / | and | or )[−+-]?\d[\d.]*)*\}?"
    ),
]
NUM = r"[−+-]?~?\d[\d,]*(?:\.\d+)?"
MEASURE = re.compile(
    rf"(?<![\w.-])(?:{NUM}\s?%"  # a percentage
    rf"|\$\s?{NUM}"  # dollars
    rf"|{NUM}\s?(?:ms|µs|min|minutes|hours|GPU-hours|CPU-seconds)\b|{NUM}\s(?:s|sec|seconds|h)\b"  # a time
    rf"|{NUM}\s?×"  # a factor
    rf"|{NUM}\s?(?:->|→)\s?{NUM}"  # a before and after
    r"|[−+-]?\d+\.\d+(?![\d.]*[A-Za-z])(?!\d)(?!\.\d))"  # a decimal, not a version (2.13.0) nor part of a name
)

# (page, the words as they stand, what they are): constants, not measurements
ALLOWED = [
    ("README.md", "98%", "the pick's criterion (`pyrodash select --min-accuracy 0.98`, the demo's)"),
    ("docs/your-models.md", "98%", "the pick's criterion (`pyrodash select --min-accuracy 0.98`, the demo's)"),
    ("docs/your-models.md", "0.2", "`curate.val_share`'s default"),
    ("docs/your-models.md", "0.90", "the paper's price sheet: LLM input, USD per million tokens"),
    ("docs/your-models.md", "2.86", "the paper's price sheet: LLM output, USD per million tokens"),
    ("docs/results.md", "98%", "the pick's criterion (`--min-accuracy 0.98`) and the bars' (`BARS`, turn_tables.py)"),
    ("docs/results.md", "0.10", "the conversation bar's cost margin over the oracle (`scripts/turn_tables.py`)"),
    ("docs/results.md", "90%", "the conversation bar's share of the LLM's own-history accuracy (turn_tables.py)"),
    ("docs/results.md", "0.56", "the conversation bar's single-question cost cap (`scripts/turn_tables.py`)"),
    ("docs/evaluation.md", "20%", "`--val-share 0.2`, the option's value as a share"),
    ("docs/providers.md", "1.0", "`top_p`'s neutral value, an API constant"),
    ("docs/internals.md", "1.0", "`top_p`'s neutral value and RoPE's unit scaling, constants"),
]

# pages with hand-written measurements still to be rendered from docs/results/ or removed (expected to fail)
TO_RENDER: dict[str, str] = {}


def pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def prose(text: str) -> str:
    """`text` with the spans that may hold numbers blanked out (each kept as many newlines, so lines stay lines)."""
    for span in SPANS:
        text = span.sub(lambda m: "\n" * m.group(0).count("\n") + " ", text)
    return text


def measurements(text: str, page: str = "") -> list[tuple[int, str]]:
    """(line, words) of every measurement-like number outside the allowed spans and the allow-list."""
    allowed = {words for p, words, _ in ALLOWED if p == page}
    out = []
    for n, line in enumerate(prose(text).splitlines(), 1):
        out += [(n, m.group(0)) for m in MEASURE.finditer(line) if m.group(0).strip() not in allowed]
    return out


def _rel(path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize(
    "path",
    [
        pytest.param(p, marks=pytest.mark.xfail(reason=TO_RENDER[_rel(p)], strict=True)) if _rel(p) in TO_RENDER else p
        for p in pages()
    ],
    ids=_rel,
)
def test_no_measurement_outside_a_rendered_span(path):
    found = [f"{_rel(path)}:{n}: {w!r}" for n, w in measurements(path.read_text(), _rel(path))]
    assert not found, "render it from docs/results/ (scripts/render_docs.py) or say what it shows:\n" + "\n".join(found)


def test_the_lists_name_pages_that_exist():
    names = {_rel(p) for p in pages()}
    assert set(TO_RENDER) <= names and {p for p, _, _ in ALLOWED} <= names
    assert all(why for _, _, why in ALLOWED) and len(ALLOWED) <= 20


@pytest.mark.parametrize(
    "text",
    [
        "the table: 76.67% at 0.095",
        "world pretraining takes 170 s",
        "from scratch ~3.5 min",
        "handoff time 1.11-1.22 ms",
        "turn 2 −0.011 points",
        "one-thread seconds 960 -> 818",
        "about 50 GPU-hours",
        "a 2× speed-up",
        "$8,907 a day",
    ],
)
def test_a_hand_written_measurement_is_caught(text):
    assert measurements(text), text


@pytest.mark.parametrize(
    "text",
    [
        "<!-- rendered: table quick-seed0 -->| 100.00 / 0.496 |<!-- /rendered -->",
        "<!-- estimate: arithmetic -->about $3,400<!-- /estimate -->",
        "torch 2.13.0 on Qwen3.5-4B and GLM-5.2-FP8",
        "`offload_bias: 0.5` and `--min-accuracy 0.98`",
        "```bash\npyrodash train stage3 --lambdas 0.05,0.6,2\n```",
        "5 tiers × 30 problems, seed 0, 150 questions",
        "[a link](results.md#quick-demo-three-seeds)",
    ],
)
def test_what_is_not_a_hand_written_measurement_passes(text):
    assert measurements(text) == [], measurements(text)
