"""`pyrodash world`: build the built-in world (synthetic task + two small models trained from scratch), or show one.

    pyrodash world build --out worlds/demo --quick      # the small preset; CI uses this
    pyrodash world build --out worlds/full              # the full world
    pyrodash world info worlds/demo                     # the measured accuracies

`pyrodash curate` and `pyrodash train` build a recipe's missing world with `pyrodash.world.build.build_named_world`.
"""

from __future__ import annotations

import argparse
import json

from pyrodash.world.build import build_world, read_world_info, world_warnings
from pyrodash.world.shipped import models_source


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="world_command", metavar="ACTION", required=True)
    b = sub.add_parser("build", help="build (or reuse a cached build of) the world")
    b.add_argument(
        "--out", default=None, help="output directory (default: $PYRODASH_CACHE/worlds/<preset>-seed<N>-<hash>)"
    )
    b.add_argument(
        "--quick",
        action="store_true",
        help="the small CI preset (smaller splits, the same models: seed 0's models ship with PyroDash and are "
        "copied; another seed pretrains them, a few minutes on 2 cores: world.json records the time)",
    )
    b.add_argument("--seed", type=int, default=0, help="world seed: table, splits, training order")
    b.add_argument("--force", action="store_true", help="rebuild even if OUT already holds this world")
    b.add_argument(
        "--from-scratch",
        action="store_true",
        help="pretrain the two models here (a few minutes on 2 cores; world.json records the time) instead of "
        "copying the base models that ship with PyroDash or those of a cached world with the same models",
    )
    i = sub.add_parser("info", help="print a built world's accuracies")
    i.add_argument("dir", help="a world directory made by `pyrodash world build`")
    i.add_argument("--json", action="store_true", help="print world.json as it is")


def print_info(info: dict, world_dir: str) -> None:
    from rich.console import Console
    from rich.table import Table

    acc = info["accuracy"]
    splits = [s for s in acc["slm"] if s != "mean"]
    table = Table(
        title=f"world {world_dir}  (preset {info['config']['preset']}, seed {info['seed']}, hash {info['config_hash']})"
    )
    table.add_column("model")
    for s in [*splits, "mean"]:
        table.add_column(f"{s}\n({info['tiers'].get(s, 'mix')})" if s in info["tiers"] else s, justify="right")
    table.add_column("params", justify="right")
    for m in ("slm", "llm"):
        table.add_row(m, *(f"{acc[m][s]:.1%}" for s in [*splits, "mean"]), f"{info['params'][m]:,}")
    console = Console()
    console.print(table)
    d = info["slm_accuracy_by_difficulty"]
    console.print(
        f"SLM on problems without / with an untaught lookup: {d['no_hard_step']:.1%} "
        f"(n={d['n_no_hard_step']}) / {d['has_hard_step']:.1%} (n={d['n_has_hard_step']})"
    )
    console.print(f"LLM continuing a gold prefix cut at a random step boundary (with P_l): {info['llm_continue']:.1%}")
    fw = info["first_wrong_step"]
    console.print(
        f"SLM's first wrong step on failed hard problems (n={fw['n']}): by index {fw['step_index']}, "
        f"relative to the first untaught lookup {fw['relative_to_first_hard']}"
    )
    console.print(f"build: {info['build_seconds']:.0f} s {info['timings']}")
    if info.get("models_from"):
        console.print(f"models: {models_source(info)}; `pyrodash world build --from-scratch` trains them here")
    for w in world_warnings(info):
        console.print(f"[bold yellow]warning:[/] {w}")


def run(args: argparse.Namespace) -> int:
    if args.world_command == "build":
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # no "Writing model shards" bars between ours
        world_dir = build_world(
            args.out, quick=args.quick, seed=args.seed, force=args.force, from_scratch=args.from_scratch
        )
        print_info(read_world_info(world_dir), str(world_dir))
        print(world_dir)
        return 0
    info = read_world_info(args.dir)
    if args.json:
        print(json.dumps(info, indent=1))
    else:
        print_info(info, args.dir)
    return 0
