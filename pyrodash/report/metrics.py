"""Per-method metrics recomputed from stored records (accuracy, LLM token ratio, calls, dollars), `summary.json`'s
methods, trigger positions and the case studies' picks."""

from __future__ import annotations

from dataclasses import dataclass, field

from pyrodash.cost import Prices, Usage, llm_token_ratio, total_usage
from pyrodash.eval.names import parse_method
from pyrodash.record import usage_of

STEP_BOUNDARY = "\n\n"


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
    total = Usage(slm_in=u.slm_in, slm_out=u.slm_out, slm_cached_in=u.slm_cached_in).cost(prices)
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
        # input an earlier call of the answer sent (relay): a prefix cache's, unless the provider reported a figure
        prior = 0 if e.get("cache_reported") else e.get("llm_prior_in", 0)
        total += Usage(
            llm_in=e["llm_in"], llm_out=e["llm_out"], llm_cached_in=e["llm_cached_in"], llm_prior_in=prior
        ).cost(sheet)
    return total


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
