"""Every figure the docs quote from a run, and every reference page, is rendered from one source.

`scripts/render_docs.py` rewrites the spans `<!-- rendered: VIEW NAME -->...<!-- /rendered -->` in README.md and
docs/ from `docs/results/NAME.json`, and writes docs/reference/ from the code (the CLI's parsers, the config
dataclasses). Here it re-renders everything and fails on any difference: a page cannot quote a stale figure, a
flag or a key the code no longer has. The fix is always `python scripts/render_docs.py` (after `--store RUN_DIR
NAME` for a new run).
"""

from __future__ import annotations

import copy
import importlib.util
import json

import pytest
from doc_blocks import ROOT


@pytest.fixture(scope="module")
def render():
    spec = importlib.util.spec_from_file_location("render_docs", ROOT / "scripts" / "render_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_rendered_span_and_reference_page_is_current(render):
    stale = [
        str(p.relative_to(ROOT)) for p, text in render.targets().items() if not p.is_file() or p.read_text() != text
    ]
    assert not stale, f"{stale} differ from what they render to: run `python scripts/render_docs.py`"


def test_the_headline_figures_are_rendered_where_they_are_quoted(render):
    quoted = {p.relative_to(ROOT).as_posix() for p in render.doc_pages() if "<!-- rendered: table " in p.read_text()}
    assert {"README.md", "docs/results.md"} <= quoted, quoted


def test_every_stored_result_is_used_and_names_its_machine(render):
    used = {m.group(2) for p in render.doc_pages() for m in render.SPAN.finditer(p.read_text())}
    stored = {p.stem for p in (ROOT / "docs" / "results").glob("*.json")}
    assert used and used <= stored, used - stored
    for name in stored:
        res = json.loads((ROOT / "docs" / "results" / f"{name}.json").read_text())
        assert {"cpu", "cpu_capability", "torch"} <= set(res["platform"]), name
        assert render.machine(res) in render.demo_time(res) if res.get("times") else True


def test_a_changed_figure_changes_the_page(render, monkeypatch):
    """The spans are rendered from the store, not kept: one figure changed in the store changes the README."""
    res = copy.deepcopy(render.load("quick-seed0"))
    name = next(n for n in res["methods"] if n.startswith("pyrodash@"))
    res["methods"][name]["accuracy"] = 0.1234
    real = render.load
    monkeypatch.setattr(render, "load", lambda name: res if name == "quick-seed0" else real(name))
    assert "12.34" in render.render_text((ROOT / "README.md").read_text())


def test_store_keeps_a_runs_quoted_fields_and_platform(render, tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    method = {"accuracy": 0.5, "llm_token_ratio": 0.2, "llm_calls": 0.3, "cost_usd": 1.0, "cost_normalized": 0.4}
    summary = {
        "methods": {"slm": method, "llm": {**method, "cost_normalized": 1.0}},
        "platform": {"cpu": "X", "torch": "t", "cpu_capability": "AVX2"},
    }
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "demo_times.json").write_text(json.dumps({"world": 1.0, "training + evaluation (wall)": 60.0}))
    monkeypatch.setattr(render, "RESULTS", tmp_path)
    stored = json.loads(render.store(run, "x").read_text())
    assert stored["methods"]["slm"] == {
        k: method[k] for k in ("accuracy", "llm_token_ratio", "llm_calls", "cost_normalized")
    }
    assert stored["platform"]["cpu"] == "X" and stored["times"]["world"] == 1.0
    assert render.demo_time(stored).startswith("1.0 min on a ")


def test_the_per_turn_table_is_rendered_from_the_seeds_store(render, monkeypatch):
    """docs/results.md's conversations per turn come from the stored seeds run: one turn's figure changed there
    changes the page."""
    res = copy.deepcopy(render.load("quick-seeds"))
    seed = next(iter(res["turns"]))
    res["turns"][seed]["world:multiturn"]["slm"]["2"]["accuracy"] = 0.4321
    real = render.load
    monkeypatch.setattr(render, "load", lambda name: res if name == "quick-seeds" else real(name))
    page = (ROOT / "docs" / "results.md").read_text()
    assert "<!-- rendered: turns quick-seeds -->" in page and "| 43% at " not in page
    assert f"| {seed} | SLM alone | " in render.render_text(page) and "| 43% at " in render.render_text(page)


def test_the_sizing_table_is_the_pages_arithmetic_on_the_stored_rates(render):
    """docs/scaling.md's 1M-requests table: a rate of 0.922 calls per example gives the page's worked figures (SLM
    1,078 tokens, 12 CE processes, $8,907 + $94 a day); the LLM alone costs $11,575; the world's rows read the
    stored run's LLM calls, so another rate changes them."""
    res = {"methods": {"pyrodash@0.05": {"llm_calls": 0.922}}, "selection": {}}
    rows = {r.split(" | ")[0].lstrip("| "): r for r in render.sizing(res).splitlines()[2:]}
    assert rows["world, measured: full demo λ=0.05"].endswith(
        "| 0.922 | 1,078 | 228 ms | 12 (11.3) | 37,431 | 9 (8.1) | $8,907 | $94 | $9,000 |"
    )
    assert rows["LLM only (no SLM; 150 in, 4,000 out)"].endswith("| $11,575 | $0 | $11,575 |")
    res["methods"]["pyrodash@0.05"]["llm_calls"] = 0.5
    assert "| 0.5 | 1,500 |" in render.sizing(res)


def test_the_ablation_views_read_the_matched_points(render):
    """The cost-penalty ablation's table pairs each normalized point with its direct one, by normalized λ, and the
    sentence names the largest gaps among those pairs."""

    def point(lam, acc, calls, turn3):
        return {"lambda": lam, "accuracy": acc, "llm_calls": calls, "cost": calls / 2, "turn3_self": turn3}

    matched = [
        {"normalized": point(2.0, 0.90, 0.60, 0.80), "direct": point(3000, 0.93, 0.62, 0.70)},
        {"normalized": point(0.6, 0.99, 0.75, 0.95), "direct": point(950, 0.99, 0.75, None)},
    ]
    res = {"ablation": {"0": {"mean_cost_base_usd": 6e-4, "cost_base": {"cv": 0.2, "min": 4e-4, "max": 9e-4},
                              "matched": matched}}}  # fmt: skip
    rows = render.ablation(res).splitlines()[2:]
    assert rows == [
        "| 0 | 0.6 / 950 | 99.0 / 99.0 | 0.75 / 0.75 | 0.375 / 0.375 | 95 / -- |",
        "| 0 | 2 / 3000 | 90.0 / 93.0 | 0.60 / 0.62 | 0.300 / 0.310 | 80 / 70 |",
    ]
    gaps = render.ablation_gaps(res)
    assert "differ by at most 0.02" in gaps and "at most 3.0 points (seed 0, normalized λ 2)" in gaps
    assert "turn 3 by at most 10 points" in gaps and "variation of 0.20 to 0.20" in gaps


def test_the_seeds_verdict_names_misses_and_fallbacks(render):
    """The README's sentence over the seeds is the seeds table's: a pick that misses its bar is named as missing it, and
    a pick made with no candidate meeting the criterion on val is named as a fallback."""

    def row(seed, met, acc, cost=0.45):
        return {"seed": seed, "kind": "single", "picked": "pyrodash@0.6", "met": met, "accuracy": acc, "cost": cost,
                "oracle_accuracy": 1.0, "oracle_cost": 0.45}  # fmt: skip

    res = {"seeds": {"rows": [row(0, True, 1.0), row(1, False, 0.995), row(2, True, 0.9)]}}
    text = render.seeds_verdict(res)
    assert text.startswith("the single-handoff pick meets its bar on seeds 0 and 1 and misses it on seed 2"), text
    assert "(seed 1: a fallback" in text
    res["seeds"]["rows"] = [row(0, True, 1.0), row(1, True, 1.0)]
    assert render.seeds_verdict(res) == "the single-handoff pick meets its bar on seeds 0 and 1"
    assert render.bars(res).startswith("the single-handoff pick: within 1 point of the oracle")


def test_the_readme_defines_the_bar_it_uses_and_renders_the_seeds_verdict():
    readme = (ROOT / "README.md").read_text()
    assert "<!-- rendered: bars quick-seeds -->" in readme and "<!-- rendered: seeds-verdict quick-seeds -->" in readme
    assert readme.index("rendered: bars ") < readme.index("rendered: seeds-verdict ")


def test_the_relay_page_renders_its_rows_from_the_store(render, monkeypatch):
    """docs/relay.md's oracles and relay points are the stored quick run's, oracles first: a relay point's figure
    changed in the store changes the page, and a run without relay points is refused."""
    res = copy.deepcopy(render.load("quick-seed0"))
    relay = next(n for n in res["methods"] if "+relay" in n)
    res["methods"][relay]["accuracy"] = 0.4321
    real = render.load
    monkeypatch.setattr(render, "load", lambda name: res if name == "quick-seed0" else real(name))
    page = (ROOT / "docs" / "relay.md").read_text()
    assert "<!-- rendered: relay quick-seed0 -->" in page and f"| `{relay}` | 43.21 |" in render.render_text(page)
    rows = [r.split(" | ")[0].lstrip("| ") for r in render.relay(res).splitlines()[2:]]
    assert rows[:2] == ["oracle (single handoff)", "relay oracle"] and all("+relay" in r for r in rows[2:])
    with pytest.raises(SystemExit, match="no relay points"):
        render.relay({"methods": {"oracle": res["methods"]["oracle"]}})
