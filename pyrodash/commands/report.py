"""`pyrodash report RUN_DIR [--prices SHEET]`: report.md, summary.json and pareto.png from stored records only.

    pyrodash report runs/demo --prices cached

Also the console tables `pyrodash eval` and `pyrodash demo` print from a run's summary.json (`print_table2`,
`print_turns`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyrodash.cost import Prices
from pyrodash.report import write_report


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a run directory written by `pyrodash eval` (holds records/*.jsonl)")
    p.add_argument("--prices", default=None, help="re-price under this sheet (YAML path or configs/prices/ name)")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    prices = Prices.from_yaml(args.prices) if args.prices else None
    path = write_report(args.run_dir, prices)
    console = Console()
    dups = json.loads((Path(args.run_dir) / "summary.json").read_text()).get("duplicates_dropped")
    if dups:
        console.print(f"duplicate records ignored (last line per (benchmark, id, sample) kept): {dups}",
                      style="yellow", markup=False)
    console.print(f"report: [bold]{path}[/]  (summary.json, pareto.png beside it)")
    return 0


def print_table2(run_dir: str | Path, console) -> None:
    """The headline table (Table 2) from RUN_DIR/summary.json."""
    from rich.table import Table

    summary = json.loads((Path(run_dir) / "summary.json").read_text())["methods"]
    t = Table(title="Table 2 (from stored records)")
    for col in ("Method", "Avg. Acc. (%)", "LLM Token Ratio (%)", "Avg. LLM Calls", "Cost ($)", "Cost / LLM"):
        t.add_column(col, justify="left" if col == "Method" else "right", no_wrap=col == "Method")
    for name, m in summary.items():
        norm = m.get("cost_normalized")
        t.add_row(name, f"{100 * m['accuracy']:.2f}", f"{100 * m['llm_token_ratio']:.2f}", f"{m['llm_calls']:.3f}",
                  f"{m['cost_usd']:.6f}", "--" if norm is None else f"{norm:.4f}")
    console.print(t)


def print_turns(run_dir: str | Path, console, methods: tuple[str, ...] = ("slm", "llm")) -> None:
    """Conversations per turn (from RUN_DIR/summary.json): accuracy, LLM calls and $ per example of the SLM, the
    LLM and every PyroDash λ."""
    from rich.table import Table

    per_turn = json.loads((Path(run_dir) / "summary.json").read_text()).get("per_turn") or {}
    names = [n for n in per_turn if n in methods or (n.startswith("pyrodash@") and "+" not in n)]
    if not names:
        return
    t = Table(title="Conversations: accuracy / LLM calls / $ per example, by turn")
    turns = sorted({int(k) for n in names for k in per_turn[n]})
    t.add_column("Method", no_wrap=True)
    for k in turns:
        t.add_column(f"turn {k}", justify="right")
    for n in names:
        cells = []
        for k in turns:
            v = per_turn[n].get(str(k)) or per_turn[n].get(k)
            cells.append("--" if v is None else f"{100 * v['accuracy']:.0f}% / {v['llm_calls']:.2f} / "
                                                 f"{v['cost_usd']:.2e}")
        t.add_row(n, *cells)
    console.print(t)
