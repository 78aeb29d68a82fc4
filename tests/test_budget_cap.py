"""The hard cap under bursts and faults: two real `pyrodash serve` apps (uvicorn, tiny models in process)
behind a real nginx, sharing a real Redis (Debian's `redis-server`). Each case sends 64 simultaneous forced-handoff
requests (`offload_bias` 50) and checks that the LLM dollars the answers report stay within the cap: from a cold
start, after three paid requests, with Redis stopped half-way, after a replica restart, and per key; and that a
killed replica's reservations are released after `reservation_ttl_s`. Each case starts from an empty Redis."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from servers import free_port
from test_budget_redis import REDIS, RedisServer
from test_scaling import parse_metrics
from test_server import UvicornThread, make_engine, serve_config

from pyrodash.engine.requests import EngineRequest
from pyrodash.server.app import build_app
from pyrodash.server.budget import store as budget_store
from pyrodash.server.budget.reserve import worst_case

pytest.importorskip("redis", reason="the budgets' Redis store needs the redis package: pip install 'pyrodash[budget]'")
NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if os.access(p, os.X_OK)), None)
pytestmark = [
    pytest.mark.skipif(
        REDIS is None or NGINX is None, reason="needs redis-server and nginx: `apt-get install -y redis-server nginx`"
    ),
    pytest.mark.exclusive,  # (bursts of 64 through nginx: they need the cores)
]
ROOT = Path(__file__).resolve().parent.parent
BURST = 64
MAX_TOKENS = 12
TTL_S = 3.0  # reservation_ttl_s here
KEYS = {"team-a": "key-of-team-a", "team-b": "key-of-team-b"}


def nginx_conf(upstreams: list[str], port: int, prefix: Path) -> str:
    """deploy/nginx.conf pointed at `upstreams`, listening on 127.0.0.1:`port`, its files under `prefix`."""
    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    servers = "".join(f"server {u} max_fails=3 fail_timeout=10s;\n        " for u in upstreams)
    start = conf.index("server pyrodash:8000")
    conf = conf[:start] + servers + conf[conf.index("\n", start) + 1 :]
    conf = conf.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    conf = conf.replace("worker_processes auto;", f"worker_processes 1;\npid {prefix}/nginx.pid;")
    temp = "".join(f"    {k}_temp_path {prefix}/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return conf.replace("http {\n", "http {\n" + temp, 1)


@pytest.fixture(scope="module")
def worst(models) -> float:
    """The worst case one request reserves (prompt bound x input price per attempt + budget x output price)."""
    slm, llm = models
    config = serve_config(api_key=None)
    call = EngineRequest(messages(0), max_tokens=MAX_TOKENS, max_total_tokens=MAX_TOKENS)
    return worst_case(make_engine(slm, llm, config), call, "llm").collab


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory):
    srv = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield srv
    srv.kill()


class Gated:
    """TEST DOUBLE of a slow provider: the real tiny LLM, whose calls wait while `open` is clear (so a test can hold
    answers in flight, with their reservations, for as long as it needs); `waiting`: calls held now."""

    def __init__(self, inner):
        self.inner, self.open, self.waiting = inner, threading.Event(), 0
        self.open.set()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def stream(self, req):
        self.waiting += 1
        try:
            while not self.open.is_set():
                await asyncio.sleep(0.01)
        finally:
            self.waiting -= 1
        async with contextlib.aclosing(self.inner.stream(req)) as it:
            async for ch in it:
                yield ch


def replica(models, redis_url: str, cap: float):
    slm, llm = models
    llm = Gated(llm)
    per_key = {name: {"key_env": f"TEST_CAP_{name.upper().replace('-', '_')}", "usd_per_hour": cap, "cap_usd": cap}
               for name in KEYS}  # fmt: skip
    budgets = {
        "default": {"usd_per_hour": cap, "cap_usd": cap, "at_cap": "slm"},
        "keys": per_key,
        "redis_url": redis_url,
        "reservation_ttl_s": TTL_S,
        "replicas": 2,  # each one's share while Redis is down, from the first request (heartbeats count later)
        "redis_timeout_s": 2.0,  # a replica busy with 32 answers on a shared CI core is slow, not cut off from Redis
    }
    config = serve_config(api_key=None, budgets=budgets)
    srv = UvicornThread(build_app(config, engine=make_engine(slm, llm, config)))
    srv.gate = llm  # (its LLM's gate: a test may hold its answers in flight)
    return srv


@pytest.fixture(scope="module")
def stack(models, redis_server, worst, tmp_path_factory):
    """(nginx URL, replica a, replica b, cap): the cap fits three worst cases."""
    mp = pytest.MonkeyPatch()
    mp.setattr(budget_store, "HEARTBEAT_S", 0.1)
    for name, key in KEYS.items():
        mp.setenv(f"TEST_CAP_{name.upper().replace('-', '_')}", key)
    cap = 3 * worst
    tmp = tmp_path_factory.mktemp("nginx")
    with replica(models, redis_server.url, cap) as a, replica(models, redis_server.url, cap) as b:
        port = free_port()
        (tmp / "nginx.conf").write_text(nginx_conf([f"127.0.0.1:{a.port}", f"127.0.0.1:{b.port}"], port, tmp))
        cmd = [NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf"), "-e", str(tmp / "error.log"), "-g", "daemon off;"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                httpx.get(f"{url}/health", timeout=2)
                break
            except httpx.HTTPError:
                time.sleep(0.05)
        yield url, a, b, cap
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    mp.undo()


@pytest.fixture()
def cold(stack, redis_server):
    """Each case from an empty Redis (no spend, no pacer state: a cold start)."""
    import redis

    redis.Redis(port=redis_server.port).flushall()
    return stack


CHAT = "/v1/chat/completions"
LEDGER_KEY = "default/3600s/0"  # the budget's rows in the ledger: name, period, origin


def period_now() -> int:
    return int(time.time() // 3600)


async def until(cond, timeout_s: float = 60.0) -> None:
    """Wait for `cond()` (checked every 10 ms), failing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


