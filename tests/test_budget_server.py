"""Budgets in a real `pyrodash serve` (uvicorn on 127.0.0.1, tiny real models in process): the hard cap (the SLM
alone, or 429 with Retry-After), per-key budgets (a request's key picks its budget; keys never logged), and what
the server shows: the response's `pyrodash.budget`, GET /v1/budget, /health and `pyrodash_budget_*` in /metrics.

Time is compressed (`budgets.time_compression`): a budget "hour" lasts a few seconds, so periods roll over in a
test."""

from __future__ import annotations

import logging
import math
import tempfile
import time

import httpx
import pytest
from test_server import PRICES, UvicornThread, make_engine, serve_config

from pyrodash.server.app import build_app

HOUR_S = 8.0  # wall-clock seconds of a budget hour here


def serve(models, budgets: dict, **kw):
    slm, llm = models
    budgets = {"time_compression": 3600.0 / HOUR_S, "state_dir": tempfile.mkdtemp(prefix="budgets-"), **budgets}
    config = serve_config(budgets=budgets, **kw)
    return UvicornThread(build_app(config, engine=make_engine(slm, llm, config)))


def ask(c: httpx.Client, i: int, headers: dict | None = None, model: str = "always-offload") -> httpx.Response:
    return c.post(
        "/v1/chat/completions",
        headers=headers or {},
        json={"model": model, "messages": [{"role": "user", "content": f"{i}+{i % 7}="}], "max_tokens": 12},
    )


