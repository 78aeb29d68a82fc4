"""No LLM dollar without a reservation: a real `pyrodash serve` (uvicorn on 127.0.0.1, tiny models in process) whose LLM
is a TEST DOUBLE of a provider that bills every call exactly the most it may (`WorstBiller`), so any call made
without a reservation that covers it, or any over-admission, shows as spend above the cap. Each case sends a burst at
a cap worth a few answers, polls `spent + reserved <= cap` from GET /v1/budget while the burst runs, and checks the
dollars the answers report: turns past the SLM's range (`range_rule`), retries after a broken upstream, a mesh
takeover, relay, `dollars: all`, and the LLM alone (`mode: llm`)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import tempfile
import time

import httpx
import pytest
from test_server import PRICES, UvicornThread, make_engine, serve_config

from pyrodash.backends.base import BackendError, GenChunk
from pyrodash.backends.mesh import Member, MeshBackend
from pyrodash.server.app import build_app

MAX_TOKENS = 12
OPS = {
    "offload": 100.0,
    "ranged": {"offload_bias": 100.0, "range_rule": {"max_turns": 3}},
    "relay": {"offload_bias": 100.0, "max_llm_calls": 3},
}


class WorstBiller:
    """TEST DOUBLE of an LLM provider (we cannot reach one from a test) serving a real model: every answer bills its
    prompt as the model's tokenizer counts it and the whole `max_tokens` as output (a reasoning model billing hidden
    tokens), the most the call may bill. `fail_every`: every n-th call breaks after `cut_after` chunks (billed its
    prompt and the chunks sent, as a provider bills a stream cut mid-flight); `stop_after`: each call ends ("stop", a
    relay step's end) after that many chunks, billed its prompt and those chunks."""

    def __init__(self, inner, fail_every: int = 0, cut_after: int = 2, stop_after: int = 0):
        self.inner, self.fail_every, self.cut_after, self.stop_after = inner, fail_every, cut_after, stop_after
        self.calls = 0

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def stream(self, req):
        self.calls += 1
        prompt = len(self.inner.prompt_ids(req))
        failing = self.fail_every and self.calls % self.fail_every == 0
        sent = 0
        async with contextlib.aclosing(self.inner.stream(req)) as it:
            async for ch in it:
                if ch.finish_reason is not None:
                    yield dataclasses.replace(
                        ch, prompt_tokens=prompt, completion_tokens=req.max_tokens, cached_tokens=0
                    )
                    return
                yield ch
                sent += 1
                if failing and sent >= self.cut_after:
                    cut = GenChunk(prompt_tokens=prompt, completion_tokens=sent)
                    raise BackendError("upstream stream cut (test double)", usage=cut)
                if self.stop_after and sent >= self.stop_after:
                    yield GenChunk(finish_reason="stop", prompt_tokens=prompt, completion_tokens=sent)
                    return


def four_turns(i: int) -> list[dict]:
    """A chat at its fourth user turn (past `max_turns: 3`)."""
    out = []
    for k in range(3):
        out += [{"role": "user", "content": f"{i}+{k}="}, {"role": "assistant", "content": f"{i + k}"}]
    return out + [{"role": "user", "content": f"{i}*3="}]


def one_turn(i: int) -> list[dict]:
    return [{"role": "user", "content": f"{i:04d}*7="}]


def server(models, llm, budget: dict, **failure):
    slm, _ = models
    # a pacer that lets every request through at the policy's point (a head start of a whole period): the cap alone
    # holds the budget
    budgets = {
        "default": budget,
        "state_dir": tempfile.mkdtemp(prefix="budgets-"),
        "controller": {"head_start_s": 3600.0},
    }
    config = serve_config(api_key=None, operating_points=OPS, budgets=budgets)
    return UvicornThread(build_app(config, engine=make_engine(slm, llm, config, **failure)))


def llm_usd(p: dict) -> float:
    return sum(e["cost_usd"] for e in p["llm_endpoints"])


async def _burst(url: str, bodies: list[dict], cap: float) -> tuple[list[httpx.Response], int]:
    """The burst's responses, and how often /v1/budget was polled while it ran (each poll: spent + reserved <= cap)."""
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=httpx.Limits(max_connections=80)) as c:
        sent = [asyncio.ensure_future(c.post("/v1/chat/completions", json=b)) for b in bodies]
        polls = 0
        while not all(f.done() for f in sent):
            row = (await c.get("/v1/budget")).json()["data"][0]
            assert row["cap_spent_usd"] + row["reserved_usd"] <= cap * (1 + 1e-9), row
            polls += 1
            await asyncio.sleep(0.02)
        return [f.result() for f in sent], polls


def burst(url: str, bodies: list[dict], cap: float) -> list[httpx.Response]:
    rs, polls = asyncio.run(_burst(url, bodies, cap))
    assert polls >= 1
    return rs


def answers(rs: list[httpx.Response]) -> list[dict]:
    assert all(r.status_code == 200 for r in rs), [r.text for r in rs if r.status_code != 200][:2]
    return [r.json()["pyrodash"] for r in rs]


def body(model: str, messages: list[dict], **pyrodash) -> dict:
    out = {"model": model, "messages": messages, "max_tokens": MAX_TOKENS}
    return {**out, "pyrodash": pyrodash} if pyrodash else out


def one_answer_usd(models, llm, model: str, messages: list[dict], **pyrodash) -> float:
    """The LLM dollars of one answer on a server whose cap is far away."""
    with server(models, llm, {"usd_per_hour": 1e6, "cap_usd": 1e6}) as srv:
        p = answers(burst(srv.url, [body(model, messages, **pyrodash)], 1e6))[0]
    assert llm_usd(p) > 0
    return llm_usd(p)


