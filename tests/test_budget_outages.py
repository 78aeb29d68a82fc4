"""Redis outages cannot mint a second cap: the Redis ledger against a real `redis-server` (Debian's, killed and
started for each outage), with a TEST DOUBLE of a provider that bills every admitted request exactly its worst case
and keeps its own invoice. Redis down twice with nothing in between, a replica restarted during an outage (its
reservations and settlements in the state_dir's file), two workers sharing one file with Redis down at start-up,
and an idle replica whose view of the period follows the heartbeat: the invoice never passes the cap, and once Redis
is back its ledger holds every billed dollar, each once."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from servers import free_port
from test_budget_redis import REDIS, RedisServer

from pyrodash.server.budget import store as budget_store
from pyrodash.server.budget.reserve import Ticket

pytest.importorskip("redis", reason="the budgets' Redis store needs the redis package: pip install 'pyrodash[budget]'")
pytestmark = pytest.mark.skipif(REDIS is None, reason="redis-server is not installed: apt-get install -y redis-server")
CAP, TTL, KEY, PERIOD = 1.0, 600.0, "default/3600s/0", 7
ASK = 0.1  # each request's worst case


class WorstCaseProvider:
    """TEST DOUBLE of an LLM provider (we cannot bill a real one here): it bills every request it serves exactly the
    request's worst case (its reservation: the most the ledger allowed for) and keeps its own invoice."""

    def __init__(self) -> None:
        self.invoice = 0.0
        self.bills: dict[str, float] = {}

    def serve(self, t: Ticket) -> float:
        self.bills[t.id] = t.usd
        self.invoice += t.usd
        return t.usd


@pytest.fixture()
def redis_server(tmp_path):
    srv = RedisServer(tmp_path).start()
    yield srv
    srv.kill()


def store_for(url: str, path, replicas: int = 1):
    from pyrodash.server.budget.store import RedisStore

    return RedisStore(url, replicas=replicas, fallback_path=path)


async def spend_all(store, provider: WorstCaseProvider, n: int = 40) -> int:
    """Requests until the ledger refuses one (at most `n`): each admitted one served and settled at its bill."""
    served = 0
    for _ in range(n):
        t = Ticket(KEY, PERIOD, uuid.uuid4().hex, ASK)
        ok, _, _ = await store.ledger.reserve(t, CAP, TTL)
        if not ok:
            break
        await store.ledger.settle(t, provider.serve(t))
        served += 1
    return served


async def back(store, redis: RedisServer) -> None:
    """Redis started again, and the replica reconnected (its retry timer, run now)."""
    await asyncio.to_thread(redis.start)
    await store._try_reconnect()
    assert store.down_since is None


async def down(store, redis: RedisServer) -> None:
    await asyncio.to_thread(redis.kill)
    await store.ledger.read(KEY, PERIOD)  # (the next call finds it gone)
    assert store.down_since is not None


def test_redis_down_twice_with_nothing_in_between_admits_one_cap(redis_server, tmp_path):
    provider = WorstCaseProvider()

    async def run():
        store = store_for(redis_server.url, tmp_path / "ledger.sqlite")
        try:
            await spend_all(store, provider, n=3)  # with Redis: $0.3
            await down(store, redis_server)
            first = await spend_all(store, provider)  # the replica's share (all of it: one replica)
            await back(store, redis_server)  # ... and nothing sent in between
            await down(store, redis_server)
            second = await spend_all(store, provider)
            await back(store, redis_server)
            return first, second, await store.ledger.read(KEY, PERIOD)
        finally:
            await store.aclose()

    first, second, (spent, held) = asyncio.run(run())
    assert first == 7 and second == 0, (first, second)  # the second outage starts from what the first spent
    assert provider.invoice <= CAP + 1e-9
    assert spent == pytest.approx(provider.invoice) and held == 0.0  # every billed dollar in Redis, once


