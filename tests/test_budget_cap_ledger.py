"""The hard cap's ledger without servers (`pyrodash.server.budget.reserve`): reservations are atomic under threads
and across two connections to one SQLite file, expire, settle into the period they were made in; the worst case
bounds a request at the dearest prices; and `Budgets` holds the cap across a period boundary in a burst and a price
change between periods."""

from __future__ import annotations

import asyncio
import tempfile
import threading
from types import SimpleNamespace

import pytest

from pyrodash.cost import Prices
from pyrodash.engine.requests import EngineRequest, FailurePolicy
from pyrodash.server.budget.budgets import Budgets
from pyrodash.server.budget.config import BudgetsConfig
from pyrodash.server.budget.reserve import MemoryLedger, Ticket, worst_case
from pyrodash.server.budget.store import FileStore

SHEET = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)


def hammer(reserve, n: int = 200) -> int:
    """`n` threads reserving $0.1 each at once; how many got in."""
    wins, start = [], threading.Barrier(n)

    def one(i: int) -> None:
        start.wait()
        wins.append(reserve(Ticket("b", 0, f"r{i}", 0.1)))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(wins)


def test_memory_reservations_are_atomic_and_expire():
    now = [0.0]
    ledger = MemoryLedger(clock=lambda: now[0])
    assert all(ledger.reserve_now(Ticket("b", 0, name, 0.1), 1.0, 10.0)[0] for name in ("first", "second"))
    assert hammer(lambda t: ledger.reserve_now(t, 1.0, 10.0)[0]) == 8  # $1 holds ten $0.1 reservations, no more
    assert ledger.read_now("b", 0) == (0.0, pytest.approx(1.0))
    assert ledger.settle_now(Ticket("b", 0, "first", 0.1), 0.04)  # settled to what it billed: room for $0.06 more
    assert ledger.read_now("b", 0) == (pytest.approx(0.04), pytest.approx(0.9))
    now[0] = 11.0  # the rest expire (their replica died): each counts as spent at its worst case
    assert ledger.read_now("b", 0) == (pytest.approx(0.94), 0.0)
    assert not ledger.reserve_now(Ticket("b", 0, "after", 0.1), 1.0, 10.0)[0]  # an expiry frees no headroom
    assert not ledger.settle_now(Ticket("b", 0, "second", 0.1), 0.05)  # a late Done: its worst case corrected
    assert ledger.read_now("b", 0) == (pytest.approx(0.89), 0.0)
    assert ledger.settle_now(Ticket("b", 0, "second", 0.1), 0.05)  # settled twice: counted once
    assert ledger.read_now("b", 0) == (pytest.approx(0.89), 0.0)


def test_workers_on_one_file_share_one_cap(tmp_path):
    path = tmp_path / "b.sqlite"

    def worker_reserves(t: Ticket) -> bool:  # each its own connection, as the worker processes have
        store = FileStore(path)
        try:
            return asyncio.run(store.ledger.reserve(t, 1.0, 60.0))[0]
        finally:
            asyncio.run(store.aclose())

    a = FileStore(path)
    assert asyncio.run(a.ledger.reserve(Ticket("b", 0, "first", 0.1), 1.0, 60.0))[0]
    assert hammer(worker_reserves, n=40) == 9  # $1 holds ten $0.1 reservations, no more
    assert asyncio.run(a.ledger.settle(Ticket("b", 0, "first", 0.1), 0.03))  # settled to what it billed
    assert asyncio.run(a.ledger.read("b", 0)) == (pytest.approx(0.03), pytest.approx(0.9))


def engine(prices: Prices = SHEET, retries: int = 0, members=None):
    return SimpleNamespace(
        prices=prices,
        failure=FailurePolicy(retries=retries),
        prompts=None,
        messages=lambda p: p,
        llm=SimpleNamespace(members=members, status=lambda: []) if members else None,  # a mesh's shape (`Meshed`)
    )


def test_admission_reserves_the_first_call_at_the_dearest_endpoint():
    q = [{"role": "user", "content": "x" * 84}]  # 84 bytes + 16 template tokens = 100 prompt tokens at most
    kw = EngineRequest(q, max_tokens=50, max_total_tokens=50)
    one = worst_case(engine(), kw, "llm")  # a handoff reads the prompt and at most 50 tokens of partial answer
    assert one.collab == pytest.approx((100 + 50) * 10e-6 + 50 * 40e-6) and one.slm == 0.0
    assert one.llm == pytest.approx(100 * 10e-6 + 50 * 40e-6)  # the LLM alone reads the conversation
    assert worst_case(engine(retries=2), kw, "llm") == one  # a retry reserves at the gate, before it is made
    # mesh members as pyrodash.backends.mesh has them: own prices or None, and a backend (here without a tokenizer)
    dear = SimpleNamespace(prices=Prices(slm_in=0, slm_out=0, llm_in=30.0, llm_out=90.0), backend=None)
    mesh = worst_case(engine(members=[SimpleNamespace(prices=None, backend=None), dear]), kw, "llm")
    # a takeover re-sends the prompt with what streamed (<= 50 tokens) and grants at least one more token
    assert mesh.collab == pytest.approx((150 + 200) * 30e-6 + 51 * 90e-6)
    both = worst_case(engine(), kw, "all")
    assert both.slm == pytest.approx(2 * 150 * 1e-6 + 50 * 2e-6) and both.collab == pytest.approx(one.collab + both.slm)
    assert worst_case(SimpleNamespace(prices=None), kw, "llm") is None


