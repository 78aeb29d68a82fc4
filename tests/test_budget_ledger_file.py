"""The hard caps' ledger without Redis lives in a file (`budgets.state_dir`): a restarted server continues its period
from the dollars spent, and budgets of different periods in one file (an hourly default, a daily key budget; the
workers of `--workers N` open the same file) each keep their own spend when the other closes its old periods."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from test_server import UvicornThread, make_engine, serve_config

from pyrodash.server.app import build_app
from pyrodash.server.budget.reserve import Ticket
from pyrodash.server.budget.store import ledger_file


def test_an_hourly_budget_does_not_close_a_daily_budgets_period(tmp_path):
    path = tmp_path / "ledger.sqlite"
    hour, day = int(time.time() // 3600), int(time.time() // 86400)  # ~490,000 and ~20,000
    worker_a, worker_b = ledger_file(path), ledger_file(path)  # two workers' connections to one file

    async def run():
        assert (await worker_a.reserve(Ticket("team", day, "k1", 0.5), 1.0, 60.0))[0]
        await worker_a.settle(Ticket("team", day, "k1", 0.5), 0.65)
        assert (await worker_b.reserve(Ticket("default", hour, "d1", 0.1), 1.0, 60.0))[0]
        await worker_b.settle(Ticket("default", hour, "d1", 0.1), 0.05)
        return await worker_a.read("team", day), await worker_b.read("default", hour)

    team, default = asyncio.run(run())
    assert team == (pytest.approx(0.65), 0.0) and default == (pytest.approx(0.05), 0.0)
    assert not asyncio.run(worker_b.reserve(Ticket("team", day, "k2", 0.4), 1.0, 60.0))[0]  # 0.65 + 0.4 > 1
    for ledger in (worker_a, worker_b):
        ledger.db.close()


ORIGIN = time.time() - 5.0  # the hour began 5 s ago: no boundary during the tests (the same for every server)


def serve(models, state_dir, cap: float):
    slm, llm = models
    budgets = {"default": {"usd_per_hour": cap, "cap_usd": cap}, "state_dir": str(state_dir), "period_origin": ORIGIN}
    config = serve_config(api_key=None, budgets=budgets)
    return UvicornThread(build_app(config, engine=make_engine(slm, llm, config)))


def ask(url: str, i: int) -> dict:
    body = {"model": "always-offload", "messages": [{"role": "user", "content": f"{i}+1="}], "max_tokens": 12}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["pyrodash"]


def row(url: str) -> dict:
    return httpx.get(f"{url}/v1/budget", timeout=30).json()["data"][0]


def test_a_restart_without_redis_continues_the_period_from_its_spent_dollars(models, tmp_path):
    cap = 1.0
    with serve(models, tmp_path, cap) as srv:
        before = sum(e["cost_usd"] for i in range(3) for e in ask(srv.url, i)["llm_endpoints"])
        assert before > 0 and row(srv.url)["cap_spent_usd"] == pytest.approx(before)
        assert httpx.get(f"{srv.url}/v1/budget", timeout=30).json()["ledger"] == "file"
    with serve(models, tmp_path, cap) as srv:  # a new process state, the same state_dir
        assert row(srv.url)["cap_spent_usd"] == pytest.approx(before)
        more = sum(e["cost_usd"] for e in ask(srv.url, 9)["llm_endpoints"])
        assert row(srv.url)["cap_spent_usd"] == pytest.approx(before + more)
    with serve(models, tmp_path / "elsewhere", cap) as srv:  # another state_dir: another ledger
        assert row(srv.url)["cap_spent_usd"] == 0.0
