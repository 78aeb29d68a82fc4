"""`pyrodash curate`: EasyHard curation (Corpus A / Corpus B) into DIR/curated/.

pyrodash curate --config configs/world/quick.yaml --output-dir runs/quick
pyrodash curate --config configs/paper/qwen3.5-4b-glm5.2.yaml --output-dir runs/paper --dry-run
pyrodash curate --config configs/world/quick.yaml --output-dir runs/mine --chats my_chats.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pyrodash.backends.hf.chat_template import add_chat_template_argument
from pyrodash.backends.http.endpoint import add_llm_arguments, llm_from_flags
from pyrodash.jobs.library_log import library_log
from pyrodash.train import distributed as dist
from pyrodash.train.chat_logs import is_chat_log
from pyrodash.train.config import load_recipe
from pyrodash.train.curate import run_curation
from pyrodash.train.plan import print_plan
from pyrodash.world.build import build_named_world


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="YAML recipe (configs/world/*.yaml, configs/paper/*.yaml)")
    p.add_argument("--output-dir", required=True, help="run directory; curation writes DIR/curated/")
    p.add_argument("--limit", type=int, default=None, help="curate only the first N examples of the source")
    p.add_argument(
        "--chats",
        default=None,
        metavar="FILE",
        help="your own chat logs (.jsonl, one OpenAI `messages` conversation per line): curated turn by "
        "turn in place of the recipe's curate.conversations",
    )
    add_llm_arguments(p)
    add_chat_template_argument(p)
    p.add_argument("--dry-run", action="store_true", help="validate the config and print the plan; load nothing")


def run(args: argparse.Namespace) -> int:
    if not args.dry_run:
        dist.setup()  # before any TRL config is built: under a launcher the ranks join one process group
    overrides = {"curate.limit": args.limit} if args.limit is not None else {}
    if args.chats:
        if not Path(args.chats).is_file():
            raise ValueError(f"--chats {args.chats}: no such file")
        if not args.chats.endswith(".jsonl") or not is_chat_log(args.chats):
            raise ValueError(
                f'--chats {args.chats}: expected a .jsonl file with one {{"messages": [...]}} conversation per line'
            )
        overrides["curate.conversations"] = args.chats
    if args.chat_template:
        overrides["chat_template"] = args.chat_template
    recipe = load_recipe(args.config, overrides)
    recipe.llm = llm_from_flags(recipe.llm, args.llm, args.llm_mode)
    if args.dry_run:
        print_plan(recipe, args.output_dir, ["curate"])
        return 0
    if not dist.is_main():  # under `accelerate launch`: the main process curates (one set of LLM calls), others wait
        dist.barrier()
        return 0
    log = Path(args.output_dir) / "curate.log"
    with library_log(log, lazy=True):
        build_named_world(recipe.world_dir(), recipe.world)  # a missing world is built here: curation only resolves it
        out = run_curation(recipe, args.output_dir)
    dist.barrier()
    logged = {"library_log": str(log)} if log.exists() else {}
    print(json.dumps({"curated": str(out), **json.loads((out / "stats.json").read_text()), **logged}, indent=1))
    return 0
