"""Continuation-mode detection that does not misjudge: a real LiteLLM proxy in front of the
Anthropic TEST DOUBLE (tests/provider_doubles.py, serving a real tiny model), with and without LiteLLM dropping
`top_p`; auto mode must pick `anthropic` (LiteLLM's `/v1/messages`, an assistant prefill), say at start-up that it
picked by the provider's shape, and make one LLM call per handoff. Also: `top_p` is sent only when set, Anthropic's
temperature/top_p refusal is recognised, an undecidable probe with no Anthropic sign picks `instruct` with a warning,
and the Anthropic double takes content as a list of text blocks."""

from __future__ import annotations

import asyncio
import json
import logging
import os

import httpx
import pytest
from provider_doubles import anthropic_double, deepseek_double
from servers import free_port
from test_readme_endpoints import _process, litellm_or_skip
from tiny_models import CLEAN_LLM_SEEDS, HANDOFF_SLM_SEED, tiny_model_dir
from tiny_models import mid_trace_bias as tiny_mid_trace_bias

from pyrodash.backends import load_llm
from pyrodash.backends.base import BackendError, GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.http.continuation import Wire, build_request
from pyrodash.backends.http.probe import rejected_fields
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.prompts import get_prompts
from pyrodash.server.model_server import serve_in_thread

PROMPTS = get_prompts("world-v1")
PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)
QUESTION = "Start 12: +1, +2, f."
ANT_KEY = "sk-ant-double-0123456789abcdef"
MASTER = "sk-litellm-master-0123456789abcdef"  # the proxy's key: what PyroDash sends (OPENAI_API_KEY)
REFUSAL = "`temperature` and `top_p` cannot both be specified for this model. Please use only one."


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    slm = HFBackend(tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=HANDOFF_SLM_SEED), name="slm")
    llm = HFBackend(tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=CLEAN_LLM_SEEDS[1], offload=False), name="llm")
    return slm, llm, tiny_mid_trace_bias(slm, PROMPTS, QUESTION)


def _handoff(models, llm, calls: list) -> object:
    """One engine run with a mid-trace handoff: exactly one LLM call (counted by the engine and by the double)."""
    slm, ref_llm, bias = models
    n0 = len(calls)
    done = CollaborateEngine(slm, llm, PROMPTS, PRICES, offload_bias=bias, max_tokens=24).run(QUESTION)
    assert done.handoff is not None and done.handoff >= 2, "not a mid-trace handoff"
    assert done.usage.llm_calls == 1 and len(calls) - n0 == 1, (done.usage.llm_calls, calls[n0:])
    assert not done.fallback and not done.errors and done.usage.llm_out > 0 and not done.usage_estimated
    assert done.output == done.slm_text + done.llm_text
    ref = CollaborateEngine(
        slm, ref_llm, PROMPTS, PRICES, handoff_style="continue", offload_bias=bias, max_tokens=24
    ).run(QUESTION)
    assert ref.slm_text == done.slm_text
    if done.slm_text == done.slm_text.rstrip():  # a prefill loses trailing whitespace (Anthropic's rule)
        assert done.llm_text == ref.llm_text, "the prefix was not continued as the in-process LLM continues it"
    return done


# ---- fast: the request body, the refusal, the double -------------------------------------------------------


def test_top_p_is_sent_only_when_set():
    req = GenRequest(messages=[{"role": "user", "content": "q"}], prefix="a", max_tokens=2)
    for mode in ("continue", "instruct", "prefix"):
        _, body = build_request(Wire(mode), req, "m")
        assert "top_p" not in body and body["temperature"] == 0.0
        _, body = build_request(Wire(mode), GenRequest(messages=req.messages, top_p=0.9, temperature=0.7), "m")
        assert body["top_p"] == 0.9 and body["temperature"] == 0.7
    _, body = build_request(Wire("anthropic"), GenRequest(messages=req.messages, top_p=0.9), "m")
    assert "top_p" not in body  # the Messages API body never carries it


