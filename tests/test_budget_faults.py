"""A caps' ledger that cannot answer, and usage no provider bills: a real `pyrodash serve` (uvicorn on 127.0.0.1,
tiny models in process) whose ledger is a SQLite file locked by another process, or a real Redis (Debian's
`redis-server`) that refuses writes (a read-only replica, out of memory) or whose budget state keeps changing, answers
503 with Retry-After in each API's error shape, never a 500, and admits nothing meanwhile. An answer whose provider
reported negative or non-finite usage is billed at its reservations' bound and flagged (response, /metrics). A
request whose client goes while it waits for the concurrency limit releases its reservation at once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import sqlite3
import threading
import time
from collections.abc import Callable
from types import SimpleNamespace

import httpx
import pytest
from servers import free_port
from starlette.requests import Request
from test_budget_redis import REDIS, RedisServer
from test_scaling import parse_metrics
from test_server import UvicornThread, make_engine, serve_config

from pyrodash.server.app import build_app
from pyrodash.server.budget import store as budget_store

CHAT = "/v1/chat/completions"
ROUTES = {  # route -> a forced handoff's body in its API
    CHAT: {"model": "always-offload", "messages": [{"role": "user", "content": "12*7="}], "max_tokens": 12},
    "/v1/responses": {
        "model": "always-offload",
        "input": [{"role": "user", "content": "12*7="}],
        "max_output_tokens": 12,
    },
    "/v1/messages": {"model": "always-offload", "messages": [{"role": "user", "content": "12*7="}], "max_tokens": 12},
}
PACED = {"controller": {"head_start_s": 3600.0}}  # the pacer lets every request through: the cap alone decides


def app_for(models, budgets: dict, llm=None, **limits):
    slm, tiny_llm = models
    config = serve_config(api_key=None, budgets={**PACED, **budgets})
    if limits:
        config = dataclasses.replace(config, limits=dataclasses.replace(config.limits, **limits))
    return build_app(config, engine=make_engine(slm, llm or tiny_llm, config))


def metric(url: str, name: str, **labels) -> float:
    found = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text).get(name, {})
    return sum(v for k, v in found.items() if set(labels.items()) <= set(k))


def budget_row(url: str) -> dict:
    return httpx.get(f"{url}/v1/budget", timeout=30).json()["data"][0]


def assert_unavailable(r: httpx.Response, route: str) -> None:
    """A 503 with Retry-After, in the route's API's error shape, saying the ledger cannot answer."""
    assert r.status_code == 503, (route, r.status_code, r.text)
    assert int(r.headers["Retry-After"]) >= 1
    body = r.json()
    if route == "/v1/messages":  # Anthropic's shape
        assert body["type"] == "error" and body["error"]["type"] == "api_error", body
    else:
        assert body["error"]["code"] == "budget_ledger_unavailable", body
    message = body["error"]["message"]
    assert "cannot admit" in message and "Nothing was charged" in message, message


# ---------------------------------------------------------------- a locked SQLite ledger


def test_a_locked_ledger_file_answers_503_in_each_apis_shape_then_serves_again(models, tmp_path):
    app = app_for(models, {"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "state_dir": str(tmp_path)})
    app.state.budgets.store.ledger.db.execute("PRAGMA busy_timeout = 200")  # (10 s in service: a test waits less)
    with UvicornThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        locker = sqlite3.connect(str(tmp_path / "ledger.sqlite"), isolation_level=None)
        locker.execute("BEGIN EXCLUSIVE")  # another process holds the file's write lock
        try:
            for route, body in ROUTES.items():
                assert_unavailable(c.post(route, json=body), route)
            state = c.get("/v1/budget")
            assert state.status_code == 503 and int(state.headers["Retry-After"]) >= 1
            assert metric(srv.url, "pyrodash_budget_ledger_errors_total", where="admission") == len(ROUTES)
        finally:
            locker.execute("ROLLBACK")
            locker.close()
        r = c.post(CHAT, json=ROUTES[CHAT])
        assert r.status_code == 200, r.text
        row = budget_row(srv.url)
        # nothing was charged for the refused requests: the ledger holds the one answer served
        assert row["cap_spent_usd"] == pytest.approx(sum(e["cost_usd"] for e in r.json()["pyrodash"]["llm_endpoints"]))


# ---------------------------------------------------------------- a Redis that refuses


@pytest.fixture()
def redis_server(tmp_path):
    if REDIS is None:
        pytest.skip("redis-server is not installed: `apt-get install -y redis-server`")
    pytest.importorskip("redis")
    srv = RedisServer(tmp_path).start()
    yield srv
    srv.kill()


def _refuse(client, how: str) -> Callable:
    """Make the real Redis refuse writes `how`; returns what undoes it."""
    if how == "readonly":  # a replica of a master that is not there: writes are READONLY errors
        client.execute_command("REPLICAOF", "127.0.0.1", str(free_port()))
        return lambda: client.execute_command("REPLICAOF", "NO", "ONE")
    client.config_set("maxmemory", "1")  # out of memory under noeviction: writes are OOM errors
    return lambda: client.config_set("maxmemory", "0")


@pytest.mark.parametrize("how", ["readonly", "oom"])
def test_a_redis_refusing_writes_answers_503_not_500_nor_a_fallback_share(models, redis_server, how, monkeypatch):
    import redis

    monkeypatch.setattr(budget_store, "HEARTBEAT_S", 0.1)
    budgets = {"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "redis_url": redis_server.url, "replicas": 2}
    with UvicornThread(app_for(models, budgets)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        assert c.post(CHAT, json=ROUTES[CHAT]).status_code == 200
        undo = _refuse(redis.Redis(port=redis_server.port), how)
        try:
            for route, body in ROUTES.items():
                r = c.post(route, json=body)
                assert_unavailable(r, route)
                assert ("ReadOnlyError" if how == "readonly" else "OutOfMemoryError") in r.json()["error"]["message"]
            assert httpx.get(f"{srv.url}/health").json()["budget"]["redis"] == "up"  # reachable: no fallback
        finally:
            undo()
        r = c.post(CHAT, json=ROUTES[CHAT])
        assert r.status_code == 200 and r.json()["pyrodash"]["budget"]["fallback"] is False, r.text
        assert metric(srv.url, "pyrodash_budget_ledger_errors_total", where="admission") == len(ROUTES)


def test_a_budget_state_that_keeps_changing_answers_503(models, redis_server, monkeypatch):
    """The WATCH retries run out (here: none allowed, standing in for replicas that always write in between)."""
    budgets = {"default": {"usd_per_hour": 1.0}, "redis_url": redis_server.url}
    with UvicornThread(app_for(models, budgets)) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        monkeypatch.setattr(budget_store, "WATCH_ATTEMPTS", 0)
        r = c.post(CHAT, json=ROUTES[CHAT])
        assert_unavailable(r, CHAT)
        assert "kept changing" in r.json()["error"]["message"]
        monkeypatch.setattr(budget_store, "WATCH_ATTEMPTS", 50)
        assert c.post(CHAT, json=ROUTES[CHAT]).status_code == 200


# ---------------------------------------------------------------- usage no provider bills


def odd_done(cost: float) -> SimpleNamespace:
    """What `Budgets.record` reads of a Done (its LLM endpoints' dollars, its total) when a provider reported usage
    that makes `cost` (a stand-in for the engine's Done: the engine's own handling of such usage is not tested here)."""
    return SimpleNamespace(llm_endpoints=[{"cost_usd": cost}], cost_usd=cost)


def fake_request() -> Request:
    """A bearer-less HTTP request (it draws on `budgets.default`)."""
    return Request({"type": "http", "method": "POST", "path": CHAT, "headers": []})


@pytest.mark.parametrize(
    ("cost", "kind"),
    [(-0.5, "negative"), (math.nan, "non_finite"), (math.inf, "non_finite"), (-math.inf, "non_finite")],
)
def test_odd_usage_is_billed_at_the_bound_and_flagged(models, tmp_path, cost, kind):
    from prometheus_client import CollectorRegistry

    from pyrodash.engine.requests import EngineRequest
    from pyrodash.server.budget.budgets import Budgets
    from pyrodash.server.budget.config import BudgetsConfig
    from pyrodash.server.budget.reserve import period_of

    slm, llm = models
    engine = make_engine(slm, llm, serve_config(api_key=None))
    cfg = BudgetsConfig.parse({"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "state_dir": str(tmp_path), **PACED})
    registry = CollectorRegistry()
    budgets = Budgets(cfg, 100.0, registry)
    call = EngineRequest([{"role": "user", "content": "12*7="}], max_tokens=12, max_total_tokens=12)

    async def run():
        try:
            _, first = await budgets.pace(fake_request(), engine, call)
            await budgets.record(first, odd_done(cost))
            _, second = await budgets.pace(fake_request(), engine, call)  # the ledger still admits
            ledger = await budgets.store.ledger.read(
                budgets.ledger_key(budgets.cfg.default), period_of(budgets.now(), 3600.0)
            )
            return first, second, ledger
        finally:
            await budgets.aclose()

    first, second, (spent, held) = asyncio.run(run())
    assert kind in first.info["anomaly"] and "billed at the request's bound" in first.info["anomaly"]
    reserved = first.info["reserved_usd"]
    assert reserved > 0 and first.info["billed_usd"] == pytest.approx(reserved)  # its worst case, not 0 nor NaN
    assert spent == pytest.approx(reserved) and held == pytest.approx(second.info["reserved_usd"])
    assert registry.get_sample_value("pyrodash_budget_usage_anomalies_total", {"budget": "default", "kind": kind}) == 1


# ---------------------------------------------------------------- a request that never ran


class HeldLLM:
    """TEST DOUBLE of a slow provider: the real tiny LLM, each call held until `go` is set (so the one request
    running holds the concurrency limit for as long as the test needs)."""

    def __init__(self, inner):
        self.inner, self.go, self.calls = inner, threading.Event(), 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def stream(self, req):
        self.calls += 1
        while not self.go.is_set():
            await asyncio.sleep(0.01)
        async with contextlib.aclosing(self.inner.stream(req)) as it:
            async for ch in it:
                yield ch


def wait_for(cond, timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_a_request_whose_client_goes_while_queued_releases_its_reservation_at_once(models, tmp_path):
    _, llm = models
    held = HeldLLM(llm)
    # a ttl of an hour: a reservation left to expire would still be there at the end of the test
    budgets = {"default": {"usd_per_hour": 1.0, "cap_usd": 1.0}, "state_dir": str(tmp_path), "reservation_ttl_s": 3600}
    with UvicornThread(app_for(models, budgets, llm=held, max_concurrency=1)) as srv:
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            running = threading.Thread(target=lambda: c.post(CHAT, json=ROUTES[CHAT]))
            running.start()  # takes the one engine slot, and waits in its LLM call
            wait_for(lambda: held.calls == 1, what="the first request's LLM call")
            one = budget_row(srv.url)["reserved_usd"]
            assert one > 0
            with pytest.raises(httpx.ReadTimeout):  # queued behind it; its client gives up
                httpx.post(f"{srv.url}{CHAT}", json=ROUTES[CHAT], timeout=1.0)
            # the queued request's reservation goes as soon as its client is gone (not after the ttl)
            wait_for(lambda: budget_row(srv.url)["reserved_usd"] == pytest.approx(one), what="the release")
            held.go.set()
            running.join(timeout=60)
        row = budget_row(srv.url)
        assert row["reserved_usd"] == 0.0 and held.calls == 1  # the queued request never reached the LLM


# ---------------------------------------------------------------- a crash is an answer


def test_an_unhandled_error_is_a_500_body_on_a_connection_that_stays_usable(models, tmp_path, monkeypatch):
    """A bug in a hook (here: the budgets' pace raising, standing in for any error no handler maps) answers a 500
    error body; the web server would otherwise drop the connection, and a proxy in front reports its own 502."""
    app = app_for(models, {"default": {"usd_per_hour": 1.0}, "state_dir": str(tmp_path)})

    async def broken(*_a, **_k):
        raise RuntimeError("a bug (test)")

    with UvicornThread(app) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        monkeypatch.setattr(app.state.budgets, "pace", broken)
        r = c.post(CHAT, json=ROUTES[CHAT])
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error", r.text
        assert "RuntimeError" in r.json()["error"]["message"] and "a bug" not in r.text  # (details: the log only)
        assert c.get("/health").status_code == 200  # the same connection, still usable
        assert metric(srv.url, "pyrodash_requests_total", route=CHAT, status="500") == 1
