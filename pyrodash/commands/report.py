"""`pyrodash report RUN_DIR [--prices SHEET]`: report.md, summary.json and pareto.png from stored records only.

pyrodash report runs/demo --prices cached

"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyrodash.cost import Prices
from pyrodash.report.render import write_report


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
        console.print(
            f"duplicate records ignored (last line per (benchmark, id, sample) kept): {dups}",
            style="yellow",
            markup=False,
        )
    console.print(f"report: [bold]{path}[/]  (summary.json, pareto.png beside it)")
    return 0
