"""`report.md`, `summary.json` and `pareto.png` of a run, recomputed from its stored records only.

    pyrodash report RUN_DIR [--prices SHEET]

The header names the platform the records were made on (`pyrodash.report.platform`; summary.json `platform`).
Method names: `slm`, `slm+sft`, `llm`, `oracle`, `routellm@<α>`, `glimprouter@<τ>`, `pyrodash@<λ>`,
`pyrodash@<λ>+bias<b>`, `pyrodash@<λ>+share<s>` (`pyrodash.eval.names`). Conversation turns (`meta.turn`) get their
own section (`pyrodash.report.turns`); Tables 1-4 cover single questions.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.backends.answer_store import answers_sentence, run_answer_counts
from pyrodash.cost import PRICES_DIR, Prices
from pyrodash.eval.names import lambda_points, parse_method
from pyrodash.record import usage_of
from pyrodash.report.load import load_run, run_prices, single_turn
from pyrodash.report.markdown import fence, md_table
from pyrodash.report.metrics import Metrics, all_metrics, case_studies, summary_dict, trigger_positions
from pyrodash.report.platform import platform_line, run_platform
from pyrodash.report.plots import pareto_png
from pyrodash.report.select import picked_section, selection_summary
from pyrodash.report.tables import (
    mesh_table,
    oracle_distance,
    pareto_verdict,
    table1,
    table2,
    table3,
    table4,
    verdict_sentence,
)
from pyrodash.report.turns import (
    conversation_sections,
    gold_history_turns,
    per_turn_by_benchmark,
    range_section,
    turn_pareto,
)
from pyrodash.world.shipped import models_source


def world_line(run_dir: Path) -> list[str]:
    """The run's world and where its base models come from (`models_source` of its world.json), when the run names
    one."""
    try:
        world = json.loads((run_dir / "config.resolved.json").read_text()).get("world_dir")
        info = json.loads((Path(world) / "world.json").read_text()) if world else None
    except (OSError, ValueError, TypeError):
        return []
    if not info:
        return []
    return [
        f"World: `{world}` (seed {info.get('seed')}, config hash {info.get('config_hash')}); models: "
        f"{models_source(info)}.",
        "",
    ]


def baseline_notes(run_dir: Path, runs: dict[str, list[dict]]) -> list[str]:
    """RouteLLM-MF's router (labels, fit, α) and the realised LLM shares / steps of both routing baselines."""
    lines = []
    rj = run_dir / "routellm" / "router.json"
    if rj.exists():
        meta = json.loads(rj.read_text())
        keep = ("pool", "slm_acc", "llm_acc", "n_labels", "n_llm_wins", "train_acc", "train_loss", "dim", "spec")
        lines.append("- RouteLLM-MF router: " + ", ".join(f"{k}={meta[k]}" for k in keep if k in meta))
    aj = run_dir / "routellm" / "alphas.json"
    if aj.exists():
        a = json.loads(aj.read_text())
        lines.append(
            f"- RouteLLM-MF α: {a.get('alphas')} (calibrated to target LLM shares {a.get('shares')} on the "
            "training pool)"
        )
    gj = run_dir / "glimprouter" / "taus.json"
    if gj.exists():
        g = json.loads(gj.read_text())
        lines.append(
            f"- GlimpRouter τ calibrated to step shares {g['spec']['step_shares']}: {g['taus']} (SLM "
            f"first-token entropy quantiles over {g['n_steps']} training-pool steps: "
            f"{g['entropy_quantiles']})"
        )
    for n, rs in runs.items():
        fam = parse_method(n)[0]
        if fam == "routellm":
            share = sum(r.get("route") == "llm" for r in rs) / len(rs)
            lines.append(f"- {n}: {100 * share:.1f}% of queries routed to the LLM")
        elif fam == "glimprouter":
            steps = sum(len(r.get("entropies") or []) for r in rs)
            lines.append(
                f"- {n}: {sum(r['llm_calls'] for r in rs)} LLM-written steps of {steps} steps "
                f"({sum(1 for r in rs if r['llm_calls'])}/{len(rs)} queries used the LLM)"
            )
    return lines or ["(no routing baselines in this run)"]


