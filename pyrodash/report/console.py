"""The console tables `pyrodash eval`, `pyrodash report` and `pyrodash demo` print from a run's summary.json:
Table 2 and the conversations per turn (gold and own history)."""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.eval.names import is_lambda_point


def print_table2(run_dir: str | Path, console) -> None:
    """The headline table (Table 2) from RUN_DIR/summary.json."""
    from rich.table import Table

    summary = json.loads((Path(run_dir) / "summary.json").read_text())["methods"]
    t = Table(title="Table 2 (from stored records)")
    for col in ("Method", "Avg. Acc. (%)", "LLM Token Ratio (%)", "Avg. LLM Calls", "Cost ($)", "Cost / LLM"):
        t.add_column(col, justify="left" if col == "Method" else "right", no_wrap=col == "Method")
    for name, m in summary.items():
        norm = m.get("cost_normalized")
        t.add_row(
            name,
            f"{100 * m['accuracy']:.2f}",
            f"{100 * m['llm_token_ratio']:.2f}",
            f"{m['llm_calls']:.3f}",
            f"{m['cost_usd']:.6f}",
            "--" if norm is None else f"{norm:.4f}",
        )
    console.print(t)


def print_turns(run_dir: str | Path, console, methods: tuple[str, ...] = ("slm", "llm", "oracle")) -> None:
    """Conversations per turn (from RUN_DIR/summary.json), one table per conversation benchmark (gold history, then
    own history: `world:multiturn`, `world:multiturn-self`): accuracy / cost over the LLM-only cost of the same turn
    of `methods` and every PyroDash λ, then each turn's PyroDash points on / off the per-turn Pareto frontier."""
    from rich.table import Table

    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    by_bench = summary.get("per_turn_by_benchmark")
    if by_bench is None and summary.get("per_turn"):  # a summary written before own-history benchmarks
        by_bench = {"conversations": summary["per_turn"]}
    for bench, per_turn in (by_bench or {}).items():
        names = [n for n in per_turn if n in methods or is_lambda_point(n)]
        if not names:
            continue
        own = bench.endswith("-self")
        console.print(
            f"Conversations, {'own' if own else 'gold'} history ({bench}): accuracy / cost ÷ LLM-only "
            "(the method's $ over the LLM's on the same turn), by turn",
            style="bold",
            markup=False,
        )
        t = Table()
        turns = sorted({int(k) for n in names for k in per_turn[n]})
        t.add_column("Method", no_wrap=True)
        for k in turns:
            t.add_column(f"turn {k}", justify="right")
        for n in names:
            cells = []
            for k in turns:
                v = per_turn[n].get(str(k)) or per_turn[n].get(k)
                norm = None if v is None else v.get("cost_normalized")
                cells.append(
                    "--" if v is None else f"{100 * v['accuracy']:.0f}% / " + ("--" if norm is None else f"{norm:.3f}")
                )
            t.add_row(n, *cells)
        console.print(t)
        for k, v in ((summary.get("turn_pareto") or {}).get(bench) or {}).items():
            pts = {n: p for n, p in v["points"].items() if n in names}
            if not pts:
                continue
            on = [n for n, p in pts.items() if p["on_frontier"]]
            off = [f"{n} (by {', '.join(p['dominated_by'])})" for n, p in pts.items() if not p["on_frontier"]]
            console.print(
                f"turn {k}: on the frontier: {', '.join(on) or 'none'}"
                + (f"; dominated: {'; '.join(off)}" if off else ""),
                markup=False,
            )


def print_picked(run_dir: str | Path, console) -> None:
    """The operating points picked on val (summary.json `selection`, `pyrodash.report.select`): per kind the criterion,
    the point, its val figures and its test figures."""
    selection = json.loads((Path(run_dir) / "summary.json").read_text()).get("selection") or {}
    for kind, sel in selection.items():
        v, t = sel["val"], sel.get("test") or {}
        fell_back = "" if sel["met"] else " (none met it: the fallback)"
        test = f"{100 * t['accuracy']:.2f}% at {t['cost_normalized']:.3f}" if t else "not evaluated"
        console.print(
            f"Picked on val ({'relay' if kind == 'relay' else 'single handoff'}): {sel['picked']} by "
            f"{sel['criterion']['text']}{fell_back}: val {100 * v['accuracy']:.2f}% at {v['cost_normalized']:.3f} of "
            f"LLM-only; test {test}",
            style="bold",
            markup=False,
        )
