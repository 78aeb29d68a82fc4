"""Reports from stored evaluation records only: metrics, the paper's Tables 1-4, case studies, trigger positions,
re-pricing, `summary.json` and the Pareto figure.

    pyrodash report RUN_DIR [--prices SHEET]

Everything here reads `RUN_DIR/records/<method>.jsonl` (one line per (method, example, sample), written by
`pyrodash.eval.harness`) and recomputes every number from the stored token counts, so a run can be re-priced and
re-drawn without running a model again. Method names follow one scheme: `slm`, `slm+sft`, `llm`, `routellm@<α>`,
`glimprouter@<τ>`, `pyrodash@<λ>`, `pyrodash@<λ>+bias<b>` (an offload_bias sweep), `pyrodash@<λ>+share<s>`
(a handoff_share sweep).

Conversations (records with `meta.turn`) are reported apart from the single questions of Tables 1-4, one section per
conversation benchmark: gold history (`world:multiturn`, every turn after the gold earlier turns) and own history
(`world:multiturn-self`, every turn after the method's own earlier answers,
`pyrodash.eval.harness`). Per turn: accuracy,
LLM calls, handoff share, $ and $ over method `llm`'s on the same turn (`per_turn_by_benchmark`), and the Pareto
verdict (`turn_pareto`: the frontier, each PyroDash point's dominators, its distance to the oracle). summary.json:
`per_turn` (gold-history turns, as before), `per_turn_by_benchmark` and `turn_pareto` ({benchmark: {...}}).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pyrodash.cost import PRICES_DIR, Prices, Usage, llm_token_ratio, total_usage
from pyrodash.data.benchmarks import own_history_benchmark
from pyrodash.eval.names import lambda_points, parse_method, sort_key
from pyrodash.record import read_record, usage_of
from pyrodash.report.plots import pareto_png
from pyrodash.world.shipped import models_source

STEP_BOUNDARY = "\n\n"
# --- reading records ----------------------------------------------------------------------------------------------


def read_records(path: Path) -> list[dict]:
    """The complete JSON lines of one records file; a torn last line (a killed writer) is skipped."""
    out = []
    lines = path.read_text().split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(read_record(json.loads(line)))
        except json.JSONDecodeError:
            if i < len(lines) - 1 and any(x.strip() for x in lines[i + 1 :]):
                raise ValueError(f"{path}: line {i + 1} is not JSON; delete that line and re-run eval") from None
    return out


def dedupe(records: list[dict]) -> tuple[list[dict], int]:
    """(records with one line per (benchmark, id, sample), the LAST one kept in file order; lines dropped).
    A records file gets a duplicate when two runs append to it (e.g. a copied or merged file); counting both would
    weigh those examples twice."""
    last: dict[tuple, int] = {}
    for i, r in enumerate(records):
        last[(r.get("benchmark"), str(r.get("id")), int(r.get("sample", 0) or 0))] = i
    keep = sorted(last.values())
    return [records[i] for i in keep], len(records) - len(keep)


def load_run(run_dir: str | Path, duplicates: dict[str, int] | None = None) -> dict[str, list[dict]]:
    """{method: records} for every `records/*.jsonl` of a run directory, deduplicated (`dedupe`); the number of
    dropped lines per method goes into `duplicates` when given."""
    rec_dir = Path(run_dir) / "records"
    files = sorted(rec_dir.glob("*.jsonl")) if rec_dir.is_dir() else []
    if not files:
        raise ValueError(f"no records in {rec_dir}: run `pyrodash eval --config CFG` with run_dir={run_dir} first")
    runs = {}
    for f in files:
        runs[f.stem], dropped = dedupe(read_records(f))
        if dropped and duplicates is not None:
            duplicates[f.stem] = dropped
    for name in runs:
        parse_method(name)
    return dict(sorted(runs.items(), key=lambda kv: sort_key(kv[0])))


def run_prices(run_dir: str | Path) -> Prices:
    """The price sheet the run was configured with (config.resolved.json), else the paper's sheet."""
    cfg = Path(run_dir) / "config.resolved.json"
    if cfg.exists():
        p = json.loads(cfg.read_text()).get("prices")
        if isinstance(p, dict):
            return Prices(**p)
    return Prices.from_yaml("paper")


