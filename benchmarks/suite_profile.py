"""Where the test suite's CPU-seconds go, from the profile a run of it writes (`PYRODASH_SUITE_PROFILE=FILE`,
tests/conftest.py): each background build (the quick demo, the from-scratch quick world, the Gemma fetch) and the tests
by module, with CPU-seconds and wall, and the floor those CPU-seconds put under the suite's wall on its cores.

    PYRODASH_SUITE_PROFILE=suite.json .venv/bin/pytest -q
    python benchmarks/suite_profile.py suite.json              # a table on the console
    python benchmarks/suite_profile.py suite.json --markdown   # the same as a Markdown table

A test's CPU-seconds are its process's and those of the processes it waited for (servers, scripts, `pyrodash`
commands), setup and teardown included; a background build's are its own and its workers'. Tests run one after
the other beside the builds, so their walls add up to the session's; the builds' walls overlap them.
The last line: `cpu_s=<all> builds_cpu_s=<the builds> tests_cpu_s=<the tests> wall_s=<the session>
floor_s=<cpu_s / cores>`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

BUILDS = {
    "quick_demo": "background: the quick demo",
    "scratch_world": "background: the from-scratch quick world",
    "gemma": "background: the Gemma 3 270M fetch",
}


def suite_rows(profile: dict, top: int = 10) -> tuple[list[tuple[str, float, float, int]], dict]:
    """(rows of (part, CPU-seconds, wall seconds, tests): the builds, then the `top` modules by CPU-seconds and the
    rest as one row; totals: cpu_s, builds_cpu_s, tests_cpu_s, wall_s, cores, floor_s)."""
    rows = [(BUILDS.get(n, f"background: {n}"), b["cpu_s"], b["wall_s"], 0) for n, b in profile["builds"].items() if b]
    modules: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for t in profile["tests"]:
        m = modules[t["test"].split("::")[0]]
        m[0], m[1], m[2] = m[0] + t["cpu_s"], m[1] + t["wall_s"], m[2] + 1
    ranked = sorted(modules.items(), key=lambda kv: -kv[1][0])
    rows += [(name, cpu, wall, int(n)) for name, (cpu, wall, n) in ranked[:top]]
    rest = [v for _, v in ranked[top:]]
    if rest:
        rows.append(
            (
                f"the other {len(rest)} modules",
                *(sum(v[i] for v in rest) for i in range(2)),
                int(sum(v[2] for v in rest)),
            )
        )
    builds = sum(r[1] for r in rows if r[0].startswith("background"))
    tests = sum(t["cpu_s"] for t in profile["tests"])
    cores = int(profile["platform"].get("cores") or 1)
    totals = {
        "cpu_s": round(builds + tests, 1),
        "builds_cpu_s": round(builds, 1),
        "tests_cpu_s": round(tests, 1),
        "wall_s": profile["platform"].get("wall_s"),
        "cores": cores,
        "floor_s": round((builds + tests) / cores, 1),
    }
    return rows, totals


def suite_markdown(rows: list[tuple[str, float, float, int]]) -> str:
    """`suite_rows`' rows as a Markdown table (docs/results.md, "Time")."""
    out = ["| part | CPU-seconds | wall seconds | tests |", "| --- | ---: | ---: | ---: |"]
    out += [f"| {part} | {cpu:.0f} | {wall:.0f} | {n or ''} |" for part, cpu, wall, n in rows]
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("profile", type=Path, help="the JSON a suite run wrote (PYRODASH_SUITE_PROFILE=FILE pytest ...)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown (docs/results.md)")
    ap.add_argument("--top", type=int, default=10, help="modules shown one by one (the rest: one row)")
    a = ap.parse_args()
    try:
        profile = json.loads(a.profile.read_text())
        rows, totals = suite_rows(profile, a.top)
    except (OSError, ValueError, KeyError) as e:
        sys.exit(f"{a.profile}: not a suite profile ({e}); write one with PYRODASH_SUITE_PROFILE={a.profile} pytest")
    p = profile["platform"]
    print(f"machine: {p.get('cpu')} ({p.get('cpu_capability')}), {totals['cores']} cores, torch {p.get('torch')}")
    if a.markdown:
        print(suite_markdown(rows))
    else:
        for part, cpu, wall, n in rows:
            print(f"{part:<52} {cpu:8.0f} CPU-s {wall:7.0f} s  {n or '':>4}")
    print(" ".join(f"{k}={totals[k]}" for k in ("cpu_s", "builds_cpu_s", "tests_cpu_s", "wall_s", "floor_s")))


if __name__ == "__main__":
    main()
