"""Conversations per turn: per-turn metrics of each conversation benchmark (gold history `world:multiturn`, own
history `world:multiturn-self`), the per-turn Pareto verdict with the oracle distance, and their markdown; the range
rule's calibration (`range_calibration.json` of `pyrodash calibrate --range`) as a table and `range.png`."""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.cost import Prices
from pyrodash.data.benchmarks import own_history_benchmark
from pyrodash.eval.names import lambda_points, parse_method
from pyrodash.report.markdown import md_table, norm, pct
from pyrodash.report.metrics import record_cost
from pyrodash.report.plots import range_png
from pyrodash.world.multiturn import LONG_SPLITS

LONG_BENCHMARKS = {f"world:{s}" for s in LONG_SPLITS}  # six-turn splits: their own tables, not `per_turn`


def conversation_benchmarks(runs: dict[str, list[dict]]) -> list[str]:
    """The benchmarks with conversation turns (`meta.turn`), each gold-history one before its `-self` twin."""
    names = {r["benchmark"] for rs in runs.values() for r in rs if (r.get("meta") or {}).get("turn") is not None}
    return sorted(
        names, key=lambda b: (b.removesuffix("-self") if own_history_benchmark(b) else b, own_history_benchmark(b))
    )


def per_turn(runs: dict[str, list[dict]], prices: Prices, benchmarks=None) -> dict[str, dict[int, dict]]:
    """{method: {turn: {n, accuracy, llm_calls, handoff_share, cost_usd}}} over the records of conversation turns
    (`meta.turn`, e.g. the world's multi-turn split) of `benchmarks` (default: every benchmark); per-example means.
    Empty when the run has none."""
    out: dict[str, dict[int, dict]] = {}
    for name, recs in runs.items():
        by: dict[int, list[dict]] = {}
        for r in recs:
            turn = (r.get("meta") or {}).get("turn")
            if turn is not None and (benchmarks is None or r.get("benchmark") in benchmarks):
                by.setdefault(int(turn), []).append(r)
        if by:
            out[name] = {
                t: {
                    "n": len(rs),
                    "accuracy": sum(bool(r["correct"]) for r in rs) / len(rs),
                    "llm_calls": sum(r.get("llm_calls", 0) for r in rs) / len(rs),
                    "handoff_share": sum(r.get("handoff") is not None for r in rs) / len(rs),
                    "cost_usd": sum(record_cost(r, prices) for r in rs) / len(rs),
                }
                for t, rs in sorted(by.items())
            }
            if any(r.get("routed") for rs in by.values() for r in rs):  # the range rule: each turn's share routed
                for t, rs in by.items():
                    out[name][t]["range_routed"] = sum(r.get("routed") == "range" for r in rs) / len(rs)
    return out


def gold_history_turns(runs: dict[str, list[dict]], prices: Prices) -> dict[str, dict[int, dict]]:
    """`per_turn` over the gold-history conversation benchmarks only (`summary.json["per_turn"]`, as before
    own-history benchmarks existed)."""
    gold = {b for b in conversation_benchmarks(runs) if not own_history_benchmark(b) and b not in LONG_BENCHMARKS}
    return per_turn(runs, prices, gold)


def per_turn_by_benchmark(runs: dict[str, list[dict]], prices: Prices) -> dict[str, dict[str, dict[int, dict]]]:
    """{benchmark: {method: {turn: per_turn's numbers + cost_normalized}}} for each conversation benchmark;
    cost_normalized = the method's $ per example on that turn / method `llm`'s on the same turn and benchmark (None
    without `llm` records there or when they cost nothing)."""
    return {b: normalized(per_turn(runs, prices, {b})) for b in conversation_benchmarks(runs)}


def normalized(pt: dict[str, dict[int, dict]]) -> dict[str, dict[int, dict]]:
    """`pt` with each turn's cost_normalized (over method `llm`'s $ per example on the same turn) added."""
    llm = pt.get("llm") or {}
    for turns in pt.values():
        for t, v in turns.items():
            base = (llm.get(t) or {}).get("cost_usd")
            v["cost_normalized"] = v["cost_usd"] / base if base else None
    return pt


def dominates(a: dict, b: dict) -> bool:
    """Whether point `a` dominates `b` on a turn: accuracy >= and cost <= with one strict. Costs are compared in
    dollars per example, the same order as normalized cost (one LLM cost divides every method's on a turn)."""
    return (
        a["accuracy"] >= b["accuracy"]
        and a["cost_usd"] <= b["cost_usd"]
        and (a["accuracy"] > b["accuracy"] or a["cost_usd"] < b["cost_usd"])
    )


