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

from pyrodash.jobs.profile import demo_profile, profile_markdown  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a finished demo's output directory (pyrodash demo --out RUN)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/results.md)")
    a = ap.parse_args()
    try:
        rows, totals = demo_profile(a.run)
    except ValueError as e:
        sys.exit(f"{e} (a demo run: pyrodash demo --quick --out {a.run})")
    plat = a.run / "platform.json"
    if plat.exists():
        p = json.loads(plat.read_text())
        print(f"machine: {p.get('cpu')} ({p.get('cpu_capability')}), {p.get('threads')} threads, ", end="")
        print(f"{p.get('workers')} workers")
    if a.markdown:
        print(profile_markdown(rows))
    else:
        width = max(len(r[0]) for r in rows)
        for name, sec, threads, crit in rows:
            print(f"{name:<{width}}  {sec:7.1f}s  {threads:>6}  {'critical' if crit else ''}")
    print(" ".join(f"{k}={v}" for k, v in totals.items()))


if __name__ == "__main__":
    main()