class Clock:
    def __init__(self) -> None:
        self.t = 10.0

    def __call__(self) -> float:
        return self.t


def budgets_with(cap: float, clock: Clock) -> Budgets:
    cfg = BudgetsConfig.parse(
        {
            "default": {"usd_per_hour": cap, "cap_usd": cap},
            "controller": {"head_start_s": 3600},
            "state_dir": tempfile.mkdtemp(prefix="budgets-"),
        }
    )
    return Budgets(cfg, clock=clock)


async def admit(budgets: Budgets, eng, i: int):
    call = EngineRequest(
        [{"role": "user", "content": f"q{i:03d}"}], max_tokens=50, max_total_tokens=50, handoff_share=1.0
    )
    _, grant = await budgets.pace(SimpleNamespace(headers={}), eng, call)
    return grant


def done(usd: float):
    return SimpleNamespace(cost_usd=usd, llm_endpoints=[{"cost_usd": usd}])


def test_a_period_boundary_in_a_burst_and_a_price_change_keep_each_period_within_the_cap():
    clock = Clock()
    eng = engine()
    worst = worst_case(
        eng, EngineRequest([{"role": "user", "content": "q000"}], max_tokens=50, max_total_tokens=50), "llm"
    ).collab
    budgets = budgets_with(3 * worst, clock)

    async def run():
        burst = [await admit(budgets, eng, i) for i in range(5)]  # none finished yet
        assert [g.info["state"] for g in burst].count("capped") == 2  # three worst cases fit, not a fourth
        clock.t = 3600.0 + 10.0  # the hour ends with three answers in flight
        fresh = [await admit(budgets, eng, 10 + i) for i in range(3)]
        assert all(g.ticket is not None for g in fresh)  # a new period: room again
        for g in burst[:3] + fresh:
            await budgets.record(g, done(0.9 * worst))  # the old period's answers settle into the old period
        rows = {p: await budgets.store.ledger.read(budgets.ledger_key(budgets.cfg.default), p) for p in (0, 1)}
        assert rows[0] == (pytest.approx(2.7 * worst), 0.0) and rows[1] == (pytest.approx(2.7 * worst), 0.0)
        clock.t = 7200.0 + 10.0  # the next hour the LLM's price doubles: worst cases double, half as many fit
        eng.prices = Prices(slm_in=1.0, slm_out=2.0, llm_in=20.0, llm_out=80.0)
        dear = [await admit(budgets, eng, 20 + i) for i in range(3)]
        assert [g.ticket is not None for g in dear] == [True, False, False]
        assert dear[1].info["reason"].startswith("worst case $")

    asyncio.run(run())


def test_billing_clamps_cached_tokens_and_counts_an_overrun_as_billed():
    from prometheus_client import CollectorRegistry

    from pyrodash.cost import endpoint_bill
    from pyrodash.server.budget.gate import billed

    price = {"slm_in": 0.0, "slm_out": 0.0, "llm_in": 10.0, "llm_out": 40.0, "llm_cached_in": 1.0}
    # a provider reporting more cached than prompt tokens: billed as if every prompt token were cached, never negative
    odd = {"endpoint": "llm", "calls": 1, "llm_in": 100, "llm_cached_in": 300, "llm_out": 5, "prices": price}
    sheet = Prices(slm_in=0.0, slm_out=0.0, llm_in=0.0, llm_out=0.0)  # (the call's own prices bill it)
    got = billed(SimpleNamespace(cost_usd=0.0, llm_endpoints=endpoint_bill([odd], sheet)), "llm")
    assert got == pytest.approx(100 * 1e-6 + 5 * 40e-6)

    clock = Clock()
    cfg = BudgetsConfig.parse(
        {"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "state_dir": tempfile.mkdtemp(prefix="budgets-")}
    )
    budgets = Budgets(cfg, registry=CollectorRegistry(), clock=clock)

    async def run():
        grant = await admit(budgets, engine(), 0)
        over = grant.ticket.usd * 3  # usage above what the request allowed (reasoning tokens, an injected prompt)
        await budgets.record(grant, done(over))
        return grant, over, await budgets.store.ledger.read(budgets.ledger_key(budgets.cfg.default), 0)

    grant, over, (spent, held) = asyncio.run(run())
    assert spent == pytest.approx(over) and held == 0.0  # on the ledger as billed
    assert grant.info["overrun_usd"] == pytest.approx(over - grant.info["reserved_usd"])
    value = budgets.metrics.overrun.labels("default")._value.get()
    assert value == pytest.approx(grant.info["overrun_usd"])