def turn_pareto(pt: dict[str, dict[int, dict]]) -> dict[int, dict]:
    """The Pareto verdict per turn of one conversation benchmark (`per_turn_by_benchmark(...)[benchmark]`):
    {turn: {"frontier": methods no other method dominates on that turn, "points": {pyrodash point: {accuracy,
    cost_normalized, dominated_by: [methods], on_frontier, oracle_acc_gap (accuracy - the oracle's, a fraction),
    oracle_cost_gap (cost_normalized - the oracle's)}}}}; the gaps are None without oracle records (or LLM ones)."""
    out: dict[int, dict] = {}
    for t in sorted({t for turns in pt.values() for t in turns}):
        at = {n: turns[t] for n, turns in pt.items() if t in turns}
        frontier = [n for n, v in at.items() if not any(dominates(w, v) for m, w in at.items() if m != n)]
        o = at.get("oracle")
        points = {}
        for n, v in at.items():
            if parse_method(n)[0] != "pyrodash":
                continue
            by = [m for m, w in at.items() if m != n and dominates(w, v)]
            nc, oc = v.get("cost_normalized"), None if o is None else o.get("cost_normalized")
            points[n] = {
                "accuracy": v["accuracy"],
                "cost_normalized": nc,
                "dominated_by": by,
                "on_frontier": not by,
                "oracle_acc_gap": None if o is None else v["accuracy"] - o["accuracy"],
                "oracle_cost_gap": None if nc is None or oc is None else nc - oc,
            }
        out[t] = {"frontier": frontier, "points": points}
    return out


def turn_table(runs: dict[str, list[dict]], prices: Prices, benchmark: str | None = None) -> list[str]:
    """A conversations table: accuracy, LLM calls, handoffs, dollars and cost / LLM-only per example, by method
    and turn, of one conversation benchmark (default: every gold-history one, as `summary.json["per_turn"]`)."""
    pt = normalized(gold_history_turns(runs, prices) if benchmark is None else per_turn(runs, prices, {benchmark}))
    if not pt:
        return ["(no conversation turns in this run: add the world's `world:multiturn` split to the benchmarks)"]
    ranged = any("range_routed" in v for turns in pt.values() for v in turns.values())  # (a column only then)
    rows = [
        [
            name,
            t,
            v["n"],
            pct(v["accuracy"]),
            f"{v['llm_calls']:.2f}",
            pct(v["handoff_share"]),
            f"{v['cost_usd']:.8f}",
            norm(v.get("cost_normalized")),
        ]
        + ([pct(v.get("range_routed", 0.0))] if ranged else [])
        for name, turns in pt.items()
        for t, v in turns.items()
    ]
    head = ["Method", "turn", "n", "accuracy", "LLM calls / ex.", "handoffs", "$ / ex.", "Cost / LLM-only"]
    return md_table(head + (["routed by range rule"] if ranged else []), rows)


def turn_verdict(pareto: dict[int, dict]) -> list[str]:
    """`turn_pareto` as markdown lines: per turn, the frontier, then each PyroDash point's verdict and its distance
    to the oracle."""
    lines = []
    for t, v in pareto.items():
        lines.append(
            f"- turn {t}: Pareto frontier (methods no other one dominates with higher-or-equal accuracy "
            f"at lower-or-equal cost, one strictly): {', '.join(v['frontier']) or '--'}"
        )
        for n, p in v["points"].items():
            where = "on the frontier" if p["on_frontier"] else f"dominated by {', '.join(p['dominated_by'])}"
            gap = (
                "no oracle records"
                if p["oracle_acc_gap"] is None
                else f"vs oracle {100 * p['oracle_acc_gap']:+.2f} points, "
                + ("cost --" if p["oracle_cost_gap"] is None else f"{p['oracle_cost_gap']:+.4f} of LLM-only cost")
            )
            lines.append(
                f"  - {n} (acc {pct(p['accuracy'])}%, {norm(p['cost_normalized'])} of LLM-only): {where}; {gap}"
            )
    return lines or ["(no PyroDash points on these turns)"]


def conversation_sections(runs: dict[str, list[dict]], prices: Prices) -> list[str]:
    """The report's conversations: per conversation benchmark (gold history, then own history), the per-turn table
    and the per-turn Pareto verdict with the oracle distance."""
    benches = conversation_benchmarks(runs)
    if not benches:
        return [
            "(no conversation turns in this run: add the world's `world:multiturn` split to the benchmarks, and "
            "`world:multiturn-self` to answer each turn after the method's own earlier answers)"
        ]
    by_bench = per_turn_by_benchmark(runs, prices)
    out = []
    for b in benches:
        if own_history_benchmark(b):
            out += [
                f"### Conversations, own history: `{b}`",
                "",
                "Each turn is answered after the method's OWN "
                "earlier answers (turn 1 alone), as a user lives the conversation; it is graded against the "
                "conversation's gold, so a wrong earlier answer carries into later turns.",
                "",
            ]
        else:
            out += [
                f"### Conversations, gold history: `{b}`",
                "",
                "Each turn is graded with the gold earlier turns "
                "as history (the same context for every method); a follow-up continues from the previous "
                "answer.",
                "",
            ]
        out += turn_table(runs, prices, b)
        out += (
            [
                "",
                "Pareto verdict per turn (cost / LLM-only: the method's $ on the turn over `llm`'s on the same turn):",
                "",
            ]
            + turn_verdict(turn_pareto(by_bench[b]))
            + [""]
        )
    return out[:-1]


