"""`pyrodash select RUN`: pick the operating point to serve on the run's validation evaluation, and write it into a
serve config.

    pyrodash select runs/demo-quick --min-accuracy 0.98 --out serve.yaml   # cheapest point at >= 98% on val
    pyrodash select runs/demo-quick --max-cost 0.5                         # most accurate at <= 0.5 of LLM-only
    pyrodash select runs/demo-quick --budget-usd-per-question 2e-4 --relay # among the relay points

The candidates are RUN's PyroDash points (λ, offload_bias, handoff_share, relay calls) evaluated on a validation
split in RUN/val (`--relay`: among the relay points there; `--val DIR` names another): the demo writes them, or
`pyrodash eval` with that run_dir and a validation benchmark. The pick is recorded in RUN/selection.json, so
`pyrodash report RUN` shows it under "Picked on val" with its test figures (`pyrodash.report.select`). `--out FILE`
writes the point as the first (default) model of a serve config's `operating_points`, with the policy checkpoint as
its `slm`; an existing FILE keeps its other keys and points.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from pyrodash.report.select import Candidate, Criterion, figures_on_test, select_run
from pyrodash.server.config import ServeConfig


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="the run directory (its test evaluation; its validation one in RUN/val)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--min-accuracy", type=float, help="the cheapest point at or above this accuracy (0-1), on val")
    how.add_argument("--max-cost", type=float, help="the most accurate point at or below this cost / LLM-only")
    how.add_argument(
        "--budget-usd-per-question", type=float, help="the most accurate point at or below this many $ per question"
    )
    p.add_argument(
        "--relay",
        action="store_true",
        help="pick among the relay points (several LLM calls per answer) instead of the single-handoff ones",
    )
    p.add_argument("--val", default=None, help="the validation evaluation to pick on (default RUN/val)")
    p.add_argument("--out", default=None, help="a serve config to write the picked point into (created or updated)")
    p.add_argument("--name", default="pyrodash", help="the model name the point is served as (default pyrodash)")


def criterion_of(args: argparse.Namespace) -> Criterion:
    """The criterion the flags give (default: --min-accuracy 0.98)."""
    for kind in ("min_accuracy", "max_cost", "budget_usd_per_question"):
        if getattr(args, kind) is not None:
            return Criterion(kind, getattr(args, kind))
    return Criterion("min_accuracy", 0.98)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    run_dir = Path(args.run)
    if not run_dir.is_dir():
        raise ValueError(
            f"{run_dir}: no such run directory; give the directory `pyrodash demo` or `pyrodash eval` wrote"
        )
    sel = select_run(run_dir, criterion_of(args), relay=args.relay, val=args.val)
    print_candidates(sel, console)
    test = figures_on_test(run_dir, sel)
    if test:
        console.print(
            f"on test ({', '.join(test['split'])}): {100 * test['accuracy']:.2f}% at {test['cost_normalized']:.3f} of "
            "LLM-only (read after the pick; it decides nothing)",
            markup=False,
        )
    console.print(f'recorded in {run_dir / "selection.json"} (`pyrodash report {run_dir}`: "Picked on val")')
    if args.out:
        write_serve_config(Path(args.out), sel, run_dir, args.name)
        console.print(f"wrote {args.out}: model {args.name!r} = {json.dumps(sel['operating_point'])}")
    return 0


def print_candidates(sel: dict, console) -> None:
    """The candidates on val, the picked one marked, then the pick in one line."""
    from rich.table import Table

    t = Table(title=f"Candidates on val ({', '.join(sel['val_split'])}): {sel['criterion']['text']}")
    for col in ("Point", "Acc. (%)", "Cost / LLM", "$ / question", "LLM calls", "meets"):
        t.add_column(col, justify="left" if col == "Point" else "right", no_wrap=col == "Point")
    crit = Criterion(sel["criterion"]["kind"], sel["criterion"]["value"])
    for c in sel["candidates"]:
        cand = Candidate(**c)
        t.add_row(
            ("▶ " if c["name"] == sel["picked"] else "  ") + c["name"],
            f"{100 * c['accuracy']:.2f}",
            f"{c['cost_normalized']:.3f}",
            f"{c['usd_per_question']:.2e}",
            f"{c['llm_calls']:.3f}",
            "yes" if crit.meets(cand) else "no",
        )
    console.print(t)
    v = sel["val"]
    note = "" if sel["met"] else " (no point meets the criterion: the fallback)"
    console.print(
        f"picked {sel['picked']}{note}: {100 * v['accuracy']:.2f}% at {v['cost_normalized']:.3f} of LLM-only on val",
        markup=False,
    )


def write_serve_config(path: Path, sel: dict, run_dir: Path, name: str) -> None:
    """The picked point as `name`, first in `operating_points` of `path` (created from the run's models and sheet, or
    updated: its own keys, e.g. `budgets:`, stay; the run's fill what it lacks), its val figures in the comment above;
    the result must load as `pyrodash serve` loads it."""
    resolved_path = run_dir / sel["test_run"] / "config.resolved.json"
    if not resolved_path.is_file():
        raise ValueError(f"{resolved_path} is missing: the run's models are named there; re-run `pyrodash eval` for it")
    resolved = json.loads(resolved_path.read_text())
    v, models = sel["val"], resolved.get("models") or {}
    policy = models.get("pyrodash") or {}
    slm = (
        policy.get(str(v["lam"]))
        or policy.get(f"{v['lam']:g}")
        or next((p for k, p in policy.items() if float(k) == v["lam"]), None)
    )
    if slm is None:
        raise ValueError(f"{run_dir}: its config.resolved.json names no checkpoint for λ {v['lam']:g}; re-run eval")
    data = yaml.safe_load(path.read_text()) if path.is_file() else None
    run = {"llm": models.get("llm")} | {k: resolved.get(k) for k in ("prices", "prompts")}
    data = run | (data if isinstance(data, dict) else {})  # a file's own keys (its budgets, its LLM) stay
    data["slm"] = slm
    data["operating_points"] = {name: sel["operating_point"]} | {
        k: p for k, p in (data.get("operating_points") or {}).items() if k != name
    }
    head = (
        f"# operating point {name!r}: {sel['picked']}, picked by `pyrodash select` ({sel['criterion']['text']}"
        f"{'' if sel['met'] else '; none met it, the fallback'}) on {', '.join(sel['val_split'])}: "
        f"{100 * v['accuracy']:.2f}% at {v['cost_normalized']:.3f} of LLM-only, ${v['usd_per_question']:.2e} per "
        f"question, {v['llm_calls']:.3f} LLM calls ({v['n']} questions)\n"
    )
    text = head + yaml.safe_dump(data, sort_keys=False, allow_unicode=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    try:
        ServeConfig.from_yaml(tmp)  # what `pyrodash serve --config` loads; a ValueError names what is wrong
    except (ValueError, TypeError) as e:
        tmp.unlink()
        raise ValueError(
            f"{path}: the config with the picked point does not load ({e}); fix that file or pick a new --out"
        ) from None
    tmp.replace(path)
