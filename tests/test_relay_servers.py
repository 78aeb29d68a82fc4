"""Relay through real HTTP servers on 127.0.0.1: `pyrodash serve-model` (continue mode) and the provider doubles
(OpenAI: instruct form; DeepSeek: prefix completion; Anthropic: prefill), each serving the scripted LLM of
tests/test_relay.py. One call per handoff with the stop sequence on the wire, the providers' cached-token fields
billed, and the servers that cannot stop at a step end (one that ignores `stop`, Anthropic's prefill that loses the
trace's trailing separator) fall back to a single handoff visibly."""

from __future__ import annotations

import contextlib

import pytest
from provider_doubles import anthropic_double, deepseek_double, openai_double
from test_relay import GOLD, ScriptLLM, ScriptSLM

from pyrodash.backends import load_llm
from pyrodash.backends.model_server import build_model_app, serve_in_thread
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.relay import EMPTY_STEP, STOP_IGNORED, RelayConfig
from pyrodash.prompts import get_prompts
from pyrodash.record import Record

PROMPTS = get_prompts("world-v1")
CACHED = Prices.from_yaml("cached")
PAPER = Prices.from_yaml("paper")
OPENAI_KEY = "sk-double-0123456789abcdefXYZ"

# case -> (app factory over the scripted LLM, spec overrides, the stop field in the body)
CASES = {
    "serve-model": (lambda b: build_model_app(b, "llm"), {"model": "llm", "mode": "continue"}, "stop"),
    "openai": (
        lambda b: openai_double(b, key=OPENAI_KEY, prompt_cache=True),
        {"model": "gpt-double", "api_key_env": "PD_OPENAI_KEY", "mode": "instruct"},
        "stop",
    ),
    "deepseek": (
        lambda b: deepseek_double(b, prompt_cache=True),
        {"model": "deepseek-chat", "api_key_env": "PD_DEEPSEEK_KEY", "mode": "prefix", "beta": True},
        "stop",
    ),
    "anthropic": (
        lambda b: anthropic_double(b, prompt_cache=True),
        {"model": "claude-double", "api_key_env": "PD_ANTHROPIC_KEY", "mode": "anthropic"},
        "stop_sequences",
    ),
}


@pytest.fixture(autouse=True)
def keys(monkeypatch):
    monkeypatch.setenv("PD_OPENAI_KEY", OPENAI_KEY)
    monkeypatch.setenv("PD_DEEPSEEK_KEY", "sk-deepseek-0123456789abcdef")
    monkeypatch.setenv("PD_ANTHROPIC_KEY", "sk-ant-double-0123456789abcdef")


@contextlib.contextmanager
def relay_over(case: str, **llm_kw):
    """(engine, the server's app) with the scripted LLM behind `case`'s server."""
    factory, over, _ = CASES[case]
    app = factory(ScriptLLM(**llm_kw))
    over = dict(over)
    with serve_in_thread(app) as url:
        if over.pop("beta", False):
            url = url.removesuffix("/v1") + "/beta"
        llm = load_llm({"url": url, **over})
        cfg = RelayConfig(max_llm_calls=8)
        yield CollaborateEngine(ScriptSLM(), llm, PROMPTS, CACHED, max_tokens=200, relay=cfg), app


def generation_calls(app) -> list[dict]:
    calls = getattr(app.state, "calls", None)
    return [c for c in calls if c.get("max_tokens") != 1] if calls is not None else []


@pytest.mark.parametrize("case", ["serve-model", "openai", "deepseek"])
def test_one_call_per_handoff_with_the_stop_sequence_on_the_wire(case):
    with relay_over(case) as (engine, app):
        done = engine.run("q")
    assert done.output == GOLD and done.relay_fallback is None and not done.errors
    assert done.usage.llm_calls == 2 and len(done.handoffs) == 2
    assert [s["by"] for s in done.segments] == ["slm", "llm", "slm", "llm", "slm"]
    if case != "serve-model":  # the doubles record the bodies they were sent
        bodies = generation_calls(app)[-2:]
        assert all(b[CASES[case][2]] == ["\n\n"] for b in bodies)
    u, (ep,) = done.usage, Record.from_done(done).llm_endpoints
    assert u.llm_prior_in > 0 and ep["llm_prior_in"] == u.llm_prior_in  # the split is recorded whatever the sheet
    if case == "serve-model":  # no cached figure reported: the sheet's prefix cache estimates it from the split
        assert ep.get("cache_estimated") and u.llm_cached_in == 0
        assert done.cost_usd == pytest.approx(u.cost(CACHED)) and u.cost(CACHED) < u.cost(PAPER)
    elif case == "openai":  # the instruct form quotes the trace before a fixed tail: the cache reports 0, billed so
        assert ep.get("cache_reported") and not ep.get("cache_estimated") and u.llm_cached_in == 0
        assert done.cost_usd == pytest.approx(u.cost(PAPER) - u.slm_in * (PAPER.slm_in - CACHED.slm_in) / 1e6)
    else:  # the continued prefix is the earlier prompt: the provider's cached figure is billed
        assert ep.get("cache_reported") and 0 < u.llm_cached_in <= u.llm_prior_in
        assert done.cost_usd == pytest.approx(u.cost(CACHED))


