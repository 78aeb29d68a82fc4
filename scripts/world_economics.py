"""The world's economics from gold solutions alone (no model): check a task design before training anything.

    python scripts/world_economics.py [--preset full] [--seed 0] [--runs 6,9] [--known-frac 0.65] [--task tools]

From the test tiers' gold solutions, the world chat template's real token counts and the world-v1 prompts, prints
per tier and overall: LLM-only tokens read and written (out/in), the share of problems with no untaught lookup (the
SLM-alone accuracy it allows), where the first untaught step starts (fraction of the gold solution), and the cost of
an oracle single handoff (right before the first untaught step; none without one) under `eq:cost` with the paper's
prices, as a fraction of LLM-only. The oracle is billed as the engine bills a handoff: the SLM reads P_s + the
question and writes the prefix plus `<offload>`; the LLM reads P_l + the question + the prefix and writes the rest.
Also the mean pretraining example length in tokens (what a build's compute scales with). `--task tools`: the tool
task's agent loops instead (`pyrodash.world.tool_task`): per tier, requests and tool calls per task, the LLM alone's
dollars per task, the oracle's cost as a fraction of it and the share of its dollars that is input, at the paper's
sheet and the cached one (input an earlier LLM call of the task read billed as cached).
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import replace

from pyrodash.cost import Prices, Usage
from pyrodash.prompts import get_prompts
from pyrodash.world.build import first_hard_frac, make_splits
from pyrodash.world.config import TIER_SPLITS, WorldConfig
from pyrodash.world.pretrain import example_stream
from pyrodash.world.tokenizer import encode_chat


def n_prompt(msgs: list[dict]) -> int:
    return len(encode_chat(msgs, add_generation_prompt=True)[0])


def economics(tests: dict, prompts, prices: Prices) -> dict:
    """Per-tier rows and the overall numbers (printed); returns the overall ones."""
    sys_s, sys_l = prompts.offload_system, prompts.completion_system
    tot_llm, tot_orc, fracs, rows = Usage(), Usage(), [], []
    for name, exs in tests.items():
        llm, orc, easy, tf = Usage(), Usage(), 0, []
        for ex in exs:
            q, sol = ex.question, ex.meta["solution"]
            llm += Usage(llm_in=n_prompt([{"role": "user", "content": q}]), llm_out=len(sol) + 1, llm_calls=1)
            slm_in = n_prompt([{"role": "system", "content": sys_s}, {"role": "user", "content": q}])
            f = first_hard_frac(ex.meta)
            if f is None:
                easy += 1
                orc += Usage(slm_in=slm_in, slm_out=len(sol) + 1)
                continue
            tf.append(f)
            cut = round(f * len(sol))
            orc += Usage(
                slm_in=slm_in,
                slm_out=cut + 1,
                llm_calls=1,
                llm_out=len(sol) - cut + 1,
                llm_in=n_prompt([{"role": "system", "content": sys_l}, {"role": "user", "content": q}]) + cut,
            )
        n = len(exs)
        rows.append(
            (
                name,
                llm.llm_out / llm.llm_in,
                easy / n,
                statistics.median(tf) if tf else float("nan"),
                orc.cost(prices) / llm.cost(prices),
                llm.llm_in / n,
                llm.llm_out / n,
            )
        )
        tot_llm, tot_orc, fracs = tot_llm + llm, tot_orc + orc, fracs + tf
    print(f"{'tier':6} {'out/in':>7} {'no-hard':>8} {'med p':>6} {'oracle':>7} {'in':>6} {'out':>6}")
    for r in rows:
        print(f"{r[0]:6} {r[1]:7.2f} {r[2]:8.3f} {r[3]:6.3f} {r[4]:7.3f} {r[5]:6.1f} {r[6]:6.1f}")
    q = statistics.quantiles(fracs, n=4)
    out = {
        "out_in": tot_llm.llm_out / tot_llm.llm_in,
        "no_hard_share": sum(r[2] for r in rows) / len(rows),
        "first_hard_median": statistics.median(fracs),
        "oracle_cost": tot_orc.cost(prices) / tot_llm.cost(prices),
    }
    print(
        f"ALL    out/in={out['out_in']:.2f} no_hard_share={out['no_hard_share']:.3f} "
        f"first_hard_frac median={out['first_hard_median']:.3f} mean={statistics.mean(fracs):.3f} q1={q[0]:.3f} "
        f"q3={q[2]:.3f} oracle_cost/LLM-only={out['oracle_cost']:.3f}"
    )
    return out


def tool_economics(seed: int, known_frac: float, n: int = 150) -> dict:
    """The tool task's economics (`pyrodash.world.tool_task.task_usage`) per tier and overall, at the paper's sheet
    and the cached one: requests and tool calls per task, LLM-only dollars per task and per request, the oracle's cost
    as a fraction of LLM-only, and the share of LLM-only dollars that is input (prefill)."""
    from pyrodash.chat import Tools
    from pyrodash.world.task import make_known
    from pyrodash.world.tool_task import TOOL, make_tool_split, task_usage

    prompts, tools = get_prompts("world-v1"), Tools.of([TOOL]).schemas()
    sheets = {"paper": Prices.from_yaml("paper"), "cached": Prices.from_yaml("cached")}
    print(f"tool task: seed={seed} known_frac={known_frac}, {n} test tasks per tier")
    print(f"{'tier':5} {'req/task':>8} {'calls':>6} {'LLM$/task':>10} " + " ".join(
        f"{'oracle ' + k:>13} {'prefill ' + k:>14}" for k in sheets))  # fmt: skip
    out = {}
    for tier in (1, 2, 3):
        exs = make_tool_split(seed, f"test-t{tier}", n, [tier], make_known(known_frac))
        alone, orc = Usage(), Usage()
        for ex in exs:
            a, o = task_usage(ex, prompts, tools)
            alone, orc = alone + a, orc + o
        calls = sum(ex.meta["ops"].count("g") for ex in exs) / n
        row = {
            "requests": alone.llm_calls / n,
            "tool_calls": calls,
            "llm_usd_per_task": alone.cost(sheets["paper"]) / n,
        }
        for k, sheet in sheets.items():
            split = alone.components(sheet)
            row[f"oracle_{k}"] = orc.cost(sheet) / alone.cost(sheet)
            row[f"prefill_{k}"] = split["llm_in"] / (split["llm_in"] + split["llm_out"])
        out[tier] = row
        print(f"t{tier:<4} {row['requests']:8.2f} {calls:6.2f} {row['llm_usd_per_task']:10.2e} " + " ".join(
            f"{row['oracle_' + k]:13.3f} {row['prefill_' + k]:14.3f}" for k in sheets))  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="full", choices=["full", "quick"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--runs", default=None, help="lead run range lo,hi (default: the preset's)")
    ap.add_argument("--known-frac", type=float, default=None)
    ap.add_argument("--task", default="math", choices=["math", "tools"], help="the world's task (tools: agent loops)")
    a = ap.parse_args()
    cfg = WorldConfig.from_preset(a.preset)
    if a.runs:
        cfg = replace(cfg, lead_runs=tuple(int(x) for x in a.runs.split(",")))
    if a.known_frac is not None:
        cfg = replace(cfg, known_frac=a.known_frac)
    if a.task == "tools":
        tool_economics(a.seed, cfg.known_frac)
        return
    splits = make_splits(cfg, a.seed)
    print(f"preset={a.preset} seed={a.seed} lead_runs={cfg.lead_runs} known_frac={cfg.known_frac}")
    economics({name: splits[name] for name in TIER_SPLITS}, get_prompts("world-v1"), Prices.from_yaml("paper"))
    stream = example_stream("llm", cfg, a.seed)
    lens = [len(next(stream)[0]) for _ in range(2000)]
    print(f"pretraining example: mean {statistics.mean(lens):.0f} tokens, max {max(lens)}")


if __name__ == "__main__":
    main()