# --- metrics ------------------------------------------------------------------------------------------------------


@dataclass
class Metrics:
    name: str
    per_benchmark: dict[str, float]  # accuracy in [0, 1]: mean over examples of the mean over samples (avg@k)
    accuracy: float  # unweighted mean over benchmarks
    llm_token_ratio: float
    llm_calls: float  # per example (per sample for avg@k sets)
    cost_usd: float
    usage: Usage
    usage_by_benchmark: dict[str, Usage]
    n: int  # records
    cost_normalized: float | None = None
    extra: dict = field(default_factory=dict)
    llm_failures: int = 0  # records with a failed LLM call (retried or not)
    fallbacks: int = 0  # records the SLM finished after the LLM failed
    usage_estimated: int = 0  # records with token counts a server did not report


def record_cost(r: dict, prices: Prices, endpoint_prices: dict[str, Prices] | None = None) -> float:
    """Dollars of one record: SLM tokens at `prices`; LLM tokens at `prices` too, except those of an endpoint with
    its own price sheet (`own_price`, a member of an LLM mesh; records from before that key had endpoints only for a
    mesh), billed at `endpoint_prices[name]` when given, else at the price stored in the record."""
    eps = r.get("llm_endpoints")
    u = usage_of(r)
    if not eps:
        return u.cost(prices)
    total = Usage(slm_in=u.slm_in, slm_out=u.slm_out).cost(prices)
    for e in eps:
        sheet = (endpoint_prices or {}).get(e["endpoint"])
        if sheet is None and not e.get("own_price", True):
            sheet = prices
        if sheet is None:
            pr = e.get("price") or {}
            sheet = Prices(
                slm_in=0,
                slm_out=0,
                llm_in=pr.get("llm_in", prices.llm_in),
                llm_out=pr.get("llm_out", prices.llm_out),
                llm_cached_in=pr.get("llm_cached_in"),
            )
        total += Usage(llm_in=e["llm_in"], llm_out=e["llm_out"], llm_cached_in=e["llm_cached_in"]).cost(sheet)
    return total


def mesh_table(runs: dict[str, list[dict]], prices: Prices) -> list[str]:
    """Per method and LLM endpoint: calls, failed calls, tokens, the endpoint's price and dollars (mesh runs)."""
    rows = []
    for name, recs in runs.items():
        agg: dict[str, dict] = {}
        for r in recs:
            for e in r.get("llm_endpoints") or []:
                if not e.get("own_price", True):  # one LLM at the run's prices: not a mesh
                    continue
                a = agg.setdefault(
                    e["endpoint"],
                    {"calls": 0, "errors": 0, "llm_in": 0, "llm_out": 0, "cost": 0.0, "price": e.get("price") or {}},
                )
                for k in ("calls", "errors", "llm_in", "llm_out"):
                    a[k] += e.get(k, 0)
                a["cost"] += record_cost({"llm_endpoints": [e]}, prices)
        rows += [
            [
                name,
                ep,
                a["calls"],
                a["errors"],
                a["llm_in"],
                a["llm_out"],
                f"{a['price'].get('llm_in')}/{a['price'].get('llm_out')}",
                f"{a['cost']:.6f}",
            ]
            for ep, a in agg.items()
        ]
    if not rows:
        return ["(no LLM mesh in this run: every LLM call went to the one configured LLM)"]
    return _table(["Method", "LLM endpoint", "calls", "failed", "LLM in", "LLM out", "$/M in/out", "$"], rows)


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
    return out


