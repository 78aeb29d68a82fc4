"""Where a run of steps spent its time: the step graph `pyrodash.jobs.scheduler.run_jobs` wrote (`steps.json`), and its
critical path, the chain of steps, each waiting for the one before it, whose seconds add up to the most. No number of
workers finishes the steps sooner than that chain's total; a step off it can take longer without delaying the end.

    steps = read_steps(Path("runs/demo-quick/jobs"))
    path, total = critical_path(steps)
    rows, totals = demo_profile(Path("runs/demo-quick"))   # with the demo's steps outside the graph
"""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.jobs.scheduler import STEPS_FILE

WALL = "training + evaluation (wall)"  # demo_times.json: the graph's wall time, not a step


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


def demo_profile(run: Path) -> tuple[list[tuple[str, float, str, bool]], dict]:
    """A finished demo's steps as ([(step, seconds, threads, on the critical path)] in the order they ran, totals):
    the graph's (`RUN/jobs/steps.json`) and the ones outside it (`RUN/demo_times.json`: the world before, the reports
    after, one after the other, so on the critical path). Totals: steps, critical_s, critical_steps, sum_s, wall_s."""
    steps = read_steps(Path(run) / "jobs")
    times_path = Path(run) / "demo_times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
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


def profile_markdown(rows: list[tuple[str, float, str, bool]]) -> str:
    """`demo_profile`'s rows as a Markdown table (docs/results.md, "Time")."""
    out = ["| step | seconds | threads | critical path |", "| --- | ---: | --- | --- |"]
    out += [f"| {name} | {sec:.1f} | {threads} | {'yes' if crit else ''} |" for name, sec, threads, crit in rows]
    return "\n".join(out)
