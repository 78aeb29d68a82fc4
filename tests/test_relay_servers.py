"""Relay through real HTTP servers on 127.0.0.1: `pyrodash serve-model` (continue mode) and the provider doubles
(OpenAI: instruct form; DeepSeek: prefix completion; Anthropic: prefill), each serving the scripted LLM of
tests/test_relay.py. One call per handoff with the stop sequence on the wire, the providers' cached-token fields
billed; a server that ignores `stop` and Anthropic's prefill (which may not end in the trace's trailing separator) relay
one call per step too: the client stops reading at the separator and closes the stream, said on the record."""

from __future__ import annotations

import contextlib
import os

import pytest
from provider_doubles import anthropic_double, deepseek_double, openai_double
from test_relay import GOLD, ScriptLLM, ScriptSLM

from pyrodash.backends import load_llm
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.relay import STOP_IGNORED, RelayConfig
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
from pyrodash.server.metrics import Metrics
from pyrodash.server.model_server import build_model_app, serve_in_thread

PROMPTS = get_prompts("world-v1")
CACHED = Prices.from_yaml("cached")
PAPER = Prices.from_yaml("paper")
OPENAI_KEY = "sk-double-0123456789abcdefXYZ"
KEY_ANT = "sk-ant-double-0123456789abcdef"  # the Anthropic double's default key

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


def test_a_server_that_ignores_stop_is_cut_by_the_client_at_each_step_end():
    with relay_over("openai") as (engine, _):
        honoured = engine.run("q")
    with relay_over("openai", honours_stop=False) as (engine, app):
        done = engine.run("q")
    assert all(b["stop"] == ["\n\n"] for b in generation_calls(app)[-2:])  # sent, and written past
    assert done.relay_fallback is None and done.output == GOLD and not done.errors
    assert done.usage.llm_calls == 2 and done.segments == honoured.segments and done.handoffs == honoured.handoffs
    (ep,) = Record.from_done(done).llm_endpoints
    assert ep["client_stops"] == 2 and "client_stops" not in Record.from_done(honoured).llm_endpoints[0]
    # billed for what arrived (the text past the separator too), counted locally and marked so
    assert done.usage.llm_out > honoured.usage.llm_out and done.usage_estimated
    m = Metrics()
    m.observe_done(done, "pyrodash", 0.1, None)
    assert f'pyrodash_llm_endpoint_client_stops_total{{endpoint="{ep["endpoint"]}"}} 2.0' in m.render()


def test_anthropic_prefill_with_a_blank_line_separator_relays_one_call_per_step():
    with relay_over("anthropic") as (engine, app):
        done = engine.run("q")
    steps = [c for c in app.state.calls if c.get("max_tokens", 0) > 2][-2:]  # (the start-up probe asks for 2 or less)
    # the prefill may not end in whitespace: the blank-line stop would match the model's first characters, so the
    # client enforces it (not sent), reading the step from its first non-blank text to the next separator
    assert all("stop_sequences" not in c and c["messages"][-1]["role"] == "assistant" for c in steps)
    assert done.relay_fallback is None and done.output == GOLD and not done.errors
    assert done.usage.llm_calls == 2 and len(done.handoffs) == 2
    assert [s["by"] for s in done.segments] == ["slm", "llm", "slm", "llm", "slm"]
    assert Record.from_done(done).llm_endpoints[0]["client_stops"] == 2


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


# ---------------------------------------------------------------- real servers in their own processes

QUESTION = "Start 47: +3, f."


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(SLM dir, LLM dir, the LLM in process, an offload_bias that hands off mid-trace on QUESTION): the models of
    tests/test_readme_endpoints.py's `transformers serve` example (an LLM that writes no special-token text)."""
    from tiny_models import CLEAN_LLM_SEEDS, HANDOFF_SLM_SEED, mid_trace_bias, tiny_model_dir

    slm_dir = tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=HANDOFF_SLM_SEED)
    llm_dir = tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=CLEAN_LLM_SEEDS[1], offload=False)
    return slm_dir, llm_dir, HFBackend(llm_dir), mid_trace_bias(HFBackend(slm_dir), PROMPTS, QUESTION)


