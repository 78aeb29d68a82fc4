"""A failed LLM call is a typed `LLMFailure` (attempt, kind, status, reached_server, message) from the backend to the
record, and the server maps it to a reason code with one table (`protocol.REASONS`): the kinds an HTTP endpoint
produces (a refused request, no server, an error event, a stall), through the engine."""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import JSONResponse, StreamingResponse
from test_relay import ScriptSLM

from pyrodash.backends.model_server import serve_in_thread
from pyrodash.backends.openai_compat import OpenAICompatBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, FailurePolicy
from pyrodash.events import FAILURE_KINDS, LLMFailure
from pyrodash.prompts import get_prompts
from pyrodash.record import Record
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
