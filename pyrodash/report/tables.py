"""The report's single-question tables (the paper's Tables 1-4), the LLM mesh table and the Pareto verdicts."""

from __future__ import annotations

from pyrodash.cost import Prices, Usage
from pyrodash.eval.names import parse_method
from pyrodash.report.markdown import md_table, pct
from pyrodash.report.metrics import Metrics, record_cost


def table1(ms: dict[str, Metrics]) -> list[str]:
    benches = sorted({b for m in ms.values() for b in m.per_benchmark})
    rows = [
        [n]
        + [pct(m.per_benchmark.get(b)) for b in benches]
        + [pct(m.accuracy), pct(m.llm_token_ratio), f"{m.llm_calls:.3f}"]
        for n, m in ms.items()
    ]
    return md_table(
        ["Method"] + [f"{b} Acc. (%)" for b in benches] + ["Avg. Acc. (%)", "LLM Token Ratio (%)", "Avg. LLM Calls"],
        rows,
    )


def table2(ms: dict[str, Metrics]) -> list[str]:
    rows = [
        [
            n,
            pct(m.accuracy),
            pct(m.llm_token_ratio),
            f"{m.llm_calls:.3f}",
            f"{m.cost_usd:.6f}",
            "--" if m.cost_normalized is None else f"{m.cost_normalized:.4f}",
            m.n,
            f"{m.llm_failures} / {m.fallbacks}",
        ]
        for n, m in ms.items()
    ]
    return md_table(
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
        [f"λ={k:g}", pct(m.accuracy), pct(m.llm_token_ratio), f"{m.llm_calls:.3f}", f"{m.cost_usd:.6f}"]
        for k, m in sorted(lam, key=lambda x: x[0])
    ]
    return md_table(["Configuration", "Avg. Acc. (%)", "LLM Token Ratio (%)", "Avg. LLM Calls", "Cost ($)"], rows)


def table4(ms: dict[str, Metrics], prices: Prices, method: str) -> list[str]:
    cols = [c for c in ("slm", method, "llm") if c in ms]
    benches = sorted({b for c in cols for b in ms[c].usage_by_benchmark})
    header = ["Benchmark"] + [f"{c} {h}" for c in cols for h in ("SLM in", "SLM out", "LLM in", "LLM out", "$")]
    rows = []
    for b in benches + ["**Total**"]:
        row = [b]
        for c in cols:
            u = ms[c].usage if b == "**Total**" else ms[c].usage_by_benchmark.get(b, Usage())
            slm_in = f"{u.slm_in:,}" + (f" ({u.slm_cached_in:,} cached)" if u.slm_cached_in else "")
            row += [slm_in, f"{u.slm_out:,}", f"{u.llm_in:,}", f"{u.llm_out:,}", f"{u.cost(prices):.6f}"]
        rows.append(row)
    return md_table(header, rows)


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
    return md_table(["Method", "LLM endpoint", "calls", "failed", "LLM in", "LLM out", "$/M in/out", "$"], rows)


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
            lines.append(f"- {n} (acc {pct(m.accuracy)}%, ${m.cost_usd:.6f}): no PyroDash point costs as little.")
        else:
            verdict = "matched or beaten" if best.accuracy >= m.accuracy else "NOT matched"
            lines.append(
                f"- {n} (acc {pct(m.accuracy)}%, ${m.cost_usd:.6f}): {verdict} by PyroDash at no higher "
                f"cost — best there is {best.name} (acc {pct(best.accuracy)}%, ${best.cost_usd:.6f})."
            )
    if "llm" in ms:
        llm = ms["llm"]
        hits = [
            o.name
            for o in ours
            if o.cost_normalized is not None and o.cost_normalized <= 0.10 and o.accuracy >= 0.9 * llm.accuracy
        ]
        lines.append(
            f"- ≤10% of LLM-only cost with ≥90% of its accuracy ({pct(0.9 * llm.accuracy)}%): "
            + (", ".join(hits) if hits else "no PyroDash point")
        )
    return lines


def verdict_sentence(ms: dict[str, Metrics]) -> str:
    """The Pareto verdict in one sentence: how many routing points PyroDash matches or beats at no higher cost
    (among those at or above its cheapest point's cost), and its most accurate point near the oracle's cost on these
    same problems (a best-on-this-set figure: the point to serve is picked on val, `pyrodash.report.select`)."""
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
            f"; the oracle single handoff reaches {pct(o.accuracy)}% at {o.cost_normalized:.3f} of LLM-only "
            "cost, and "
            + (
                f"the most accurate PyroDash point on these problems within +0.10 of its cost (read here, not "
                f"picked on held-out data) is {best.name} at {pct(best.accuracy)}% ({best.cost_normalized:.3f})"
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
                pct(m.accuracy),
                "--" if m.cost_normalized is None else f"{m.cost_normalized:.4f}",
                f"{100 * (m.accuracy - o.accuracy):+.2f}",
                "--" if dc is None else f"{dc:+.4f}",
                "yes" if dc is not None and m.accuracy >= o.accuracy - 0.05 and dc <= 0.10 else "no",
            ]
        )
    head = (
        [
            f"Oracle: {pct(o.accuracy)}% at {o.cost_normalized:.4f} of LLM-only cost, {o.llm_calls:.3f} LLM calls "
            "per problem.",
            "",
        ]
        if o.cost_normalized is not None
        else []
    )
    return head + md_table(
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
