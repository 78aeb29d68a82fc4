"""`pyrodash cost`: price token counts (in tokens, or millions with --millions) under a price sheet (`eq:cost`).

pyrodash cost --slm-in 0.60 --slm-out 27.86 --millions --prices paper
"""

from __future__ import annotations

import argparse
import json

from pyrodash.cost import Prices, Usage


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prices", default="paper", help="price sheet: a YAML path or a name in configs/prices/")
    for name in ("slm-in", "slm-out", "llm-in", "llm-out", "llm-cached-in"):
        p.add_argument(f"--{name}", type=float, default=0.0, help=f"{name.replace('-', ' ')} tokens")
    p.add_argument("--millions", action="store_true", help="the counts are in millions of tokens")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    prices = Prices.from_yaml(args.prices)
    scale = 1_000_000 if args.millions else 1
    counts = {k: round(getattr(args, k) * scale) for k in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_cached_in")}
    if counts["llm_cached_in"] > counts["llm_in"]:
        raise ValueError("--llm-cached-in cannot exceed --llm-in (cached tokens are part of the LLM input)")
    usage = Usage(**counts)
    cost = usage.cost(prices)
    if args.json:
        print(json.dumps({"usage": usage.to_dict(), "prices": prices.to_dict(), "cost_usd": cost}))
    else:
        print(f"${cost:,.4f}  ({', '.join(f'{k}={v:,}' for k, v in counts.items() if v)})")
    return 0
