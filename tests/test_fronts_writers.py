"""The Responses and Messages APIs' stream writers (`pyrodash.server.responses_api.ResponsesWriter`,
`messages_api.MessagesWriter`) through `sse_events`, on a scripted engine run (no models): every event is valid JSON
whose `type` is its SSE event name, text deltas are the JSON encoder's own text, the handoff is tagged, and an engine
error after the status line ends the stream with the API's error event."""

from __future__ import annotations

import asyncio
import json

import pytest
from test_server_runs import Scripted

from pyrodash.cost import Usage
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.server import messages_api, protocol, responses_api
from pyrodash.server.engine_run import EngineRun
from pyrodash.server.metrics import Metrics
from pyrodash.server.sse import sse_events

DONE = Done(
    output="ab😀",
    slm_text="a",
    llm_text="b😀",
    usage=Usage(slm_in=3, slm_out=1, llm_in=5, llm_out=2, llm_cached_in=2, llm_calls=1),
    cost_usd=0.5,
    finish_reason="length",
    handoff=1,
)
EVENTS = [SLMDelta("a"), Handoff(1, "a"), LLMDelta("b😀"), DONE]
WRITERS = {
    "responses": lambda: responses_api.ResponsesWriter("m", responses_api.ResponsesRequest(input="q")),
    "messages": lambda: messages_api.MessagesWriter(
        "m", messages_api.MessagesRequest(messages=[{"role": "user", "content": "q"}], max_tokens=3)
    ),
}


def _info(done: Done) -> protocol.PyroDashInfo:
    return protocol.PyroDashInfo.from_done(done)


def _events(kind: str, script: list, error: Exception | None = None) -> list[tuple[str, dict]]:
    async def go() -> str:
        run = EngineRun(Scripted(script, error), "q", set(), asyncio.Semaphore(1))
        first = await run.next_batch()
        parts = sse_events(Metrics(), run, first, WRITERS[kind](), "m", "/v1/x", _info, sources=True)
        return "".join([p async for p in parts])

    out = []
    for block in asyncio.run(go()).split("\n\n"):
        if block:
            head, data = block.split("\n")
            out.append((head.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


@pytest.mark.parametrize("kind", list(WRITERS))
def test_every_event_is_json_named_by_its_type_and_tagged(kind):
    events = _events(kind, EVENTS)
    assert all(name == data["type"] for name, data in events)
    tagged = [d["pyrodash"] for _, d in events if "pyrodash" in d and "source" in d["pyrodash"]]
    assert tagged == [{"source": "slm"}, {"source": "handoff", "handoff": 1}, {"source": "llm"}]
    last = events[-1][1] if kind == "responses" else events[-2][1]  # (messages: message_delta before message_stop)
    info = last["response"]["pyrodash"] if kind == "responses" else last["pyrodash"]
    assert info["handoff"] == 1 and info["cost_usd"] == 0.5 and "overhead_ms" in info
    if kind == "responses":
        assert [d["sequence_number"] for _, d in events] == list(range(len(events)))
        assert events[-1][0] == "response.incomplete" and last["response"]["output_text"] == "ab😀"
        assert last["response"]["usage"]["input_tokens_details"]["cached_tokens"] == 2
    else:
        assert events[-1][0] == "message_stop" and last["delta"]["stop_reason"] == "max_tokens"
        assert last["usage"] == {"input_tokens": 6, "output_tokens": 3, "cache_creation_input_tokens": 0,
                                 "cache_read_input_tokens": 2}  # fmt: skip


@pytest.mark.parametrize("text", ['quo"te \\ back', "line\nbreak\x00", "é 中 \u2028", "\ud800 lone"])
@pytest.mark.parametrize("kind", list(WRITERS))
def test_a_delta_is_the_json_encoders_own_text(kind, text):
    head, data = WRITERS[kind]().delta(text).rstrip("\n").split("\n")
    body = json.loads(data.removeprefix("data: "))
    assert (body.get("delta") if kind == "responses" else body["delta"]["text"]) == text


@pytest.mark.parametrize("kind", list(WRITERS))
def test_an_engine_error_after_the_status_line_is_the_apis_error_event(kind):
    events = _events(kind, [SLMDelta("a"), None], RuntimeError("upstream down"))
    names = [n for n, _ in events]
    if kind == "responses":
        assert names[-2:] == ["error", "response.failed"] and events[-1][1]["response"]["status"] == "failed"
        assert events[-2][1]["code"] == "backend_error" and "upstream down" not in json.dumps(events)
    else:
        assert names[-1] == "error" and events[-1][1]["error"]["type"] == "api_error"
        assert "upstream down" not in json.dumps(events)