@pytest.mark.slow
def test_relay_through_transformers_serve(tiny, tmp_path):
    """The real `transformers serve` (its /v1/completions route, the chat template rendered locally) maps `stop` to
    generate's `stop_strings`: it stops at the separator but returns the separator in the text. The backend drops a
    returned stop string (as `GenChunk.text` promises), so the relay through it is the one in process: same
    segments, handoffs and calls. The random tiny LLM writes no blank lines: the separator is a
    character its own continuation writes."""
    import shutil
    import sys
    from pathlib import Path

    from servers import free_port
    from test_readme_endpoints import _process

    slm_dir, llm_dir, llm, bias = tiny
    slm = HFBackend(slm_dir)
    rest = CollaborateEngine(slm, llm, PROMPTS, PAPER, offload_bias=bias, max_tokens=24).run(QUESTION).llm_text
    j = next(j for j in range(1, len(rest)) if rest[j] not in rest[:j])  # the step: rest[:j], then the separator
    relay = RelayConfig(max_llm_calls=4, step_sep=rest[j])
    ref = CollaborateEngine(slm, llm, PROMPTS, PAPER, offload_bias=bias, max_tokens=24, relay=relay).run(QUESTION)
    assert ref.relay_fallback is None and ref.segments[1]["text"] == rest[: j + 1]  # in process: the step, its sep
    port = free_port()
    (tmp_path / "hub").mkdir()
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), str(llm_dir)]
    with _process(cmd, f"http://127.0.0.1:{port}/health", env, tmp_path / "serve.log"):
        served_llm = load_llm(f"http://127.0.0.1:{port}/v1#{llm_dir}")
        engine = CollaborateEngine(slm, served_llm, PROMPTS, PAPER, offload_bias=bias, max_tokens=24, relay=relay)
        done = engine.run(QUESTION)
    assert served_llm.report.mode == "completion"
    # the server stopped at the separator (the unconstrained continuation goes on past it) and returned it
    assert done.segments[1]["text"] == rest[: j + 1] and len(rest) > j + 1 and not done.errors
    assert done.relay_fallback is None and Record.from_done(done).relay_fallback is None
    assert done.segments == ref.segments and done.handoffs == ref.handoffs and done.output == ref.output
    assert done.usage.llm_calls == ref.usage.llm_calls


