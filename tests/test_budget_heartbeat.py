"""Replicas sharing a budget through Redis count each other by heartbeats sent on a timer: a replica that serves no
request still counts among those alive (each one's fallback share is 1/N of them), and one that lost Redis comes
back without waiting for a request."""

from __future__ import annotations

import asyncio

import pytest

from pyrodash.server.budget import store as budget_store
from pyrodash.server.budget.pacer import PacerSpec

pytest.importorskip("redis", reason="the budgets' Redis store needs the redis package: pip install 'pyrodash[budget]'")


def test_an_idle_replica_keeps_counting_and_comes_back_on_its_own(redis_server, monkeypatch):
    monkeypatch.setattr(budget_store, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(budget_store, "ALIVE_S", 0.5)
    spec = PacerSpec(rate=1.0, period_s=3600.0)

    async def run():
        busy = budget_store.RedisStore(redis_server.url, prefix="hb:", retry_s=0.1)
        idle = budget_store.RedisStore(redis_server.url, prefix="hb:", retry_s=0.1)
        try:
            for s in (busy, idle):
                await s.run("default", spec, lambda st, sp: None)  # each serves one request, then only `busy` does
            await asyncio.sleep(1.5)  # three ALIVE_S without a request on `idle`
            await busy.run("default", spec, lambda st, sp: None)
            counted = busy.replicas
            idle.lost(ConnectionError("Redis unreachable (test)"))  # `idle` loses Redis, then it is reachable again
            await asyncio.sleep(0.6)
            return counted, idle.down_since
        finally:
            await busy.aclose()
            await idle.aclose()

    counted, down_since = asyncio.run(run())
    assert counted == 2 and down_since is None
