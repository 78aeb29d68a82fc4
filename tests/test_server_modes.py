"""The request's `pyrodash` object (mode slm / llm / collab, stream sources) and the response's cost split and
LLM-only estimate, through a real server over tiny real models (the `stack` of test_server.py) with the openai SDK."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from test_server import KEY, PRICES, Q, client, stack  # noqa: F401 - fixtures

from pyrodash.backends.base import GenRequest
from pyrodash.cost import MILLION
from pyrodash.prompts import OFFLOAD_TOKEN


def _mid_bias(client) -> tuple[float, int]:  # noqa: F811
    """A bias at which the greedy SLM writes >= 2 tokens and then hands off (bisection; see test_playground)."""
    lo, hi = -20.0, 20.0
    for _ in range(14):
        mid = (lo + hi) / 2
        r = client.chat.completions.create(
            model="pyrodash", messages=Q, max_tokens=30, temperature=0, extra_body={"offload_bias": mid}
        )
        h = r.model_extra["pyrodash"]["handoff"]
        if h is not None and 2 <= h <= 25:
            return mid, h
        lo, hi = (lo, mid) if h is not None and h < 2 else (mid, hi)
    raise AssertionError("no bias puts the handoff mid-answer")


def test_stream_sources_say_who_wrote_each_delta(client):  # noqa: F811
    bias, at = _mid_bias(client)
    kw = dict(model="pyrodash", messages=Q, max_tokens=30, temperature=0)
    whole = client.chat.completions.create(**kw, extra_body={"offload_bias": bias})
    chunks = list(
        client.chat.completions.create(
            **kw,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"offload_bias": bias, "pyrodash": {"sources": True}},
        )
    )
    tagged = [
        (c.model_extra["pyrodash"], c.choices[0].delta.content)
        for c in chunks[:-1]
        if c.choices and "pyrodash" in c.model_extra
    ]
    sources = [p["source"] for p, _ in tagged]
    k = sources.index("handoff")
    assert set(sources[:k]) == {"slm"} and set(sources[k + 1 :]) == {"llm"} and sources.count("handoff") == 1
    assert tagged[k][0]["handoff"] == at == whole.model_extra["pyrodash"]["handoff"] and tagged[k][1] == ""
    slm = "".join(t for _, t in tagged[:k])
    llm = "".join(t for _, t in tagged[k + 1 :])
    assert slm and llm and slm + llm == whole.choices[0].message.content
    untagged = [c for c in chunks[:-1] if c.choices and c.choices[0].delta.content and "pyrodash" not in c.model_extra]
    assert untagged == [], "with sources on, every content delta says who wrote it"


def test_mode_slm_is_the_slm_alone(client, stack):  # noqa: F811
    slm = stack[2]
    r = client.chat.completions.create(
        model="always-offload", messages=Q, max_tokens=12, temperature=0, extra_body={"pyrodash": {"mode": "slm"}}
    )
    p = r.model_extra["pyrodash"]
    assert p["mode"] == "slm" and p["handoff"] is None and (p["llm_in"], p["llm_out"], p["llm_calls"]) == (0, 0, 0)
    # what `pyrodash eval`'s slm baseline sends: the conversation as given, no P_s, <offload> banned
    ban = {slm.token_id(OFFLOAD_TOKEN): float("-inf")}

    async def direct() -> str:
        return "".join([ch.text async for ch in slm.stream(GenRequest(messages=Q, max_tokens=12, logit_bias=ban))])

    assert r.choices[0].message.content == asyncio.run(direct())
    assert p["slm_in"] == len(slm.prompt_ids(GenRequest(messages=Q))) and p["slm_out"] == 12


def test_mode_llm_is_the_llm_alone_and_its_cost_is_measured(client):  # noqa: F811
    r = client.chat.completions.create(
        model="pyrodash", messages=Q, max_tokens=10, extra_body={"pyrodash": {"mode": "llm"}}
    )
    p = r.model_extra["pyrodash"]
    assert p["mode"] == "llm" and (p["slm_in"], p["slm_out"]) == (0, 0) and p["llm_calls"] == 1 and p["llm_out"] >= 1
    assert p["llm_only_cost_usd"] == p["cost_usd"] and p["llm_only_estimate"]["estimated"] is False
    parts = list(
        client.chat.completions.create(
            model="pyrodash",
            messages=Q,
            max_tokens=10,
            stream=True,
            extra_body={"pyrodash": {"mode": "llm", "sources": True}},
        )
    )
    assert {c.model_extra["pyrodash"]["source"] for c in parts if c.choices and c.choices[0].delta.content} == {"llm"}


def test_cost_split_and_llm_only_estimate(client, stack):  # noqa: F811
    slm = stack[2]
    r = client.chat.completions.create(model="always-offload", messages=Q, max_tokens=12)
    p = r.model_extra["pyrodash"]
    by = p["cost_usd_by_component"]
    assert by == pytest.approx(
        {
            "slm_in": p["slm_in"] * PRICES.slm_in / MILLION,
            "slm_out": p["slm_out"] * PRICES.slm_out / MILLION,
            "llm_in": p["llm_in"] * PRICES.llm_in / MILLION,
            "llm_out": p["llm_out"] * PRICES.llm_out / MILLION,
        }
    )
    assert sum(by.values()) == pytest.approx(p["cost_usd"])
    est = p["llm_only_estimate"]
    # the LLM is remote here: the LLM-only prompt (no P_s) is counted with the in-process SLM's tokenizer
    assert est["estimated"] is True and "SLM's tokenizer" in est["method"]
    assert est["prompt_tokens"] == len(slm.prompt_ids(GenRequest(messages=Q))) < p["slm_in"]
    assert est["completion_tokens"] == p["slm_out"] + p["llm_out"] - 1  # the <offload> stop token is not answer
    assert p["llm_only_cost_usd"] == pytest.approx(
        (est["prompt_tokens"] * PRICES.llm_in + est["completion_tokens"] * PRICES.llm_out) / MILLION
    )


def test_bad_pyrodash_options_are_400s(stack):  # noqa: F811
    url, auth = f"{stack[0].url}/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}
    for extra, param in (({"mode": "gpt"}, "pyrodash.mode"), ({"sources": "yes"}, "pyrodash.sources")):
        r = httpx.post(url, json={"messages": Q, "pyrodash": extra}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(url, json={"messages": Q, "pyrodash": "slm"}, headers=auth)
    assert r.status_code == 400 and r.json()["error"]["param"] == "pyrodash"


def test_legacy_completions_stream_sources(client):  # noqa: F811
    parts = list(
        client.completions.create(
            model="always-offload", prompt="3+4=", max_tokens=6, stream=True, extra_body={"pyrodash": {"sources": True}}
        )
    )
    tagged = [p.model_extra["pyrodash"]["source"] for p in parts if "pyrodash" in (p.model_extra or {})]
    assert tagged[0] == "handoff" and set(tagged[1:]) == {"llm"}, "bias 100: the handoff comes first"