def _header(run_dir: Path, prices: Prices, duplicates: dict[str, int], platform: dict) -> list[str]:
    """The title, the price sheet, the platform, the run's world and the duplicate lines dropped."""
    out = [
        f"# PyroDash evaluation report: `{run_dir.name}`",
        "",
        f"Prices (USD per million tokens): {prices.to_dict()}. Every number below is recomputed from "
        f"`records/*.jsonl`.",
        "",
        platform_line(platform),
        "",
    ] + world_line(run_dir)
    if duplicates:
        out += [
            "Duplicate records ignored (the last line per (benchmark, id, sample) is kept): "
            + ", ".join(f"{n}: {k}" for n, k in duplicates.items())
            + ".",
            "",
        ]
    return out


def _paper_tables(ms: dict[str, Metrics], prices: Prices) -> list[str]:
    """Tables 1-4 of the single questions (Table 4 for the largest λ)."""
    lam_names = lambda_points(ms)
    out = ["## Table 1: per-benchmark accuracy", ""] + table1(ms)
    out += ["", "## Table 2: averages and dollars", ""] + table2(ms)
    out += ["", "## Table 3: sensitivity to λ", ""] + (table3(ms) if lam_names else ["(no pyrodash@<λ> records)"])
    t4 = lam_names[-1] if lam_names else None
    out += ["", f"## Table 4: token usage and cost per benchmark (slm, {t4 or '--'}, llm)", ""]
    return out + table4(ms, prices, t4 or "")


def _mesh_section(all_runs: dict[str, list[dict]], prices: Prices) -> list[str]:
    """Each LLM endpoint's calls, tokens and dollars at its own price sheet."""
    return [
        "## LLM endpoints (mesh)",
        "",
        "Each endpoint's tokens at its own price sheet (`llm_endpoints` of the "
        "records); the totals above use these prices for mesh records.",
        "",
    ] + mesh_table(all_runs, prices)


def _trigger_section(runs: dict[str, list[dict]], ms: dict[str, Metrics]) -> list[str]:
    """Where the LLM first takes over, relative to the first step the SLM was not taught."""
    out = [
        "## Trigger positions",
        "",
        "Where the LLM first takes over, in steps (boundary `\\n\\n`), relative to the first step the SLM was not "
        "taught (`meta.hard_steps`).",
        "",
    ]
    rows = [
        [n] + list(trigger_positions(runs[n]).values())
        for n in ms
        if parse_method(n)[0] in ("pyrodash", "glimprouter", "oracle")
    ]
    return out + md_table(["Method", "before", "at", "after", "no hard step", "hard, no handoff", "handoffs"], rows)


def _case_studies_section(runs: dict[str, list[dict]]) -> list[str]:
    """The picked traces (`case_studies`): question, SLM prefix and LLM continuation (or the SLM-only answer)."""
    out = ["## Case studies", ""]
    for n, r in case_studies(runs):
        head = f"### {n} · {r['benchmark']} #{r['id']} · {'correct' if r.get('correct') else 'wrong'}"
        out += [head, "", "**Question**", ""] + fence(r.get("question", ""))
        slm = "".join(s["text"] for s in r.get("segments", []) if s["by"] == "slm")
        llm = "".join(s["text"] for s in r.get("segments", []) if s["by"] == "llm")
        if r.get("llm_calls"):
            out += ["", f"**SLM prefix** ({r.get('handoff')} tokens)", ""] + fence(slm)
            out += ["", "**⟨offload⟩ → LLM continuation**", ""] + fence(llm)
        else:
            out += ["", "**SLM-only answer (no LLM call)**", ""] + fence(slm or r.get("output", ""))
        out += ["", f"gold: `{r.get('gold')}` · usage: {usage_of(r).to_dict()}", ""]
    return out