def test_turns_past_the_slms_range_at_the_cap_are_the_slms(models):
    llm = WorstBiller(models[1])
    cap = 3 * one_answer_usd(models, llm, "ranged", four_turns(0))
    with server(models, llm, {"usd_per_hour": cap, "cap_usd": cap, "at_cap": "slm"}) as srv:
        got = answers(burst(srv.url, [body("ranged", four_turns(i)) for i in range(64)], cap))
        row = httpx.get(f"{srv.url}/v1/budget").json()["data"][0]
    spent = sum(llm_usd(p) for p in got)
    assert 0 < spent <= cap and row["cap_spent_usd"] == pytest.approx(spent)
    by_llm = [p for p in got if p["llm_endpoints"]]
    assert by_llm and all(p["answered_by"] == "llm" for p in by_llm)  # routed: the LLM alone, within the cap
    turned = [p for p in got if not p["llm_endpoints"]]
    assert turned and all(p["budget"]["state"] == "capped" and p["answered_by"] != "llm" for p in turned)
    assert all("past the SLM's range" in p["budget"]["reason"] for p in turned)


def llm_for(models, case: str, failing: bool = True):
    """The LLM of a case: retries (every call of a failing upstream breaks), mesh (the first endpoint's streams
    break, the second takes over mid-stream), relay (each call ends a step after two chunks)."""
    llm = models[1]
    if case == "mesh":
        return MeshBackend([Member(WorstBiller(llm, fail_every=1), "a"), Member(WorstBiller(llm), "b")])
    if case == "relay":
        return WorstBiller(llm, stop_after=2)
    return WorstBiller(llm, fail_every=1 if case == "retries" and failing else 0)


@pytest.mark.parametrize("case", ["retries", "mesh", "relay", "all"])
def test_every_llm_call_is_covered_at_the_cap(models, case):
    model = "relay" if case == "relay" else "offload"
    dollars = "all" if case == "all" else "llm"
    cap = 4 * one_answer_usd(models, llm_for(models, case, failing=False), model, one_turn(0))
    budget = {"usd_per_hour": cap, "cap_usd": cap, "at_cap": "slm", "dollars": dollars}
    with server(models, llm_for(models, case), budget, retries=2) as srv:
        rs = burst(srv.url, [body(model, one_turn(i)) for i in range(32)], cap)
        row = httpx.get(f"{srv.url}/v1/budget").json()["data"][0]
    # (in `dollars: all` a request whose SLM dollars alone no longer fit is refused)
    assert {r.status_code for r in rs} <= ({200, 429} if dollars == "all" else {200}), rs[0].text
    got = [r.json()["pyrodash"] for r in rs if r.status_code == 200]
    spent = sum(llm_usd(p) if dollars == "llm" else p["cost_usd"] for p in got)
    assert 0 < spent <= cap and row["cap_spent_usd"] == pytest.approx(spent)
    assert any(not p["llm_endpoints"] or p["fallback"] for p in got)  # the cap turned some away: it was tested
    if case == "retries":
        assert all(len(p["llm_errors"]) >= 1 for p in got if p["llm_endpoints"])
    if case == "relay":  # a relay step after the first: made within the cap, or not made and said so
        assert any(p["llm_calls"] >= 2 or "an LLM call's bound" in (p["budget"]["reason"] or "") for p in got)


def test_the_llm_alone_at_the_cap_is_refused(models):
    llm = WorstBiller(models[1])
    cap = 3 * one_answer_usd(models, llm, "offload", one_turn(0), mode="llm")
    with server(models, llm, {"usd_per_hour": cap, "cap_usd": cap, "at_cap": "slm"}) as srv:
        rs = burst(srv.url, [body("offload", one_turn(i), mode="llm") for i in range(32)], cap)
    assert {r.status_code for r in rs} == {200, 429}
    assert 0 < sum(llm_usd(r.json()["pyrodash"]) for r in rs if r.status_code == 200) <= cap


def test_a_stream_cut_by_its_client_settles_at_what_was_generated(models):
    """A client hanging up after the first chunks: the request settles at its calls' input and the output streamed
    plus `CUT_TOKENS` (the stated bound on what an upstream generates before it sees the cancel), not at the whole
    `max_tokens` it reserved."""
    from pyrodash.server.budget.gate import CUT_TOKENS

    max_tokens = 400
    cap = 1.0
    with server(models, WorstBiller(models[1]), {"usd_per_hour": cap, "cap_usd": cap}) as srv:
        req = {**body("offload", one_turn(1)), "max_tokens": max_tokens, "stream": True}
        with httpx.Client(base_url=srv.url, timeout=60) as c, c.stream("POST", "/v1/chat/completions", json=req) as r:
            lines = r.iter_lines()
            seen = [next(lines) for _ in range(4)]  # a few chunks of the LLM's answer, then the client goes
        assert any("content" in line for line in seen)
        for _ in range(100):
            row = httpx.get(f"{srv.url}/v1/budget").json()["data"][0]
            if row["reserved_usd"] == 0.0:
                break
            time.sleep(0.05)
    in_price, out_price = PRICES.llm_in / 1e6, PRICES.llm_out / 1e6
    assert row["reserved_usd"] == 0.0 and 0 < row["cap_spent_usd"]
    # the prompt (under 200 tokens here) and the streamed bytes plus CUT_TOKENS, far below the 400 tokens reserved
    text = "".join(
        (json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
        for line in seen
        if line.startswith("data: {")
    )
    bound = 200 * in_price + (len(text.encode()) + CUT_TOKENS) * out_price
    assert row["cap_spent_usd"] <= bound < max_tokens * out_price