def _prompt_tokens(toks: dict | None) -> str:
    return "--" if toks is None else f"{toks['mean']:.0f} ({toks['min']}-{toks['max']})"


def range_section(run_dir: str | Path) -> list[str]:
    """The range rule's calibration of a run (`range_calibration.json`, `pyrodash calibrate --range --out`): the
    per-turn table and `range.png` (drawn here); nothing when the run has none."""
    path = Path(run_dir) / "range_calibration.json"
    if not path.is_file():
        return []
    cal = json.loads(path.read_text())
    range_png(cal, Path(run_dir) / "range.png")
    rows = [
        [
            r["turn"],
            r["n"],
            _prompt_tokens(r.get("slm_prompt_tokens")),
            pct(r["policy_acc"]),
            "--" if r["policy_cost_usd"] is None else f"{r['policy_cost_usd']:.8f}",
            pct(r["llm_acc"]),
            "--" if r["llm_cost_usd"] is None else f"{r['llm_cost_usd']:.8f}",
            {True: "yes", False: "no", None: "not measured"}[r["within"]],
        ]
        for r in cal["by_turn"]
    ]
    head = ["turn", "n", "SLM prompt tokens", "policy acc.", "policy $", "LLM acc.", "LLM $", "within range"]
    return [
        "",
        f"### The range rule: `{cal.get('benchmark')}` (gold history), max_turns = {cal['max_turns']}",
        "",
        f"A turn is within the SLM's range when the policy (rule off) keeps >= {cal['min_ratio']:.0%} of the LLM's "
        "accuracy and at least its accuracy per dollar; past the last such turn the LLM answers alone "
        "(docs/conversations.md). The policy is measured up to the first turn out of range: no later turn can move "
        "`max_turns`.",
        "",
        *md_table(head, rows),
        "",
        "![Range rule](range.png)",
    ]


# the seeds' per-turn table (docs/results.md "Conversations, per turn", scripts/turn_tables.py): these benchmarks and
# turns, "gold" each turn after the gold earlier turns, "own" after the method's own earlier answers
SEED_TURNS = (("world:multiturn", "gold", ("1", "2", "3")), ("world:multiturn-self", "own", ("2", "3")))


def seed_turns(by_benchmark: dict) -> dict:
    """A run's `per_turn_by_benchmark` trimmed to what the seeds' per-turn table shows: accuracy and cost / LLM-only
    of each method on each turn of `SEED_TURNS` (turn keys as strings, as summary.json stores them)."""
    out: dict = {}
    for bench, _, turns in SEED_TURNS:
        for name, by_turn in (by_benchmark.get(bench) or {}).items():
            out.setdefault(bench, {})[name] = {
                str(t): {"accuracy": v["accuracy"], "cost_normalized": v.get("cost_normalized")}
                for t, v in by_turn.items()
                if str(t) in turns
            }
    return out


def seed_turn_table(by_seed: dict, first: str = "seed") -> list[str]:
    """One row per (`by_seed` key, method): the SLM alone, each PyroDash λ, the oracle single handoff and the LLM, as
    accuracy at cost / LLM-only on each turn of `SEED_TURNS` (the LLM's cost is 1 by definition: accuracy only)."""
    label = {"slm": "SLM alone", "oracle": "oracle single handoff", "llm": "LLM"}
    header = [first, "method"] + [f"{who}: turn {t}" if i == 0 else f"turn {t}"
                                   for _, who, turns in SEED_TURNS for i, t in enumerate(turns)]  # fmt: skip
    rows = []
    for seed, by in by_seed.items():
        gold = by.get(SEED_TURNS[0][0]) or {}
        for name in [n for n in ("slm", *lambda_points(gold), "oracle", "llm") if n in gold]:
            cells = [
                _turn_cell(((by.get(b) or {}).get(name) or {}).get(t), name) for b, _, ts in SEED_TURNS for t in ts
            ]
            rows.append([seed, label[name] if name in label else f"PyroDash λ {name.split('@', 1)[1]}", *cells])
    return md_table(header, rows)


def _turn_cell(v: dict | None, name: str) -> str:
    if v is None:
        return "--"
    c = None if name == "llm" else v.get("cost_normalized")
    return f"{100 * v['accuracy']:.0f}%" + ("" if c is None else f" at {c:.3f}")
