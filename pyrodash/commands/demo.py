"""`pyrodash demo [--quick] [--out DIR]`: the whole pipeline on the built-in world, end to end on a CPU.

    pyrodash demo --quick            # λ in {0.2, 0.6, 2}; README "Time" has the minutes on 2 cores
    pyrodash demo --out runs/demo    # the larger world, λ in {0.05, 0.6, 2, 4}
    pyrodash demo --quick --seeds 0,1,2 --out runs/seeds   # one run per world seed, the picked points' spread

World build (cached; seed 0's base models ship and are copied, `--from-scratch` pretrains them) → curation →
Stages 1-3 (per λ) and the evaluation of every method, as steps of `pyrodash.jobs.scheduler` side by side in
`--workers` processes (logs in `DIR/jobs/`) → `DIR/report.md`, `pareto.png`, `summary.json`, `records/`. A step whose
output is in DIR is reused, so an interrupted demo resumes. `DIR/platform.json`: the machine it ran on (the report names
it). The PyroDash points are evaluated on world:val too (DIR/val/), where the operating point is picked
(`DEFAULT_CRITERION`, `pyrodash.report.select`); the report reads the pick on test under "Picked on val".
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path

from pyrodash.eval.build import SWEEPS, method_specs, sweep_lambda, sweep_relay
from pyrodash.eval.carve import val_methods
from pyrodash.eval.harness import EvalConfig, evaluate
from pyrodash.eval.long import (
    BASELINES,
    CALIBRATION_FILE,
    VALIDATION,
    calibrate_long,
    evaluate_long,
    llm_validation_answers,
    with_long_conversations,
)
from pyrodash.eval.names import method_name, relay_calls
from pyrodash.jobs.library_log import library_log
from pyrodash.jobs.scheduler import Job, default_workers, run_jobs
from pyrodash.report.console import print_picked, print_table2, print_turns
from pyrodash.report.load import load_run, run_prices, single_turn
from pyrodash.report.metrics import all_metrics
from pyrodash.report.platform import record_platform
from pyrodash.report.render import write_report
from pyrodash.report.seeds import write_seeds
from pyrodash.report.select import Criterion, select_run, val_dir
from pyrodash.report.tables import verdict_sentence
from pyrodash.train.config import load_recipe
from pyrodash.train.curate import run_curation
from pyrodash.train.paths import curated_dir, stage_dir
from pyrodash.train.stage1 import run_stage1
from pyrodash.train.stage2 import run_stage2
from pyrodash.train.stage3 import fill_cost_base, run_stage3
from pyrodash.world.build import build_world, read_world_info, world_warnings
from pyrodash.world.config import TIER_SPLITS
from pyrodash.world.shipped import models_source

ROOT = Path(__file__).resolve().parent.parent.parent
# λ spans the world's trade-off, not the paper's grid (docs/training.md "λ grid": the break-even λ ≈ 1.6 and the
# dev/val measurements behind each point): the quick demo's λ sit below the break-even (0.2, the accuracy end the pick
# on val needs; 0.6) and just above it (2, whose share sweep is the cheap end); the full demo's are the paper's 0.05,
# 0.6, 2 and 4. λ acts through Stage 3's exploration (stage3.explore_no_handoff in configs/world/*.yaml).
LAMBDAS = {"quick": [0.2, 0.6, 2.0], "full": [0.05, 0.6, 2.0, 4.0]}
LOG_NAME = "demo.log"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help=f"the quick world, λ {LAMBDAS['quick']} (CI)")
    p.add_argument("--out", default=None, help="output directory (default runs/demo-quick or runs/demo)")
    p.add_argument("--seed", type=int, default=0, help="world seed")
    p.add_argument(
        "--seeds",
        default=None,
        help="comma-separated world seeds (e.g. 0,1,2): one demo per seed in OUT/seed<N>/, then the picked points' "
        "test figures as mean and min-max over them in OUT/seeds.md and seeds.json (seeds other than 0 pretrain "
        "their world's models first)",
    )
    p.add_argument("--lambdas", default=None, help="comma-separated λ values (default: the preset's)")
    p.add_argument("--world", default=None, help="a built world directory to use (default: build or reuse the cache)")
    p.add_argument(
        "--from-scratch",
        action="store_true",
        help="pretrain the world's two models (minutes: docs/world.md) instead of starting from the "
        "base models that ship with PyroDash (seed 0) or a cached world's",
    )
    p.add_argument(
        "--relay",
        action="store_true",
        help="does nothing: every demo trains one chain and evaluates it with one LLM call per answer and as a relay",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes for Stage 3 per λ and the evaluation, side by side on one thread each (default: "
        "the cores, at most 4; 1: one after the other on every thread)",
    )


def _done(path: Path) -> bool:
    return (path / "config.resolved.json").exists()


def eval_jobs(
    cfg: EvalConfig, stage3_job: dict[float, str], pending: set[str], stage2_job: str = "stage2", prefix: str = ""
) -> list[Job]:
    """`cfg`'s evaluation as steps that can run side by side, each writing its own methods' records: the models
    alone and the oracle; the routers after them (neither needs the run's training; the model a router picks answers
    as it does alone, read back from the run's answer store, `pyrodash.backends.answer_store`); the Stage 2 model
    (after `stage2_job` when it is in `pending`, still to run); per λ its PyroDash policy, and apart from it the sweeps
    at that λ (two steps that end together pack better than one: measured, the λ 2 step with its five sweeps 22.5 s,
    the λ 0.6 step beside it 14 s), each after `stage3_job[λ]` when that job is in `pending`."""
    lam_specs = {float(k): v for k, v in (cfg.models.get("pyrodash") or {}).items()}
    base_models = {k: v for k, v in cfg.models.items() if k != "pyrodash"}
    groups: dict[str, list] = {"models alone, oracle": [], "routers": [], "slm+sft": []}
    per_lam: dict[tuple[str, float], list] = {("pyrodash", lam): [] for lam in lam_specs}
    for entry, (kind, opt) in zip(cfg.methods, method_specs(cfg.methods)):
        if kind == "pyrodash":
            for lam in opt.get("lambdas", sorted(lam_specs)):
                per_lam.setdefault(("pyrodash", float(lam)), []).append({"pyrodash": {**opt, "lambdas": [lam]}})
        elif kind in SWEEPS:
            per_lam.setdefault(("sweeps", sweep_lambda(opt, lam_specs)), []).append(entry)
        elif kind in ("routellm", "glimprouter"):
            groups["routers"].append(entry)
        else:
            groups["slm+sft" if kind == "slm+sft" else "models alone, oracle"].append(entry)
    sft_after = (stage2_job,) if stage2_job in pending else ()
    alone = (f"{prefix}eval models alone, oracle",) if groups["models alone, oracle"] else ()
    untrained = {k: v for k, v in base_models.items() if k != "sft"}  # what runs beside training may not need it
    jobs = [
        Job(
            f"{prefix}eval {label}",
            evaluate,
            (replace(cfg, methods=ms, models=base_models if label == "slm+sft" else untrained),),
            {"quiet": True},
            after=sft_after if label == "slm+sft" else alone if label == "routers" else (),
        )
        for label, ms in groups.items()
        if ms
    ]
    for (what, lam), ms in per_lam.items():
        if ms:
            models = base_models | {"pyrodash": {lam: lam_specs[lam]}} if lam in lam_specs else cfg.models
            after = (stage3_job[lam],) if stage3_job.get(lam) in pending else ()
            jobs.append(
                Job(
                    f"{prefix}eval {what} λ={lam:g}",
                    evaluate,
                    (replace(cfg, methods=ms, models=models),),
                    {"quiet": True},
                    after=after,
                )
            )
    return jobs


def long_conversation_jobs(cfg: EvalConfig, lam: float, names: set[str]) -> list[Job]:
    """`pyrodash.eval.long` for the λ policy as steps: the range rule calibrated after that policy's Stage 3 (when it
    is a step); the LLM alone (`BASELINES`) on the six-turn conversations after the models alone (whose record files
    it adds to: the rule binds PyroDash only, so it needs no calibration); the policy under the rule after its
    calibration, its
    own evaluation and the LLM's conversations, whose answers its turns past the range are (read back from the run's
    answer store, `pyrodash.backends.answer_store`, not decoded again)."""
    stage3, own = f"stage3 λ={lam:g}", f"eval pyrodash λ={lam:g}"
    baselines = f"long conversations: {', '.join(BASELINES)}"

    def after(*needs: str) -> tuple[str, ...]:
        return tuple(n for n in needs if n in names)

    # a resumed run whose policy is not trained again keeps its calibration (150 six-turn conversations: minutes)
    calibrated = stage3 not in names and _calibrated(Path(cfg.run_dir), lam)
    # its LLM half (the LLM alone on the validation turns, into the answer store) needs no training: beside it
    calibration = (
        []
        if calibrated
        else [
            Job("range calibration: llm", llm_validation_answers, (cfg,)),
            Job("range calibration", calibrate_long, (cfg, lam), after=(*after(stage3), "range calibration: llm")),
        ]
    )
    return calibration + [
        Job(
            baselines,
            evaluate_long,
            (cfg, lam, BASELINES),
            {"quiet": True},
            after=after("eval models alone, oracle"),
        ),
        Job(
            "long conversations: pyrodash",
            evaluate_long,
            (cfg, lam, ("pyrodash",)),
            {"quiet": True},
            after=(
                *[j.name for j in calibration if j.name == "range calibration"],
                baselines,
                *after(own),
            ),
        ),
    ]


def _calibrated(run_dir: Path, lam: float) -> bool:
    """Whether RUN holds the range calibration of the λ policy on the validation conversations (`eval.long`)."""
    path = run_dir / CALIBRATION_FILE
    if not path.is_file():
        return False
    cal = json.loads(path.read_text())
    return cal.get("policy") == method_name("pyrodash", lam) and cal.get("benchmark") == VALIDATION


def training_jobs(recipe, out: Path, lambdas: list[float], console) -> list[Job]:
    """Curation -> Stage 1 -> Stage 2 -> Stage 3 per λ as steps, each after the one before it; a step whose output
    is in `out` already is reused (not a step). Stage 2 is elastic (`pyrodash.jobs.scheduler`): it takes the core the
    evaluation beside it leaves idle. Its weights do not depend on its threads: measured, quick world seed 0, the
    same bytes on 1 and on 2 threads (and its offload rates), 98 s on 1 thread beside the evaluation, 72 s on 2."""
    chain = [
        ("curation", run_curation, curated_dir(out), {}),
        ("stage1", run_stage1, stage_dir(out, "stage1"), {}),
        ("stage2", run_stage2, stage_dir(out, "stage2"), {}),
    ]
    # each policy is evaluated on val and test below: its held-out (dev) evaluation, recipe work, is left out here
    # (`pyrodash train stage3` runs it): ~4 s of one thread per λ on the quick world
    chain += [
        (f"stage3 λ={lam:g}", run_stage3, stage_dir(out, "stage3", lam), {"lam": lam, "heldout": False})
        for lam in lambdas
    ]
    jobs: list[Job] = []
    needs = {"curation": (), "stage1": ("curation",), "stage2": ("stage1",)}
    for name, fn, dest, kw in chain:
        if _done(dest):
            console.print(f"[dim]{name}: reused[/]")
            continue
        if name.startswith("stage3") and "cost base" not in {j.name for j in jobs}:
            # Cost_base (the LLM alone on Stage 3's prompts) once, beside Stages 1-2, not in each λ's run
            jobs.append(Job("cost base", fill_cost_base, (recipe, out)))
        before = needs.get(name, ("stage2", "cost base"))
        jobs.append(
            Job(
                name,
                fn,
                (recipe, out),
                kw,
                after=tuple(b for b in before if b in {j.name for j in jobs}),
                elastic=name == "stage2",
            )
        )
    return jobs


# The validation split the demo picks its operating points on (`pyrodash.report.select`), and the criterion: the
# cheapest point at >= 98% there, else the most accurate (the selection says which). The test tiers decide nothing.
VAL_SPLIT = "world:val"
DEFAULT_CRITERION = Criterion("min_accuracy", 0.98)


def val_config(cfg: EvalConfig) -> EvalConfig:
    """`cfg`'s PyroDash points (every λ and its sweeps) and the LLM alone (the cost base; `pyrodash.eval.carve.
    val_methods`), on `VAL_SPLIT` in RUN/val (`pyrodash.report.select.val_dir`), single questions, no range rule."""
    return replace(
        cfg,
        run_dir=str(val_dir(cfg.run_dir)),
        benchmarks=[VAL_SPLIT],
        methods=val_methods(cfg.methods),
        benchmark_methods={},
        range_rule=None,
    )


class _TimedSteps:
    """The demo's steps outside the scheduler: each under a console rule, its seconds in `times`."""

    def __init__(self, console):
        self.console, self.times = console, {}

    def __call__(self, name: str, fn):
        t0 = time.perf_counter()
        self.console.rule(f"[bold]{name}[/]")
        res = fn()
        self.times[name] = round(time.perf_counter() - t0, 1)
        return res


def _demo_world(world_dir, quick: bool, seed: int, from_scratch: bool, step: _TimedSteps) -> Path:
    """The world the demo runs on: `world_dir` as built, or the preset's (built or cached); says where its models come
    from and what is wrong with it."""
    if world_dir is not None and not (Path(world_dir) / "world.json").exists():
        raise ValueError(f"--world {world_dir}: no world.json there; build one with `pyrodash world build --out DIR`")
    world = (
        Path(world_dir)
        if world_dir
        else step("world", lambda: build_world(None, quick=quick, seed=seed, from_scratch=from_scratch))
    )
    info = read_world_info(world)
    if info.get("models_from") and "world" not in step.times:  # (a build that ran said so itself)
        step.console.print(f"[dim]world {world}: models: {models_source(info)}; `--from-scratch` trains them here[/]")
    for w in world_warnings(info):
        step.console.print(f"[bold yellow]warning: world {world}:[/] {w}")
    return world


def _demo_eval_config(preset: str, out: Path, world: Path, lambdas: list[float]) -> EvalConfig:
    """The preset's eval config on the world's test tiers and conversations, with the models this run trains."""
    return EvalConfig.from_yaml(
        ROOT / "configs" / "eval" / f"world-{preset}.yaml",
        run_dir=str(out),
        world_dir=str(world),
        benchmarks=[f"world:{s}" for s in TIER_SPLITS] + ["world:multiturn", "world:multiturn-self"],
        models={
            "slm": str(world / "slm"),
            "llm": str(world / "llm"),
            "sft": str(stage_dir(out, "stage2")),
            "pyrodash": {lam: str(stage_dir(out, "stage3", lam)) for lam in lambdas},
        },
    )


def run_demo(
    out: str | Path,
    quick: bool = True,
    seed: int = 0,
    lambdas: list[float] | None = None,
    console=None,
    world_dir: str | Path | None = None,
    workers: int | None = None,
    from_scratch: bool = False,
) -> Path:
    """Build, curate, train and evaluate into `out`; returns the report path. `workers`: processes for the steps
    that run side by side (Stage 3 per λ, the evaluation's methods; default
    `pyrodash.jobs.scheduler.default_workers()`). One training chain serves both kinds of point: each λ policy is
    evaluated with one LLM call per answer (Algorithm 1) and as a relay (the eval config's relay points)."""
    from rich.console import Console

    console = console or Console()
    preset = "quick" if quick else "full"
    lambdas = lambdas or LAMBDAS[preset]
    workers = workers or default_workers()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    record_platform(out, workers=workers)  # what the report names as the platform of the run's numbers
    step = _TimedSteps(console)
    world = _demo_world(world_dir, quick, seed, from_scratch, step)
    recipe = load_recipe(ROOT / "configs" / "world" / f"{preset}.yaml", {"world": {"dir": str(world)}})
    cfg = _demo_eval_config(preset, out, world, lambdas)
    # Training and the evaluation's methods: steps side by side on one thread each (pyrodash.jobs.scheduler), each
    # after what it needs; the models alone, the oracle and the routers need no training, so they run beside it.
    # Training's chain comes first in the list: a free worker takes its next step before any evaluation.
    jobs = training_jobs(recipe, out, lambdas, console)
    stage3_jobs = {lam: f"stage3 λ={lam:g}" for lam in lambdas}
    evals = eval_jobs(cfg, stage3_jobs, {j.name for j in jobs})
    # the same points on world:val (where the demo picks one): after the test's, so a free worker takes those first
    evals += eval_jobs(val_config(cfg), stage3_jobs, {j.name for j in jobs}, prefix="val: ")
    # the range rule, calibrated for the λ 0.6 policy, on six-turn conversations (docs/conversations.md): steps beside
    # the others, listed before the evaluation's (the longest ones go first when they are ready)
    long_lam = 0.6 if 0.6 in lambdas else lambdas[0]
    jobs += [*long_conversation_jobs(cfg, long_lam, {j.name for j in jobs + evals}), *evals]
    console.rule(f"[bold]training and evaluation[/] ({len(jobs)} steps, {min(workers, len(jobs))} side by side)")
    t0 = time.perf_counter()
    step.times.update(run_jobs(jobs, workers, out / "jobs", console=console))
    # every record is there: writes the run's whole eval config (config.resolved.json)
    evaluate(with_long_conversations(cfg, long_lam), quiet=True)
    evaluate(val_config(cfg), quiet=True)
    step.times["training + evaluation (wall)"] = round(time.perf_counter() - t0, 1)
    for relay in (False, True):  # picked on world:val, read on test by the report ("Picked on val")
        if relay_points_in(cfg) or not relay:
            select_run(out, DEFAULT_CRITERION, relay=relay)
    path = step("report", lambda: write_report(out))
    (out / "demo_times.json").write_text(json.dumps(step.times, indent=2) + "\n")
    return path


def _check_args(args: argparse.Namespace) -> list[int] | None:
    """The flags' mistakes as one line naming the fix; the seeds of `--seeds` (None: one run, `--seed`)."""
    if args.from_scratch and args.world:
        raise ValueError(
            "--from-scratch builds the world's models; it cannot be combined with --world DIR (a world "
            "already built): drop one of the two"
        )
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers {args.workers}: give 1 or more processes (1 runs the steps one after the other)")
    if args.seeds is None:
        return None
    try:
        seeds = sorted({int(x) for x in args.seeds.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"--seeds {args.seeds!r}: give world seeds separated by commas, e.g. --seeds 0,1,2") from None
    if not seeds or args.world:
        raise ValueError("--seeds builds one world per seed: give at least one seed, and no --world DIR")
    return seeds


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    out = Path(args.out or ("runs/demo-quick" if args.quick else "runs/demo"))
    seeds = _check_args(args)
    if seeds is None:
        return _one_demo(args, out, args.seed, console)
    for seed in seeds:  # one after the other: each run takes every core it is given
        console.rule(f"[bold]seed {seed}[/] ({out / f'seed{seed}'})")
        _one_demo(args, out / f"seed{seed}", seed, console)
    path = write_seeds(out, {seed: out / f"seed{seed}" for seed in seeds})
    console.print(path.read_text(), markup=False)
    return 0


def _one_demo(args: argparse.Namespace, out: Path, seed: int, console) -> int:
    """One demo into `out` on world `seed`, then its picked points, tables and verdicts on the console."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    with library_log(out / LOG_NAME):
        path = run_demo(
            out,
            quick=args.quick,
            seed=seed,
            lambdas=[float(x) for x in args.lambdas.split(",")] if args.lambdas else None,
            console=console,
            world_dir=args.world,
            workers=args.workers,
            from_scratch=args.from_scratch,
        )
    print_picked(out, console)  # the points a user would serve first: picked on world:val, read on test
    print_table2(out, console)
    print_turns(out, console)

    verdict = verdict_sentence(all_metrics(single_turn(load_run(out)), run_prices(out)))
    console.print(f"[bold]Verdict:[/] {verdict}")
    if args.relay:
        console.print("[dim]--relay does nothing: the relay points are in every demo's report[/]")
    sentence = relay_sentence(out)
    if sentence:
        console.print(f"[bold]Relay:[/] {sentence}")
    console.print(
        f"report: [bold]{path}[/] (pareto.png, summary.json, records/ beside it; library logs in "
        f"{out / LOG_NAME}) in {time.perf_counter() - t0:.0f}s"
    )
    return 0


def relay_points_in(cfg: EvalConfig) -> bool:
    """Whether `cfg` evaluates relay points (a sweep with `max_llm_calls` or `calls` above 1)."""
    specs = method_specs(cfg.methods)
    return any(kind == "pyrodash_relay" or (kind in SWEEPS and sweep_relay(kind, opt)) for kind, opt in specs)


def relay_sentence(run_dir: Path) -> str:
    """The relay in one sentence: the relay oracle and each learned relay point, accuracy and cost / LLM-only (the
    run's sheet), and where its report is."""
    ms = all_metrics(single_turn(load_run(run_dir)), run_prices(run_dir))
    points = [n for n in ms if n == "relay_oracle" or (n.startswith("pyrodash@") and relay_calls(n) > 1)]
    if not points:
        return ""
    text = "; ".join(f"{n} {100 * ms[n].accuracy:.2f}% at {ms[n].cost_normalized:.3f} of LLM-only" for n in points)
    return f"{text} ({run_dir / 'report.md'}; the cached-input sheet: pyrodash report --prices cached {run_dir})"
