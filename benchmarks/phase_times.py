"""Wall time of the quick demo's two engine-heavy phases, this checkout against another one (e.g. the commit before a
refactor), measured A/B interleaved on the same trained run so background load hits both alike.

    python benchmarks/phase_times.py --base /path/to/other/checkout --run runs/demo-quick [--repeats 3] [--quick]

Per repeat and side (the order alternates): (1) evaluation: the demo's eval config, its single-question tiers and
conversations, methods slm, llm, oracle and PyroDash at the run's first λ, into a fresh run dir; (2) Stage 3: one λ
trained from the run's Stage 2 checkpoint, with its cached Cost_base. Prints each side's best time per phase and
the ratio this/base (< 1.05: the engine's one execution path costs the evaluation and Stage 3 no time). The trained
run comes from `pyrodash demo --quick`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent.parent


def _run(code_dir: Path, args: list[str], log: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(code_dir)}
    t0 = time.perf_counter()
    with log.open("a") as f:
        subprocess.run([sys.executable, "-m", "pyrodash", *args], cwd=code_dir, env=env, stdout=f, stderr=f, check=True)
    return time.perf_counter() - t0


def _eval_config(run: Path, tmp: Path, quick: bool) -> Path:
    """The demo's eval config at the run's first λ, into tmp/eval (the other checkout may predate `prices_sheet` and
    `answers`);
    `quick`: 2 examples of the first benchmark, the SLM and PyroDash only."""
    cfg = json.loads((run / "config.resolved.json").read_text())
    lam = sorted(cfg["models"]["pyrodash"], key=float)[0]
    methods = ["slm"] if quick else ["slm", "llm", "oracle"]
    # (not the run's answer store: the evaluation is measured decoding, in a store of its own under tmp/eval)
    ecfg = {k: v for k, v in cfg.items() if k not in ("prices_sheet", "answers")} | {
        "run_dir": str(tmp / "eval"),
        "prices": cfg.get("prices_sheet") or cfg["prices"],
        "methods": [*methods, {"pyrodash": {"lambdas": [float(lam)]}}],
        "benchmark_methods": {},
        "models": {**cfg["models"], "pyrodash": {float(lam): cfg["models"]["pyrodash"][lam]}},
    }
    if quick:
        ecfg |= {"benchmarks": cfg["benchmarks"][:1], "limit": 2}
    (tmp / "eval.yaml").write_text(yaml.safe_dump(ecfg))
    return tmp / "eval.yaml"


def _stage3_dir(code_dir: Path, run: Path, tmp: Path, quick: bool) -> tuple[Path, Path]:
    """(the Stage 3 run dir: the run's Stage 2, curated sets and Cost_base copied, the recipe); `quick`: 1 step and
    2 held-out rows."""
    out = tmp / "train"
    out.mkdir()
    for name in ("stage2", "curated", "cost_base.json", "cost_base.calls.jsonl"):
        src = run / name
        if src.is_dir():
            shutil.copytree(src, out / name)
        elif src.exists():
            shutil.copy(src, out / name)
    recipe = code_dir / "configs" / "world" / "quick.yaml"  # the cached quick world
    if quick:
        from pyrodash.train.config import load_yaml

        data = load_yaml(recipe.read_text())
        data["stage3"]["max_steps"] = 1
        recipe = tmp / "quick.yaml"
        recipe.write_text(yaml.safe_dump(data))
        held = out / "curated" / "heldout.jsonl"
        held.write_text("".join(held.read_text().splitlines(keepends=True)[:2]))
    return out, recipe


def _phases(code_dir: Path, run: Path, tmp: Path, log: Path, quick: bool) -> dict[str, float]:
    lam = sorted(json.loads((run / "config.resolved.json").read_text())["models"]["pyrodash"], key=float)[0]
    evaluation = _run(code_dir, ["eval", "--config", str(_eval_config(run, tmp, quick))], log)
    out, recipe = _stage3_dir(code_dir, run, tmp, quick)
    args = ["train", "stage3", "--config", str(recipe), "--output-dir", str(out), "--lambda", str(lam)]
    return {"evaluation": evaluation, "stage3": _run(code_dir, args, log)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout (its pyrodash/ is imported for side 'base')")
    ap.add_argument("--run", default="runs/demo-quick", help="a quick demo's output directory")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="a smoke run: 2 examples of one benchmark, 1 Stage 3 step")
    a = ap.parse_args()
    run = Path(a.run).resolve()
    if not (run / "config.resolved.json").exists():
        sys.exit(f"{run} is not a demo run: run `pyrodash demo --quick --out {a.run}` first")
    sides = {"this": HERE, "base": Path(a.base).resolve()}
    best: dict[str, dict[str, float]] = {s: {} for s in sides}
    log = Path(tempfile.gettempdir()) / "pyrodash-phase-times.log"
    for i in range(a.repeats):
        for side in ("this", "base") if i % 2 == 0 else ("base", "this"):
            with tempfile.TemporaryDirectory() as d:
                for k, v in _phases(sides[side], run, Path(d), log, a.quick).items():
                    best[side][k] = min(best[side].get(k, float("inf")), v)
                    print(f"repeat {i + 1} {side:4s} {k:10s} {v:7.1f}s", flush=True)
    for k in best["this"]:
        ratio = best["this"][k] / best["base"][k]
        print(f"{k}: this={best['this'][k]:.1f}s base={best['base'][k]:.1f}s ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