@pytest.mark.slow
def test_relay_through_a_litellm_proxy(tmp_path, monkeypatch):
    """A real LiteLLM proxy (`hosted_vllm/` route) in front of `pyrodash serve-model`'s app serving the scripted LLM
    (a test double of an LLM that continues the gold trace): the proxy passes `stop` through, so each handoff is one
    call stopped at the separator and the SLM resumes; with the same upstream ignoring `stop` the client stops reading
    at the separator: one call per step still, each closed by the client."""
    import json

    from servers import free_port
    from test_readme_endpoints import _process, litellm_or_skip

    exe = litellm_or_skip()
    script = ScriptLLM()
    with serve_in_thread(build_model_app(script, "llm")) as upstream:
        params = {"model": "hosted_vllm/llm", "api_base": upstream, "api_key": "none"}
        cfg = tmp_path / "litellm.yaml"
        cfg.write_text(json.dumps({"model_list": [{"model_name": "my-llm", "litellm_params": params}]}))
        port, master = free_port(), "sk-litellm-master-0123456789abcdef"
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True"}
        env = {**os.environ, **env, "LITELLM_MASTER_KEY": master}
        monkeypatch.setenv("OPENAI_API_KEY", master)
        cmd = [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
        with _process(cmd, f"http://127.0.0.1:{port}/health/liveliness", env, tmp_path / "litellm.log", 180):
            llm = load_llm(f"http://127.0.0.1:{port}/v1#my-llm")
            relay = RelayConfig(max_llm_calls=8)
            done = CollaborateEngine(ScriptSLM(), llm, PROMPTS, CACHED, max_tokens=200, relay=relay).run("q")
            steps = [r.stop for r in script.requests if r.max_tokens > 2]  # (the start-up probe asks for 2)
            script.honours_stop = False
            fell = CollaborateEngine(ScriptSLM(), llm, PROMPTS, CACHED, max_tokens=200, relay=relay).run("q")
    assert llm.report.mode == "continue"
    assert done.output == GOLD and done.relay_fallback is None and not done.errors
    assert steps == [["\n\n"], ["\n\n"]]  # one request per handoff reached the upstream, the stop sequence with it
    assert done.usage.llm_calls == 2 and len(done.handoffs) == 2
    assert [s["by"] for s in done.segments] == ["slm", "llm", "slm", "llm", "slm"]
    assert all(s["text"].endswith("\n\n") and s["text"].count("\n\n") == 1 for s in done.segments[1:4:2])
    (ep,) = Record.from_done(done).llm_endpoints
    assert ep["endpoint"] == "my-llm" and ep["calls"] == 2 and ep["llm_prior_in"] == done.usage.llm_prior_in > 0
    assert ep.get("cache_estimated") and done.cost_usd == pytest.approx(done.usage.cost(CACHED))
    assert fell.relay_fallback is None and fell.usage.llm_calls == 2 and fell.output == GOLD
    assert fell.segments == done.segments and Record.from_done(fell).llm_endpoints[0]["client_stops"] == 2


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["anthropic", "auto"])
def test_relay_through_a_litellm_proxy_in_front_of_the_anthropic_double(tmp_path, monkeypatch, mode):
    """A real LiteLLM proxy (`anthropic/` route) in front of the Anthropic test double serving the scripted LLM, with
    the blank-line separator: one call per step, no `empty_step`."""
    import json

    from servers import free_port
    from test_readme_endpoints import _process, litellm_or_skip

    exe = litellm_or_skip()
    double = anthropic_double(ScriptLLM())
    with serve_in_thread(double) as upstream:
        params = {"model": "anthropic/claude-double", "api_base": upstream.removesuffix("/v1"), "api_key": KEY_ANT}
        cfg = tmp_path / "litellm.yaml"
        cfg.write_text(json.dumps({"model_list": [{"model_name": "my-claude", "litellm_params": params}]}))
        port, master = free_port(), "sk-litellm-master-0123456789abcdef"
        env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "NO_DOCS": "True", "DISABLE_ADMIN_UI": "True"}
        env = {**os.environ, **env, "LITELLM_MASTER_KEY": master}
        monkeypatch.setenv("PD_PROXY_KEY", master)
        cmd = [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
        with _process(cmd, f"http://127.0.0.1:{port}/health/liveliness", env, tmp_path / "litellm.log", 180):
            spec = {"url": f"http://127.0.0.1:{port}/v1", "model": "my-claude", "api_key_env": "PD_PROXY_KEY"}
            llm = load_llm({**spec, "mode": mode})
            relay = RelayConfig(max_llm_calls=8)
            done = CollaborateEngine(ScriptSLM(), llm, PROMPTS, CACHED, max_tokens=200, relay=relay).run("q")
    # auto: the probe finds the Anthropic model behind the proxy and takes the proxy's Messages API
    assert llm.report.mode == "anthropic"
    steps = [c for c in double.state.calls if c.get("max_tokens", 0) > 2]  # (the start-up probe asks for 2 or less)
    assert len(steps) == 2 and all("stop_sequences" not in c for c in steps)  # the blank line: enforced by the client
    assert done.output == GOLD and done.relay_fallback is None and not done.errors
    assert done.usage.llm_calls == 2 and [s["by"] for s in done.segments] == ["slm", "llm", "slm", "llm", "slm"]
    assert Record.from_done(done).llm_endpoints[0]["client_stops"] == 2
