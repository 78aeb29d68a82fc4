"""The spend pacer: a feedback controller that holds one budget's dollar rate by moving the operating point.

    spec = PacerSpec(rate=2.0 / 3600)             # dollars per (budget) second; see pyrodash.server.budget.config
    st = PacerState()
    d = arrive(st, spec, t, admitted=lambda share: engine.handoff_admitted(messages, share), base_share=1.0)
    ...                                           # the engine answers at d.handoff_share / d.offload_bias
    finish(st, spec, t2, d, actual_usd)           # the Done's dollars

Everything here is pure arithmetic on a `PacerState` (a flat record of floats, so replicas can keep it in one Redis
hash, `pyrodash.server.budget.store`). The controller (feedforward, integral feedback, no wind-up, no delay, the hard
cap), the budget's clock and the `offload_bias` knob: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

SHARE, BIAS = "handoff_share", "offload_bias"
FAST = 4.0  # the fast arrival average runs over rate_window_s / FAST


@dataclass(frozen=True)
class Curve:
    """Dollars per request against `offload_bias`, from `pyrodash calibrate --budget-usd X --json` (its `trace`:
    bias, LLM-call rate, mean cost_usd per question, measured by running the engine on a traffic sample). Costs are
    made non-decreasing in the bias (the handoff set only grows with it)."""

    bias: tuple[float, ...]
    cost: tuple[float, ...]

    @classmethod
    def from_trace(cls, trace: list[dict]) -> Curve:
        pts = sorted((float(p["bias"]), float(p["cost_usd"])) for p in trace if p.get("cost_usd") is not None)
        if len(pts) < 2:
            raise ValueError(
                "a budget curve needs at least two points with cost_usd: run `pyrodash calibrate "
                "--budget-usd X --json` (the --target-rate mode measures no dollars)"
            )
        bias, cost, top = [], [], -math.inf
        for b, c in pts:
            top = max(top, c)
            bias.append(b)
            cost.append(top)
        return cls(tuple(bias), tuple(cost))

    def at(self, bias: float) -> float:
        """Interpolated dollars per request at `bias` (flat beyond the measured range)."""
        b, c = self.bias, self.cost
        if bias <= b[0]:
            return c[0]
        for i in range(1, len(b)):
            if bias <= b[i]:
                w = (bias - b[i - 1]) / (b[i] - b[i - 1]) if b[i] > b[i - 1] else 1.0
                return c[i - 1] + w * (c[i] - c[i - 1])
        return c[-1]

    def bias_for(self, fraction: float, top_bias: float) -> float:
        """The lowest bias whose dollars per request are `fraction` of the way from the curve's floor (its lowest
        bias) to its value at `top_bias` (the operating point's); never above `top_bias`."""
        lo, hi = self.cost[0], self.at(top_bias)
        if fraction >= 1.0 or hi <= lo:
            return top_bias
        want = lo + max(0.0, fraction) * (hi - lo)
        b, c = self.bias, self.cost
        for i in range(1, len(b)):
            if c[i] >= want and b[i - 1] < top_bias:
                w = (want - c[i - 1]) / (c[i] - c[i - 1]) if c[i] > c[i - 1] else 0.0
                return min(top_bias, b[i - 1] + w * (b[i] - b[i - 1]))
        return min(top_bias, b[0])


@dataclass(frozen=True)
class PacerSpec:
    """One budget's controller settings. Money in dollars, time in budget seconds."""

    rate: float  # target dollars per second
    period_s: float = 3600.0  # the period of the hard cap (an hour for usd_per_hour, a day for usd_per_day)
    cap: float | None = None  # dollars per period, or None
    at_cap: str = "slm"  # "slm": the SLM alone until the period ends; "refuse": 429
    knob: str = SHARE
    integral_s: float = 300.0  # the bank is paid back / made up within about this long
    rate_window_s: float = 600.0  # arrival-rate and spend-rate averaging window
    bank_s: float = 600.0  # at most this many seconds of target spend banked ...
    debt_s: float = 3600.0  # ... or owed
    cost_window: int = 50  # dollars per request: a running mean over about this many requests
    # in a period's first head_start_s, requests go through at the policy's own point while the period's dollars stay
    # within head_start_s seconds of target spend ahead of its allowance (paid back later in the period): the traffic
    # estimate lags a sudden drop, and a quiet period must not start by turning away the requests it can afford
    head_start_s: float = 0.0
    prior_c1: float | None = None  # dollars per request inside the share (from the curve), else learnt
    prior_c0: float | None = None  # ... outside it
    prior_weight: int = 5  # the prior counts as this many requests
    curve: Curve | None = None  # for the offload_bias knob
    curve_top_bias: float = 0.0  # the bias at which the curve's cost is the policy's own (c1)


@dataclass
class PacerState:
    """What the controller remembers (shared by all replicas through Redis when there is one)."""

    t: float = -math.inf  # last update, budget seconds (-inf: never)
    age: float = 0.0  # seconds observed (bias correction of the rate averages)
    spend: float = 0.0  # dollars charged since the budget began (expected dollars of answers still in flight)
    bank: float = 0.0  # allowance accrued at the target rate minus dollars charged (clamped, see module doc)
    period: float = -1.0  # index of the current period
    period_spend: float = 0.0  # dollars charged in the current period
    arrivals: float = 0.0  # paced requests per second (exponentially weighted over rate_window_s)
    arrivals_fast: float = 0.0  # ... over a quarter of it
    rate: float = 0.0  # dollars per second (exponentially weighted)
    c1: float = 0.0  # dollars per request inside the share
    n1: float = 0.0  # requests behind c1 (capped at cost_window)
    c0: float = 0.0  # dollars per request outside the share
    n0: float = 0.0
    level: float = 1.0  # the controller's last output: the share (or curve fraction) it wanted, 0..1
    requests: float = 0.0  # requests drawn on this budget
    cap_hits: float = 0.0  # requests answered by the SLM alone or refused at the hard cap

    def to_strings(self) -> dict[str, str]:
        return {k: repr(float(v)) for k, v in asdict(self).items()}

    @classmethod
    def from_strings(cls, raw: dict) -> PacerState:
        names = {f.name for f in fields(cls)}
        vals = {}
        for k, v in raw.items():
            k = k.decode() if isinstance(k, bytes) else k
            if k in names:
                vals[k] = float(v.decode() if isinstance(v, bytes) else v)
        return cls(**vals)

    def copy(self) -> PacerState:
        return PacerState(**asdict(self))


@dataclass
class Decision:
    """What one request got from its budget."""

    level: float  # the controller's output (share ceiling, or curve fraction), before the cap
    handoff_share: float | None  # the share the engine is given (None: unchanged)
    offload_bias: float | None  # the bias the engine is given (None: unchanged)
    admitted: bool  # inside the share (may hand off)
    expected: float  # dollars charged at admission
    state: str  # "paced" | "policy" (the policy wants less than the budget) | "capped" | "refused"
    # | "solo" (mode slm/llm: not paced, charged when done) | "learning" (no dollars measured yet)
    paced: bool = True
    period: float = 0.0


def _ewma_decay(x: float, dt: float, window: float) -> float:
    return x * math.exp(-dt / window) if dt > 0 else x


def advance(st: PacerState, spec: PacerSpec, t: float) -> None:
    """Move the state to time `t`: the averages decay, the allowance accrues (within its clamps), a new period
    starts with nothing spent and nothing banked."""
    period = math.floor(t / spec.period_s)
    if st.t == -math.inf:
        st.t, st.period = t, float(period)
        return
    dt = t - st.t
    if dt > 0:
        st.arrivals = _ewma_decay(st.arrivals, dt, spec.rate_window_s)
        st.arrivals_fast = _ewma_decay(st.arrivals_fast, dt, spec.rate_window_s / FAST)
        st.rate = _ewma_decay(st.rate, dt, spec.rate_window_s)
        st.age += dt
        st.bank += spec.rate * dt
        st.t = t
    st.bank = min(max(st.bank, -spec.rate * spec.debt_s), spec.rate * spec.bank_s)
    if period != st.period:  # a new period starts afresh: nothing spent, nothing banked or owed
        st.period, st.period_spend, st.bank = float(period), 0.0, 0.0


def charge(st: PacerState, spec: PacerSpec, usd: float) -> None:
    """Count `usd` (may be negative: a correction) against the budget."""
    st.spend += usd
    st.period_spend += usd
    st.bank -= usd
    st.rate += usd / spec.rate_window_s


def _costs(st: PacerState, spec: PacerSpec) -> tuple[float | None, float]:
    """(dollars per request inside the share or None when nothing is known yet, outside it)."""
    c1 = st.c1 if st.n1 > 0 else spec.prior_c1
    c0 = st.c0 if st.n0 > 0 else (spec.prior_c0 or 0.0)
    return c1, c0


def _unbiased(x: float, age: float, window: float) -> float:
    young = 1.0 - math.exp(-age / window) if age > 0 else 0.0
    return x / young if young > 1e-3 else x


def arrival_rate(st: PacerState, spec: PacerSpec) -> float:
    """Paced requests per second: the lower of a slow and a fast average (bias-corrected while young). Lower,
    because the two errors are not alike: too low a rate overspends for a moment, which the bank pays back later
    in the period; too high a rate holds back handoffs that a quieter rest of the period may not make up for."""
    slow = _unbiased(st.arrivals, st.age, spec.rate_window_s)
    fast = _unbiased(st.arrivals_fast, st.age, spec.rate_window_s / FAST)
    return min(slow, fast)


def spend_rate(st: PacerState, spec: PacerSpec) -> float:
    young = 1.0 - math.exp(-st.age / spec.rate_window_s) if st.age > 0 else 0.0
    return st.rate / young if young > 1e-3 else st.rate


def wanted_level(st: PacerState, spec: PacerSpec) -> float:
    """The controller's output in [0, 1]: the share (or curve fraction) whose spend rate meets the target plus the
    bank's payback, at the measured arrival rate and dollars per request."""
    c1, c0 = _costs(st, spec)
    if c1 is None:
        return 1.0  # nothing measured and no curve: let one request through and learn its dollars
    elapsed = st.t - st.period * spec.period_s
    if elapsed < spec.head_start_s and st.period_spend + c1 <= spec.rate * (elapsed + spec.head_start_s):
        return 1.0  # a period's head start: the traffic estimate may still be the last period's
    n = arrival_rate(st, spec)
    left = (st.period + 1) * spec.period_s - st.t  # the bank is settled by the period's end at the latest
    want = spec.rate + st.bank / max(1e-9, min(spec.integral_s, left))
    span = n * (c1 - c0)
    if span <= 1e-18:
        return 1.0 if want >= n * c0 else 0.0
    return min(1.0, max(0.0, (want - n * c0) / span))


def arrive(
    st: PacerState,
    spec: PacerSpec,
    t: float,
    admitted: Callable[[float], bool],
    base_share: float = 1.0,
    base_bias: float = 0.0,
    solo: bool = False,
    cap: str = "",
) -> Decision:
    """A request starts: decide its operating point, charge its expected dollars. `admitted(share)` says whether
    the request falls inside a handoff share (the engine's fixed hash of its messages). `cap`: the hard cap's verdict
    ("": the request's worst case fits; "slm": the SLM alone; "refuse")."""
    advance(st, spec, t)
    st.requests += 1
    period = st.period
    if solo:  # one model answering alone (the playground's compare modes): charged when done, never paced
        if cap:
            st.cap_hits += 1
            return Decision(st.level, None, None, False, 0.0, "capped", paced=False, period=period)
        return Decision(st.level, None, None, True, 0.0, "solo", paced=False, period=period)
    c1, c0 = _costs(st, spec)
    level = wanted_level(st, spec)  # from the rate seen before this arrival (after it, the average is biased up)
    st.arrivals += 1.0 / spec.rate_window_s
    st.arrivals_fast += FAST / spec.rate_window_s
    st.level = level
    capped = bool(cap)
    if capped:
        st.cap_hits += 1
        if cap == "refuse":
            return Decision(level, None, None, False, 0.0, "refused", period=period)
        level_used = 0.0
    else:
        level_used = level
    if spec.knob == BIAS and spec.curve is not None:
        share, inside = None, admitted(base_share)
        if level_used <= 0.0:
            share, inside = 0.0, False
            bias = None
        else:
            bias = min(base_bias, spec.curve.bias_for(level_used, base_bias))
        expected = (c0 + level_used * ((c1 or 0.0) - c0)) if inside else c0
    else:
        share = min(base_share, level_used)
        inside = admitted(share)
        bias = None
        expected = (c1 if c1 is not None else 0.0) if inside else c0
    charge(st, spec, expected)
    if capped:
        state = "capped"
    elif c1 is None:
        state = "learning"
    elif level >= 1.0:
        state = "policy"
    else:
        state = "paced"
    return Decision(level, share, bias, inside, expected, state, period=period)


def finish(st: PacerState, spec: PacerSpec, t: float, d: Decision, actual: float) -> None:
    """A request's Done: replace its expected dollars by the billed ones and learn dollars per request."""
    advance(st, spec, t)
    if d.period == st.period:
        charge(st, spec, actual - d.expected)
    else:  # charged in a period that has ended: its accounting is closed, only the running total moves
        st.spend += actual - d.expected
    if not d.paced or d.state == "refused":
        return
    if spec.knob == BIAS and spec.curve is not None:
        if d.admitted and d.level >= 0.2 and d.state != "capped":
            # the curve's shape is trusted, its scale learnt: this request implies c1 = c0 + (actual - c0) / level
            c1 = max(0.0, st.c0 if st.n0 > 0 else (spec.prior_c0 or 0.0))
            implied = c1 + (actual - c1) / d.level
            st.n1 = min(st.n1 + 1, spec.cost_window)
            st.c1 += (implied - st.c1) / st.n1
        return
    if d.admitted:
        if st.n1 == 0 and spec.prior_c1 is not None:
            st.c1, st.n1 = spec.prior_c1, float(spec.prior_weight)
        st.n1 = min(st.n1 + 1, spec.cost_window)
        st.c1 += (actual - st.c1) / st.n1
    else:
        if st.n0 == 0 and spec.prior_c0 is not None:
            st.c0, st.n0 = spec.prior_c0, float(spec.prior_weight)
        st.n0 = min(st.n0 + 1, spec.cost_window)
        st.c0 += (actual - st.c0) / st.n0