def messages(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{i:04d}*7="}]


async def _burst(url: str, n: int, key: str | None = None, start: int = 0) -> list[dict]:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    body = {"model": "always-offload", "max_tokens": MAX_TOKENS, "offload_bias": 50}
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=n)) as c:
        sent = [
            asyncio.ensure_future(
                c.post("/v1/chat/completions", headers=headers, json={**body, "messages": messages(start + i)})
            )
            for i in range(n)
        ]
        await poll_cap(url, sent, headers)
        rs = [f.result() for f in sent]
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200][:2]
    return [r.json()["pyrodash"] for r in rs]


async def poll_cap(url: str, pending: list, headers: dict) -> None:
    """The cap's ledger while the requests run (a connection per look): spent + reserved <= cap."""
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_keepalive_connections=0)) as c:
        while not all(f.done() for f in pending):
            state = (await c.get("/v1/budget", headers=headers)).json()
            row, cap = state["data"][0], state["data"][0]["cap_usd"] / state["store"]["replica_share"]
            # (while Redis is down a replica shows its share of the cap, and its estimate of the shared ledger)
            assert row["cap_spent_usd"] + row["reserved_usd"] <= cap * (1 + 1e-9), str(state)
            await asyncio.sleep(0.02)


def burst(url: str, n: int = BURST, key: str | None = None, start: int = 0) -> list[dict]:
    return asyncio.run(_burst(url, n, key, start))


def llm_usd(answers: list[dict]) -> float:
    return sum(e["cost_usd"] for p in answers for e in p["llm_endpoints"])


def metric(url: str, name: str, **labels) -> float:
    found = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text).get(name, {})
    return sum(v for k, v in found.items() if set(labels.items()) <= set(k))


def assert_turned_openly(answers: list[dict], stack) -> None:
    """The requests turned to the SLM by their reservation say so: state, reason, and the replicas' /metrics."""
    _, a, b, _ = stack
    capped = [p for p in answers if p["budget"]["state"] == "capped"]
    assert capped, "the cap turned no request away: the burst did not test it"
    assert all(p["budget"]["reason"] and "does not fit" in p["budget"]["reason"] for p in capped)
    assert all(not p["llm_endpoints"] and p["budget"]["handoff_share"] == 0.0 for p in capped)
    denied = sum(metric(r.url, "pyrodash_budget_reservation_denied_total", budget="default") for r in (a, b))
    assert denied >= len(capped)


