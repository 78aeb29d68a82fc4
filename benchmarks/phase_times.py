"""Wall time of the quick demo's two engine-heavy phases, this checkout against another one (e.g. the commit before a
refactor), measured A/B interleaved on the same trained run so background load hits both alike.

    python benchmarks/phase_times.py --base /path/to/other/checkout --run runs/demo-quick [--repeats 3]

Per repeat and side (the order alternates): (1) evaluation: the demo's eval config, its single-question tiers and
conversations, methods slm, llm, oracle and PyroDash at the run's first λ, into a fresh run dir; (2) Stage 3: one λ
trained from the run's Stage 2 checkpoint, with its cached Cost_base. Prints each side's best time per phase and
the ratio this/base (< 1.05 is the bar of issue 25). The trained run comes from `pyrodash demo --quick`.
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


def _phases(code_dir: Path, run: Path, tmp: Path, log: Path) -> dict[str, float]:
    cfg = json.loads((run / "config.resolved.json").read_text())
    lam = sorted(cfg["models"]["pyrodash"], key=float)[0]
    ecfg = {k: v for k, v in cfg.items() if k != "prices_sheet"} | {
        "run_dir": str(tmp / "eval"),
        "prices": cfg.get("prices_sheet") or cfg["prices"],
        "methods": ["slm", "llm", "oracle", {"pyrodash": {"lambdas": [float(lam)]}}],
        "benchmark_methods": {},
        "models": {**cfg["models"], "pyrodash": {float(lam): cfg["models"]["pyrodash"][lam]}},
    }
    (tmp / "eval.yaml").write_text(yaml.safe_dump(ecfg))
    out = tmp / "train"
    out.mkdir()
    for name in ("stage2", "curated", "cost_base.json", "cost_base.calls.jsonl"):
        src = run / name
        if src.is_dir():
            shutil.copytree(src, out / name)
        elif src.exists():
            shutil.copy(src, out / name)
    return {
        "evaluation": _run(code_dir, ["eval", "--config", str(tmp / "eval.yaml")], log),
        "stage3": _run(
            code_dir,
            [
                "train",
                "stage3",
                "--config",
                str(code_dir / "configs" / "world" / "quick.yaml"),
                "--output-dir",
                str(out),
                "--lambda",
                str(lam),
            ],
            log,
        ),  # the cached quick world
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the other checkout (its pyrodash/ is imported for side 'base')")
    ap.add_argument("--run", default="runs/demo-quick", help="a quick demo's output directory")
    ap.add_argument("--repeats", type=int, default=3)
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
                for k, v in _phases(sides[side], run, Path(d), log).items():
                    best[side][k] = min(best[side].get(k, float("inf")), v)
                    print(f"repeat {i + 1} {side:4s} {k:10s} {v:7.1f}s", flush=True)
    for k in best["this"]:
        ratio = best["this"][k] / best["base"][k]
        print(f"{k}: this={best['this'][k]:.1f}s base={best['base'][k]:.1f}s ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