def gold_history_turns(runs: dict[str, list[dict]], prices: Prices) -> dict[str, dict[int, dict]]:
    """`per_turn` over the gold-history conversation benchmarks only (`summary.json["per_turn"]`, as before
    own-history benchmarks existed)."""
    return per_turn(runs, prices, {b for b in conversation_benchmarks(runs) if not own_history_benchmark(b)})


def per_turn_by_benchmark(runs: dict[str, list[dict]], prices: Prices) -> dict[str, dict[str, dict[int, dict]]]:
    """{benchmark: {method: {turn: per_turn's numbers + cost_normalized}}} for each conversation benchmark;
    cost_normalized = the method's $ per example on that turn / method `llm`'s on the same turn and benchmark (None
    without `llm` records there or when they cost nothing)."""
    return {b: _normalized(per_turn(runs, prices, {b})) for b in conversation_benchmarks(runs)}


def _normalized(pt: dict[str, dict[int, dict]]) -> dict[str, dict[int, dict]]:
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


def single_turn(runs: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """The runs without conversation turns (`meta.turn`): Tables 1-4, the Pareto verdict and the case studies
    cover single questions, as in the paper; turns have their own section. A run of turns only is kept whole."""
    out = {n: [r for r in rs if (r.get("meta") or {}).get("turn") is None] for n, rs in runs.items()}
    out = {n: rs for n, rs in out.items() if rs}
    return out or runs


def _norm(x: float | None) -> str:
    return "--" if x is None else f"{x:.4f}"


def turn_table(runs: dict[str, list[dict]], prices: Prices, benchmark: str | None = None) -> list[str]:
    """A conversations table: accuracy, LLM calls, handoffs, dollars and cost / LLM-only per example, by method
    and turn, of one conversation benchmark (default: every gold-history one, as `summary.json["per_turn"]`)."""
    pt = _normalized(gold_history_turns(runs, prices) if benchmark is None else per_turn(runs, prices, {benchmark}))
    if not pt:
        return ["(no conversation turns in this run: add the world's `world:multiturn` split to the benchmarks)"]
    rows = [
        [
            name,
            t,
            v["n"],
            _pct(v["accuracy"]),
            f"{v['llm_calls']:.2f}",
            _pct(v["handoff_share"]),
            f"{v['cost_usd']:.8f}",
            _norm(v.get("cost_normalized")),
        ]
        for name, turns in pt.items()
        for t, v in turns.items()
    ]
    return _table(
        ["Method", "turn", "n", "accuracy", "LLM calls / ex.", "handoffs", "$ / ex.", "Cost / LLM-only"], rows
    )


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
                f"  - {n} (acc {_pct(p['accuracy'])}%, {_norm(p['cost_normalized'])} of LLM-only): {where}; {gap}"
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


def compute_metrics(name: str, records: list[dict], prices: Prices) -> Metrics:
    if not records:
        raise ValueError(f"method {name!r} has no records; re-run eval for it or delete its empty file")
    by_bench: dict[str, dict[str, list[bool]]] = {}
    usage_by_bench: dict[str, list[Usage]] = {}
    for r in records:
        by_bench.setdefault(r["benchmark"], {}).setdefault(str(r["id"]), []).append(bool(r["correct"]))
        usage_by_bench.setdefault(r["benchmark"], []).append(usage_of(r))
    per_bench = {b: sum(sum(v) / len(v) for v in ex.values()) / len(ex) for b, ex in sorted(by_bench.items())}
    usages = [u for us in usage_by_bench.values() for u in us]
    total = total_usage(usages)
    return Metrics(
        name=name,
        per_benchmark=per_bench,
        accuracy=sum(per_bench.values()) / len(per_bench),
        llm_token_ratio=llm_token_ratio(usages),
        llm_calls=total.llm_calls / len(records),
        cost_usd=sum(record_cost(r, prices) for r in records),
        usage=total,
        usage_by_benchmark={b: total_usage(us) for b, us in sorted(usage_by_bench.items())},
        n=len(records),
        llm_failures=sum(1 for r in records if r.get("llm_errors") or r.get("llm_failed")),
        fallbacks=sum(1 for r in records if r.get("fallback")),
        usage_estimated=sum(1 for r in records if r.get("usage_estimated")),
    )


def all_metrics(runs: dict[str, list[dict]], prices: Prices) -> dict[str, Metrics]:
    ms = {name: compute_metrics(name, recs, prices) for name, recs in runs.items()}
    if "llm" in ms and ms["llm"].cost_usd > 0:
        for m in ms.values():
            m.cost_normalized = m.cost_usd / ms["llm"].cost_usd
    return ms


def summary_dict(ms: dict[str, Metrics], prices: Prices) -> dict:
    return {
        "prices": prices.to_dict(),
        "methods": {
            name: {
                "accuracy": m.accuracy,
                "llm_token_ratio": m.llm_token_ratio,
                "llm_calls": m.llm_calls,
                "cost_usd": m.cost_usd,
                "cost_normalized": m.cost_normalized,
                "per_benchmark": m.per_benchmark,
                "usage": m.usage.to_dict(),
                "n": m.n,
                "llm_failures": m.llm_failures,
                "fallbacks": m.fallbacks,
                "usage_estimated": m.usage_estimated,
            }
            for name, m in ms.items()
        },
    }


# --- trigger positions and case studies ---------------------------------------------------------------------------


def first_llm_step(record: dict, boundary: str = STEP_BOUNDARY) -> int | None:
    """Index of the step in which the LLM first took over (number of step boundaries written before it), or None."""
    before = ""
    for seg in record.get("segments") or []:
        if seg["by"] == "llm":
            return before.count(boundary)
        before += seg["text"]
    return None


def trigger_positions(records: list[dict], boundary: str = STEP_BOUNDARY) -> dict[str, int]:
    """Handoffs counted relative to the first step the SLM was not taught (meta.hard_steps): before / at / after it,
    plus handoffs on problems with no hard step, and problems with a hard step that the SLM never handed off."""
    out = {"before": 0, "at": 0, "after": 0, "no_hard_step": 0, "hard_no_handoff": 0, "handoffs": 0}
    for r in records:
        step = first_llm_step(r, boundary)
        hard = (r.get("meta") or {}).get("hard_steps") or []
        if step is None:
            out["hard_no_handoff"] += bool(hard)
            continue
        out["handoffs"] += 1
        if not hard:
            out["no_hard_step"] += 1
        else:
            first = min(hard)
            out["before" if step < first else "at" if step == first else "after"] += 1
    return out


def case_studies(runs: dict[str, list[dict]], k: int = 2) -> list[tuple[str, dict]]:
    """Up to k PyroDash traces with a handoff (correct ones first, λ runs before bias runs) and one SLM-only
    PyroDash answer (a correct one if any)."""
    names = sorted((n for n in runs if parse_method(n)[0] == "pyrodash"), key=lambda n: parse_method(n)[2] is not None)
    handoffs = [(n, r) for n in names for r in runs[n] if r.get("llm_calls")]
    alone = [(n, r) for n in names for r in runs[n] if not r.get("llm_calls")]
    handoffs.sort(key=lambda nr: not nr[1].get("correct"))
    alone.sort(key=lambda nr: not nr[1].get("correct"))
    return handoffs[:k] + alone[:1]


# --- markdown -----------------------------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "--" if x is None else f"{100 * x:.2f}"


def _row(cells: list) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _table(header: list[str], rows: list[list]) -> list[str]:
    return [_row(header), _row(["---"] * len(header))] + [_row(r) for r in rows]


def table1(ms: dict[str, Metrics]) -> list[str]:
    benches = sorted({b for m in ms.values() for b in m.per_benchmark})
    rows = [
        [n]
        + [_pct(m.per_benchmark.get(b)) for b in benches]
        + [_pct(m.accuracy), _pct(m.llm_token_ratio), f"{m.llm_calls:.3f}"]
        for n, m in ms.items()
    ]
    return _table(
        ["Method"] + [f"{b} Acc. (%)" for b in benches] + ["Avg. Acc. (%)", "LLM Token Ratio (%)", "Avg. LLM Calls"],
        rows,
    )


def table2(ms: dict[str, Metrics]) -> list[str]:
    rows = [
        [
            n,
            _pct(m.accuracy),
            _pct(m.llm_token_ratio),
            f"{m.llm_calls:.3f}",
            f"{m.cost_usd:.6f}",
            "--" if m.cost_normalized is None else f"{m.cost_normalized:.4f}",
            m.n,
            f"{m.llm_failures} / {m.fallbacks}",
        ]
        for n, m in ms.items()
    ]
    return _table(
        [
            "Method",
            "Avg. Acc. (%)",
            "LLM Token Ratio (%)",
            "Avg. LLM Calls",
            "Cost ($)",
            "Cost / LLM-only",
            "Records",
            "LLM failures / fallbacks",
        ],
        rows,
    )


def table3(ms: dict[str, Metrics]) -> list[str]:
    lam = [
        (parse_method(n)[1], m)
        for n, m in ms.items()
        if parse_method(n)[0] == "pyrodash" and parse_method(n)[2] is None
    ]
    rows = [
        [f"λ={k:g}", _pct(m.accuracy), _pct(m.llm_token_ratio), f"{m.llm_calls:.3f}", f"{m.cost_usd:.6f}"]
        for k, m in sorted(lam, key=lambda x: x[0])
    ]
    return _table(["Configuration", "Avg. Acc. (%)", "LLM Token Ratio (%)", "Avg. LLM Calls", "Cost ($)"], rows)


def table4(ms: dict[str, Metrics], prices: Prices, method: str) -> list[str]:
    cols = [c for c in ("slm", method, "llm") if c in ms]
    benches = sorted({b for c in cols for b in ms[c].usage_by_benchmark})
    header = ["Benchmark"] + [f"{c} {h}" for c in cols for h in ("SLM in", "SLM out", "LLM in", "LLM out", "$")]
    rows = []
    for b in benches + ["**Total**"]:
        row = [b]
        for c in cols:
            u = ms[c].usage if b == "**Total**" else ms[c].usage_by_benchmark.get(b, Usage())
            row += [f"{u.slm_in:,}", f"{u.slm_out:,}", f"{u.llm_in:,}", f"{u.llm_out:,}", f"{u.cost(prices):.6f}"]
        rows.append(row)
    return _table(header, rows)


def pareto_verdict(ms: dict[str, Metrics]) -> list[str]:
    """Does some PyroDash point match or beat each routing baseline at no higher cost, and does some λ reach
    <= 10% of LLM-only cost with >= 90% of its accuracy?"""
    ours = [m for n, m in ms.items() if parse_method(n)[0] == "pyrodash"]
    lines = []
    for n, m in ms.items():
        if parse_method(n)[0] not in ("routellm", "glimprouter"):
            continue
        cheaper = [o for o in ours if o.cost_usd <= m.cost_usd]
        best = max(cheaper, key=lambda o: o.accuracy, default=None)
        if best is None:
            lines.append(f"- {n} (acc {_pct(m.accuracy)}%, ${m.cost_usd:.6f}): no PyroDash point costs as little.")
        else:
            verdict = "matched or beaten" if best.accuracy >= m.accuracy else "NOT matched"
            lines.append(
                f"- {n} (acc {_pct(m.accuracy)}%, ${m.cost_usd:.6f}): {verdict} by PyroDash at no higher "
                f"cost — best there is {best.name} (acc {_pct(best.accuracy)}%, ${best.cost_usd:.6f})."
            )
    if "llm" in ms:
        llm = ms["llm"]
        hits = [
            o.name
            for o in ours
            if o.cost_normalized is not None and o.cost_normalized <= 0.10 and o.accuracy >= 0.9 * llm.accuracy
        ]
        lines.append(
            f"- ≤10% of LLM-only cost with ≥90% of its accuracy ({_pct(0.9 * llm.accuracy)}%): "
            + (", ".join(hits) if hits else "no PyroDash point")
        )
    return lines


def verdict_sentence(ms: dict[str, Metrics]) -> str:
    """The Pareto verdict in one sentence: how many routing points PyroDash matches or beats at no higher cost
    (among those at or above its cheapest point's cost), and its closest point to the oracle."""
    ours = [m for n, m in ms.items() if parse_method(n)[0] == "pyrodash"]
    if not ours:
        return "No PyroDash records in this run."
    floor = min(o.cost_usd for o in ours)
    routed = [m for n, m in ms.items() if parse_method(n)[0] in ("routellm", "glimprouter") and m.cost_usd >= floor]
    beaten = [m for m in routed if any(o.cost_usd <= m.cost_usd and o.accuracy >= m.accuracy for o in ours)]
    lost = [m.name for m in routed if m not in beaten]
    text = (
        f"PyroDash matches or beats {len(beaten)} of {len(routed)} RouteLLM-MF/GlimpRouter points at no higher "
        f"cost (those at or above its cheapest point's cost)" + (f"; not {', '.join(lost)}" if lost else "")
    )
    o = ms.get("oracle")
    if o is not None and o.cost_normalized is not None:
        best = max(
            (m for m in ours if m.cost_normalized is not None and m.cost_normalized <= o.cost_normalized + 0.10),
            key=lambda m: m.accuracy,
            default=None,
        )
        text += (
            f"; the oracle single handoff reaches {_pct(o.accuracy)}% at {o.cost_normalized:.3f} of LLM-only "
            "cost, and "
            + (
                f"the best PyroDash point within +0.10 of its cost is {best.name} at "
                f"{_pct(best.accuracy)}% ({best.cost_normalized:.3f})"
                if best
                else "no PyroDash point comes within +0.10 of its cost"
            )
        )
    return text + "."


def oracle_distance(ms: dict[str, Metrics]) -> list[str]:
    """Each PyroDash point against the oracle single handoff (`pyrodash.eval.oracle`): accuracy gap (points) and
    cost gap (fraction of LLM-only), so a world limit (the oracle itself is far from LLM-only) reads apart from a
    training gap (the policy is far from the oracle)."""
    if "oracle" not in ms:
        return ["(no oracle records in this run: add `- oracle` to the eval config's methods)"]
    o = ms["oracle"]
    rows = []
    for n, m in ms.items():
        if parse_method(n)[0] != "pyrodash":
            continue
        dc = None if m.cost_normalized is None or o.cost_normalized is None else m.cost_normalized - o.cost_normalized
        rows.append(
            [
                n,
                _pct(m.accuracy),
                "--" if m.cost_normalized is None else f"{m.cost_normalized:.4f}",
                f"{100 * (m.accuracy - o.accuracy):+.2f}",
                "--" if dc is None else f"{dc:+.4f}",
                "yes" if dc is not None and m.accuracy >= o.accuracy - 0.05 and dc <= 0.10 else "no",
            ]
        )
    head = (
        [
            f"Oracle: {_pct(o.accuracy)}% at {o.cost_normalized:.4f} of LLM-only cost, {o.llm_calls:.3f} LLM calls "
            "per problem.",
            "",
        ]
        if o.cost_normalized is not None
        else []
    )
    return head + _table(
        [
            "Method",
            "Avg. Acc. (%)",
            "Cost / LLM-only",
            "Δ acc. vs oracle (points)",
            "Δ cost vs oracle",
            "within 5 points at ≤ oracle cost + 0.10",
        ],
        rows,
    )


def world_line(run_dir: Path) -> list[str]:
    """The run's world and where its base models come from (`models_source` of its world.json), when the run names
    one."""
    try:
        world = json.loads((run_dir / "config.resolved.json").read_text()).get("world_dir")
        info = json.loads((Path(world) / "world.json").read_text()) if world else None
    except (OSError, ValueError, TypeError):
        return []
    if not info:
        return []
    return [
        f"World: `{world}` (seed {info.get('seed')}, config hash {info.get('config_hash')}); models: "
        f"{models_source(info)}.",
        "",
    ]


def baseline_notes(run_dir: Path, runs: dict[str, list[dict]]) -> list[str]:
    """RouteLLM-MF's router (labels, fit, α) and the realised LLM shares / steps of both routing baselines."""
    lines = []
    rj = run_dir / "routellm" / "router.json"
    if rj.exists():
        meta = json.loads(rj.read_text())
        keep = ("pool", "slm_acc", "llm_acc", "n_labels", "n_llm_wins", "train_acc", "train_loss", "dim", "spec")
        lines.append("- RouteLLM-MF router: " + ", ".join(f"{k}={meta[k]}" for k in keep if k in meta))
    aj = run_dir / "routellm" / "alphas.json"
    if aj.exists():
        a = json.loads(aj.read_text())
        lines.append(
            f"- RouteLLM-MF α: {a.get('alphas')} (calibrated to target LLM shares {a.get('shares')} on the "
            "training pool)"
        )
    gj = run_dir / "glimprouter" / "taus.json"
    if gj.exists():
        g = json.loads(gj.read_text())
        lines.append(
            f"- GlimpRouter τ calibrated to step shares {g['spec']['step_shares']}: {g['taus']} (SLM "
            f"first-token entropy quantiles over {g['n_steps']} training-pool steps: "
            f"{g['entropy_quantiles']})"
        )
    for n, rs in runs.items():
        fam = parse_method(n)[0]
        if fam == "routellm":
            share = sum(r.get("route") == "llm" for r in rs) / len(rs)
            lines.append(f"- {n}: {100 * share:.1f}% of queries routed to the LLM")
        elif fam == "glimprouter":
            steps = sum(len(r.get("entropies") or []) for r in rs)
            lines.append(
                f"- {n}: {sum(r['llm_calls'] for r in rs)} LLM-written steps of {steps} steps "
                f"({sum(1 for r in rs if r['llm_calls'])}/{len(rs)} queries used the LLM)"
            )
    return lines or ["(no routing baselines in this run)"]


def _fence(text: str) -> list[str]:
    return ["```", text.replace("```", "ʼʼʼ"), "```"]


def render(run_dir: str | Path, prices: Prices | None = None) -> tuple[str, dict, dict[str, Metrics]]:
    """(markdown, summary dict, metrics) of a run; `prices` re-prices it (default: the run's own sheet)."""
    duplicates: dict[str, int] = {}
    all_runs = load_run(run_dir, duplicates)
    runs = single_turn(all_runs)
    own = run_prices(run_dir)
    prices = prices or own
    ms = all_metrics(runs, prices)
    lam_names = lambda_points(ms)
    out = [
        f"# PyroDash evaluation report: `{Path(run_dir).name}`",
        "",
        f"Prices (USD per million tokens): {prices.to_dict()}. Every number below is recomputed from "
        f"`records/*.jsonl`.",
        "",
    ] + world_line(Path(run_dir))
    if duplicates:
        out += [
            "Duplicate records ignored (the last line per (benchmark, id, sample) is kept): "
            + ", ".join(f"{n}: {k}" for n, k in duplicates.items())
            + ".",
            "",
        ]
    out += ["## Table 1: per-benchmark accuracy", ""] + table1(ms)
    out += ["", "## Table 2: averages and dollars", ""] + table2(ms)
    out += ["", "## Table 3: sensitivity to λ", ""] + (table3(ms) if lam_names else ["(no pyrodash@<λ> records)"])
    t4 = lam_names[-1] if lam_names else None
    out += ["", f"## Table 4: token usage and cost per benchmark (slm, {t4 or '--'}, llm)", ""]
    out += table4(ms, prices, t4 or "")
    out += ["", "## Pareto verdict", "", verdict_sentence(ms), ""] + pareto_verdict(ms) + ["", "![Pareto](pareto.png)"]
    out += ["", "## Distance to the oracle single handoff", ""] + oracle_distance(ms)
    out += ["", "## Baselines as run", ""] + baseline_notes(Path(run_dir), runs)
    out += ["", "## Conversations: per turn", ""] + conversation_sections(all_runs, prices)
    out += [
        "",
        "## LLM endpoints (mesh)",
        "",
        "Each endpoint's tokens at its own price sheet (`llm_endpoints` of the "
        "records); the totals above use these prices for mesh records.",
        "",
    ] + mesh_table(all_runs, prices)
    out += [
        "",
        "## Trigger positions",
        "",
        "Where the LLM first takes over, in steps (boundary `\\n\\n`), relative to the first step the SLM was not "
        "taught (`meta.hard_steps`).",
        "",
    ]
    rows = [
        [n] + list(trigger_positions(runs[n]).values())
        for n in ms
        if parse_method(n)[0] in ("pyrodash", "glimprouter", "oracle")
    ]
    out += _table(["Method", "before", "at", "after", "no hard step", "hard, no handoff", "handoffs"], rows)
    out += ["", "## Case studies", ""]
    for n, r in case_studies(runs):
        head = f"### {n} · {r['benchmark']} #{r['id']} · {'correct' if r.get('correct') else 'wrong'}"
        out += [head, "", "**Question**", ""] + _fence(r.get("question", ""))
        slm = "".join(s["text"] for s in r.get("segments", []) if s["by"] == "slm")
        llm = "".join(s["text"] for s in r.get("segments", []) if s["by"] == "llm")
        if r.get("llm_calls"):
            out += ["", f"**SLM prefix** ({r.get('handoff')} tokens)", ""] + _fence(slm)
            out += ["", "**⟨offload⟩ → LLM continuation**", ""] + _fence(llm)
        else:
            out += ["", "**SLM-only answer (no LLM call)**", ""] + _fence(slm or r.get("output", ""))
        out += ["", f"gold: `{r.get('gold')}` · usage: {usage_of(r).to_dict()}", ""]
    sheets = {"run": own, "report": prices}
    sheets.update({p.stem: Prices.from_yaml(p) for p in sorted(PRICES_DIR.glob("*.yaml"))})
    out += ["", "## Re-pricing (total $ under each sheet)", ""]
    out += _table(
        ["Method"] + list(sheets), [[n] + [f"{m.usage.cost(s):.6f}" for s in sheets.values()] for n, m in ms.items()]
    )
    summary = summary_dict(ms, prices)
    turns = gold_history_turns(all_runs, prices)
    if turns:  # the gold-history turns, as before own-history benchmarks (tests/test_demo.py reads it)
        summary["per_turn"] = turns
    by_bench = per_turn_by_benchmark(all_runs, prices)
    if by_bench:
        summary["per_turn_by_benchmark"] = by_bench
        summary["turn_pareto"] = {b: turn_pareto(pt) for b, pt in by_bench.items()}
    if duplicates:
        summary["duplicates_dropped"] = duplicates
    return "\n".join(out) + "\n", summary, ms


def write_report(run_dir: str | Path, prices: Prices | None = None) -> Path:
    """Write `report.md`, `summary.json` and `pareto.png` into `run_dir`; returns the report path."""
    run_dir = Path(run_dir)
    md, summary, ms = render(run_dir, prices)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    pareto_png(ms, run_dir / "pareto.png")
    (run_dir / "report.md").write_text(md)
    return run_dir / "report.md"
