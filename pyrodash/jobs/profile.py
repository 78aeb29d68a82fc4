"""Where a run of steps spent its time: the step graph `pyrodash.jobs.scheduler.run_jobs` wrote (`steps.json`), and its
critical path, the chain of steps, each waiting for the one before it, whose seconds add up to the most. No number of
workers finishes the steps sooner than that chain's total; a step off it can take longer without delaying the end.

    steps = read_steps(Path("runs/demo-quick/jobs"))
    path, total = critical_path(steps)
"""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.jobs.scheduler import STEPS_FILE


def read_steps(log_dir: Path) -> list[dict]:
    """The steps of `log_dir/steps.json` in the order they were listed (a ValueError naming the file when it is not
    there: the steps ran with an older scheduler, or nothing ran)."""
    path = Path(log_dir) / STEPS_FILE
    if not path.exists():
        raise ValueError(f"{path} not found: it is written when the run's steps end; run the steps again")
    return json.loads(path.read_text())["steps"]


def critical_path(steps: list[dict]) -> tuple[list[str], float]:
    """(the critical path's step names, first to last; its seconds): the chain through `after` whose `seconds` add
    up to the most. A step waiting for one that did not run here (reused) waits for nothing."""
    by_name = {s["name"]: s for s in steps}
    finish: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for s in _ordered(steps, by_name):
        needs = [a for a in s["after"] if a in by_name]
        before = max(needs, key=lambda a: finish[a], default=None)
        via[s["name"]] = before
        finish[s["name"]] = s["seconds"] + (finish[before] if before is not None else 0.0)
    if not finish:
        return [], 0.0
    rank = {n: i for i, n in enumerate(finish)}  # a tie goes to the longer chain (a step of 0 s still ends it)
    end: str | None = max(finish, key=lambda n: (finish[n], rank[n]))
    total = finish[end]
    chain = []
    while end is not None:
        chain.append(end)
        end = via[end]
    return chain[::-1], round(total, 1)


def _ordered(steps: list[dict], by_name: dict[str, dict]) -> list[dict]:
    """`steps` with each after those it waits for (the scheduler refused any other graph)."""
    out: list[dict] = []
    seen: set[str] = set()

    def visit(s: dict) -> None:
        if s["name"] in seen:
            return
        seen.add(s["name"])
        for a in s["after"]:
            if a in by_name:
                visit(by_name[a])
        out.append(s)

    for s in steps:
        visit(s)
    return out
