"""After a handoff, an LLM behind HTTP gets the tools and its structured calls reach the answer: a chat endpoint's
`delta.tool_calls` (OpenAI-shaped, split across chunks) and an Anthropic endpoint's `tool_use` blocks with
`input_json_delta`. The endpoints are TEST DOUBLES (a provider we cannot reach) that stream a fixed call the way
each API does and record the request body; the SLM is tests/tool_doubles.py's."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from tool_doubles import TASK, run_tool, tool_pair

from pyrodash.backends import load_llm
from pyrodash.backends.http.endpoint import LLMEndpoint
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.backends.http.probe import ProbeReport, probe_tools, run_sync
from pyrodash.chat import Message, Tools, ToolSpec
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine
from pyrodash.prompts import get_prompts
from pyrodash.server.model_server import serve_in_thread

ARGS = '{"x": 4}'


def openai_tool_double() -> FastAPI:
    """TEST DOUBLE of a chat endpoint with a tool parser: a call streamed as `delta.tool_calls` in three pieces."""
    app = FastAPI()
    app.state.bodies = []

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        app.state.bodies.append(await request.json())
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m"}

        def chunk(delta, finish=None, usage=None):
            body = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(body | ({'usage': usage} if usage else {}))}\n\n"

        call = {"index": 0, "id": "call_up1", "type": "function", "function": {"name": "lookup_g", "arguments": ""}}
        events = [
            chunk({"role": "assistant", "content": "Looking it up."}),
            chunk({"tool_calls": [call]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[:4]}}]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": ARGS[4:]}}]}, "tool_calls"),
            f"data: {json.dumps({**head, 'choices': [], 'usage': {'prompt_tokens': 40, 'completion_tokens': 9}})}\n\n",
            "data: [DONE]\n\n",
        ]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    return app


def anthropic_tool_double() -> FastAPI:
    """TEST DOUBLE of the Messages API: a text block, then a `tool_use` block whose input streams in two pieces."""
    app = FastAPI()
    app.state.bodies = []

    @app.post("/v1/messages")
    async def messages(request: Request):
        app.state.bodies.append(await request.json())

        def ev(kind, **f):
            return f"event: {kind}\ndata: {json.dumps({'type': kind, **f})}\n\n"

        use = {"type": "tool_use", "id": "toolu_1", "name": "lookup_g", "input": {}}
        events = [
            ev("message_start", message={"usage": {"input_tokens": 40, "output_tokens": 1}}),
            ev("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=0, delta={"type": "text_delta", "text": "Looking it up."}),
            ev("content_block_stop", index=0),
            ev("content_block_start", index=1, content_block=use),
            ev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": ARGS[:3]}),
            ev("content_block_delta", index=1, delta={"type": "input_json_delta", "partial_json": ARGS[3:]}),
            ev("content_block_stop", index=1),
            ev("message_delta", delta={"stop_reason": "tool_use"}, usage={"output_tokens": 9}),
            ev("message_stop"),
        ]
        return StreamingResponse(iter(events), media_type="text/event-stream")

    return app


def second_request(e: CollaborateEngine, tools: Tools):
    """The task's second request (one tool result in): the SLM hands off there."""
    first = e.run([Message("user", TASK)], tools=tools)
    c = first.tool_calls[0]
    msgs = [
        Message("user", TASK),
        Message("assistant", first.output, tool_calls=(c,)),
        Message("tool", run_tool(c.name, c.arguments), tool_call_id=c.id),
    ]
    return e.run(msgs, tools=tools)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_an_endpoint_llm_after_a_handoff_returns_a_structured_call(api):
    app = openai_tool_double() if api == "openai" else anthropic_tool_double()
    tools = Tools.of([ToolSpec("lookup_g", "The value of g at x.", {"type": "object"})])
    with serve_in_thread(app) as url:
        mode = "instruct" if api == "openai" else "anthropic"
        llm = load_llm({"url": url, "model": "m", "mode": mode})
        slm = tool_pair()[0]
        e = CollaborateEngine(slm, llm, get_prompts("world-v1"), Prices(1, 2, 10, 40), max_tokens=200)
        done = second_request(e, tools)
    assert done.handoff is not None and done.finish_reason == "tool_calls"
    assert [(c.name, json.loads(c.arguments), c.by) for c in done.tool_calls] == [("lookup_g", {"x": 4}, "llm")]
    assert done.output.endswith("Looking it up.") and done.usage.llm_in == 40
    body = app.state.bodies[-1]
    if api == "openai":
        assert body["tools"][0]["function"]["name"] == "lookup_g"
        assert any(m.get("role") == "tool" for m in body["messages"])  # the tool result reached the LLM
    else:
        assert body["tools"][0]["name"] == "lookup_g" and body["tools"][0]["input_schema"] == {"type": "object"}
        kinds = [b.get("type") for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
        assert "tool_use" in kinds and "tool_result" in kinds


def plain_double() -> FastAPI:
    """TEST DOUBLE of a chat endpoint that refuses `tools` (400), as a server without a tool parser may."""
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        if "tools" in body:
            err = {"message": "tools are not supported", "type": "invalid_request_error", "param": "tools"}
            return JSONResponse({"error": err}, status_code=400)
        return JSONResponse({"error": {"message": "unexpected"}}, status_code=500)

    return app


@pytest.mark.parametrize(
    "app, says",
    [(openai_tool_double, "yes: structured calls (lookup_g)"), (plain_double, "no: the endpoint refused tools")],
)
def test_pyrodash_check_says_whether_tool_calls_work_in_the_mode(app, says):
    with serve_in_thread(app()) as url:
        backend = OpenAICompatBackend.from_endpoint(LLMEndpoint.parse({"url": url, "model": "m", "mode": "instruct"}))
        rep = ProbeReport(url=url, model="m", configured_mode="instruct", key_env=None, key_sent=False, mode="instruct")
        run_sync(probe_tools(backend, rep))
        run_sync(backend.aclose())
    assert rep.tools.startswith(says), rep.tools
    assert any(line.strip().startswith("tool calls") for line in rep.lines())