def test_a_cold_burst_spends_within_the_cap(cold, worst):
    url, a, b, cap = cold
    answers = burst(url)
    spent = llm_usd(answers)
    typical = max(llm_usd([p]) for p in answers if p["llm_endpoints"])
    assert cap >= 3 * typical  # a cap of a few answers' worth ...
    assert 0.5 * cap <= spent <= cap  # ... admits what it can pay for, and no more
    assert_turned_openly(answers, cold)
    admitted = [p for p in answers if p["llm_endpoints"]]
    assert all(p["budget"]["reserved_usd"] == pytest.approx(worst) for p in admitted)
    assert BURST * min(llm_usd([p]) for p in admitted) > cap  # admitted on hope, the burst would pass the cap
    row = httpx.get(f"{a.url}/v1/budget", timeout=30).json()["data"][0]
    assert row["period_spend_usd"] == pytest.approx(spent)
    # the cap's ledger: every answer settled to what it billed, nothing left reserved
    assert row["cap_spent_usd"] == pytest.approx(spent) and row["reserved_usd"] == pytest.approx(0.0)
    assert row["cap_hits"] >= sum(p["budget"]["state"] == "capped" for p in answers)
    # the cap's utilisation: billed / reserved at admission, per replica, in /v1/budget and /metrics
    reserved = sum(p["budget"]["reserved_usd"] for p in admitted)
    assert 0.5 < spent / reserved <= 1.0
    for r in (a, b):
        mine = httpx.get(f"{r.url}/v1/budget", timeout=30).json()["data"][0]["utilisation"]
        assert mine is None or 0 < mine <= 1.0
        assert metric(r.url, "pyrodash_budget_overrun_usd_total", budget="default") == 0.0
    billed_total = sum(metric(r.url, "pyrodash_budget_settled_billed_usd_total", budget="default") for r in (a, b))
    assert billed_total == pytest.approx(spent)


def test_three_paid_requests_then_a_burst(cold):
    url, _, _, cap = cold
    first = [burst(url, 1, start=1000 + i)[0] for i in range(3)]
    answers = burst(url)
    assert llm_usd(first) > 0 and llm_usd(first + answers) <= cap
    assert_turned_openly(answers, cold)


