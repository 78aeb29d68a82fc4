"""`pyrodash benchmarks`: list the math benchmarks (rows, where they load from), or show a few examples of one.

pyrodash benchmarks                              # table: name, rows, source
pyrodash benchmarks gsm8k --limit 3              # the first 3 examples
pyrodash benchmarks minerva --limit 20 --seed 0 --json   # a seeded subsample as JSON lines
pyrodash benchmarks world:tier3 --path runs/world        # a split of the built-in world
"""

from __future__ import annotations

import argparse
import json

from pyrodash.data.benchmarks import BENCHMARK_NAMES, HUB, benchmarks_dir, load_benchmark, local_file


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "name",
        nargs="?",
        help="benchmark to show (gsm8k, minerva, olympiadbench, aime24, aime25, "
        "math500, world:<split>); omit to list them all",
    )
    p.add_argument("--path", help="a JSONL file (or a directory with test.jsonl); for world:<split>, the world dir")
    p.add_argument("--limit", type=int, default=5, help="how many examples to show (default 5; 0 = all)")
    p.add_argument("--seed", type=int, default=None, help="show a seeded random subsample instead of the first rows")
    p.add_argument("--json", action="store_true", help="print one JSON object per line")


def _list(args: argparse.Namespace) -> int:
    rows = []
    for name in BENCHMARK_NAMES:
        f = local_file(name)
        hub_id, config, split = HUB[name]
        hub = f"hub: {hub_id}{':' + config if config else ''} [{split}]"
        if f is not None:
            rows.append({"name": name, "rows": len(load_benchmark(name, path=f)), "source": str(f), "fallback": hub})
        else:
            rows.append({"name": name, "rows": None, "source": hub + " (no local file; loads if the hub is reachable)"})
    if args.json:
        for r in rows:
            print(json.dumps(r))
        return 0
    from rich.console import Console
    from rich.table import Table

    root = benchmarks_dir()
    table = Table(title=f"benchmarks (local dir: {root if root else 'none found; set PYRODASH_BENCHMARKS_DIR'})")
    for col in ("name", "rows", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(r["name"], "-" if r["rows"] is None else str(r["rows"]), r["source"])
    Console().print(table)
    return 0


def _show(args: argparse.Namespace) -> int:
    if args.limit < 0:
        raise ValueError(f"--limit must be >= 0 (0 = all), got {args.limit}")
    examples = load_benchmark(args.name, path=args.path, limit=args.limit or None, seed=args.seed)
    if args.json:
        for ex in examples:
            print(json.dumps(ex.to_dict(), ensure_ascii=False))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"{args.name}: {len(examples)} example(s)", show_lines=True)
    for col, width in (("id", 18), ("question", 80), ("gold", 24)):
        table.add_column(col, max_width=width, overflow="fold")
    for ex in examples:
        q = ex.question if len(ex.question) <= 400 else ex.question[:400] + " ..."
        table.add_row(ex.id, q, ex.gold)
    Console().print(table)
    return 0


def run(args: argparse.Namespace) -> int:
    return _show(args) if args.name else _list(args)