def test_a_replica_restarted_during_an_outage_keeps_its_spend_and_share(redis_server, tmp_path):
    provider = WorstCaseProvider()
    path = tmp_path / "ledger.sqlite"

    async def run():
        old = store_for(redis_server.url, path)
        await spend_all(old, provider, n=2)
        await down(old, redis_server)
        before = await spend_all(old, provider, n=4)
        killed = Ticket(KEY, PERIOD, "in-flight-at-the-kill", ASK)  # reserved, then the process dies
        assert (await old.ledger.reserve(killed, CAP, TTL))[0]
        provider.serve(killed)  # (the provider billed it: its answer was on the way)
        await old.aclose()  # the process is gone: nothing flushed, nothing settled
        new = store_for(redis_server.url, path)  # the restarted replica, Redis still down
        try:
            await down(new, redis_server)
            after = await spend_all(new, provider)
            await back(new, redis_server)
            return before, after, await new.ledger.read(KEY, PERIOD)
        finally:
            await new.aclose()

    before, after, (spent, held) = asyncio.run(run())
    # the restart continued the outage's share ($0.8 of the $1 cap): $0.4 spent and $0.1 held before it, $0.3 after
    assert (before, after) == (4, 3)
    assert provider.invoice <= CAP + 1e-9
    # Redis has every settled dollar once, and the dead process's reservation held at its worst case
    assert spent + held == pytest.approx(provider.invoice) and held == pytest.approx(ASK)


def test_workers_sharing_a_file_with_redis_down_at_start_up_hold_one_share(tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}/0"
    provider = WorstCaseProvider()

    async def run():
        workers = [store_for(dead, tmp_path / "ledger.sqlite") for _ in range(3)]  # `--workers 3`, one file
        try:
            return [await spend_all(w, provider) for w in workers]
        finally:
            for w in workers:
                await w.aclose()

    served = asyncio.run(run())
    assert sum(served) == 10 and provider.invoice <= CAP + 1e-9, served  # one cap's share, not three


def test_an_idle_replicas_view_of_the_period_follows_the_heartbeat(redis_server, tmp_path, monkeypatch):
    """Replica b served one request, then idled while a spent more of the cap: when Redis goes, b's share is of
    what is left now (its heartbeat re-read the ledger), not of what was left at its last request."""
    monkeypatch.setattr(budget_store, "HEARTBEAT_S", 0.05)
    provider = WorstCaseProvider()

    async def run():
        a = store_for(redis_server.url, tmp_path / "a.sqlite", replicas=2)
        b = store_for(redis_server.url, tmp_path / "b.sqlite", replicas=2)
        try:
            await spend_all(b, provider, n=1)
            await spend_all(a, provider, n=5)  # $0.6 spent in all
            deadline = time.monotonic() + 10
            while b.ledger.seen.get((KEY, PERIOD), (0.0, 0.0))[0] < 0.6 - 1e-9:  # b's heartbeat re-reads it
                assert time.monotonic() < deadline, b.ledger.seen
                await asyncio.sleep(0.02)
            await down(b, redis_server)
            return await spend_all(b, provider)
        finally:
            await a.aclose()
            await b.aclose()

    served = asyncio.run(run())
    assert 1 <= served <= 2, served  # half of the $0.4 left (about $0.2), not half of the $0.9 b saw last ($0.45)
    assert provider.invoice <= CAP + 1e-9


def test_a_replica_that_never_served_the_period_reads_it_on_its_heartbeat(redis_server, tmp_path):
    """`Budgets` has its Redis ledger read each capped budget's current period at every heartbeat: a replica that
    has served nothing yet still takes its outage share of what is left, not of the whole cap."""
    from pyrodash.server.budget.budgets import Budgets
    from pyrodash.server.budget.config import BudgetsConfig
    from pyrodash.server.budget.reserve import period_of

    raw = {"default": {"usd_per_hour": 1.0, "cap_usd": CAP}, "redis_url": redis_server.url, "replicas": 2}
    provider = WorstCaseProvider()

    async def run():
        idle = Budgets(BudgetsConfig.parse({**raw, "state_dir": str(tmp_path / "idle")}))
        busy = store_for(redis_server.url, tmp_path / "busy.sqlite", replicas=2)
        key, period = idle.ledger_key(idle.cfg.default), period_of(idle.now(), 3600.0)
        try:
            for _ in range(6):  # $0.6 spent by the other replica
                t = Ticket(key, period, uuid.uuid4().hex, ASK)
                assert (await busy.ledger.reserve(t, CAP, TTL))[0]
                await busy.ledger.settle(t, provider.serve(t))
            await idle.store.ledger.refresh_seen()  # (what its heartbeat runs)
            await down(idle.store, redis_server)
            got = []
            for _ in range(5):
                t = Ticket(key, period, uuid.uuid4().hex, ASK)
                got.append((await idle.store.ledger.reserve(t, CAP, TTL))[0])
            return got
        finally:
            await busy.aclose()
            await idle.aclose()

    got = asyncio.run(run())
    assert 1 <= sum(got) <= 2, got  # half of the $0.4 left (about $0.2), not half of the whole cap ($0.5)