def one_request_usd(models) -> tuple[float, float]:
    """(the LLM dollars of one always-offload answer, the worst case it reserves on a hard cap), from a server
    whose cap is far away."""
    slm, llm = models
    budgets = {"default": {"usd_per_hour": 1e6, "cap_usd": 1e6}, "state_dir": tempfile.mkdtemp(prefix="budgets-")}
    config = serve_config(api_key=None, budgets=budgets)
    with (
        UvicornThread(build_app(config, engine=make_engine(slm, llm, config))) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        answers = [ask(c, i).json()["pyrodash"] for i in range(3)]
    usd = [sum(e["cost_usd"] for e in p["llm_endpoints"]) for p in answers]
    worst = [p["budget"]["reserved_usd"] for p in answers]
    assert min(usd) > 0 and max(usd) <= min(worst)  # the reservation bounds what was billed
    return max(usd), max(worst)


def wait_next_period() -> None:
    """Sleep into the next budget hour (plus a margin), so a test starts with a fresh period."""
    left = HOUR_S - (time.time() * 3600.0 / HOUR_S % 3600.0) / (3600.0 / HOUR_S)
    time.sleep(left + 0.2)


# a pacer that lets every request through at the policy's point (a head start of a whole period): the cap alone
# holds the budget, after a few requests whatever the machine's speed
PERMISSIVE = {"controller": {"head_start_s": 3600.0}}


def test_the_hard_cap_answers_with_the_slm_alone_until_the_period_ends(models):
    c1, worst = one_request_usd(models)
    cap = worst + 4 * c1  # room for a few answers' dollars and one reservation
    budgets = {"default": {"usd_per_hour": cap, "cap_usd": cap, "at_cap": "slm"}, **PERMISSIVE}
    with serve(models, budgets, api_key=None) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        wait_next_period()
        t0 = time.time()
        seen = []
        i = 0
        while time.time() - t0 < 1.6 * HOUR_S:  # one request after another, for one and a half budget hours
            sent = time.time() / HOUR_S
            r = ask(c, i)
            assert r.status_code == 200, r.text
            p = r.json()["pyrodash"]
            llm_usd = sum(e["cost_usd"] for e in p["llm_endpoints"])
            seen.append((math.floor(sent), p["budget"], p["handoff_admitted"], llm_usd, p["llm_calls"], sent % 1))
            i += 1
        periods = sorted({s[0] for s in seen})
        # the server's own count (this request included) never passes the cap, and the dollars the answers billed,
        # summed per budget hour, agree (requests sent within 50 ms of an hour's end could be either hour's: left out)
        assert max(s[1]["period_spend_usd"] for s in seen) <= cap * (1 + 1e-9)
        spent = {k: sum(s[3] for s in seen if s[0] == k) for k in periods}
        near_edge = any(s[5] > 1 - 0.05 / HOUR_S for s in seen)
        assert near_edge or all(v <= cap * (1 + 1e-9) for v in spent.values()), (spent, cap)
        first = [s for s in seen if s[0] == periods[0]]
        capped = [s for s in first if s[1]["state"] == "capped"]
        assert capped, [s[1]["state"] for s in first]
        # at the cap: the SLM alone (outside the share: no handoff, no LLM call), and the response says so
        assert all(not s[2] and s[4] == 0 and s[1]["handoff_share"] == 0.0 for s in capped)
        assert all(s[1]["name"] == "default" and s[1]["cap_usd"] == pytest.approx(cap) for s in seen)
        # the next period starts afresh: handoffs again
        later = [s for s in seen if s[0] > periods[0]]
        assert later and any(s[2] and s[4] == 1 for s in later)
        state = c.get("/v1/budget").json()
        assert state["data"][0]["cap_hits"] >= len(capped) and state["data"][0]["name"] == "default"
        metrics = c.get("/metrics").text
        assert f'pyrodash_budget_cap_hits_total{{budget="default"}} {float(state["data"][0]["cap_hits"])}' in metrics


def test_at_cap_refuse_is_a_429_with_retry_after(models):
    c1, worst = one_request_usd(models)
    cap = worst + 2 * c1
    budgets = {"default": {"usd_per_hour": cap, "cap_usd": cap, "at_cap": "refuse"}, **PERMISSIVE}
    with serve(models, budgets, api_key=None) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        wait_next_period()
        t0, codes = time.time(), []
        i = 0
        while time.time() - t0 < 0.9 * HOUR_S:
            r = ask(c, i)
            codes.append(r.status_code)
            if r.status_code == 429:
                body = r.json()["error"]
                assert body["code"] == "budget_exceeded" and body["type"] == "insufficient_quota"
                assert "budget 'default'" in body["message"] and "hard cap" in body["message"]
                assert 1 <= int(r.headers["Retry-After"]) <= math.ceil(HOUR_S)
                break
            i += 1
        assert codes[-1] == 429 and all(code == 200 for code in codes[:-1]), codes
        time.sleep(int(r.headers["Retry-After"]) + 0.2)  # the period ended: served again
        assert ask(c, 10_000).status_code == 200
        # the OpenAPI document declares the 429
        assert "429" in c.get("/openapi.json").json()["paths"]["/v1/chat/completions"]["post"]["responses"]


def test_per_key_budgets(models, monkeypatch, caplog):
    monkeypatch.setenv("TEAM_A_KEY", "key-of-team-a")
    monkeypatch.setenv("TEAM_B_KEY", "key-of-team-b")
    budgets = {
        "default": {"usd_per_hour": 1.0},
        "keys": {
            "team-a": {"key_env": "TEAM_A_KEY", "usd_per_hour": 2.0},
            "team-b": {"key_env": "TEAM_B_KEY", "usd_per_day": 24.0, "dollars": "all"},
        },
    }
    caplog.set_level(logging.DEBUG)
    with serve(models, budgets, api_key="server-key") as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        a, b, server = ({"Authorization": f"Bearer {k}"} for k in ("key-of-team-a", "key-of-team-b", "server-key"))
        # a budget's key is an API key of this server; an unknown key is not
        assert ask(c, 1, {"Authorization": "Bearer nope"}).status_code == 401
        got = {}
        for name, h in (("team-a", a), ("team-b", b), ("default", server)):
            r = ask(c, 2, h)
            assert r.status_code == 200, r.text
            got[name] = r.json()["pyrodash"]["budget"]
            assert got[name]["name"] == name
        assert got["team-b"]["dollars"] == "all" and got["team-a"]["dollars"] == "llm"
        assert got["team-a"]["target_usd_per_hour"] == pytest.approx(2.0)
        assert got["team-b"]["target_usd_per_hour"] == pytest.approx(1.0) and got["team-b"]["period"] == "day"
        # each budget counts only its own requests
        for _ in range(2):
            assert ask(c, 3, a).status_code == 200
        state = {d["name"]: d for d in c.get("/v1/budget", headers=server).json()["data"]}
        assert set(state) == {"default", "team-a", "team-b"}
        assert (state["team-a"]["requests"], state["team-b"]["requests"], state["default"]["requests"]) == (3, 1, 1)
        # a budget key sees its own budget only
        mine = c.get("/v1/budget", headers=a).json()["data"]
        assert [d["name"] for d in mine] == ["team-a"]
        metrics = c.get("/metrics", headers=server).text
        for name in ("team-a", "team-b", "default"):
            assert f'pyrodash_budget_target_usd_per_hour{{budget="{name}"}}' in metrics
        assert 'pyrodash_budget_requests_total{budget="team-a",state=' in metrics
        text = metrics + c.get("/health", headers=server).text + c.get("/v1/budget", headers=server).text
    logged = "\n".join(r.getMessage() for r in caplog.records)
    for key in ("key-of-team-a", "key-of-team-b"):  # keys never appear in logs, metrics or state
        assert key not in logged and key not in text


def test_a_server_without_budgets_is_unchanged(models):
    with (
        serve(models, {"default": {"usd_per_hour": 1.0}}, api_key=None) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        assert "budget" in c.get("/health").json()
        # the playground's budget card: its script is on the page and reads GET /v1/budget
        assert '<script src="/static/budget.js"></script>' in c.get("/").text
        js = c.get("/static/budget.js")
        assert js.status_code == 200 and "/v1/budget" in js.text
    slm, llm = models
    config = serve_config(api_key=None)
    with (
        UvicornThread(build_app(config, engine=make_engine(slm, llm, config))) as srv,
        httpx.Client(base_url=srv.url, timeout=60) as c,
    ):
        r = ask(c, 1).json()
        assert r["pyrodash"]["budget"] is None
        assert c.get("/v1/budget").json()["data"] == []
        assert "budget" not in c.get("/health").json()
        assert PRICES.llm_out > 0


def test_two_file_stores_on_one_file_are_one_budget(tmp_path):
    """What the workers of `pyrodash serve --workers N` share: a SQLite file beside their metrics."""
    import asyncio

    from pyrodash.server.budget.pacer import PacerSpec, arrive, finish
    from pyrodash.server.budget.store import FileStore

    spec = PacerSpec(rate=1.0)
    a, b = FileStore(tmp_path / "b.sqlite"), FileStore(tmp_path / "b.sqlite")

    async def go():
        for i, store in enumerate((a, b, a, b)):
            (d, _), _ = await store.run("default", spec, lambda st, sp, i=i: (arrive(st, sp, i, lambda s: True), 0))
            await store.run("default", spec, lambda st, sp, d=d, i=i: finish(st, sp, i + 0.5, d, 0.25))
        return await a.read("default", spec), await b.read("default", spec)

    (sa, _, view), (sb, _, _) = asyncio.run(go())
    assert sa == sb and sa.requests == 4 and sa.spend == 1.0 and view["store"] == "file"


def test_workers_of_one_server_hold_one_budget(tmp_path):
    """`pyrodash serve --workers 2` (two processes on one socket) with a budget and no Redis: the workers share one
    state (a file in the metrics directory), so the budget is held once, not once per worker."""
    import asyncio
    import os
    import signal
    import subprocess
    import sys

    import yaml
    from servers import free_port, stop, wait_healthy
    from test_scaling import parse_metrics, total
    from test_server_workers import ROOT, _pids, engine_overhead

    upstream, up = engine_overhead.scripted_server_process(20, 8, 0.001)
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    cfg = tmp_path / "serve.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "slm": f"{upstream}#slm",
                "llm": f"{upstream}#llm",
                "prompts": "qwen-math-v1",
                "api_key_env": None,
                "budgets": {"default": {"usd_per_hour": 1000.0}},
            }
        )
    )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    env.pop("PYRODASH_API_KEY", None)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyrodash",
            "serve",
            "--config",
            str(cfg),
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--workers",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )

    async def load(n: int) -> list[int]:
        async def one(i: int) -> int:
            async with httpx.AsyncClient(timeout=60) as c:  # a connection of its own: the kernel picks a worker
                r = await c.post(
                    f"{url}/v1/chat/completions",
                    json={"model": "pyrodash", "messages": [{"role": "user", "content": f"{i}?"}], "max_tokens": 64},
                )
                return r.status_code

        return await asyncio.gather(*(one(i) for i in range(n)))

    try:
        wait_healthy(url, proc, "pyrodash serve --workers 2", path="/v1/models")
        codes: list[int] = []
        for _ in range(10):
            codes += asyncio.run(load(16))
            if len(_pids(metrics_dir)) >= 2:
                break
        assert set(codes) == {200} and len(_pids(metrics_dir)) == 2, "both workers should have served"
        for _ in range(4):  # whichever worker answers: the one budget, with every request
            state = httpx.get(f"{url}/v1/budget", timeout=10).json()
            assert state["store"]["store"] == "file" and state["data"][0]["requests"] == len(codes)
            m = [parse_metrics(httpx.get(f"{url}/metrics", timeout=10).text)]
            assert total(m, "pyrodash_budget_spend_usd_total") == pytest.approx(state["data"][0]["spend_usd_total"])
    finally:
        stop(proc, signal.SIGINT)
        up.terminate()
