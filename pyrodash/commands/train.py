"""`pyrodash train stage1|stage2|stage3`: the three training stages; stage N reads stage N-1 from DIR.

    pyrodash train stage1 --config configs/world/quick.yaml --output-dir runs/quick
    pyrodash train stage2 --config configs/world/quick.yaml --output-dir runs/quick
    pyrodash train stage3 --config configs/world/quick.yaml --output-dir runs/quick --lambdas 0.05,0.1,0.3,0.6
    pyrodash train stage3 --config configs/paper/qwen3.5-4b-glm5.2.yaml --output-dir runs/paper --dry-run
    accelerate launch --num_processes 4 -m pyrodash train stage3 --config ... --output-dir ...   # several GPUs

Under `accelerate launch` every rank runs the stage (see pyrodash.train.distributed); the main process prints.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyrodash.backends.hf.chat_template import add_chat_template_argument
from pyrodash.backends.http.endpoint import add_llm_arguments, llm_from_flags
from pyrodash.jobs.library_log import library_log
from pyrodash.train import distributed as dist
from pyrodash.train.config import load_recipe
from pyrodash.train.plan import print_plan
from pyrodash.train.stage1 import run_stage1
from pyrodash.train.stage2 import run_stage2
from pyrodash.train.stage3 import run_stage3, run_sweep
from pyrodash.world.build import build_named_world


def _lambdas(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"--lambdas takes comma-separated numbers, e.g. 0.05,0.1,0.3 ({e})") from e
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("--lambdas needs one or more numbers >= 0")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("stage", choices=["stage1", "stage2", "stage3"])
    p.add_argument("--config", required=True, help="YAML recipe (configs/world/*.yaml, configs/paper/*.yaml)")
    p.add_argument("--output-dir", required=True, help="run directory (DIR/curated, DIR/stage1, ...)")
    p.add_argument(
        "--from",
        dest="source",
        default=None,
        help="checkpoint to start from instead of DIR's previous stage (stage1: the base SLM)",
    )
    p.add_argument("--lambda", dest="lam", type=float, default=None, help="stage3: λ (default: the recipe's)")
    p.add_argument("--lambdas", type=_lambdas, default=None, help="stage3: a sweep, e.g. 0.05,0.1,0.3,0.6")
    p.add_argument("--resume", action="store_true", help="stage3: resume from the last checkpoint in DIR")
    add_llm_arguments(p)
    add_chat_template_argument(p)
    p.add_argument("--dry-run", action="store_true", help="validate the config and print the plan; load nothing")


def run(args: argparse.Namespace) -> int:
    if args.stage != "stage3" and (args.lam is not None or args.lambdas or args.resume):
        raise ValueError("--lambda/--lambdas/--resume apply to stage3 only")
    if args.lam is not None and args.lambdas:
        raise ValueError("give either --lambda or --lambdas, not both")
    if not args.dry_run:
        dist.setup()  # before any TRL config is built: under a launcher the ranks join one process group
    recipe = load_recipe(args.config, {"chat_template": args.chat_template} if args.chat_template else None)
    recipe.llm = llm_from_flags(recipe.llm, args.llm, args.llm_mode)
    lambdas = args.lambdas or ([args.lam] if args.lam is not None else None)
    if args.dry_run:
        print_plan(recipe, args.output_dir, [args.stage], lambdas=lambdas)
        return 0
    log = Path(args.output_dir) / "train.log"
    with library_log(log, lazy=True):
        with dist.main_first():  # one rank builds a missing world (training only resolves it); the others then find it
            build_named_world(recipe.world_dir(), recipe.world)
        show = dist.is_main()
        if args.stage == "stage1":
            out = run_stage1(recipe, args.output_dir, base=args.source)
        elif args.stage == "stage2":
            out = run_stage2(recipe, args.output_dir, stage1=args.source)
            rates = out / "offload_rates.json"
            if rates.exists() and show:
                print(json.dumps({"offload_rates": json.loads(rates.read_text())}, indent=1))
        elif args.lambdas:
            out = run_sweep(recipe, args.output_dir, args.lambdas, resume=args.resume)
            summary = json.loads(out.read_text())
            if not show:
                return 0
            print(f"SLM+SFT accuracy (held-out, no P_s): {summary.get('slm_sft_accuracy')}")
            for row in summary["table"]:
                print("  ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()))
        else:
            out = run_stage3(recipe, args.output_dir, lam=args.lam, stage2=args.source, resume=args.resume)
            if show:
                print((out / "stage3_stats.json").read_text())
    if show:
        print(f"saved {out}" + (f" (library logs in {log})" if log.exists() else ""))
    return 0
