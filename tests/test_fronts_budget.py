"""One dollar budget across the three completion APIs: a burst mixing chat completions, OpenAI's Responses and
Anthropic's Messages requests on a real `pyrodash serve` (uvicorn, tiny real models in process) at a budget's hard
cap stays within it, each answer says which budget it drew on, and a refusal at the cap is each API's own 429."""

from __future__ import annotations

import asyncio
import tempfile

import httpx
from test_budget_server import PERMISSIVE, one_request_usd
from test_server import UvicornThread, make_engine, serve_config

from pyrodash.server.app import build_app

BURST = 24  # 8 per route
Q = "Start 7: +2, g."


def serve(models, at_cap: str, cap: float):
    slm, llm = models
    budgets = {"default": {"usd_per_hour": cap, "cap_usd": cap, "at_cap": at_cap}, **PERMISSIVE}
    config = serve_config(api_key=None, budgets={**budgets, "state_dir": tempfile.mkdtemp(prefix="budgets-")})
    return UvicornThread(build_app(config, engine=make_engine(slm, llm, config)))


def request(i: int) -> tuple[str, dict]:
    """Request `i` of the burst: a forced handoff (`always-offload`, 12 tokens) on route i % 3."""
    ask = [{"role": "user", "content": f"{Q} {i}"}]
    if i % 3 == 0:
        return "/v1/chat/completions", {"model": "always-offload", "messages": ask, "max_tokens": 12}
    if i % 3 == 1:
        return "/v1/responses", {"model": "always-offload", "input": ask, "max_output_tokens": 12}
    return "/v1/messages", {"model": "always-offload", "messages": ask, "max_tokens": 12}


async def burst(url: str) -> list[tuple[str, httpx.Response]]:
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:

        async def one(i: int):
            route, body = request(i)
            return route, await c.post(route, json=body)

        return await asyncio.gather(*(one(i) for i in range(BURST)))


def llm_usd(p: dict) -> float:
    return sum(e["cost_usd"] for e in p["llm_endpoints"])


def test_a_mixed_burst_at_the_cap_stays_within_it(models):
    c1, worst = one_request_usd(models)
    cap = worst + 3 * c1  # room for a few answers' dollars and one reservation: most of the burst is capped
    with serve(models, "slm", cap) as srv:
        got = asyncio.run(burst(srv.url))
    assert all(r.status_code == 200 for _, r in got), [r.text for _, r in got if r.status_code != 200]
    infos = {route: [r.json()["pyrodash"] for rt, r in got if rt == route] for route, _ in got}
    assert sorted(len(v) for v in infos.values()) == [BURST // 3] * 3
    every = [p for v in infos.values() for p in v]
    assert sum(llm_usd(p) for p in every) <= cap * (1 + 1e-9)  # the one budget held across the three APIs
    assert all(p["budget"]["name"] == "default" for p in every)
    paid = [route for route, v in infos.items() for p in v if p["llm_calls"] == 1]
    capped = [p for p in every if p["budget"]["state"] == "capped"]
    assert paid and capped and all(p["handoff"] is None and llm_usd(p) == 0 for p in capped)


def test_refused_at_the_cap_in_each_apis_shape(models):
    c1, worst = one_request_usd(models)
    with serve(models, "refuse", worst + c1) as srv:
        got = asyncio.run(burst(srv.url))
    refused = {route: r for route, r in got if r.status_code == 429}
    assert set(refused) == {"/v1/chat/completions", "/v1/responses", "/v1/messages"}, [r.status_code for _, r in got]
    spent = sum(llm_usd(r.json()["pyrodash"]) for _, r in got if r.status_code == 200)
    assert spent <= (worst + c1) * (1 + 1e-9)
    for route, r in refused.items():
        assert int(r.headers["Retry-After"]) >= 1
        if route == "/v1/messages":
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "rate_limit_error"
        else:
            assert r.json()["error"]["code"] == "budget_exceeded"
