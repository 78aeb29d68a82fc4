"""Ledger rows that cannot collide or vanish: two servers' budgets of one name but different periods in one state
directory keep their own spend; an open period's keys in a real Redis (Debian's `redis-server`) carry no expiry (an
eviction policy that drops expiring keys cannot lose them) while closed periods' do; and a Redis whose
maxmemory-policy may evict any key is refused at start-up (or, by config, served with a warning that shows)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from test_budget_redis import REDIS, RedisServer

from pyrodash.server.budget.budgets import Budgets
from pyrodash.server.budget.config import BudgetsConfig
from pyrodash.server.budget.reserve import LedgerError, Ticket

T0 = 1_790_000_000.0  # a wall time some way into an hour and a day


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def budgets_of(raw: dict, clock: Clock) -> Budgets:
    return Budgets(BudgetsConfig.parse(raw), clock=clock)


def test_an_hourly_and_a_daily_default_sharing_a_state_dir_keep_their_own_spend(tmp_path):
    """The default state directory is shared by every server of a user: one serving an hourly `default`, another a
    daily `default`. The hourly one closing its old periods must not delete the daily one's spent dollars."""
    clock = Clock(T0)
    hourly = budgets_of({"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "state_dir": str(tmp_path)}, clock)
    daily = budgets_of({"default": {"usd_per_day": 2.0, "cap_usd": 2.0}, "state_dir": str(tmp_path)}, clock)
    h_key, d_key = hourly.ledger_key(hourly.cfg.default), daily.ledger_key(daily.cfg.default)
    assert h_key != d_key and h_key.startswith("default/") and d_key.startswith("default/")
    hour, day = int(T0 // 3600), int(T0 // 86400)

    async def run():
        try:
            await daily.store.ledger.reserve(Ticket(d_key, day, "d1", 1.5), 2.0, 600.0)
            await daily.store.ledger.settle(Ticket(d_key, day, "d1", 1.5), 1.25)
            for h in (hour, hour + 2, hour + 5):  # the hourly server runs on, closing its periods behind it
                clock.t = h * 3600 + 10
                ok, _, _ = await hourly.store.ledger.reserve(Ticket(h_key, h, f"h{h}", 0.5), 1.0, 600.0)
                assert ok
            return await daily.store.ledger.read(d_key, day), await hourly.store.ledger.read(h_key, hour + 5)
        finally:
            await hourly.aclose()
            await daily.aclose()

    (d_spent, d_held), (h_spent, h_held) = asyncio.run(run())
    assert d_spent == pytest.approx(1.25) and d_held == 0.0  # the daily budget's spend survived
    assert (h_spent, h_held) == (0.0, pytest.approx(0.5))


# ---------------------------------------------------------------- Redis


@pytest.fixture()
def redis_server(tmp_path):
    if REDIS is None:
        pytest.skip("redis-server is not installed: `apt-get install -y redis-server`")
    pytest.importorskip("redis")
    srv = RedisServer(tmp_path).start()
    yield srv
    srv.kill()


def test_an_open_periods_keys_never_expire_and_closed_ones_do(redis_server):
    import redis

    from pyrodash.server.budget.store import RedisStore

    clock = Clock(T0)
    client = redis.Redis(port=redis_server.port)
    period = int(T0 // 3600)

    async def run():
        store = RedisStore(redis_server.url, clock=clock)
        try:
            ledger = store.ledger
            await ledger.reserve(Ticket("b/3600s/0", period, "a", 0.2), 1.0, 600.0)
            await ledger.settle(Ticket("b/3600s/0", period, "a", 0.2), 0.1)
            await ledger.reserve(Ticket("b/3600s/0", period, "held", 0.2), 1.0, 600.0)
            open_ttls = {k: client.ttl(k) for k in ledger.keys("b/3600s/0", period)}
            clock.t += 3600  # the next period: this one is still open (late settlements)
            await ledger.reserve(Ticket("b/3600s/0", period + 1, "c", 0.2), 1.0, 600.0)
            still_open = {k: client.ttl(k) for k in ledger.keys("b/3600s/0", period)}
            clock.t += 3600  # two behind: closed
            await ledger.reserve(Ticket("b/3600s/0", period + 2, "d", 0.2), 1.0, 600.0)
            closed = {k: client.ttl(k) for k in ledger.keys("b/3600s/0", period) if client.exists(k)}
            return open_ttls, still_open, closed
        finally:
            await store.aclose()

    open_ttls, still_open, closed = asyncio.run(run())
    assert open_ttls and all(ttl == -1 for ttl in open_ttls.values() if ttl != -2), open_ttls  # -1: no expiry
    assert client.ttl(f"pyrodash:budget:{{b/3600s/0:cap:{period}}}:spent") != -2  # (it exists)
    assert all(ttl == -1 for ttl in still_open.values() if ttl != -2), still_open
    assert closed and all(0 < ttl <= 3 * 86400 for ttl in closed.values()), closed


def redis_budgets(url: str, **extra) -> Budgets:
    raw = {"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "redis_url": url, **extra}
    return Budgets(BudgetsConfig.parse(raw))


@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_a_redis_that_may_evict_any_key_is_refused_at_start_up(redis_server, policy):
    import redis

    redis.Redis(port=redis_server.port).config_set("maxmemory-policy", policy)
    with pytest.raises(ValueError, match=f"maxmemory-policy is {policy}.*noeviction.*redis_eviction: warn"):
        redis_budgets(redis_server.url)


def test_warn_serves_a_redis_that_may_evict_and_says_so(redis_server, caplog):
    import redis

    redis.Redis(port=redis_server.port).config_set("maxmemory-policy", "allkeys-lru")
    with caplog.at_level(logging.WARNING, logger="pyrodash.serve"):
        budgets = redis_budgets(redis_server.url, redis_eviction="warn")
    try:
        assert "maxmemory-policy is allkeys-lru" in caplog.text
        view = budgets.store.view()
        assert view["redis_eviction_policy"] == "allkeys-lru" and "evict" in view["redis_eviction_warning"]
    finally:
        asyncio.run(budgets.aclose())


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-ttl"])
def test_a_redis_that_keeps_keys_without_an_expiry_is_accepted(redis_server, policy):
    import redis

    redis.Redis(port=redis_server.port).config_set("maxmemory-policy", policy)
    budgets = redis_budgets(redis_server.url)
    try:
        assert budgets.store.view()["redis_eviction_policy"] == policy
        assert "redis_eviction_warning" not in budgets.store.view()
    finally:
        asyncio.run(budgets.aclose())


def test_an_evicting_redis_found_after_start_up_makes_the_ledger_refuse(redis_server):
    """Redis was unreachable at start-up (not checked then); at first contact its policy is read: the ledger then
    refuses (503 to requests) rather than hold spend where it may be evicted."""
    import redis

    from pyrodash.server.budget.pacer import PacerSpec
    from pyrodash.server.budget.store import RedisStore

    redis.Redis(port=redis_server.port).config_set("maxmemory-policy", "allkeys-lru")

    async def run():
        store = RedisStore(redis_server.url)  # (no start-up check: as if Redis had been down then)
        try:
            await store.run("default", PacerSpec(rate=1.0, period_s=3600.0), lambda st, spec: None)  # first contact
            with pytest.raises(LedgerError, match="allkeys-lru"):
                await store.ledger.reserve(Ticket("default/3600s/0", 1, "x", 0.1), 1.0, 600.0)
        finally:
            await store.aclose()

    asyncio.run(run())


def test_the_compose_redis_is_configured_for_the_ledger(tmp_path):
    """deploy/compose.yaml's Redis command, run by a real redis-server: every write fsynced before it is
    acknowledged, no key ever evicted, and the budgets accept it at start-up."""
    import subprocess
    from pathlib import Path

    import redis
    import yaml
    from servers import free_port

    if REDIS is None:
        pytest.skip("redis-server is not installed: `apt-get install -y redis-server`")
    compose = yaml.safe_load((Path(__file__).parent.parent / "deploy" / "compose.yaml").read_text())
    command = compose["services"]["redis"]["command"]
    assert command[0] == "redis-server"
    port = free_port()
    extra = ["--port", str(port), "--bind", "127.0.0.1", "--dir", str(tmp_path)]
    proc = subprocess.Popen([REDIS, *command[1:], *extra], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        client = redis.Redis(port=port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert proc.poll() is None, "redis-server did not start with compose's arguments"
                time.sleep(0.05)
        got = {k: client.config_get(k)[k] for k in ("appendonly", "appendfsync", "maxmemory-policy")}
        assert got == {"appendonly": "yes", "appendfsync": "always", "maxmemory-policy": "noeviction"}
        budgets = redis_budgets(f"redis://127.0.0.1:{port}/0")
        assert budgets.store.view()["redis_eviction_policy"] == "noeviction"
        asyncio.run(budgets.aclose())
    finally:
        proc.kill()
        proc.wait()


def test_redis_eviction_takes_refuse_or_warn():
    with pytest.raises(ValueError, match="budgets.redis_eviction='sometimes': use refuse"):
        BudgetsConfig.parse({"default": {"usd_per_hour": 1.0}, "redis_eviction": "sometimes"})
