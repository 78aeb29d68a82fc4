"""A failed LLM call is a typed `LLMFailure` (attempt, kind, status, reached_server, message) from the backend to the
record, and the server maps it to a reason code with one table (`protocol.REASONS`): the kinds an HTTP endpoint
produces (a refused request, no server, an error event, a stall), through the engine."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from test_relay import ScriptSLM

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, FailurePolicy
from pyrodash.events import FAILURE_KINDS, LLMFailure
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
from pyrodash.server.model_server import serve_in_thread
from pyrodash.server.protocol import REASONS, PyroDashInfo, reason

PROMPTS, PAPER = get_prompts("world-v1"), Prices.from_yaml("paper")


def test_every_kind_has_one_reason_code():
    assert set(REASONS) == set(FAILURE_KINDS)
    assert (
        reason(LLMFailure(2, "http", "HTTP 503 from http://10.0.0.1:8001/v1: busy", 503))
        == "attempt 2: upstream_http_503"
    )
    assert reason(LLMFailure(1, "timeout", "no chunk")) == "attempt 1: upstream_timeout"


def flaky_llm() -> FastAPI:
    """TEST DOUBLE of an LLM endpoint that fails in turn: a 503, an error event mid-stream, a stall."""
    app, state = FastAPI(), {"n": 0}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": "llm", "object": "model"}]}

    @app.post("/v1/chat/completions")
    async def chat():
        state["n"] += 1
        if state["n"] == 1:
            return JSONResponse({"error": {"message": "overloaded", "type": "server_error"}}, 503)

        async def events():
            if state["n"] == 2:
                yield 'data: {"error": {"message": "boom"}}\n\n'
            else:
                await asyncio.sleep(5)
                yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def test_failures_are_typed_from_the_backend_to_the_record_and_the_wire():
    with serve_in_thread(flaky_llm()) as url:
        llm = OpenAICompatBackend(url, model="llm")  # (no start-up probe: every request is the engine's)
        policy = FailurePolicy(retries=2, backoff_s=0.0, timeout_s=1.0)
        done = CollaborateEngine(ScriptSLM(), llm, PROMPTS, PAPER, max_tokens=200, failure=policy).run("q")
    kinds = [(f.attempt, f.kind, f.status, f.reached_server) for f in done.failures]
    assert kinds == [(1, "http", 503, True), (2, "error_event", None, True), (3, "timeout", None, True)]
    assert done.fallback and done.errors == [str(f) for f in done.failures]
    rec = Record.from_done(done)
    assert [f["kind"] for f in rec.llm_failures] == ["http", "error_event", "timeout"]
    info = PyroDashInfo.from_done(done)
    assert info.llm_errors == [
        "attempt 1: upstream_http_503",
        "attempt 2: upstream_error_event",
        "attempt 3: upstream_timeout",
    ]
    assert all("message" not in f for f in info.llm_failures) and info.llm_failures[0]["status"] == 503


def test_an_endpoint_nobody_listens_on_is_unreachable_and_not_a_call():
    llm = OpenAICompatBackend("http://127.0.0.1:9/v1", model="llm")
    policy = FailurePolicy(retries=0, backoff_s=0.0, timeout_s=2.0)
    done = CollaborateEngine(ScriptSLM(), llm, PROMPTS, PAPER, max_tokens=200, failure=policy).run("q")
    (f,) = done.failures
    assert (f.kind, f.reached_server, f.status) == ("unreachable", False, None) and done.usage.llm_calls == 0
    assert reason(f) == "attempt 1: upstream_unreachable"


def test_one_failure_policy_from_the_serve_config_to_the_backend():
    import pyrodash.engine
    import pyrodash.server.config
    from pyrodash.backends import retry
    from pyrodash.server.config import ServeConfig

    assert pyrodash.engine.FailurePolicy is retry.FailurePolicy and not hasattr(pyrodash.server.config, "Failure")
    c = ServeConfig(failure={"retries": 1, "timeout_s": 5, "on_error": "raise"})
    assert c.failure == retry.FailurePolicy(retries=1, backoff_s=0.2, timeout_s=5, on_error="raise")
    for bad, says in (
        ({"retries": -1}, "failure: retries"),
        ({"on_error": "x"}, "failure.on_error"),
        ({"x": 1}, "'x'"),
    ):
        with pytest.raises(ValueError, match=says):
            ServeConfig(failure=bad)


class SlowLLM:
    """An LLM that streams a chunk every `gap_s` (a TEST DOUBLE of a slow but live endpoint)."""

    def __init__(self, gap_s: float, n: int = 4):
        self.gap_s, self.n = gap_s, n

    async def stream(self, req):
        for _ in range(self.n):
            await asyncio.sleep(self.gap_s)
            yield GenChunk(text="x")
        yield GenChunk(finish_reason="stop", prompt_tokens=1, completion_tokens=self.n)


def test_batch_work_times_out_a_stall_not_a_long_live_stream():
    """`timeout_s` bounds each wait for the next chunk, in batch work as in the engine: a stream that keeps coming
    for longer than it in all is answered; one that stalls fails as a value."""
    from pyrodash.backends.retry import FailurePolicy, call_with_retry

    policy = FailurePolicy(retries=0, backoff_s=0.0, timeout_s=0.3)
    live = asyncio.run(call_with_retry(SlowLLM(0.1, n=6), GenRequest(messages=[]), policy))
    assert live.finish_reason == "stop" and live.text == "xxxxxx"
    stalled = asyncio.run(call_with_retry(SlowLLM(1.0), GenRequest(messages=[]), policy))
    assert stalled.finish_reason == "error" and "no chunk within 0.3s" in stalled.error