def test_the_temperature_top_p_refusal_is_recognised():
    direct = BackendError(f"HTTP 400 from X: {REFUSAL}", status=400)
    inner = json.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": REFUSAL}})
    proxied = BackendError(f"HTTP 400 from X: litellm.BadRequestError: AnthropicException - b'{inner}'", status=400)
    assert rejected_fields(direct) == {"top_p"} and rejected_fields(proxied) == {"top_p"}


def test_anthropic_double_takes_content_as_text_blocks(models):
    app = anthropic_double(models[1])
    with serve_in_thread(app) as url:
        h = {"x-api-key": ANT_KEY, "anthropic-version": "2023-06-01"}
        blocks = {
            "model": "claude-double",
            "max_tokens": 2,
            "system": [{"type": "text", "text": "Be brief."}],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Count on: "}, {"type": "text", "text": "1, 2, 3"}],
                },
                {"role": "assistant", "content": [{"type": "text", "text": "1, 2, 3, 4"}]},
            ],
        }
        r = httpx.post(f"{url}/messages", json=blocks, headers=h, timeout=30)
        assert r.status_code == 200 and r.json()["content"][0]["type"] == "text", r.text
        plain = {
            **blocks,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "Count on: 1, 2, 3"},
                {"role": "assistant", "content": "1, 2, 3, 4"},
            ],
        }
        r2 = httpx.post(f"{url}/messages", json=plain, headers=h, timeout=30)
        assert r2.json()["usage"] == r.json()["usage"]  # the same request, written either way
        image = {**blocks, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
        r3 = httpx.post(f"{url}/messages", json=image, headers=h, timeout=30)
        assert r3.status_code == 400 and "messages.0.content" in r3.json()["error"]["message"]


def test_undecidable_without_an_anthropic_sign_picks_instruct_and_says_so(models, caplog, monkeypatch):
    """DeepSeek's double off its beta path: `continue` is taken (the field silently ignored, the final assistant
    message closed) and counts as many tokens as a closed turn; prefix is refused. Nothing names Anthropic: instruct,
    with a start-up warning naming what the probe saw."""
    monkeypatch.setenv("PD_DEEPSEEK_KEY", "sk-deepseek-0123456789abcdef")
    caplog.set_level(logging.INFO, logger="pyrodash.llm")
    with serve_in_thread(deepseek_double(models[1])) as url:
        llm = load_llm({"url": url, "model": "deepseek-chat", "api_key_env": "PD_DEEPSEEK_KEY"})
    rep = llm.report
    assert llm.wire.mode == "instruct" and rep.provider is None, rep.lines()
    assert (
        rep.warning and "cannot tell whether continue continued" in rep.warning and "--llm-mode continue" in rep.warning
    ), rep.warning
    assert any(r.levelno == logging.WARNING and "cannot tell" in r.getMessage() for r in caplog.records)


def test_auto_on_an_anthropic_shaped_api_at_any_url(models, monkeypatch):
    """The Messages API at a URL that is not anthropic.com: its 401 to a Bearer key is an Anthropic error object, so
    the probe retries with Anthropic's headers and picks anthropic; one call per handoff."""
    monkeypatch.setenv("PD_ANTHROPIC_KEY", ANT_KEY)
    app = anthropic_double(models[1])
    with serve_in_thread(app) as url:
        llm = load_llm({"url": url, "model": "claude-double", "api_key_env": "PD_ANTHROPIC_KEY"})
        assert llm.wire.describe() == "anthropic" and llm.report.provider == "anthropic", llm.report.lines()
        _handoff(models, llm, app.state.calls)


# ---- a real LiteLLM proxy in front of the Anthropic double -------------------------------------------------


@pytest.fixture(scope="module")
def litellm_chain(models, tmp_path_factory):
    """(proxy base URL, the double's app): LiteLLM routes `my-llm` as is and `my-llm-drop` with
    `drop_params` + `additional_drop_params: [top_p]` (LiteLLM drops top_p), both to the Anthropic double."""
    exe = litellm_or_skip()
    tmp = tmp_path_factory.mktemp("litellm")
    app = anthropic_double(models[1], model="claude-double", key=ANT_KEY)
    with serve_in_thread(app) as upstream:
        params = {"model": "anthropic/claude-double", "api_base": upstream.removesuffix("/v1"), "api_key": ANT_KEY}
        cfg = tmp / "litellm.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "model_list": [
                        {"model_name": "my-llm", "litellm_params": params},
                        {
                            "model_name": "my-llm-drop",
                            "litellm_params": {**params, "drop_params": True, "additional_drop_params": ["top_p"]},
                        },
                    ]
                }
            )
        )
        port = free_port()
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "NO_DOCS": "True",
            "DISABLE_ADMIN_UI": "True",
            "LITELLM_MASTER_KEY": MASTER,
        }
        cmd = [exe, "--config", str(cfg), "--host", "127.0.0.1", "--port", str(port)]
        with _process(cmd, f"http://127.0.0.1:{port}/health/liveliness", env, tmp / "litellm.log", 180):
            yield f"http://127.0.0.1:{port}/v1", app


