"""`pyrodash demo [--quick] [--out DIR]`: the whole pipeline on the built-in world, end to end on a CPU.

    pyrodash demo --quick            # ~5 minutes on 2 cores (2 with the world cached): λ in {0.6, 2, 4}
    pyrodash demo --out runs/demo    # the larger world, λ in {0.05, 0.6, 2, 4}

Steps (each reused when its output is already in DIR, so an interrupted demo resumes): world build (cached) →
EasyHard curation → Stage 1 → Stage 2 → Stage 3 per λ → evaluation of every method (SLM, SLM+SFT, LLM, RouteLLM-MF,
GlimpRouter, PyroDash per λ and across offload_bias) on the five world test tiers and the multi-turn split
(conversations whose follow-ups continue from the previous answer, reported per turn) → `DIR/report.md`,
`DIR/pareto.png`, `DIR/summary.json`, `DIR/records/`. Prints where the report is and the headline table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

from pyrodash.commands.report import print_table2, print_turns
from pyrodash.evaluate import EvalConfig, evaluate
from pyrodash.report import all_metrics, load_run, run_prices, single_turn, verdict_sentence, write_report
from pyrodash.train.config import load_recipe
from pyrodash.train.curate import run_curation
from pyrodash.train.paths import curated_dir, stage_dir
from pyrodash.train.stage1 import run_stage1
from pyrodash.train.stage2 import run_stage2
from pyrodash.train.stage3 import run_stage3
from pyrodash.world.build import build_world, read_world_info, world_warnings
from pyrodash.world.config import TIER_SPLITS

ROOT = Path(__file__).resolve().parent.parent.parent
# λ spans the world's trade-off, not the paper's grid: a correct handoff beats a wrong SLM-alone answer while
# 1 - λ·Cost_norm(handoff) > -λ·Cost_norm(SLM alone), i.e. λ < 1 / (Cost_norm(handoff) - Cost_norm(SLM alone)).
# A handoff right before the first untaught lookup costs ~0.65 of LLM-only on this world (the oracle's, measured on
# the quick world: 0.467 overall, 71% of problems handed off), the SLM alone ~0.03, so only λ above ~1.6 makes a
# policy keep hard problems to itself; below it λ prices the handoffs on easy problems. So the quick demo's λ sit
# below the break-even (0.6), just above it (2) and well above it (4); the full demo adds the paper's 0.05. λ acts
# through Stage 3's exploration (stage3.explore_no_handoff in configs/world/*.yaml): measured, quick world seed 0,
# λ 0.6 / 4 handed off on 0.85 / 0.42 of the test problems.
LAMBDAS = {"quick": [0.6, 2.0, 4.0], "full": [0.05, 0.6, 2.0, 4.0]}
LOG_NAME = "demo.log"


@contextlib.contextmanager
def library_log(path: Path):
    """Send library noise (transformers/datasets/TRL log records, FutureWarnings and other warnings) to `path`, and
    turn off transformers' weight-loading and datasets' map bars: the console keeps the stage headers, our rich
    bars and the tables."""
    import logging
    import warnings

    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    loggers = [logging.getLogger(n) for n in ("py.warnings", "transformers", "datasets", "trl", "accelerate", "peft",
                                              "torch")]
    saved = [(lg, lg.handlers[:], lg.propagate) for lg in loggers]
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_default_handler()
        hf_logging.disable_progress_bar()  # "Loading weights" bars of every from_pretrained
    except ImportError:  # pragma: no cover - transformers is a dependency
        hf_logging = None
    try:
        import datasets

        datasets.disable_progress_bars()
    except ImportError:  # pragma: no cover
        datasets = None
    logging.captureWarnings(True)
    for lg in loggers:
        lg.handlers = [handler]
        lg.propagate = False
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        try:
            yield
        finally:
            logging.captureWarnings(False)
            for lg, hs, prop in saved:
                lg.handlers, lg.propagate = hs, prop
            if hf_logging is not None:
                hf_logging.enable_default_handler()
                hf_logging.enable_progress_bar()
            if datasets is not None:
                datasets.enable_progress_bars()
            handler.close()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="the quick world and two λ values (CI)")
    p.add_argument("--out", default=None, help="output directory (default runs/demo-quick or runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="world seed")
    p.add_argument("--lambdas", default=None, help="comma-separated λ values (default: the preset's)")
    p.add_argument("--world", default=None, help="a built world directory to use (default: build or reuse the cache)")


def _done(path: Path) -> bool:
    return (path / "config.resolved.json").exists()


def run_demo(out: str | Path, quick: bool = True, seed: int = 0, lambdas: list[float] | None = None,
             console=None, world_dir: str | Path | None = None) -> Path:
    """Build, curate, train and evaluate into `out`; returns the report path."""
    from rich.console import Console

    console = console or Console()
    preset = "quick" if quick else "full"
    lambdas = lambdas or LAMBDAS[preset]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    times: dict[str, float] = {}

    def step(name: str, fn, skip: bool = False):
        t0 = time.perf_counter()
        if skip:
            console.print(f"[dim]{name}: reused[/]")
            return None
        console.rule(f"[bold]{name}[/]")
        res = fn()
        times[name] = round(time.perf_counter() - t0, 1)
        return res

    if world_dir is not None and not (Path(world_dir) / "world.json").exists():
        raise ValueError(f"--world {world_dir}: no world.json there; build one with `pyrodash world build --out DIR`")
    world = Path(world_dir) if world_dir else step("world", lambda: build_world(None, quick=quick, seed=seed))
    for w in world_warnings(read_world_info(world)):
        console.print(f"[bold yellow]warning: world {world}:[/] {w}")
    recipe = load_recipe(ROOT / "configs" / "world" / f"{preset}.yaml", {"world": {"dir": str(world)}})
    step("curation", lambda: run_curation(recipe, out), skip=_done(curated_dir(out)))
    step("stage1", lambda: run_stage1(recipe, out), skip=_done(stage_dir(out, "stage1")))
    step("stage2", lambda: run_stage2(recipe, out), skip=_done(stage_dir(out, "stage2")))
    for lam in lambdas:
        step(f"stage3 λ={lam:g}", lambda lam=lam: run_stage3(recipe, out, lam=lam),
             skip=_done(stage_dir(out, "stage3", lam)))
    cfg = EvalConfig.from_yaml(
        ROOT / "configs" / "eval" / f"world-{preset}.yaml", run_dir=str(out), world_dir=str(world),
        benchmarks=[f"world:{s}" for s in TIER_SPLITS] + ["world:multiturn", "world:multiturn-self"],
        models={"slm": str(world / "slm"), "llm": str(world / "llm"), "sft": str(stage_dir(out, "stage2")),
                "pyrodash": {lam: str(stage_dir(out, "stage3", lam)) for lam in lambdas}})
    step("evaluation", lambda: evaluate(cfg))
    path = step("report", lambda: write_report(out))
    (out / "demo_times.json").write_text(json.dumps(times, indent=2) + "\n")
    return path


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    out = Path(args.out or ("runs/demo-quick" if args.quick else "runs/demo"))
    lambdas = [float(x) for x in args.lambdas.split(",")] if args.lambdas else None
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with library_log(out / LOG_NAME):
        path = run_demo(out, quick=args.quick, seed=args.seed, lambdas=lambdas, console=console,
                        world_dir=args.world)
    print_table2(out, console)
    print_turns(out, console)

    verdict = verdict_sentence(all_metrics(single_turn(load_run(out)), run_prices(out)))
    console.print(f"[bold]Verdict:[/] {verdict}")
    console.print(f"report: [bold]{path}[/] (pareto.png, summary.json, records/ beside it; library logs in "
                  f"{out / LOG_NAME}) in {time.perf_counter() - t0:.0f}s")
    return 0
