"""`pyrodash eval --config CFG [--run-dir DIR] [--limit N]`: methods x benchmarks into RUN_DIR/records/*.jsonl
(resumable: re-run the same command after an interruption), then the summary table from the stored records.

    pyrodash eval --config configs/eval/world-quick.yaml
"""

from __future__ import annotations

import argparse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="eval YAML (see configs/eval/)")
    p.add_argument("--run-dir", default=None, help="override run_dir of the config")
    p.add_argument("--limit", type=int, default=None, help="override limit (examples per benchmark)")
    p.add_argument("--no-report", action="store_true", help="do not write report.md / summary.json afterwards")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from pyrodash.evaluate import EvalConfig, evaluate
    from pyrodash.report import write_report

    cfg = EvalConfig.from_yaml(args.config, run_dir=args.run_dir, limit=args.limit)
    run_dir = evaluate(cfg)
    console = Console()
    console.print(f"records: [bold]{run_dir / 'records'}[/]")
    if not args.no_report:
        from pyrodash.commands.demo import print_table2

        path = write_report(run_dir)
        print_table2(run_dir, console)
        console.print(f"report: [bold]{path}[/]")
    return 0
