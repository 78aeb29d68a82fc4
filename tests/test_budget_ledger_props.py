"""Property tests of the hard cap's ledgers (in memory, a SQLite file, Redis): random interleavings of reservations,
settlements (honest, repeated, above the reservation), expiries, period boundaries, Redis going down and coming back,
on two budgets of different periods. After every step no budget's period holds more than its cap (spent + reserved,
above it only by what was billed past reservations), and whenever the ledger is reachable its spent dollars are
exactly the billed dollars of the settled requests plus the worst case of those that expired unsettled."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from pyrodash.server.budget.reserve import MemoryLedger, Ticket, period_of
from pyrodash.server.budget.store import ledger_file

BUDGETS = {"hourly": (3600.0, 1.0), "daily": (86400.0, 2.0)}  # name -> (period seconds, cap)
TTL = 600.0
T0 = 1_790_000_000.0 - 1.0  # a second before an hour's end (and a day's)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(sorted(BUDGETS)), st.floats(0.01, 0.7)),
        st.tuples(st.just("settle"), st.integers(0, 40), st.floats(0.0, 1.0)),
        st.tuples(st.just("overrun"), st.integers(0, 40), st.floats(1.0, 1.5)),
        st.tuples(st.just("again"), st.integers(0, 40)),
        st.tuples(st.just("wait"), st.sampled_from([0.5, 2.0, 300.0, TTL, 3600.0])),
        st.tuples(st.just("down")),
        st.tuples(st.just("up")),
    ),
    max_size=40,
)


class Model:
    """What the ledger must hold: each ticket's state, billed dollars and expiry."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock
        self.tickets: list[dict] = []

    def expired(self, k: dict) -> bool:
        return k["billed"] is None and self.clock[0] >= k["expires"]

    def spent(self, name: str, period: int) -> float:
        mine = [k for k in self.tickets if (k["t"].budget, k["t"].period) == (name, period)]
        return sum(
            k["billed"] if k["billed"] is not None else k["t"].usd
            for k in mine
            if k["billed"] is not None or self.expired(k)
        )

    def held(self, name: str, period: int) -> float:
        mine = [k for k in self.tickets if (k["t"].budget, k["t"].period) == (name, period)]
        return sum(k["t"].usd for k in mine if k["billed"] is None and not self.expired(k))

    def over(self, name: str, period: int) -> float:
        mine = [k for k in self.tickets if (k["t"].budget, k["t"].period) == (name, period)]
        return sum(max(0.0, (k["billed"] or 0.0) - k["t"].usd) for k in mine)


async def play(ledger, ops, clock: list[float], redis=None) -> None:
    model = Model(clock)
    for op in ops:
        kind = op[0]
        if kind == "reserve":
            name, usd = op[1], op[2]
            period_s, cap = BUDGETS[name]
            t = Ticket(name, period_of(clock[0], period_s), uuid.uuid4().hex, usd)
            ok, _, _ = await ledger.reserve(t, cap, TTL)
            if ok:
                model.tickets.append({"t": t, "billed": None, "expires": clock[0] + TTL})
        elif kind in ("settle", "overrun", "again") and model.tickets:
            k = model.tickets[op[1] % len(model.tickets)]
            if kind == "again":
                if k["billed"] is not None:  # a second settle of a settled ticket changes nothing
                    await ledger.settle(k["t"], k["billed"] + 1.0)
                continue
            if k["billed"] is None:
                k["billed"] = k["t"].usd * op[2]
                await ledger.settle(k["t"], k["billed"])
        elif kind == "wait":
            clock[0] += op[1]
        elif kind == "down" and redis is not None:
            redis.lost(ConnectionError("Redis stopped (test)"))
        elif kind == "up" and redis is not None and redis.down_since is not None:
            await redis._try_reconnect()
        await check(ledger, model, clock, exact=redis is None or redis.down_since is None)


async def check(ledger, model: Model, clock: list[float], exact: bool) -> None:
    for name, (period_s, cap) in BUDGETS.items():
        period = period_of(clock[0], period_s)
        spent, held = await ledger.read(name, period)
        assert spent + held <= cap + model.over(name, period) + 1e-9, (name, spent, held)
        if exact:
            assert spent == pytest.approx(model.spent(name, period), abs=1e-9), name
            assert held == pytest.approx(model.held(name, period), abs=1e-9), name


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(ops=OPS)
def test_the_memory_ledger_never_passes_a_cap(ops):
    clock = [T0]
    asyncio.run(play(MemoryLedger(clock=lambda: clock[0]), ops, clock))


@SETTINGS
@given(ops=OPS)
def test_the_file_ledger_never_passes_a_cap(ops):
    clock = [T0]
    with tempfile.TemporaryDirectory() as d:
        ledger = ledger_file(Path(d) / "ledger.sqlite")
        ledger.clock = lambda: clock[0]
        try:
            asyncio.run(play(ledger, ops, clock))
        finally:
            ledger.db.close()


def test_the_redis_ledger_never_passes_a_cap(redis_server):
    pytest.importorskip("redis")
    from pyrodash.server.budget.store import RedisStore

    @SETTINGS
    @given(ops=OPS)
    @example(  # a ticket settled while Redis was down, settled again in the next outage: it must count once
        ops=[
            *[("reserve", "daily", 0.5)] * 2,
            ("down",),
            *[("reserve", "daily", 0.5)] * 2,
            ("settle", 2, 0.0),
            ("up",),
            ("down",),
            ("again", 2),
            ("reserve", "daily", 0.5),
        ]
    )
    def prop(ops):
        clock = [T0]

        async def run():
            store = RedisStore(redis_server.url, prefix=f"p{uuid.uuid4().hex[:8]}:", replicas=1, clock=lambda: clock[0])
            try:
                await play(store.ledger, [*ops, ("up",)], clock, redis=store)
            finally:
                await store.aclose()

        asyncio.run(run())

    prop()