def test_per_key_budgets_bursting_at_once(cold):
    url, _, _, cap = cold

    async def both():
        return await asyncio.gather(*(_burst(url, BURST // 2, key, 100 * i) for i, key in enumerate(KEYS.values())))

    for name, answers in zip(KEYS, asyncio.run(both())):
        assert all(p["budget"]["name"] == name for p in answers)
        assert 0 < llm_usd(answers) <= cap
        assert any(p["budget"]["state"] == "capped" for p in answers)


def test_spend_after_a_restart_continues_from_redis(cold, models, redis_server):
    url, a, _, cap = cold
    before = llm_usd(burst(url, 8))
    with replica(models, redis_server.url, cap) as c:  # a new replica process state, the same Redis
        row = httpx.get(f"{c.url}/v1/budget", timeout=30).json()["data"][0]
        assert row["period_spend_usd"] == pytest.approx(before)
        after = burst(c.url, 16, start=500)
    assert before + llm_usd(after) <= cap


def test_redis_stopped_half_way_through_the_burst(cold, redis_server):
    """Redis is killed while admitted answers are held in flight (their reservations in Redis, their settlements to
    come), then the second half of the burst arrives (admitted on each replica's own share): every request is
    answered, and the period's dollars stay within the cap."""
    import redis

    url, a, b, cap = cold
    gates = [a.gate, b.gate]

    def held_in_redis() -> int:
        return redis.Redis(port=redis_server.port).hlen(f"pyrodash:budget:{{{LEDGER_KEY}:cap:{period_now()}}}:held")

    async def burst_with_a_fault():
        body = {"model": "always-offload", "max_tokens": MAX_TOKENS, "offload_bias": 50}
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=BURST)) as c:
            post = lambda i: asyncio.ensure_future(c.post(CHAT, json={**body, "messages": messages(i)}))  # noqa: E731
            for g in gates:
                g.open.clear()
            first = [post(i) for i in range(BURST // 2)]
            # the first half: each request answered, or admitted and waiting in its LLM call
            await until(lambda: sum(f.done() for f in first) + sum(g.waiting for g in gates) == len(first))
            assert sum(g.waiting for g in gates) >= 1
            assert held_in_redis() >= 1
            await asyncio.to_thread(redis_server.kill)
            for g in gates:
                g.open.set()  # the held answers finish and settle with Redis gone
            second = [post(i) for i in range(BURST // 2, BURST)]  # admitted without Redis
            rs = await asyncio.gather(*first, *second)
        assert all(r.status_code == 200 for r in rs), [
            (r.status_code, r.text[:300]) for r in rs if r.status_code != 200
        ][:2]
        return [r.json()["pyrodash"] for r in rs]

    try:
        answers = asyncio.run(burst_with_a_fault())
        assert llm_usd(answers) <= cap
        assert any(p["budget"]["fallback"] for p in answers)  # the second half ran on the replicas' own shares
        after = burst(url, 8, start=BURST)  # and what comes after, each replica on its own share (and says so)
        assert all(p["budget"]["fallback"] for p in after)
        assert llm_usd(answers + after) <= cap
    finally:
        for g in gates:
            g.open.set()
        redis_server.start()


def test_nginx_closes_idle_replica_connections_before_the_replicas_do():
    """deploy/nginx.conf's upstream keep-alive ends before uvicorn's (5 s): otherwise a POST that nginx sends on a
    connection the replica is closing at that instant fails, and nginx answers it 502 without resending it."""
    import re

    import uvicorn

    conf = (ROOT / "deploy" / "nginx.conf").read_text()
    upstream = conf[conf.index("upstream pyrodash {") : conf.index("}", conf.index("upstream pyrodash {"))]
    found = re.search(r"keepalive_timeout\s+(\d+)(ms|s);", upstream)
    assert found, "deploy/nginx.conf: the upstream block sets no keepalive_timeout (nginx's default is 60 s)"
    nginx_s = int(found.group(1)) / (1000 if found.group(2) == "ms" else 1)
    assert nginx_s < uvicorn.Config(app=None).timeout_keep_alive


KILLED = """
import asyncio, os, signal, sys
from pyrodash.server.budget.reserve import Ticket
from pyrodash.server.budget.store import RedisStore

async def main():
    store = RedisStore(sys.argv[1])
    ok, _, _ = await store.ledger.reserve(Ticket("default", int(sys.argv[2]), "dead", float(sys.argv[3])), 1.0, 2.0)
    print(ok, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)  # killed in flight: its reservation is never settled

asyncio.run(main())
"""


def test_a_killed_replicas_reservation_counts_as_spent_after_its_ttl(redis_server):
    """A replica killed mid-request never settles: after `reservation_ttl_s` its reservation counts as spent at its
    worst case (the provider may have billed it), so the headroom it held does not go to the next request."""
    from pyrodash.server.budget.reserve import Ticket
    from pyrodash.server.budget.store import RedisStore

    period = 7
    out = subprocess.run([sys.executable, "-c", KILLED, redis_server.url, str(period), "0.8"], capture_output=True)
    assert out.returncode == -signal.SIGKILL and out.stdout.strip() == b"True", out.stderr[-500:]

    async def other_replica():
        store = RedisStore(redis_server.url)
        try:
            held = await store.ledger.read("default", period)
            turned, _, _ = await store.ledger.reserve(Ticket("default", period, "x", 0.5), 1.0, 2.0)
            await asyncio.sleep(2.2)  # the dead replica's reservation expires (ttl 2 s)
            after = await store.ledger.read("default", period)
            still, _, _ = await store.ledger.reserve(Ticket("default", period, "y", 0.5), 1.0, 2.0)
            small, _, _ = await store.ledger.reserve(Ticket("default", period, "z", 0.15), 1.0, 2.0)
            return held, turned, after, still, small
        finally:
            await store.aclose()

    held, turned, after, still, small = asyncio.run(other_replica())
    assert held == (0.0, pytest.approx(0.8)) and not turned
    assert after == (pytest.approx(0.8), 0.0) and not still and small  # spent at its worst case, the rest free
