"""The spend pacer's controller (`pyrodash.server.budget.pacer`), driven by a discrete-event simulation of traffic:
Poisson
arrivals whose rate steps up and down, requests whose dollars arrive when they finish (latency), a handoff share
applied by a hash (uniform in [0, 1)), and price changes.

Budget time units throughout: dollars per second, periods of 600 s."""

from __future__ import annotations

import heapq
import json
import random

import pytest

from pyrodash.server.budget.pacer import (
    BIAS,
    Curve,
    PacerSpec,
    PacerState,
    arrival_rate,
    arrive,
    finish,
)
from pyrodash.server.budget.reserve import MemoryLedger, Ticket, period_of

PERIOD = 600.0


def simulate(
    spec: PacerSpec,
    segments: list[tuple[float, float, float]],
    cost=None,
    seed: int = 0,
    latency=(0.5, 3.0),
    state: PacerState | None = None,
    base_share: float = 1.0,
    worst: float = 1.8,
):
    """Run `segments` ((start, end, arrivals per second)) through the pacer. `cost(rnd, t)` is the dollars of a
    request inside the share (outside: 0, as LLM dollars are), at most `worst` (what each request reserves on a
    hard cap, as `pyrodash.server.budget.reserve` does). Returns (state, rows: (t, level, admitted, usd))."""
    rnd = random.Random(seed)
    cost = cost or (lambda rnd, t: rnd.uniform(0.2, 1.8))  # mean 1 $ per request inside the share
    st = state or PacerState()
    events: list = []
    n = 0
    for a, b, rate in segments:
        t = a
        while rate > 0:
            t += rnd.expovariate(rate)
            if t >= b:
                break
            heapq.heappush(events, (t, n, "arrive", None))
            n += 1
    rows = []
    now = [0.0]
    ledger = MemoryLedger(clock=lambda: now[0])  # the hard cap's reservations, as the server makes them
    while events:
        t, i, kind, payload = heapq.heappop(events)
        now[0] = t
        if kind == "arrive":
            h = rnd.random()
            ticket = Ticket("b", period_of(t, spec.period_s), str(i), worst)
            fits = spec.cap is None or ledger.reserve_now(ticket, spec.cap, 1e9)[0]
            verdict = "" if fits else spec.at_cap
            d = arrive(st, spec, t, lambda share, h=h: h < share, base_share=base_share, cap=verdict)
            usd = cost(rnd, t) if d.admitted else 0.0
            rows.append((t, d.level, d.admitted, usd, d.state))
            heapq.heappush(events, (t + rnd.uniform(*latency), i, "finish", (d, usd, ticket if fits else None)))
        else:
            d, usd, ticket = payload
            if ticket is not None:
                ledger.settle_now(ticket, usd)
            finish(st, spec, t, d, usd)
    return st, rows


