"""Budgets past one replica: two real `pyrodash serve` apps (uvicorn on 127.0.0.1, tiny models in process) sharing a
real Redis (Debian's `redis-server`, started here on a free port with an append-only file): one spend counter and
one controller state; a replica restart and a Redis restart lose no spend; Redis down -> each replica holds its own
share of the budget and says so (/health, /metrics, /v1/budget, each response), and its dollars reach the shared
counter once Redis is back."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import httpx
import pytest
from servers import free_port
from test_scaling import parse_metrics
from test_server import UvicornThread, make_engine, serve_config

from pyrodash.server.app import build_app
from pyrodash.server.budget import store as budget_store

pytest.importorskip("redis", reason="the budgets' Redis store needs the redis package: pip install 'pyrodash[budget]'")
REDIS = shutil.which("redis-server") or next((p for p in ("/usr/bin/redis-server",) if os.access(p, os.X_OK)), None)
RETRY_S = 2.0  # RedisStore's retry_s
pytestmark = pytest.mark.skipif(
    REDIS is None, reason="redis-server is not installed: `apt-get install -y redis-server` (.ci/run installs it)"
)


class RedisServer:
    """redis-server on 127.0.0.1:`port`, its append-only file under `dir` (a restart keeps what was written)."""

    def __init__(self, dir, port: int | None = None):
        self.dir, self.port = dir, port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        import redis

        self.proc = subprocess.Popen(
            [
                REDIS,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture()
def redis_server(tmp_path):
    srv = RedisServer(tmp_path).start()
    yield srv
    srv.kill()


@pytest.fixture(autouse=True)
def fast_heartbeats(monkeypatch):
    monkeypatch.setattr(budget_store, "HEARTBEAT_S", 0.1)  # replicas count each other at once


def replica(models, redis_url: str, **budget):
    slm, llm = models
    # a replica busy on a shared CI core is slow, not cut off from Redis (a stopped Redis refuses at once)
    budgets = {"default": {"usd_per_hour": 1000.0, **budget}, "redis_url": redis_url, "redis_timeout_s": 2.0}
    config = serve_config(api_key=None, budgets=budgets)
    return UvicornThread(build_app(config, engine=make_engine(slm, llm, config)))


def ask(url: str, i: int) -> dict:
    r = httpx.post(
        f"{url}/v1/chat/completions",
        timeout=60,
        json={"model": "always-offload", "messages": [{"role": "user", "content": f"{i}*3="}], "max_tokens": 12},
    )
    assert r.status_code == 200, r.text
    return r.json()["pyrodash"]


def budget_of(url: str) -> dict:
    return httpx.get(f"{url}/v1/budget", timeout=30).json()["data"][0]


def metric(url: str, name: str, **labels) -> float:
    found = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text).get(name, {})
    return sum(v for k, v in found.items() if set(labels.items()) <= set(k))


def test_two_replicas_hold_one_budget_and_a_restart_loses_no_spend(models, redis_server):
    with replica(models, redis_server.url) as a, replica(models, redis_server.url) as b:
        llm_usd = 0.0
        for i in range(6):  # round robin, as nginx does
            p = ask((a, b)[i % 2].url, i)
            assert p["budget"]["store"] == "redis" and not p["budget"]["fallback"]
            llm_usd += sum(e["cost_usd"] for e in p["llm_endpoints"])
        sa, sb = budget_of(a.url), budget_of(b.url)
        # ONE counter: both replicas see all six requests and all their dollars
        assert sa["requests"] == sb["requests"] == 6
        assert sa["spend_usd_total"] == pytest.approx(llm_usd) == pytest.approx(sb["spend_usd_total"])
        assert sa["period_spend_usd"] == pytest.approx(llm_usd)
        # each replica's counter counts what it served; summed over replicas they are the shared total
        per_replica = [metric(u, "pyrodash_budget_spend_usd_total", budget="default") for u in (a.url, b.url)]
        assert all(v > 0 for v in per_replica) and sum(per_replica) == pytest.approx(llm_usd)
        health = httpx.get(f"{a.url}/health").json()["budget"]
        assert health == {"store": "redis", "budgets": ["default"], "redis": "up", "mode": "shared"}
    # a replica restarted (a new process) finds the same state: no spend lost
    with replica(models, redis_server.url) as c:
        assert budget_of(c.url)["spend_usd_total"] == pytest.approx(llm_usd)
        ask(c.url, 99)
        after = budget_of(c.url)["spend_usd_total"]
        assert after > llm_usd
    # and so does Redis itself, restarted from its append-only file
    redis_server.kill()
    redis_server.start()
    with replica(models, redis_server.url) as d:
        assert budget_of(d.url)["spend_usd_total"] == pytest.approx(after)


def test_redis_loss_each_replica_holds_its_share_and_says_so(models, redis_server):
    with replica(models, redis_server.url, cap_usd=2000.0) as a, replica(models, redis_server.url) as b:
        for i in range(4):
            ask((a, b)[i % 2].url, i)
        time.sleep(0.2)
        ask(a.url, 10)  # a's heartbeat now counts b too
        shared = budget_of(a.url)
        assert shared["target_usd_per_hour"] == pytest.approx(1000.0)

        redis_server.kill()
        p = ask(a.url, 11)  # still served, on this replica's own share of the budget
        assert p["budget"]["fallback"] is True and p["budget"]["target_usd_per_hour"] == pytest.approx(500.0)
        assert p["budget"]["cap_usd"] == pytest.approx(1000.0)
        outage_usd = sum(e["cost_usd"] for e in p["llm_endpoints"])
        health = httpx.get(f"{a.url}/health").json()
        assert health["status"] == "ok"  # a replica without Redis still serves: not "degraded"
        assert health["budget"]["redis"] == "down" and health["budget"]["mode"] == "own share 1/2"
        assert metric(a.url, "pyrodash_budget_fallback") == 1.0
        assert metric(a.url, "pyrodash_budget_replica_share") == 0.5
        assert metric(a.url, "pyrodash_budget_target_usd_per_hour", budget="default") == pytest.approx(500.0)
        state = httpx.get(f"{a.url}/v1/budget").json()
        assert state["store"]["fallback"] is True and state["store"]["redis_error"]
        assert state["data"][0]["target_usd_per_hour"] == pytest.approx(500.0)

        redis_server.start()  # back (its append-only file kept the shared state)
        time.sleep(RETRY_S + 0.2)  # the replicas retry Redis this often
        p = ask(a.url, 12)
        assert p["budget"]["fallback"] is False and p["budget"]["target_usd_per_hour"] == pytest.approx(1000.0)
        after = budget_of(b.url)
        # the dollars spent during the outage reached the shared counter
        assert after["spend_usd_total"] == pytest.approx(
            shared["spend_usd_total"] + outage_usd + sum(e["cost_usd"] for e in p["llm_endpoints"])
        )
        assert metric(a.url, "pyrodash_budget_fallback") == 0.0
        assert httpx.get(f"{a.url}/health").json()["budget"]["redis"] == "up"


def test_redis_down_at_start_up_serves_on_a_configured_share(models, tmp_path):
    dead = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    slm, llm = models
    config = serve_config(api_key=None, budgets={"default": {"usd_per_hour": 90.0}, "redis_url": dead, "replicas": 3})
    with UvicornThread(build_app(config, engine=make_engine(slm, llm, config))) as srv:
        p = ask(srv.url, 1)
        assert p["budget"]["fallback"] is True and p["budget"]["target_usd_per_hour"] == pytest.approx(30.0)
        assert httpx.get(f"{srv.url}/health").json()["budget"]["mode"] == "own share 1/3"