@pytest.mark.slow
@pytest.mark.parametrize("route", ["my-llm", "my-llm-drop"])
def test_auto_picks_anthropic_through_litellm(route, models, litellm_chain, monkeypatch, caplog):
    base, app = litellm_chain
    monkeypatch.setenv("OPENAI_API_KEY", MASTER)  # a 127.0.0.1 URL#model reads OPENAI_API_KEY: the proxy's key
    caplog.set_level(logging.INFO, logger="pyrodash.llm")
    llm = load_llm(f"{base}#{route}")
    rep = llm.report
    assert llm.wire.describe() == "anthropic" and llm.continues_prefix, rep.lines()
    assert rep.provider == "anthropic" and "x-litellm-model-name: anthropic/claude-double" in rep.seen, rep.lines()
    # the start-up warning says the counts could not tell and names what it saw
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "by the provider's shape" in r.getMessage()
    ]
    assert len(warned) == 1 and "cannot tell whether prefix continued" in warned[0], rep.lines()
    assert "x-litellm-model-name" in warned[0] and "/messages" in warned[0], warned[0]
    done = _handoff(models, llm, app.state.calls)
    last = app.state.calls[-1]  # what reached Anthropic: a prefill of the SLM's trace, no top_p
    assert last["messages"][-1]["role"] == "assistant" and "top_p" not in last
    assert done.usage.llm_out <= 24


@pytest.mark.slow
def test_a_forced_openai_style_mode_through_litellm_learns_anthropic_refuses_top_p(models, litellm_chain, monkeypatch):
    """`--llm-mode prefix` through the proxy: the counts cannot tell, the provider is Anthropic-shaped (LiteLLM
    sends a final assistant message as a prefill), so the mode is kept with a warning and top_p is never sent:
    a sampled request with top_p set is not refused."""
    base, app = litellm_chain
    monkeypatch.setenv("OPENAI_API_KEY", MASTER)
    llm = load_llm(f"{base}#my-llm", mode="prefix")
    assert llm.wire.describe() == "prefix (without top_p)" and llm.report.warning, llm.report.lines()
    n0 = len(app.state.calls)
    req = GenRequest(
        messages=[{"role": "user", "content": "Count on: 1, 2, 3"}],
        prefix="1, 2",
        max_tokens=3,
        temperature=0.7,
        top_p=0.9,
    )

    async def sampled() -> list:
        try:
            return [ch async for ch in llm.stream(req)]
        finally:
            await llm.aclose()

    chunks = asyncio.run(sampled())
    assert chunks[-1].finish_reason is not None and chunks[-1].completion_tokens
    assert len(app.state.calls) - n0 == 1 and "top_p" not in app.state.calls[-1]
