"""The paper's open ablation: Stage 3 with the normalized cost penalty (R_eff = Cost_act / Cost_base, eq:grpo-eff)
against the direct one (R_eff = Cost_act in dollars), at λ values giving matched LLM-call rates.

    .venv/bin/python benchmarks/cost_penalty_ablation.py --run runs/demo-quick [--scales 1]
    .venv/bin/python benchmarks/cost_penalty_ablation.py --run RUN --points 1 --limit 2 --max-steps 2   # smoke run

Needs a finished `pyrodash demo --quick` run. Each normalized λ maps to the direct λ = λ / mean(Cost_base) (x each
`--scales` factor); each direct policy is trained from the run's Stage 2 with the same recipe into
RUN/ablation-direct/ and evaluated on the run's benchmarks (the LLM's records reused). Per normalized point: the
direct point with the closest LLM-call rate, and the direct curve's accuracy interpolated at that rate (None
outside its range); printed and written to RUN/cost_penalty.json. The last line starts `matched: normalized λ`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyrodash.eval.harness import EvalConfig, evaluate  # noqa: E402
from pyrodash.eval.names import lambda_points, parse_method  # noqa: E402
from pyrodash.jobs.library_log import library_log  # noqa: E402
from pyrodash.report.load import load_run, run_prices, single_turn  # noqa: E402
from pyrodash.report.metrics import all_metrics  # noqa: E402
from pyrodash.report.turns import per_turn_by_benchmark  # noqa: E402
from pyrodash.train.config import load_recipe  # noqa: E402
from pyrodash.train.paths import stage_dir  # noqa: E402
from pyrodash.train.stage3 import run_stage3  # noqa: E402


def points(run: Path) -> dict[str, dict]:
    """{method: {accuracy, llm_calls, cost, turns_self: {turn: accuracy}}} of every pyrodash@λ of an eval run."""
    runs = load_run(run)
    prices = run_prices(run)
    ms = all_metrics(single_turn(runs), prices)
    pt = per_turn_by_benchmark(runs, prices).get("world:multiturn-self", {})
    return {
        name: {
            "lambda": parse_method(name)[1],
            "accuracy": ms[name].accuracy,
            "llm_calls": ms[name].llm_calls,
            "cost": ms[name].cost_normalized,
            "turns_self": {str(t): v["accuracy"] for t, v in (pt.get(name) or {}).items()},
        }
        for name in lambda_points(ms)
    }


def interpolate(direct: list[dict], calls: float) -> float | None:
    """The direct curve's accuracy at an LLM-call rate (piecewise linear; None outside its range)."""
    pts = sorted((p["llm_calls"], p["accuracy"]) for p in direct)
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= calls <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (calls - x0) / (x1 - x0)
    return None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", required=True, help="a finished `pyrodash demo --quick` run directory")
    ap.add_argument("--scales", default="1", help="factors on λ / mean(Cost_base) for the direct λ sweep")
    ap.add_argument("--recipe", default=str(ROOT / "configs" / "world" / "quick.yaml"))
    ap.add_argument("--eval-config", default=str(ROOT / "configs" / "eval" / "world-quick.yaml"))
    ap.add_argument("--points", type=int, default=None, help="only the run's first N normalized λ (default: all)")
    ap.add_argument("--limit", type=int, default=None, help="examples per benchmark (and Stage 3's held-out rows)")
    ap.add_argument("--max-steps", type=int, default=None, help="Stage 3 steps of each direct policy (the recipe's)")
    return ap.parse_args(argv)


def direct_lambdas(run: Path, normalized: dict, scales: list[float]) -> tuple[float, list[float]]:
    """(mean Cost_base over the Stage 3 prompts, the direct λ of every normalized point x every scale)."""
    base = [e["cost_base"] for e in json.loads((run / "cost_base.json").read_text()).values()]
    mean_base = sum(base) / len(base)
    return mean_base, sorted({round(p["lambda"] / mean_base * s, 1) for p in normalized.values() for s in scales})


