"""The world's economics from gold solutions alone (no model): check a task design before training anything.

    python scripts/world_economics.py [--design v1|v2] [--preset full] [--seed 0] [--reps 4,9,1,1,3,6]

From the test tiers' gold solutions, the chat template's real token counts and the world-v1 prompts, prints per
tier and overall: LLM-only tokens read and written (out/in), the share of problems with no untaught lookup (the
SLM-alone accuracy it allows), where the first untaught step starts (fraction of the gold solution), and the cost of
an oracle single handoff (right before the first untaught step; none without one) under `eq:cost` with the paper's
prices, as a fraction of LLM-only. The oracle is billed as the engine bills a handoff: the SLM reads P_s + the
question and writes the prefix plus `<offload>`; the LLM reads P_l + the question + the prefix and writes the rest.
Also the mean pretraining example length in tokens (what a build's compute scales with).

v1 is the built-in world (`pyrodash.world`); v2 the candidate of `scripts/world_v2_task.py` (compact question that
expands into worked runs of additions, lookups mid-solution, a chat template of one role token per message).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

from pyrodash.cost import Prices, Usage
from pyrodash.prompts import get_prompts
from pyrodash.world.build import first_hard_frac
from pyrodash.world.config import TIER_SPLITS, WorldConfig
from pyrodash.world.task import make_known, make_split, make_table
from pyrodash.world.tokenizer import encode_chat


def v1_prompt(msgs: list[dict]) -> int:
    return len(encode_chat(msgs, add_generation_prompt=True)[0])


def v2_prompt(msgs: list[dict]) -> int:
    """The compact template: role token + content + <|im_end|> per message, then the assistant role token."""
    return sum(len(m["content"]) + 2 for m in msgs) + 1


def economics(tests: dict, n_prompt, prompts, prices: Prices) -> None:
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
            orc += Usage(slm_in=slm_in, slm_out=cut + 1, llm_calls=1, llm_out=len(sol) - cut + 1,
                         llm_in=n_prompt([{"role": "system", "content": sys_l}, {"role": "user", "content": q}]) + cut)
        n = len(exs)
        rows.append((name, llm.llm_out / llm.llm_in, easy / n, statistics.median(tf) if tf else float("nan"),
                     orc.cost(prices) / llm.cost(prices), llm.llm_in / n, llm.llm_out / n))
        tot_llm, tot_orc, fracs = tot_llm + llm, tot_orc + orc, fracs + tf
    print(f"{'tier':6} {'out/in':>7} {'no-hard':>8} {'med p':>6} {'oracle':>7} {'in':>6} {'out':>6}")
    for r in rows:
        print(f"{r[0]:6} {r[1]:7.2f} {r[2]:8.3f} {r[3]:6.3f} {r[4]:7.3f} {r[5]:6.1f} {r[6]:6.1f}")
    q = statistics.quantiles(fracs, n=4)
    no_hard = sum(r[2] for r in rows) / len(rows)
    print(f"ALL    out/in={tot_llm.llm_out / tot_llm.llm_in:.2f} no_hard_share={no_hard:.3f} "
          f"first_hard_frac median={statistics.median(fracs):.3f} mean={statistics.mean(fracs):.3f} q1={q[0]:.3f} "
          f"q3={q[2]:.3f} oracle_cost/LLM-only={tot_orc.cost(prices) / tot_llm.cost(prices):.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--design", choices=["v1", "v2"], default="v1")
    ap.add_argument("--preset", default="full")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", default="4,9,1,1,3,6", help="v2: lead lo,hi, middle lo,hi, tail lo,hi repetitions")
    ap.add_argument("--pretrain-long-frac", type=float, default=0.25,
                    help="v2: share of long-run pretraining examples")
    a = ap.parse_args()
    cfg = WorldConfig.from_preset(a.preset)
    prices, prompts = Prices.from_yaml("paper"), get_prompts("world-v1")
    table, known = make_table(a.seed), make_known(cfg.known_frac)
    rng = random.Random(0)
    if a.design == "v1":
        from pyrodash.world.pretrain import chat_example
        from pyrodash.world.task import sample_problem, solve

        seen: set[str] = set()
        tests = {name: make_split(a.seed, name, cfg.n_test, [t], table, known, seen, cfg.max_addend)
                 for name, t in zip(TIER_SPLITS, cfg.tiers)}
        print(f"design v1 (the built-in world) preset={a.preset} seed={a.seed}")
        economics(tests, v1_prompt, prompts, prices)
        lens = [len(encode_chat(chat_example((p := sample_problem(rng, rng.choice(cfg.pretrain_tiers),
                                                                   cfg.max_addend)).question(),
                                             solve(p, table).text()))[0]) for _ in range(2000)]
    else:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import world_v2_task as v2

        r = [int(x) for x in a.reps.split(",")]
        reps = ((r[0], r[1]), (r[2], r[3]), (r[4], r[5]))
        seen = set()
        tests = {name: v2.make_split(a.seed, name, cfg.n_test, [t], table, known, seen, cfg.max_addend, reps)
                 for name, t in zip(TIER_SPLITS, cfg.tiers)}
        print(f"design v2 reps={reps} preset={a.preset} seed={a.seed}")
        economics(tests, v2_prompt, prompts, prices)
        short = ((1, 3), (1, 1), (1, 2))
        lens = []
        for _ in range(2000):
            p = v2.sample_problem(rng, rng.choice(cfg.pretrain_tiers), cfg.max_addend,
                                  reps if rng.random() < a.pretrain_long_frac else short)
            lens.append(v2_prompt([{"role": "user", "content": p.question()}]) + len(v2.solve(p, table).text()) + 1)
    print(f"pretraining example: mean {statistics.mean(lens):.0f} tokens, max {max(lens)}")


if __name__ == "__main__":
    main()
