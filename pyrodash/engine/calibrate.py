"""Pick the `offload_bias` that gives a target LLM-call rate, or the most LLM help within a $ budget per question.

    cal = calibrate_offload_bias(engine, questions, target_rate=0.3)        # or budget_usd=0.002
    engine.offload_bias = cal.bias

The counterpart, for a trained offloading policy, of RouteLLM's threshold calibration. The bias is added to the
`<offload>` logit while the SLM decodes, so (greedy decoding, fixed budget) the set of questions that hand off can
only grow with it: the LLM-call rate is a non-decreasing step function of the bias, and bisection finds it.
- Target rate: only the SLM runs (Lines 1-5 of Algorithm 1: did `<offload>` end decoding?); no LLM call is made.
- Budget: the full engine runs (SLM + LLM, exact usage) and the mean $ per question is compared to the budget;
  the result is the largest bias found whose mean cost stays within it.
"""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field


@dataclass
class Calibration:
    bias: float
    rate: float  # share of questions that hand off (= LLM calls per question) at `bias`
    cost_usd: float | None  # mean $ per question at `bias` (budget mode only)
    target: str  # "rate=0.3" | "budget_usd=0.002"
    met: bool  # the rate is within one question of the target / the cost is within the budget
    trace: list[dict] = field(default_factory=list)  # every evaluated point: {bias, rate, cost_usd}

    def to_dict(self) -> dict:
        return asdict(self)


async def handoff_positions(engine, questions: list, bias: float, concurrency: int = 8, **kw) -> list[int | None]:
    """For each question: SLM tokens before `<offload>` at this bias, or None when the SLM answers alone
    (only the SLM runs: `engine.abatch(..., stop_at_handoff=True)`, batched when the SLM runs in process)."""
    dones = await engine.abatch(
        questions,
        options=[{"offload_bias": bias, **kw}] * len(questions),
        batch_size=concurrency * 4,
        concurrency=concurrency,
        stop_at_handoff=True,
    )
    return [d.handoff for d in dones]


def _check_target(
    questions: list, target_rate: float | None, budget_usd: float | None, lo: float, hi: float, iters: int
) -> None:
    """A ValueError naming what is wrong with a calibration's target, questions or search range."""
    if (target_rate is None) == (budget_usd is None):
        raise ValueError("give exactly one of target_rate (LLM calls per question, 0..1) or budget_usd")
    if target_rate is not None and not 0.0 <= target_rate <= 1.0:
        raise ValueError(f"target_rate={target_rate} must be between 0 and 1")
    if budget_usd is not None and budget_usd < 0:
        raise ValueError(f"budget_usd={budget_usd} must be non-negative")
    if not questions:
        raise ValueError("calibration needs at least one question")
    if not lo < hi or iters < 1:
        raise ValueError("calibration needs lo < hi and iters >= 1")


async def acalibrate_offload_bias(
    engine,
    questions: list,
    target_rate: float | None = None,
    budget_usd: float | None = None,
    lo: float = -20.0,
    hi: float = 20.0,
    iters: int = 12,
    concurrency: int = 8,
    **kw,
) -> Calibration:
    _check_target(questions, target_rate, budget_usd, lo, hi, iters)
    n = len(questions)
    seen: dict[float, dict] = {}

    async def point(b: float) -> dict:
        if b not in seen:
            if target_rate is not None:
                pos = await handoff_positions(engine, questions, b, concurrency, **kw)
                seen[b] = {"bias": b, "rate": sum(p is not None for p in pos) / n, "cost_usd": None}
            else:
                dones = await engine.abatch(
                    questions,
                    options=[{"offload_bias": b, **kw}] * n,
                    batch_size=concurrency * 4,
                    concurrency=concurrency,
                )
                seen[b] = {
                    "bias": b,
                    "rate": sum(d.handoff is not None for d in dones) / n,
                    "cost_usd": sum(d.cost_usd for d in dones) / n,
                }
        return seen[b]

    def too_high(pt: dict) -> bool:  # the bias hands off more than wanted
        return pt["rate"] > target_rate if target_rate is not None else pt["cost_usd"] > budget_usd

    a, b = lo, hi
    for _ in range(iters):
        mid = (a + b) / 2
        if too_high(await point(mid)):
            b = mid
        else:
            a = mid
    pts = [await point(lo), await point(hi)] + list(seen.values())
    if target_rate is not None:
        best = min(pts, key=lambda p: (abs(p["rate"] - target_rate), p["bias"]))
        met = abs(best["rate"] - target_rate) <= 1.0 / n + 1e-12
        label = f"rate={target_rate}"
    else:
        ok = [p for p in pts if p["cost_usd"] <= budget_usd]
        best = max(ok, key=lambda p: p["bias"]) if ok else min(pts, key=lambda p: p["cost_usd"])
        met = bool(ok)
        label = f"budget_usd={budget_usd}"
    trace = sorted(seen.values(), key=lambda p: p["bias"])
    return Calibration(
        bias=best["bias"], rate=best["rate"], cost_usd=best["cost_usd"], target=label, met=met, trace=trace
    )


def calibrate_offload_bias(engine, questions: list, **kw) -> Calibration:
    """Blocking `acalibrate_offload_bias` (see the module docstring)."""
    return asyncio.run(acalibrate_offload_bias(engine, questions, **kw))