def per_period(rows, n_periods: int) -> list[float]:
    out = [0.0] * n_periods
    for t, _, _, usd, _ in rows:
        if 0 <= t < n_periods * PERIOD:
            out[int(t // PERIOD)] += usd
    return out


def spec(**kw) -> PacerSpec:
    base = dict(rate=1.0, period_s=PERIOD, integral_s=PERIOD, rate_window_s=60.0, bank_s=PERIOD, debt_s=PERIOD)
    base.update(kw)
    return PacerSpec(**base)


def test_step_changes_of_traffic_keep_the_spend_on_target():
    # 2x the budget's worth of traffic, then 4x, then 1.5x (steps at period boundaries and in the middle of one)
    segs = [(0, 600, 2.0), (600, 1500, 4.0), (1500, 2400, 1.5)]
    st, rows = simulate(spec(), segs)
    spent = per_period(rows, 4)
    for k, usd in enumerate(spent[1:], start=1):  # the first period learns the dollars per request
        assert abs(usd / PERIOD - 1.0) < 0.05, (k, spent)
    # the share follows the traffic: about 1/4 at 4x, 2/3 at 1.5x
    levels = {k: [lv for t, lv, *_ in rows if k * 300 <= t < (k + 1) * 300] for k in range(8)}
    mean = {k: sum(v) / len(v) for k, v in levels.items()}
    assert 0.18 < mean[4] < 0.35 and 0.55 < mean[7] < 0.8, mean


def test_a_sudden_surge_is_paid_back_within_its_period():
    # a 6x burst for 60 s inside a period at 2x: the period still ends on its target
    segs = [(0, 600, 2.0), (600, 800, 2.0), (800, 860, 12.0), (860, 1200, 2.0)]
    _, rows = simulate(spec(), segs, seed=3)
    assert abs(per_period(rows, 2)[1] / PERIOD - 1.0) < 0.05


def test_light_traffic_gets_the_policy_own_point_and_is_not_banked():
    # half the budget's worth of traffic for two periods, then 3x: the light periods run at share 1 (the policy's
    # own spend, never more), and the unspent allowance does not turn into an overspend when traffic rises
    segs = [(0, 1200, 0.5), (1200, 1800, 3.0)]
    _, rows = simulate(spec(), segs, seed=1)
    light = [r for r in rows if r[0] < 1200]
    assert sum(r[2] for r in light) / len(light) > 0.97  # nearly all admitted
    assert all(r[4] in ("policy", "learning") for r in light[len(light) // 4 :] if r[1] >= 1.0)
    heavy = per_period(rows, 3)[2]
    assert abs(heavy / PERIOD - 1.0) < 0.05


def test_a_quiet_period_after_a_busy_one_starts_at_the_policy_point():
    # 4x the budget's worth, then at the period's boundary a tenth of it: the arrival estimate still sees the busy
    # traffic, but the period's head start lets the quiet period's first requests through (and the busy period
    # still ends on its target)
    segs = [(0, 600, 4.0), (600, 1200, 0.4)]
    _, rows = simulate(spec(head_start_s=50.0), segs, seed=2)
    quiet = [r for r in rows if r[0] >= 600]
    assert all(r[2] for r in quiet), [round(r[1], 2) for r in quiet[:8]]
    assert abs(per_period(rows, 1)[0] / PERIOD - 1.0) < 0.05
    _, rows = simulate(spec(head_start_s=0.0), segs, seed=2)
    assert not all(r[2] for r in rows if r[0] >= 600)  # without it, the first ones are turned away


def test_a_price_change_is_followed():
    # the LLM's price doubles in the middle of period 2: dollars per request double, the share halves, and the
    # periods after it are back on target
    segs = [(0, 3000, 3.0)]
    _, rows = simulate(spec(), segs, cost=lambda rnd, t: rnd.uniform(0.2, 1.8) * (2.0 if t >= 1500 else 1.0))
    spent = per_period(rows, 5)
    assert all(abs(usd / PERIOD - 1.0) < 0.05 for usd in spent[1:]), spent
    before = [lv for t, lv, *_ in rows if 1200 <= t < 1500]
    after = [lv for t, lv, *_ in rows if 2400 <= t < 3000]
    ratio = (sum(after) / len(after)) / (sum(before) / len(before))
    assert 0.4 < ratio < 0.6, ratio


def test_the_share_never_exceeds_the_operating_point_own():
    _, rows = simulate(spec(), [(0, 600, 0.3)], base_share=0.5)  # light traffic: the pacer would allow share 1
    assert rows and all(r[1] <= 1.0 for r in rows)
    admitted = sum(r[2] for r in rows) / len(rows)
    assert admitted < 0.65  # the point's own share (0.5) is the ceiling


def test_the_hard_cap_holds_and_lifts_when_the_period_ends():
    # a cap just above the target, 5x the traffic, answers whose dollars vary 9x and arrive up to 60 s later (many
    # in flight at the period's end), each reserving its worst case: each period's dollars, counted by when their
    # requests came, stay under the cap; and a pacer whose dollars-per-request is wrong (a stale curve, never
    # relearnt) is stopped by the cap
    for sp, seed in ((spec(cap=630.0), 0), (spec(cap=630.0, prior_c1=0.25, cost_window=10**9), 1)):
        st, rows = simulate(sp, [(0, 1800, 5.0)], seed=seed, latency=(5.0, 60.0))
        spent = per_period(rows, 3)
        assert all(usd <= 630.0 for usd in spent), spent
        capped = [r for r in rows if r[4] == "capped"]
        assert not any(r[2] for r in capped)  # at the cap: the SLM alone (share 0)
        assert st.cap_hits == len(capped)
        assert any(r[4] != "capped" for r in rows if 600 <= r[0] < 610)  # the cap lifted with the new period
    assert capped and min(spent) > 560.0  # the stale pacer overspent until the cap held


def test_refuse_at_cap_and_solo_requests_are_charged_but_not_paced():
    sp = spec(cap=2.0, at_cap="refuse")
    st = PacerState()
    d = arrive(st, sp, 1.0, lambda s: True)
    finish(st, sp, 2.0, d, 1.5)
    assert arrive(st, sp, 3.0, lambda s: True, cap="refuse").state == "refused"  # the next worst case did not fit
    assert st.cap_hits == 1
    solo = arrive(st, sp, 4.0, lambda s: True, solo=True, cap="refuse")
    assert solo.state == "capped" and not solo.paced  # the server refuses the LLM alone at the cap
    st2 = PacerState()
    s = arrive(st2, spec(), 1.0, lambda s: True, solo=True)
    assert s.state == "solo" and s.expected == 0.0 and s.handoff_share is None
    finish(st2, spec(), 2.0, s, 0.7)
    assert st2.spend == pytest.approx(0.7) and st2.n1 == 0  # charged, and not mistaken for a paced request


def test_answers_in_flight_count_at_once():
    # 50 requests arrive in one second and none has finished: their expected dollars are already charged (and the
    # arrival rate jumps), so the pacer admits fewer of them than its steady share (0.5) would
    sp = spec(prior_c1=1.0)
    st = PacerState()
    for i in range(200):  # a steady 2 requests per second to learn the rate (finishing at once)
        d = arrive(st, sp, i * 0.5, lambda s: True)
        finish(st, sp, i * 0.5, d, 1.0 if d.admitted else 0.0)
    before = st.spend
    admitted = sum(arrive(st, sp, 100.0 + i * 0.02, lambda s, i=i: (i * 0.618) % 1 < s).admitted for i in range(50))
    assert admitted < 20
    assert st.spend - before == pytest.approx(admitted * st.c1)  # charged at admission, to be corrected when done


def test_a_calibration_curve_seeds_the_dollars_per_request(tmp_path):
    trace = {
        "bias": 0.0,
        "trace": [
            {"bias": -20.0, "rate": 0.0, "cost_usd": 0.2},
            {"bias": 0.0, "rate": 0.8, "cost_usd": 2.2},
            {"bias": 2.0, "rate": 0.9, "cost_usd": 2.6},
        ],
    }
    curve = Curve.from_trace(trace["trace"])
    assert curve.at(-10.0) == pytest.approx(1.2) and curve.at(5.0) == pytest.approx(2.6)
    with_curve = spec(prior_c1=2.0)  # LLM dollars: the policy adds 2.0 over the SLM alone
    st_a, st_b = PacerState(), PacerState()
    for i in range(100):  # 2 requests per second, none finished yet
        a = arrive(st_a, with_curve, i * 0.5, lambda s: False)
        b = arrive(st_b, spec(), i * 0.5, lambda s: False)
    assert b.state == "learning" and b.level == 1.0  # nothing known: one request goes through to learn
    assert a.state == "paced" and a.level == pytest.approx(1.0 / (arrival_rate(st_a, with_curve) * 2.0), rel=0.2)
    path = tmp_path / "curve.json"
    path.write_text(json.dumps(trace))
    from pyrodash.server.budget.config import load_curve

    assert load_curve(path) == curve


def test_the_offload_bias_knob_moves_along_the_curve():
    curve = Curve.from_trace(
        [{"bias": -4.0, "cost_usd": 0.0}, {"bias": 0.0, "cost_usd": 1.0}, {"bias": 4.0, "cost_usd": 1.5}]
    )
    assert curve.bias_for(1.0, 0.0) == 0.0 and curve.bias_for(0.5, 0.0) == pytest.approx(-2.0)
    assert curve.bias_for(0.0, 0.0) == pytest.approx(-4.0)
    sp = spec(knob=BIAS, curve=curve, prior_c1=1.0)
    st = PacerState()
    biases = []
    for i in range(400):  # 4x the budget's worth: the bias goes down the curve, never above the point's
        d = arrive(st, sp, i * 0.25, lambda s: True, base_bias=0.0)
        finish(st, sp, i * 0.25 + 0.1, d, 0.0 if d.offload_bias is None else max(0.0, 1 + d.offload_bias / 4))
        biases.append(d.offload_bias)
    late = [b for b in biases[200:] if b is not None]
    assert late and all(b <= 0.0 for b in late) and -4.0 <= sum(late) / len(late) <= -2.0


def test_state_round_trips_through_strings():
    st = PacerState()
    arrive(st, spec(), 5.0, lambda s: True)
    again = PacerState.from_strings({k.encode(): v.encode() for k, v in st.to_strings().items()})
    assert again == st
    assert PacerState.from_strings({}) == PacerState()


def test_the_benchmark_schedule_and_scoring():
    """benchmarks/budget_pacer.py's load (a 4x swing and a burst) and its static same-spend replay arithmetic."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import budget_pacer as bp

    args = bp.parse_args([])
    plan = bp.schedule(args, 150)
    assert plan == sorted(plan) and bp.schedule(args, 150) == plan  # seeded
    hour = args.hour_s
    counts = [sum(1 for t, _ in plan if h * hour <= t < (h + 1) * hour) for h in range(5)]
    assert counts[1] > 2.5 * counts[2] and counts[4] > counts[0]  # 4x vs 1x; hour 5 at 3x plus the burst
    rep = {
        0: {1.0: {"llm_usd": 1.0, "correct": True}, 0.0: {"llm_usd": 0.0, "correct": False}, "h": 0.3},
        1: {1.0: {"llm_usd": 2.0, "correct": True}, 0.0: {"llm_usd": 0.0, "correct": True}, "h": 0.7},
    }
    rows = [{"q": 0}, {"q": 1}, {"q": 0}]
    share, acc = bp.static_same_spend(rows, rep, 2.0)  # question 0 admitted twice, question 1 not
    assert 0.3 < share <= 0.7 and acc == 1.0
    share, acc = bp.static_same_spend(rows, rep, 0.0)
    assert share <= 0.3 and acc == pytest.approx(1 / 3)
    assert bp.p90([0.0, 0.1, 0.2, 0.3, 0.4]) == pytest.approx(0.36)