def _repricing_section(ms: dict[str, Metrics], own: Prices, prices: Prices) -> list[str]:
    """Each method's total dollars under the run's sheet, the report's and every shipped sheet."""
    sheets = {"run": own, "report": prices}
    sheets.update({p.stem: Prices.from_yaml(p) for p in sorted(PRICES_DIR.glob("*.yaml"))})
    out = ["## Re-pricing (total $ under each sheet)", ""]
    return out + md_table(
        ["Method"] + list(sheets), [[n] + [f"{m.usage.cost(s):.6f}" for s in sheets.values()] for n, m in ms.items()]
    )


def _summary(ms: dict[str, Metrics], all_runs: dict[str, list[dict]], prices: Prices, duplicates: dict) -> dict:
    """summary.json: the methods' metrics, the conversation turns and their Pareto verdict, the duplicates dropped
    (the selection, picked on val, is added by `render`)."""
    summary = summary_dict(ms, prices)
    turns = gold_history_turns(all_runs, prices)
    if turns:  # the gold-history turns, as before own-history benchmarks (tests/test_demo.py reads it)
        summary["per_turn"] = turns
    by_bench = per_turn_by_benchmark(all_runs, prices)
    if by_bench:
        summary["per_turn_by_benchmark"] = by_bench
        summary["turn_pareto"] = {b: turn_pareto(pt) for b, pt in by_bench.items()}
    if duplicates:
        summary["duplicates_dropped"] = duplicates
    return summary


def render(run_dir: str | Path, prices: Prices | None = None) -> tuple[str, dict, dict[str, Metrics]]:
    """(markdown, summary dict, metrics) of a run; `prices` re-prices it (default: the run's own sheet)."""
    run_dir = Path(run_dir)
    duplicates: dict[str, int] = {}
    all_runs = load_run(run_dir, duplicates)
    runs = single_turn(all_runs)
    own = run_prices(run_dir)
    prices = prices or own
    ms = all_metrics(runs, prices)
    platform = run_platform(run_dir)
    selection = selection_summary(run_dir, prices)
    out = _header(run_dir, prices, duplicates, platform)
    answers = run_answer_counts(run_dir)  # (pyrodash.backends.answer_store)
    out += [answers_sentence(answers), ""] if answers["served"] or answers["generated"] else []
    out += ["## Picked on val", ""] + picked_section(selection) if selection else []
    out += _paper_tables(ms, prices)
    out += ["", "## Pareto verdict", "", verdict_sentence(ms), ""] + pareto_verdict(ms) + ["", "![Pareto](pareto.png)"]
    out += ["", "## Distance to the oracle single handoff", ""] + oracle_distance(ms)
    out += ["", "## Baselines as run", ""] + baseline_notes(run_dir, runs)
    out += ["", "## Conversations: per turn", ""] + conversation_sections(all_runs, prices) + range_section(run_dir)
    out += [""] + _mesh_section(all_runs, prices) + [""] + _trigger_section(runs, ms)
    out += [""] + _case_studies_section(runs) + [""] + _repricing_section(ms, own, prices)
    summary = {**_summary(ms, all_runs, prices, duplicates), "platform": platform, "answers": answers}
    return "\n".join(out) + "\n", summary | ({"selection": selection} if selection else {}), ms


def write_report(run_dir: str | Path, prices: Prices | None = None) -> Path:
    """Write `report.md`, `summary.json` and `pareto.png` into `run_dir`; returns the report path."""
    run_dir = Path(run_dir)
    md, summary, ms = render(run_dir, prices)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    picked = {k: s["picked"] for k, s in (summary.get("selection") or {}).items() if s.get("test_run") == "."}
    pareto_png(ms, run_dir / "pareto.png", picked)
    (run_dir / "report.md").write_text(md)
    return run_dir / "report.md"