def test_a_server_that_ignores_stop_falls_back_visibly():
    with relay_over("openai", honours_stop=False) as (engine, _):
        done = engine.run("q")
    assert done.relay_fallback == STOP_IGNORED and done.usage.llm_calls == 1 and done.output == GOLD
    assert Record.from_done(done).relay_fallback == STOP_IGNORED


def test_anthropic_prefill_loses_the_separator_and_falls_back_visibly():
    with relay_over("anthropic") as (engine, app):
        done = engine.run("q")
    steps = [c for c in app.state.calls if "stop_sequences" in c]  # (the start-up probe sends none)
    assert len(steps) == 1 and steps[0]["stop_sequences"] == ["\n\n"]
    # the prefill may not end in whitespace: the LLM's continuation starts with the separator, so the step is empty
    assert done.relay_fallback == EMPTY_STEP and done.usage.llm_calls == 2
    assert done.output.replace("\n", "") == GOLD.replace("\n", "")


def test_pyrodash_serve_streams_each_segment_tagged_and_says_how_it_relayed():
    import json

    import httpx
    from test_server import KEY, UvicornThread, serve_config

    from pyrodash.server.app import build_app

    config = serve_config(operating_points={"pyrodash": 0.0, "relay": {"offload_bias": 0.0, "max_llm_calls": 4}})
    for llm, fallback in ((ScriptLLM(), None), (ScriptLLM(honours_stop=False), STOP_IGNORED)):
        engine = CollaborateEngine(ScriptSLM(), llm, PROMPTS, config.load_prices(), max_tokens=200)
        with UvicornThread(build_app(config, engine=engine)) as srv:
            auth = {"Authorization": f"Bearer {KEY}"}
            body = {
                "model": "relay",
                "messages": [{"role": "user", "content": "q"}],
                "max_tokens": 200,
                "stream": True,
                "stream_options": {"include_usage": True},
                "pyrodash": {"sources": True},
            }
            r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers=auth, timeout=60)
            chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
            metrics = httpx.get(f"{srv.url}/metrics", headers=auth).text
            # a request may ask for the single handoff on a relay operating point
            single = {**body, "stream": False, "pyrodash": {"max_llm_calls": 1}}
            one = httpx.post(f"{srv.url}/v1/chat/completions", json=single, headers=auth, timeout=60).json()
        tags, text = [], ""
        for c in chunks:
            p = c.get("pyrodash") or {}
            if c.get("choices") and p.get("source"):
                if not tags or tags[-1] != p["source"]:
                    tags.append(p["source"])
                text += c["choices"][0]["delta"].get("content") or ""
        info = chunks[-1]["pyrodash"]
        assert text == GOLD and info["relay_fallback"] == fallback
        assert one["pyrodash"]["llm_calls"] == 1 and one["pyrodash"]["handoffs"] == [one["pyrodash"]["handoff"]]
        # serve == eval: the batch driver's record of the same question (what `pyrodash eval` stores)
        (batch,) = CollaborateEngine(
            ScriptSLM(), ScriptLLM(honours_stop=fallback is None), PROMPTS, config.load_prices(), max_tokens=200
        ).batch([[{"role": "user", "content": "q"}]], options=[{"max_llm_calls": 4, "max_total_tokens": 200}])
        rec = Record.from_done(batch)
        for f in ("segments", "handoffs", "slm_in", "slm_out", "llm_in", "llm_out", "llm_prior_in", "llm_calls"):
            assert info[f] == getattr(rec, f), f
        assert info["cost_usd"] == pytest.approx(rec.cost_usd) and rec.output == text
        if fallback is None:
            assert tags == ["slm", "handoff", "llm", "slm", "handoff", "llm", "slm"]
            assert info["llm_calls"] == 2 and len(info["handoffs"]) == 2 and info["llm_prior_in"] > 0
        else:
            assert tags == ["slm", "handoff", "llm"] and info["llm_calls"] == 1
            assert f'pyrodash_relay_fallbacks_total{{model="relay",reason="{fallback}"}} 1.0' in metrics
