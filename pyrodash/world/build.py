"""Build (or reuse) the built-in world: data splits, the two pretrained models, and their measured accuracies.

    pyrodash world build --out worlds/demo --quick      # or build_world(out_dir=None, quick=False, seed=0)

Writes DIR/slm/, DIR/llm/ (HF dirs), DIR/data/<split>.jsonl (train, dev, val, tier1..tier5, multiturn,
multiturn_val, multiturn_train, multiturn6, multiturn6_val) and DIR/world.json (config, hash, seed, measured
accuracies, timings). A directory with the same config hash and seed is reused (default:
`$PYRODASH_CACHE/worlds/<quick|full>-seed<N>-<hash>`); a world with the same models (`WorldConfig.models_hash`), cached
or shipped (`pyrodash.world.shipped`), lends its models instead of pretraining them again; `from_scratch=True`
pretrains here.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from pyrodash.data.benchmarks import load_world_split  # noqa: F401  (its home is data: world:<split> benchmarks)
from pyrodash.data.example import Example
from pyrodash.prompts import get_prompts
from pyrodash.world.config import BUILD_RECIPE, TIER_SPLITS, WorldConfig, cache_root, default_world_dir
from pyrodash.world.evaluate import evaluate_continue, evaluate_split, first_wrong_distribution
from pyrodash.world.multiturn import LONG_SPLITS, evaluate_turns, world_conversations
from pyrodash.world.pretrain import pretrain, save_model
from pyrodash.world.shipped import SHIPPED, is_shipped, measured_on, models_source, platform
from pyrodash.world.task import STEP_SEP, make_known, make_split, make_table

MULTITURN_SPLITS = {
    "multiturn": "n_multiturn",
    "multiturn_val": "n_multiturn_val",
    "multiturn_train": "n_multiturn_train",
}
SPLITS = ("train", "dev", "val", *TIER_SPLITS, *MULTITURN_SPLITS, *LONG_SPLITS)
# the stream `val` is drawn from: its own, not the one `dev` took over (`make_splits`)
VAL_STREAM = "val-select"


def make_splits(cfg: WorldConfig, seed: int) -> dict[str, list[Example]]:
    """All data splits of a world (no models needed): five test tiers, the `dev` and train pools of mixed tiers, the
    conversations, then the `val` pool of mixed tiers; no question appears in two splits. `dev` draws from the stream
    and at the place the world's validation split always did, and `val` comes last from a stream of its own, so
    adding or resizing `val` leaves every other split as it was (`tests/test_world_splits.py`)."""
    table, known = make_table(seed), make_known(cfg.known_frac)
    seen: set[str] = set()
    out = {}
    tiers, runs = list(cfg.tiers), cfg.lead_runs
    for name, tier in zip(TIER_SPLITS, cfg.tiers):
        out[name] = make_split(seed, name, cfg.n_test, [tier], table, known, seen, cfg.max_addend, runs)
    out["dev"] = make_split(seed, "dev", cfg.n_dev, tiers, table, known, seen, cfg.max_addend, runs, stream="val")
    out["train"] = make_split(seed, "train", cfg.n_train, tiers, table, known, seen, cfg.max_addend, runs)
    # conversations (one example per turn, gold history in meta): openers of tiers 1-2, follow-ups of followup_tiers;
    # test first, then validation and training conversations, each from its own RNG, no opener shared with any split
    for name, size in MULTITURN_SPLITS.items():
        out[name] = world_conversations(cfg, seed, name, getattr(cfg, size), cfg.multiturn_turns, table, known, seen)
    for name, (n, turns) in LONG_SPLITS.items():  # as `ensure_long_split` makes them for a world built without them
        out[name] = world_conversations(cfg, seed, name, n, turns, table, known, seen)
    out["val"] = make_split(seed, "val", cfg.n_val, tiers, table, known, seen, cfg.max_addend, runs, stream=VAL_STREAM)
    return {name: out[name] for name in SPLITS}


def write_splits(splits: dict[str, list[Example]], data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    for name, exs in splits.items():
        tmp = data_dir / f"{name}.jsonl.tmp"
        with tmp.open("w") as f:
            for ex in exs:
                f.write(json.dumps(ex.to_dict()) + "\n")
        tmp.replace(data_dir / f"{name}.jsonl")


def read_world_info(world_dir: str | Path) -> dict:
    path = Path(world_dir) / "world.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found; build the world with `pyrodash world build --out {world_dir}`")
    return json.loads(path.read_text())


def world_warnings(info: dict) -> list[str]:
    """What makes a built world unfit to show token-level handoff, from its world.json: an LLM that did not learn
    the task (memorisation sets in late and abruptly, so a build can stop short of it: measured, the quick LLM of
    seed 1 solved 23% of problems where seed 0's solved 100%), a small SLM/LLM gap, or an LLM that cannot continue
    a prefix. Empty when the world is fine."""
    acc, out = info["accuracy"], []
    slm, llm = acc["slm"]["mean"], acc["llm"]["mean"]
    if llm < 0.75:
        out.append(
            f"the LLM solves only {llm:.0%} of test problems (want >= 75%): it did not learn the task in this "
            "build; try another --seed, or the full preset (more training steps)"
        )
    if llm - slm < 0.3:
        out.append(f"the SLM/LLM gap is {llm - slm:+.0%} (want >= 30 points): little for a handoff to win")
    if info.get("llm_continue", 1.0) < 0.75:
        out.append(
            f"the LLM continues a gold prefix correctly on only {info['llm_continue']:.0%} (want >= 75%): "
            "handoffs will often fail"
        )
    follow = {int(t): a for t, a in (info.get("multiturn_accuracy") or {}).get("llm", {}).items() if int(t) > 1}
    if follow and min(follow.values()) < 0.75:
        out.append(
            f"the LLM solves follow-up turns at {min(follow.values()):.0%} (want >= 75%): the multi-turn "
            "split will not separate the methods"
        )
    return out


def first_hard_frac(meta: dict) -> float | None:
    """Where a world problem's first untaught step starts, as a fraction of its gold solution's length (None when it
    has none), from its Example meta (steps, hard_steps, solution)."""
    hard = meta.get("hard_steps") or []
    if not hard:
        return None
    start = sum(len(s) + len(STEP_SEP) for s in meta["steps"][: hard[0]])
    return start / len(meta["solution"])


def first_hard_distribution(examples: list[Example]) -> dict:
    """Where the first step the SLM was not taught starts, as a fraction of the gold solution's length, over the
    problems that have one: quartiles, mean and a histogram in tenths (a single handoff there leaves the LLM the
    rest of the solution to write)."""
    import statistics

    fr = sorted(f for f in (first_hard_frac(ex.meta) for ex in examples) if f is not None)
    if len(fr) < 2:
        return {"n": len(fr)}
    q1, med, q3 = statistics.quantiles(fr, n=4)
    hist = [0] * 10
    for f in fr:
        hist[min(int(f * 10), 9)] += 1
    return {
        "n": len(fr),
        "share_of_problems": round(len(fr) / len(examples), 4),
        "median": round(med, 4),
        "q1": round(q1, 4),
        "q3": round(q3, 4),
        "mean": round(statistics.mean(fr), 4),
        "min": round(fr[0], 4),
        "max": round(fr[-1], 4),
        "histogram_tenths": hist,
    }


def has_models(world_dir: Path) -> bool:
    """Whether both pretrained models are saved under `world_dir`."""
    return all((world_dir / m / "config.json").is_file() for m in ("slm", "llm"))


def find_models(cfg: WorldConfig, seed: int, exclude: Path | None = None, shipped: bool = True) -> Path | None:
    """A built world whose models are the ones `cfg` and `seed` would train (same seed, build recipe and models hash,
    `WorldConfig.models_hash`): in the cache (`$PYRODASH_CACHE/worlds/`), then, with `shipped`, among the base models
    that ship with PyroDash (`SHIPPED`); None when there is none."""
    dirs = [
        d
        for root in (cache_root() / "worlds", SHIPPED if shipped else None)
        if root is not None and root.is_dir()
        for d in sorted(root.iterdir())
    ]
    for d in dirs:
        if exclude is not None and d.resolve() == Path(exclude).resolve():
            continue
        try:
            info = read_world_info(d)
            same = (
                info.get("seed") == seed
                and info.get("build_recipe") == BUILD_RECIPE
                and WorldConfig.from_dict(info["config"]).models_hash() == cfg.models_hash()
            )
        except (FileNotFoundError, OSError, ValueError, KeyError, TypeError):
            continue  # not a world, or one written by another version
        if same and has_models(d):
            return d
    return None


def is_built(world_dir: Path, cfg: WorldConfig, seed: int) -> bool:
    try:
        info = read_world_info(world_dir)
    except (FileNotFoundError, json.JSONDecodeError):
        return False
    return info.get("config_hash") == cfg.config_hash() and info.get("seed") == seed and has_models(world_dir)


def build_world(
    out_dir: str | Path | None = None,
    quick: bool = False,
    seed: int = 0,
    force: bool = False,
    cfg: WorldConfig | None = None,
    verbose: bool = True,
    from_scratch: bool = False,
) -> Path:
    """Build the world into `out_dir` (default: the cache) unless an identical build is there; return its path.
    `from_scratch`: pretrain the models here, never copy them (from the cache or the shipped base models); a built
    world there whose models were copied is built again."""
    cfg = cfg or WorldConfig.from_preset("quick" if quick else "full")
    world_dir = Path(out_dir) if out_dir is not None else default_world_dir(cfg, seed)
    if (
        not force
        and is_built(world_dir, cfg, seed)
        and not (from_scratch and read_world_info(world_dir).get("models_from"))
    ):
        return world_dir
    if (world_dir / "world.json").exists() and not force:
        info = read_world_info(world_dir)
        if info.get("config_hash") != cfg.config_hash() or info.get("seed") != seed:
            raise ValueError(
                f"{world_dir} holds a different world (hash {info.get('config_hash')}, seed "
                f"{info.get('seed')}); pass --force to rebuild it or choose another --out"
            )
    run_build(world_dir, cfg, seed, verbose=verbose, reuse_models=not from_scratch)
    return world_dir


def train_models(
    world_dir: Path, cfg: WorldConfig, seed: int, progress, side_by_side: bool = True
) -> tuple[dict, dict, dict]:
    """Pretrain the SLM and the LLM, save them, return (losses, seconds, threads) per model; `seconds` has wall time
    and CPU time (`cpu_slm`, `cpu_llm`), `threads` the schedule run: the SLM's threads, and the LLM's before and from
    its step `cfg.llm_beside_slm_steps`.

    On one core (or with `side_by_side=False`): one after the other on all threads. On n = `build_threads()` > 1:
    side by side, the SLM in a second process on 1 thread and the LLM on n - 1 threads for its first
    `cfg.llm_beside_slm_steps` steps, then on all n (the SLM is done by then). Deterministic for a seed and n: thread
    counts change at a fixed step, never at a time. Why: the models are too small to use 2 threads well (measured on
    2 cores, ms a step on 1 / 2 threads: SLM ~60 / 39, LLM ~145 / 88, the 1-thread times with the other model on the
    other core), so the LLM's steps beside the SLM cost less than waiting for it. The quick world's pretraining, seed
    0: 203 s one after the other, 170 s side by side (`benchmarks/world_build_schedule.py` compares the two)."""
    import torch

    n = build_threads()
    if n < 2 or not side_by_side:
        losses, seconds = {}, {}
        for which in ("slm", "llm"):
            losses[which], s = _pretrain_and_save(which, world_dir, cfg, seed, progress)
            seconds.update(s)
        n = torch.get_num_threads()
        return losses, seconds, {"slm": n, "llm": [n, n]}
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    ctx = mp.get_context("spawn")  # a fresh interpreter: torch's thread pools are not fork-safe
    slm_step = ctx.Value("i", 0)
    slm_task = progress.add_task("pretrain slm (1 thread, beside the LLM)", total=cfg.slm.train_steps)

    def show_slm(*_):
        progress.update(slm_task, completed=slm_step.value)

    threads = torch.get_num_threads()
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_init_slm_process, initargs=(slm_step,)) as pool:
        slm = pool.submit(_pretrain_and_save, "slm", world_dir, cfg, seed, None, 1)
        torch.set_num_threads(n - 1)
        try:
            t, cpu = time.time(), time.process_time()
            model, llm_losses = pretrain(
                "llm", cfg, seed, progress, on_step=show_slm, threads_from=(cfg.llm_beside_slm_steps, n)
            )
            save_model(model, world_dir / "llm")
            seconds = {"llm": round(time.time() - t, 1), "cpu_llm": round(time.process_time() - cpu, 1)}
        finally:
            torch.set_num_threads(threads)
        while not slm.done():
            show_slm()
            time.sleep(0.2)
        slm_losses, slm_seconds = slm.result()  # the SLM process's exception, if it failed
    show_slm()
    after = n if cfg.llm_beside_slm_steps < cfg.llm.train_steps else n - 1  # a short run never switches
    return {"slm": slm_losses, "llm": llm_losses}, {**slm_seconds, **seconds}, {"slm": 1, "llm": [n - 1, after]}


_COUNTER = None  # the SLM process's step counter, shared with the build (set by `_init_slm_process`)


def _init_slm_process(counter) -> None:
    """In the SLM's process: keep the shared step counter; no "Writing model shards" bar (the build draws its own)."""
    from transformers.utils import logging as hf_logging

    global _COUNTER
    _COUNTER = counter
    hf_logging.disable_progress_bar()


def _pretrain_and_save(
    which: str, world_dir: Path, cfg: WorldConfig, seed: int, progress=None, threads: int | None = None
) -> tuple[list[float], dict]:
    """Pretrain one model (on `threads` threads if given) and save it; (losses, {which: s, cpu_<which>: s})."""
    import torch

    if threads is not None:
        torch.set_num_threads(threads)

    def count(step, _loss):
        if _COUNTER is not None:
            _COUNTER.value = step

    t, cpu = time.time(), time.process_time()
    model, losses = pretrain(which, cfg, seed, progress, on_step=count)
    save_model(model, world_dir / which)
    return losses, {which: round(time.time() - t, 1), f"cpu_{which}": round(time.process_time() - cpu, 1)}


def run_build(world_dir: Path, cfg: WorldConfig, seed: int, verbose: bool = True, reuse_models: bool = True) -> dict:
    """Generate the splits, pretrain both models (or, with `reuse_models`, copy those of a world that has them:
    `find_models`), measure them, and write everything to `world_dir`.
    Everything runs on `build_threads()` threads (pretraining: see `train_models`): deterministic for a seed and a
    thread count."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(build_threads())
    try:
        return _run_build(world_dir, cfg, seed, verbose, reuse_models)
    finally:
        torch.set_num_threads(threads)


def build_threads() -> int:
    """The build's thread count: the machine's cores, at most 4 (the world's models are too small to use more)."""
    return max(1, min(4, os.cpu_count() or 1))


def _copy_models(donor: Path, world_dir: Path, cfg: WorldConfig, seed: int, verbose: bool, timings: dict):
    """Copy a donor world's models (same models hash and seed: the same weights, already trained); its pretraining
    timings go into `timings`. Returns (losses, pretrain threads) as the donor recorded them."""
    for w in ("slm", "llm"):
        shutil.copytree(donor / w, world_dir / w, dirs_exist_ok=True)
    old = read_world_info(donor)
    timings.update({k: v for k, v in old["timings"].items() if k.startswith("pretrain")})
    if verbose:
        source = models_source(
            {"models_from": str(donor), "models_shipped": is_shipped(donor), "seed": seed, "timings": old["timings"]}
        )
        print(
            f"world: models: {source} (same models hash {cfg.models_hash()}); `--from-scratch` trains them here",
            flush=True,
        )
    return old["losses"], old.get("pretrain_threads")


def _measure(models: dict, splits: dict, cfg: WorldConfig, seed: int, progress) -> dict:
    """Both models on the tier splits, the LLM continuing the SLM's prefixes, and both on conversation turns:
    {acc, slm_out, llm_continue, turns, turn_split}."""
    acc: dict[str, dict[str, float]] = {"slm": {}, "llm": {}}
    slm_out: dict[str, tuple[list[str], list[bool]]] = {}
    for which in ("slm", "llm"):
        for name in TIER_SPLITS:
            outs, ok = evaluate_split(
                models[which], splits[name], cfg.eval_batch_size, progress, f"eval {which} {name}"
            )
            acc[which][name] = sum(ok) / len(ok) if ok else float("nan")
            if which == "slm":
                slm_out[name] = (outs, ok)
        acc[which]["mean"] = sum(acc[which][n] for n in TIER_SPLITS) / len(TIER_SPLITS)
    per_tier = -(-cfg.n_continue // len(TIER_SPLITS))
    cont_set = [ex for name in TIER_SPLITS for ex in splits[name][:per_tier]][: cfg.n_continue]
    llm_continue = evaluate_continue(
        models["llm"], cont_set, get_prompts("world-v1").completion_system, seed, cfg.eval_batch_size, progress
    )
    # the build's check that pretraining taught follow-ups: on the validation conversations (the test ones are
    # the eval's; measuring the two models on all 3 x n_multiturn test turns took 25 s of a quick build)
    turn_split = "multiturn_val" if splits.get("multiturn_val") else "multiturn"
    turns = {
        w: evaluate_turns(models[w], splits[turn_split], cfg.eval_batch_size, progress, f"eval {w} turns")
        for w in ("slm", "llm")
    }
    return {"acc": acc, "slm_out": slm_out, "llm_continue": llm_continue, "turns": turns, "turn_split": turn_split}


# what a build measures on its models (world.json): copied with them when `reusable_measurements` allows
MEASUREMENTS = (
    "params",
    "accuracy",
    "slm_accuracy_by_difficulty",
    "llm_continue",
    "multiturn_accuracy",
    "multiturn_split",
    "first_wrong_step",
    "first_hard_frac",
)


def _world_head(cfg: WorldConfig, seed: int, donor: Path | None, splits: dict) -> dict:
    """world.json's config, models' source and splits."""
    return {
        "config": cfg.to_dict(),
        "config_hash": cfg.config_hash(),
        "models_hash": cfg.models_hash(),
        "models_from": str(donor) if donor is not None else None,
        "models_shipped": donor is not None and is_shipped(donor),
        "build_recipe": BUILD_RECIPE,
        "seed": seed,
        "tiers": dict(TIER_SPLITS),
        "prompts": "world-v1",
        "splits": {name: len(exs) for name, exs in splits.items()},
    }


def _measurements(splits: dict, models: dict, m: dict) -> dict:
    """world.json's `MEASUREMENTS` from `_measure`'s results."""
    tests = [ex for name in TIER_SPLITS for ex in splits[name]]
    outs = [o for name in TIER_SPLITS for o in m["slm_out"][name][0]]
    oks = [c for name in TIER_SPLITS for c in m["slm_out"][name][1]]
    easy = [c for ex, c in zip(tests, oks) if not ex.meta["hard_steps"]]
    hard = [c for ex, c in zip(tests, oks) if ex.meta["hard_steps"]]
    return {
        "params": {w: sum(p.numel() for p in models[w].parameters()) for w in ("slm", "llm")},
        "accuracy": m["acc"],
        "slm_accuracy_by_difficulty": {
            "no_hard_step": sum(easy) / len(easy) if easy else float("nan"),
            "has_hard_step": sum(hard) / len(hard) if hard else float("nan"),
            "n_no_hard_step": len(easy),
            "n_has_hard_step": len(hard),
        },
        "llm_continue": m["llm_continue"],
        # {model: {turn: accuracy}} after the gold earlier turns, on `multiturn_split`
        "multiturn_accuracy": m["turns"],
        "multiturn_split": m["turn_split"],
        "first_wrong_step": first_wrong_distribution(tests, outs, oks),
        "first_hard_frac": first_hard_distribution(tests),
    }


def build_platform() -> dict:
    """What a build's measurements depend on besides its models and splits: `shipped.platform()` and the torch
    threads it runs on (`run_build` sets `build_threads()`)."""
    import torch

    return {**platform(), "threads": torch.get_num_threads()}


def reusable_measurements(donor: Path | None, cfg: WorldConfig, seed: int) -> tuple[dict | None, str]:
    """(the donor world's `MEASUREMENTS`, why) when measuring its copied models here would repeat them: the same
    measured splits (`WorldConfig.measurements_hash`: the config but for `val`'s size) and seed, build recipe, and
    platform and threads (`shipped.measured_on`);
    (None, why not) otherwise. Within one platform the build's evaluation is bitwise repeatable; across CPU kinds a
    float sum can differ, hence a few answers."""
    if donor is None:
        return None, "no models copied"
    info = read_world_info(donor)
    stored = WorldConfig.from_stored(info["config"]).measurements_hash() if info.get("config") else None
    key = (stored, info.get("seed"), info.get("build_recipe"))
    if key != (cfg.measurements_hash(), seed, BUILD_RECIPE) or any(k not in info for k in MEASUREMENTS):
        return (
            None,
            f"the world at {donor} measured other splits or an older build (measured-splits hash, seed, recipe: {key})",
        )
    here, there = build_platform(), measured_on(info)
    if there != here:
        return None, f"they were measured on {_platform_words(there)}, this build runs on {_platform_words(here)}"
    return {k: info[k] for k in MEASUREMENTS}, f"measured on the same platform ({_platform_words(here)})"


def _platform_words(p: dict | None) -> str:
    if not p:
        return "an unrecorded platform"
    return f"torch {p.get('torch')}, {p.get('cpu_capability')}, {p.get('cpu')}, {p.get('threads')} threads"


def _load_and_measure(world_dir: Path, splits: dict, cfg: WorldConfig, seed: int, progress, timings: dict) -> dict:
    """Load the saved models, measure them (`_measure`), their seconds into `timings`; world.json's `MEASUREMENTS`."""
    from transformers import AutoModelForCausalLM

    cpu = time.process_time()
    models = {w: AutoModelForCausalLM.from_pretrained(str(world_dir / w)).eval() for w in ("slm", "llm")}
    t = time.time()
    measured = _measure(models, splits, cfg, seed, progress)
    timings["evaluate"], timings["cpu_evaluate"] = round(time.time() - t, 1), round(time.process_time() - cpu, 1)
    return _measurements(splits, models, measured)


def _run_build(world_dir: Path, cfg: WorldConfig, seed: int, verbose: bool, reuse_models: bool = True) -> dict:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    t0 = time.time()
    world_dir.mkdir(parents=True, exist_ok=True)
    (world_dir / "world.json").unlink(missing_ok=True)  # a half-built world is never mistaken for a built one
    splits = make_splits(cfg, seed)
    write_splits(splits, world_dir / "data")
    timings: dict[str, float] = {}
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    donor = find_models(cfg, seed, world_dir) if reuse_models else None
    reused, why = reusable_measurements(donor, cfg, seed)
    with Progress(*columns, disable=not verbose, transient=False) as progress:
        t = time.time()
        if donor is not None:
            losses, pretrain_threads = _copy_models(donor, world_dir, cfg, seed, verbose, timings)
            if verbose:
                what = "copied with the models" if reused is not None else "measuring the copied models here"
                print(f"world: measurements: {what}: {why}", flush=True)
        else:
            losses, seconds, pretrain_threads = train_models(world_dir, cfg, seed, progress)
            timings.update({f"pretrain_{w}": s for w, s in seconds.items()}, pretrain_wall=round(time.time() - t, 1))
        measured = reused if reused is not None else _load_and_measure(world_dir, splits, cfg, seed, progress, timings)
    info = {**_world_head(cfg, seed, donor, splits), **measured}
    info.update(
        losses=losses,
        timings=timings,
        build_seconds=round(time.time() - t0, 1),
        threads=build_platform()["threads"],
        pretrain_threads=pretrain_threads,  # the SLM's; the LLM's before and from step llm_beside_slm_steps
        measured_on=build_platform(),  # what the measurements depend on besides models and splits
        measurements_from=str(donor) if reused is not None else None,  # None: measured by this build
    )
    tmp = world_dir / "world.json.tmp"
    tmp.write_text(json.dumps(info, indent=1))
    tmp.replace(world_dir / "world.json")
    return info


def build_named_world(wdir: Path | None, spec: dict | None) -> Path | None:
    """A training recipe's world directory (`Recipe.world_dir()`, its `world:` section as `spec`), built when missing
    (cached: a built world is reused); None for a recipe without `world:`."""
    if wdir is None:
        return None
    spec = spec or {}
    if (wdir / "world.json").exists() and spec.get("dir"):
        return wdir  # a named, built world is used as it is (whatever preset built it)
    return build_world(wdir, quick=bool(spec.get("quick", False)), seed=int(spec.get("seed", 0)))