def train_and_eval_direct(args: argparse.Namespace, run: Path, lambdas: list[float]) -> Path:
    """Each direct policy trained from the run's Stage 2 into RUN/ablation-direct/, then evaluated there."""
    evalcfg = json.loads((run / "config.resolved.json").read_text())
    world = evalcfg["world_dir"]
    abl = run / "ablation-direct"
    abl.mkdir(exist_ok=True)
    # what Stage 3 reads beside its checkpoint: the curated held-out set and the cached Cost_base (no LLM re-run)
    if not (abl / "curated").exists():
        shutil.copytree(run / "curated", abl / "curated")
        if args.limit is not None:  # Stage 3's own held-out check, cut like the eval
            held = abl / "curated" / "heldout.jsonl"
            held.write_text("".join(held.read_text().splitlines(keepends=True)[: args.limit]))
    shutil.copy(run / "cost_base.json", abl / "cost_base.json")
    overrides = {"world": {"dir": world}, "stage3.cost_penalty": "direct"}
    if args.max_steps is not None:
        overrides["stage3.max_steps"] = args.max_steps
    with library_log(abl / "libraries.log"):
        recipe = load_recipe(args.recipe, overrides)
        for lam in lambdas:
            if not (stage_dir(abl, "stage3", lam) / "config.resolved.json").exists():
                print(f"Stage 3, direct cost penalty, λ={lam:g}", flush=True)
                run_stage3(recipe, abl, lam=lam, stage2=run / "stage2")
        (abl / "records").mkdir(exist_ok=True)
        shutil.copy(run / "records" / "llm.jsonl", abl / "records" / "llm.jsonl")  # the LLM-only cost, reused
        cfg = EvalConfig.from_yaml(
            args.eval_config,
            run_dir=str(abl),
            world_dir=world,
            benchmarks=evalcfg["benchmarks"],
            methods=["llm", "pyrodash"],
            limit=args.limit,
            models={
                **{k: evalcfg["models"][k] for k in ("slm", "llm")},
                "pyrodash": {lam: str(stage_dir(abl, "stage3", lam)) for lam in lambdas},
            },
        )
        evaluate(cfg)
    return abl


def matched(normalized: dict, direct: dict) -> list[dict]:
    """Per normalized point: the direct point with the closest LLM-call rate, and the direct curve at that rate."""
    rows = []
    for name, p in sorted(normalized.items(), key=lambda kv: kv[1]["llm_calls"]):
        near = min(direct.values(), key=lambda d: abs(d["llm_calls"] - p["llm_calls"]))
        at = interpolate(list(direct.values()), p["llm_calls"])
        rows.append({"normalized": {"method": name, **p}, "direct_nearest": near, "direct_accuracy_at_same_calls": at})
    return rows


def print_points(normalized: dict, direct: dict, rows: list[dict]) -> None:
    print(f"{'point':<28}{'acc':>7}{'calls':>7}{'cost':>7}  turns 1/2/3 (own history)")
    for tag, pts in (("normalized", normalized), ("direct", direct)):
        for name, p in sorted(pts.items(), key=lambda kv: kv[1]["llm_calls"]):
            turns = "/".join(f"{100 * p['turns_self'].get(str(t), float('nan')):.0f}" for t in (1, 2, 3))
            cells = f"{100 * p['accuracy']:>6.1f}%{p['llm_calls']:>7.2f}{p['cost']:>7.3f}"
            print(f"{tag + ' ' + name:<28}{cells}  {turns}")
    for r in rows:
        n, d, at = r["normalized"], r["direct_nearest"], r["direct_accuracy_at_same_calls"]
        at_s = "n/a (outside the direct points)" if at is None else f"{100 * at:.1f}%"
        print(
            f"matched: normalized λ {n['lambda']:g} ({100 * n['accuracy']:.1f}% at {n['llm_calls']:.2f} calls) vs "
            f"direct λ {d['lambda']:g} ({100 * d['accuracy']:.1f}% at {d['llm_calls']:.2f}); direct curve at the "
            f"same calls: {at_s}"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run = Path(args.run)
    if not (run / "config.resolved.json").is_file() or not (run / "cost_base.json").is_file():
        print(
            f"{run}: not a finished demo run (no config.resolved.json / cost_base.json); run `pyrodash demo "
            "--quick --out DIR` first",
            file=sys.stderr,
        )
        return 2
    normalized = points(run)
    if not normalized:
        print(f"{run}: no pyrodash@λ records to compare with", file=sys.stderr)
        return 2
    if args.points is not None:
        normalized = dict(sorted(normalized.items(), key=lambda kv: kv[1]["lambda"])[: args.points])
    scales = [float(x) for x in args.scales.split(",")]
    mean_base, lambdas = direct_lambdas(run, normalized, scales)
    direct = points(train_and_eval_direct(args, run, lambdas))
    rows = matched(normalized, direct)
    out = {"run": str(run), "mean_cost_base_usd": mean_base, "direct_lambdas": lambdas}
    out |= {"normalized": normalized, "direct": direct, "matched": rows}
    (run / "cost_penalty.json").write_text(json.dumps(out, indent=1))
    print(f"mean Cost_base {mean_base:.3e} $; direct λ = normalized λ / mean Cost_base x {scales}")
    print_points(normalized, direct, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
