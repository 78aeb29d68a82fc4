"""`pyrodash.server.engine_run` and `pyrodash.server.sse`: an engine run's events handed to the HTTP side in ready
batches, and the SSE chunks they become (no models: a scripted engine)."""

from __future__ import annotations

import asyncio
import json

import pytest

from pyrodash.cost import Usage
from pyrodash.events import Done, LLMDelta, SLMDelta
from pyrodash.server.engine_run import EngineRun
from pyrodash.server.metrics import Metrics
from pyrodash.server.sse import ChunkWriter, sse_body


class Scripted:
    """TEST DOUBLE engine: `stream()` yields `events` (pausing at each None) and then raises `error`, if any."""

    def __init__(self, events: list, error: Exception | None = None):
        self.events, self.error = events, error

    async def stream(self, prompt, **kwargs):
        for ev in self.events:
            if ev is None:
                await asyncio.sleep(0.01)
            else:
                yield ev
        if self.error is not None:
            raise self.error


async def _batches(engine) -> list:
    run = EngineRun(engine, "q", set(), asyncio.Semaphore(1))
    out = []
    while True:
        try:
            batch = await run.next_batch()
        except ValueError as e:
            out.append(e)
            continue
        if batch is None:
            out.append(None)
            break
        out.append([ev.text for ev in batch])
    assert await run.next_batch() is None and run.ttft is not None  # the end stays the end
    return out


def test_events_come_in_ready_batches_then_the_error_then_the_end():
    events = [SLMDelta("a"), SLMDelta("b"), None, LLMDelta("c"), None, LLMDelta("d")]
    assert asyncio.run(_batches(Scripted(events))) == [["a", "b"], ["c"], ["d"], None]
    got = asyncio.run(_batches(Scripted(events, ValueError("upstream"))))
    assert got[:3] == [["a", "b"], ["c"], ["d"]] and isinstance(got[3], ValueError) and got[4:] == [None]


@pytest.mark.parametrize(
    "text", ["plain", 'quo"te \\ back', "line\nbreak\ttab\x00\x1f", "é ü 中 😀 \u2028", "\ud800 lone surrogate"]
)
def test_a_content_delta_is_the_json_encoders_own_text(text):
    w = ChunkWriter("chatcmpl-1", 0, "pyrodash", "chat", include_usage=True)
    body = json.loads(w.delta(text)[len("data: ") :])
    assert body["choices"][0]["delta"]["content"] == text
    assert json.dumps(text, ensure_ascii=False) in w.delta(text) and json.dumps(text, ensure_ascii=False) in w.tagged(
        text, {"source": "slm"}
    )


def test_the_last_chunks_and_done_are_one_write():
    """Each ready batch of deltas is one write; the finish chunk waits for the run's end and goes out with
    `data: [DONE]` (one write less per request)."""
    done = Done(
        output="ab",
        slm_text="ab",
        llm_text="",
        usage=Usage(slm_in=3, slm_out=2),
        cost_usd=0.0,
        finish_reason="stop",
        handoff=None,
    )
    metrics = Metrics()

    async def writes() -> list[str]:
        run = EngineRun(Scripted([SLMDelta("a"), None, SLMDelta("b"), done]), "q", set(), asyncio.Semaphore(1))
        first = await run.next_batch()
        return [w async for w in sse_body(metrics, run, first, "chat", "m", "/v1/chat/completions", False, None)]

    out = asyncio.run(writes())
    assert len(out) == 2 and out[0].count("data: ") == 2 and '"content":"a"' in out[0]  # the role chunk, then "a"
    assert out[1].count("data: ") == 3 and '"content":"b"' in out[1] and '"finish_reason":"stop"' in out[1]
    assert out[1].endswith("data: [DONE]\n\n")
