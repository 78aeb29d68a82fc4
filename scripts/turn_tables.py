"""Per-turn tables of several demo runs (one per seed), as docs/results.md "Conversations, per turn" shows them, and
the conversation bar's checks.

    python scripts/turn_tables.py runs/demo-s0 runs/demo-s1 runs/demo-s2

Reads each run's summary.json (`per_turn_by_benchmark`, `methods`; written by `pyrodash report` / `pyrodash demo`).
Per run (`pyrodash.report.turns.seed_turn_table`, the table the docs render from the stored seeds run): accuracy and
cost / LLM-only on each turn, gold history and own history, for the SLM alone, every PyroDash λ, the oracle single
handoff and the LLM. Then the checks:
- gold history, turns 2 and 3: the best learned point (`pyrodash@λ`) that is >= the SLM alone and within 5 points of
  the oracle's accuracy at <= the oracle's cost + 0.10 (cost normalized by the LLM's on that turn);
- own history, turn 3: that point's accuracy >= 90% of the LLM's own-history accuracy;
- single questions: a λ point >= 98% at <= 0.56 of LLM-only cost.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyrodash.eval.names import lambda_points
from pyrodash.report.turns import seed_turn_table, seed_turns


def meets(pt: dict, name: str, turn: str) -> bool:
    p, o, s = pt[name][turn], pt["oracle"][turn], pt["slm"][turn]
    return (
        p["accuracy"] >= s["accuracy"]
        and p["accuracy"] >= o["accuracy"] - 0.05
        and p["cost_normalized"] <= o["cost_normalized"] + 0.10
    )


def main(runs: list[str]) -> int:
    for run in runs:
        summary = json.loads((Path(run) / "summary.json").read_text())
        by = summary["per_turn_by_benchmark"]
        print(f"## {run}\n\naccuracy at cost / LLM-only, per turn\n")
        print("\n".join(seed_turn_table({Path(run).name: seed_turns(by)}, first="run")))
        gold, own = by["world:multiturn"], by.get("world:multiturn-self", {})
        ok = [n for n in lambda_points(gold) if meets(gold, n, "2") and meets(gold, n, "3")]
        print(f"\ncheck, gold history turns 2 and 3 (>= SLM, oracle -5 points at <= its cost + 0.10): {ok or 'none'}")
        for n in ok:
            if own:
                a, llm = own[n]["3"]["accuracy"], own["llm"]["3"]["accuracy"]
                print(
                    f"check, own history turn 3: {n} {100 * a:.1f}% vs LLM {100 * llm:.1f}% -> "
                    f"{a / llm:.2f} of it ({'>=' if a >= 0.9 * llm else '<'} 0.90)"
                )
        single = summary["methods"]
        best = [
            (n, single[n]["accuracy"], single[n]["cost_normalized"])
            for n in lambda_points(single)
            if single[n]["accuracy"] >= 0.98 and single[n]["cost_normalized"] <= 0.56
        ]
        print(f"check, single questions >= 98% at <= 0.56: {best or 'none'}\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print("usage: python scripts/turn_tables.py RUN_DIR [RUN_DIR ...]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(sys.argv[1:]))
