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

from pyrodash.engine.range_rule import RangeRule


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


# ---- the range rule: the last turn the policy keeps, measured on validation conversations -------------------------
@dataclass
class RangeCalibration:
    """Per turn of the validation conversations (gold history): accuracy and mean $ of the policy (rule off) and of
    the LLM alone, the SLM prompt's tokens; `max_turns`: the last turn up to which every turn is within range. Both
    are measured turn by turn and stop at the first turn out of range (no later turn can move `max_turns`): the rows
    after it carry only their turn and size (`within: None`, not measured)."""

    max_turns: int | None  # None: every turn measured is within range (no limit found)
    min_ratio: float  # a turn is within range when the policy reaches this share of the LLM's accuracy ...
    by_turn: list[dict]  # ... and at least the LLM's accuracy per dollar: {turn, n, policy_acc, llm_acc, ...}
    questions: int

    @property
    def rule(self) -> dict:
        return {"max_turns": self.max_turns, "max_context_tokens": None}

    @property
    def policy_questions(self) -> int:
        """The turns the policy answered (up to and with the first turn out of range)."""
        return sum(r["n"] for r in self.by_turn if r["within"] is not None)

    def to_dict(self) -> dict:
        return {**asdict(self), "range_rule": self.rule, "policy_questions": self.policy_questions}


def within_range(row: dict, min_ratio: float) -> bool:
    """Whether the policy keeps a turn: at least `min_ratio` of the LLM's accuracy, and at least the LLM's accuracy
    per dollar (a free policy beats any LLM per dollar; a policy right nowhere beats none)."""
    pa, la, pc, lc = row["policy_acc"], row["llm_acc"], row["policy_cost_usd"], row["llm_cost_usd"]
    per_dollar = pa * lc >= la * pc  # pa / pc >= la / lc without dividing by a zero cost
    return pa >= min_ratio * la and per_dollar and (pa > 0 or la == 0)


def turn_row(turn: int, n: int, llm=None, ok_llm=None, policy=None, ok_policy=None) -> dict:
    """One turn's row of `n` questions: accuracy and mean $ of the LLM (its `Done`s) and of the policy, its handoff
    rate and its SLM prompt tokens (mean, min, max: the prompt the turn puts to the SLM under P_s); a model's fields
    are None where it was not measured (past the first turn out of range, neither is)."""
    row = {"turn": turn, "n": n, "llm_acc": None, "llm_cost_usd": None, "policy_acc": None, "policy_cost_usd": None,
           "policy_handoff_rate": None, "slm_prompt_tokens": None, "within": None}  # fmt: skip
    if llm is not None:
        row.update(llm_acc=sum(ok_llm) / n, llm_cost_usd=sum(d.cost_usd for d in llm) / n)
    if policy is not None:
        toks = [d.usage.slm_in for d in policy]
        row.update(
            policy_acc=sum(ok_policy) / n,
            policy_cost_usd=sum(d.cost_usd for d in policy) / n,
            policy_handoff_rate=sum(d.handoff is not None for d in policy) / n,
            slm_prompt_tokens={"mean": sum(toks) / n, "min": min(toks), "max": max(toks)},
        )
    return row


def calibrate_range(engine, chats: list, golds: list, turns: list[int], grade, min_ratio: float = 0.9, **kw):
    """The range rule's `max_turns` from validation conversations (`chats`: each turn's messages after the gold
    history; `grade(outputs, golds)` -> bools): turn by turn from the first, the LLM alone and the policy (collab,
    rule off) answer the turn, until a turn is not `within_range`; `max_turns` is the last turn before it. No later
    turn can move `max_turns`, so neither model answers one (its row says "not measured"; the LLM's answers to the
    turns it does answer may already be in the engine's answer store: `pyrodash.eval.long.llm_validation_answers`).
    `kw`: `engine.batch` options (batch_size, ...)."""
    if not chats or not (len(chats) == len(golds) == len(turns)):
        raise ValueError("range calibration needs one gold and one turn number per conversation turn")
    if not 0.0 <= min_ratio <= 1.0:
        raise ValueError(f"min_ratio={min_ratio} must be in [0, 1]")
    rows, last, out_of_range = [], None, False
    for t in sorted(set(turns)):
        ix = [i for i, x in enumerate(turns) if x == t]
        if out_of_range:  # past the first turn out of range: no answer can move max_turns
            rows.append(turn_row(t, len(ix)))
            continue
        these, gold = [chats[i] for i in ix], [golds[i] for i in ix]
        llm = engine.batch(these, mode="llm", **kw)
        off = [{"range_rule": RangeRule()}] * len(ix)
        policy = engine.batch(these, mode="collab", options=off, **kw)
        row = turn_row(
            t, len(ix), llm, grade([d.output for d in llm], gold), policy, grade([d.output for d in policy], gold)
        )
        row["within"] = within_range(row, min_ratio)
        rows.append(row)
        out_of_range = not row["within"]
        last = t if row["within"] else last
    limit = (last or 0) if out_of_range else None
    return RangeCalibration(max_turns=limit, min_ratio=min_ratio, by_turn=rows, questions=len(chats))
