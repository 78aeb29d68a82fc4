"""Where a finished demo's time went: each step's seconds (one thread each; Stage 2 takes the cores no other step is
ready for, and a step that runs alone every core: the threads column), whether it is on the critical path of the step
graph, and the critical path's total, from the run's own records (`RUN/jobs/steps.json`, written by the step
scheduler; `RUN/demo_times.json`; `RUN/platform.json`).

    python benchmarks/demo_profile.py runs/demo-quick              # a table on the console
    python benchmarks/demo_profile.py runs/demo-quick --markdown   # the same as a Markdown table

The steps outside the graph (the world, the reports) run one after the other before and after it, so they are on the
critical path. The last line: `steps critical_s critical_steps sum_s wall_s` (the graph's steps, the critical path's
seconds and steps with the steps outside the graph, every step's seconds added up, the demo's wall seconds).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyrodash.jobs.profile import critical_path, read_steps  # noqa: E402

WALL = "training + evaluation (wall)"  # demo_times.json: the graph's wall time, not a step


def profile(run: Path) -> tuple[list[tuple[str, float, str, bool]], dict]:
    """([(step, seconds, threads, on the critical path)] in the order they ran, totals)."""
    steps = read_steps(run / "jobs")
    times = json.loads((run / "demo_times.json").read_text()) if (run / "demo_times.json").exists() else {}
    outside = {k: v for k, v in times.items() if k != WALL and k not in {s["name"] for s in steps}}
    chain, graph_s = critical_path(steps)
    before = [(k, v, "main", True) for k, v in outside.items() if k == "world"]
    after = [(k, v, "main", True) for k, v in outside.items() if k != "world"]
    rows = [
        (s["name"], s["seconds"], "1+idle" if s["elastic"] else str(s.get("threads") or 1), s["name"] in chain)
        for s in sorted(steps, key=lambda s: s["start_s"])
    ]
    rows = before + rows + after
    totals = {
        "steps": len(steps),
        "critical_s": round(graph_s + sum(v for _, v, _, _ in before + after), 1),
        "critical_steps": len(chain) + len(before + after),
        "sum_s": round(sum(v for _, v, _, _ in rows), 1),
        "wall_s": round(times[WALL] + sum(v for _, v, _, _ in before + after), 1) if WALL in times else "unknown",
    }
    return rows, totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished demo's output directory (pyrodash demo --out RUN)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/results.md)")
    a = ap.parse_args()
    try:
        rows, totals = profile(a.run)
    except ValueError as e:
        sys.exit(f"{e} (a demo run: pyrodash demo --quick --out {a.run})")
    plat = a.run / "platform.json"
    if plat.exists():
        p = json.loads(plat.read_text())
        print(f"machine: {p.get('cpu')} ({p.get('cpu_capability')}), {p.get('threads')} threads, ", end="")
        print(f"{p.get('workers')} workers")
    if a.markdown:
        print("| step | seconds | threads | critical path |\n|---|---:|---|---|")
        for name, sec, threads, crit in rows:
            print(f"| {name} | {sec:.1f} | {threads} | {'yes' if crit else ''} |")
    else:
        width = max(len(r[0]) for r in rows)
        for name, sec, threads, crit in rows:
            print(f"{name:<{width}}  {sec:7.1f}s  {threads:>6}  {'critical' if crit else ''}")
    print(" ".join(f"{k}={v}" for k, v in totals.items()))


if __name__ == "__main__":
    main()
