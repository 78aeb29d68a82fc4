"""The spread over world seeds: each seed's picked operating points (`pyrodash.report.select`, summary.json `selection`)
on test beside the oracle's, as mean and min-max over the seeds. `pyrodash demo --quick --seeds 0,1,2` writes it to
OUT/seeds.json and OUT/seeds.md, one run per seed in OUT/seed<N>/.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.report.markdown import md_table

# per kind: the oracle it is read beside, in the same run as the picked point
ORACLE = {"single": "oracle", "relay": "relay_oracle"}
# per kind: the demo's bar for the picked point on test (tests/test_demo.py checks the same): the single handoff within
# 1 point of the oracle's accuracy at <= its cost + 0.05 of LLM-only; the relay >= 98% at <= the relay oracle's + 0.04
BARS = {
    "single": "within 1 point of the oracle at <= its cost + 0.05",
    "relay": ">= 98% at <= the relay oracle's cost + 0.04",
}


def meets_bar(row: dict) -> bool | None:
    """Whether a seed row's picked point meets its kind's bar on test (`BARS`); None when a figure is missing."""
    a, c, oa, oc = (row.get(k) for k in ("accuracy", "cost", "oracle_accuracy", "oracle_cost"))
    if None in (a, c, oa, oc):
        return None
    if row["kind"] == "relay":
        return a >= 0.98 and c <= oc + 0.04
    return a >= oa - 0.01 - 1e-9 and c <= oc + 0.05


def seed_rows(runs: dict[int, Path]) -> list[dict]:
    """One row per (seed, kind): the picked point, its test accuracy and cost / LLM-only, the oracle's."""
    rows = []
    for seed, run in sorted(runs.items()):
        summary = json.loads((Path(run) / "summary.json").read_text())
        for kind, sel in (summary.get("selection") or {}).items():
            test, oracle = sel.get("test") or {}, summary["methods"].get(ORACLE[kind]) or {}
            rows.append(
                {
                    "seed": seed,
                    "kind": kind,
                    "picked": sel["picked"],
                    "met": sel["met"],
                    "val_accuracy": sel["val"]["accuracy"],
                    "val_cost": sel["val"]["cost_normalized"],
                    "accuracy": test.get("accuracy"),
                    "cost": test.get("cost_normalized"),
                    "oracle_accuracy": oracle.get("accuracy"),
                    "oracle_cost": oracle.get("cost_normalized"),
                    "llm_accuracy": (summary["methods"].get("llm") or {}).get("accuracy"),
                }
            )
    return rows


def spread(values: list[float]) -> dict:
    """mean, min and max of `values` (None when empty)."""
    if not values:
        return {"mean": None, "min": None, "max": None}
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def seeds_summary(runs: dict[int, Path]) -> dict:
    """{rows, spread: {kind: {figure: spread}}} over the seeds' runs."""
    rows = seed_rows(runs)
    out: dict = {}
    for kind in dict.fromkeys(r["kind"] for r in rows):
        mine = [r for r in rows if r["kind"] == kind]
        figures = ("accuracy", "cost", "oracle_accuracy", "oracle_cost")
        out[kind] = {f: spread([r[f] for r in mine if r[f] is not None]) for f in figures}
    return {"seeds": sorted(runs), "rows": rows, "spread": out}


def _pct(x: float | None) -> str:
    return "--" if x is None else f"{100 * x:.2f}"


def _cost(x: float | None) -> str:
    return "--" if x is None else f"{x:.3f}"


def seeds_markdown(summary: dict) -> list[str]:
    """The seeds' table and the mean (min-max) line per kind."""
    rows = [
        [
            r["seed"],
            r["kind"],
            r["picked"] + ("" if r["met"] else " (fallback)"),
            f"{_pct(r['val_accuracy'])} / {_cost(r['val_cost'])}",
            f"{_pct(r['accuracy'])} / {_cost(r['cost'])}",
            f"{_pct(r['oracle_accuracy'])} / {_cost(r['oracle_cost'])}",
            _pct(r.get("llm_accuracy")),
            {True: "meets", False: "misses", None: "--"}[meets_bar(r)],
        ]
        for r in summary["rows"]
    ]
    head = ["seed", "kind", "picked on val", "val acc. / cost", "test acc. / cost", "oracle (test)", "LLM acc.", "bar"]
    out = md_table(head, rows)
    for kind, s in summary["spread"].items():
        a, c, oa, oc = (s[k] for k in ("accuracy", "cost", "oracle_accuracy", "oracle_cost"))
        out += [
            "",
            f"- {kind}: picked point on test {_pct(a['mean'])}% ({_pct(a['min'])}-{_pct(a['max'])}) at "
            f"{_cost(c['mean'])} ({_cost(c['min'])}-{_cost(c['max'])}) of LLM-only; oracle {_pct(oa['mean'])}% "
            f"({_pct(oa['min'])}-{_pct(oa['max'])}) at {_cost(oc['mean'])} ({_cost(oc['min'])}-{_cost(oc['max'])})",
        ]
    out += ["", "Bars: " + "; ".join(f"{k}: {v}" for k, v in BARS.items()) + "."]
    return out


def write_seeds(out: Path, runs: dict[int, Path]) -> Path:
    """OUT/seeds.json and OUT/seeds.md over the seeds' runs; the markdown's path."""
    summary = seeds_summary(runs)
    (out / "seeds.json").write_text(json.dumps(summary, indent=2) + "\n")
    md = ["# Picked operating points over world seeds", "", *seeds_markdown(summary), ""]
    (out / "seeds.md").write_text("\n".join(md))
    return out / "seeds.md"
