"""A streamed completion as server-sent events: `ChunkWriter` (OpenAI's chunks, content deltas from a precomputed
template: the hot path), `sse_events` (an engine run's events through any front's writer, one write per ready batch;
`sse_body`: with a `ChunkWriter`) and `SSEResponse` (written straight to the ASGI `send`, cancelling its run when
the client goes away).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from json.encoder import encode_basestring  # json.dumps(str, ensure_ascii=False) without an encoder per call

import anyio
from fastapi.responses import StreamingResponse

from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.server import errors, protocol
from pyrodash.server.engine_run import EngineRun
from pyrodash.server.metrics import Metrics

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ChunkWriter:
    """Server-sent events for one stream; content deltas use a precomputed template (the hot path)."""

    def __init__(self, rid: str, created: int, model: str, kind: str = "chat", include_usage: bool = False):
        self.kind, self.include_usage = kind, include_usage
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        self.head = f'data: {{"id":{json.dumps(rid)},"object":"{obj}","created":{created},"model":{json.dumps(model)},'
        tail = ',"usage":null' if include_usage else ""
        if kind == "chat":
            self.delta_pre = self.head + '"choices":[{"index":0,"delta":{"content":'
            self.delta_post = '},"logprobs":null,"finish_reason":null}]' + tail + "}\n\n"
        else:
            self.delta_pre = self.head + '"choices":[{"index":0,"text":'
            self.delta_post = ',"logprobs":null,"finish_reason":null}]' + tail + "}\n\n"

    def role(self) -> str:
        tail = ',"usage":null' if self.include_usage else ""
        return (
            self.head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
            '"finish_reason":null}]' + tail + "}\n\n"
        )

    def delta(self, text: str) -> str:
        return self.delta_pre + encode_basestring(text) + self.delta_post

    def tagged(self, text: str, pyrodash: dict) -> str:
        """A content delta that also carries a `pyrodash` object (request `pyrodash.sources`: who wrote it)."""
        post = self.delta_post[: -len("}\n\n")]
        return f'{self.delta_pre}{encode_basestring(text)}{post},"pyrodash":{json.dumps(pyrodash)}}}\n\n'

    def finish(self, reason: str) -> str:
        tail = ',"usage":null' if self.include_usage else ""
        if self.kind == "chat":
            choice = f'{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":{json.dumps(reason)}}}'
        else:
            choice = f'{{"index":0,"text":"","logprobs":null,"finish_reason":{json.dumps(reason)}}}'
        return self.head + f'"choices":[{choice}]' + tail + "}\n\n"

    def tool_call(self, index: int, call) -> str:
        """One tool call, whole, as a chat delta (`tool_calls[index]`: id, name and all its arguments)."""
        tail = ',"usage":null' if self.include_usage else ""
        delta = {"tool_calls": [{"index": index, **call.wire()}]}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self.head + f'"choices":[{json.dumps(choice)}]' + tail + "}\n\n"

    def usage(self, usage: dict, pyrodash: dict) -> str:
        return self.head + f'"choices":[],"usage":{json.dumps(usage)},"pyrodash":{json.dumps(pyrodash)}}}\n\n'

    @staticmethod
    def error(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"

    def opening(self) -> list[str]:
        """The events before the first delta (chat: the assistant's role)."""
        return [self.role()] if self.kind == "chat" else []

    def closing(self, done: Done, info: Callable[[], dict]) -> list[str]:
        """The events after the last delta: the finish chunk, and with `include_usage` the usage chunk with the
        `pyrodash` object."""
        out = [self.tool_call(i, c) for i, c in enumerate(done.tool_calls)] if self.kind == "chat" else []
        out.append(self.finish(done.finish_reason))
        if self.include_usage:
            out.append(self.usage(protocol.UsageInfo.from_done(done).model_dump(), info()))
        return out

    def failure(self, err: protocol.APIError) -> str:
        return self.error(err.body())

    DONE = "data: [DONE]\n\n"
    DONE_BYTES = DONE.encode()
    END = DONE


class SSEResponse(StreamingResponse):
    """Server-sent events written straight to the ASGI `send` (no task group per stream: the disconnect watcher that
    `engine_run.first_batch` started cancels the writing when the client goes away); the last event (`data: [DONE]`)
    ends the body in the same write. Always closes its body iterator and cancels its engine run, even when the client
    vanished before or during sending."""

    media_type = "text/event-stream"

    def __init__(self, content, run: EngineRun, watcher: asyncio.Future, headers: dict | None = None):
        super().__init__(content, headers=headers)
        self.run, self.watcher = run, watcher

    async def __call__(self, scope, receive, send) -> None:
        task, gone = asyncio.current_task(), []

        def disconnected(w: asyncio.Future) -> None:
            if not w.cancelled():
                gone.append(True)
                task.cancel()

        self.watcher.add_done_callback(disconnected)
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            more = True
            async for chunk in self.body_iterator:
                if more:
                    body = chunk.encode() if isinstance(chunk, str) else chunk
                    more = not body.endswith(ChunkWriter.DONE_BYTES)
                    if not more:  # the end of the response is no disconnect
                        self.watcher.remove_done_callback(disconnected)
                    await send({"type": "http.response.body", "body": body, "more_body": more})
            if more:
                self.watcher.remove_done_callback(disconnected)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not gone:  # not ours: the server is stopping
                raise
            uncancel = getattr(task, "uncancel", None)  # Python >= 3.11
            if uncancel is not None:
                uncancel()
        finally:
            self.watcher.remove_done_callback(disconnected)
            self.watcher.cancel()
            self.run.cancel()
            with anyio.CancelScope(shield=True):
                await self.body_iterator.aclose()


async def sse_body(
    metrics: Metrics,
    run: EngineRun,
    first: list | None,
    kind: str,
    model: str,
    route: str,
    include_usage: bool,
    info_of: Callable[[Done], protocol.PyroDashInfo],
    sources: bool = False,
):
    """`run`'s events as OpenAI's chunks of `kind` ("chat" or "text"), ending with `data: [DONE]`
    (`include_usage`: a usage chunk with the `pyrodash` object): `sse_events` with a `ChunkWriter`."""
    rid = protocol.new_id("chatcmpl" if kind == "chat" else "cmpl")
    w = ChunkWriter(rid, protocol.now(), model, kind, include_usage)
    async for part in sse_events(metrics, run, first, w, model, route, info_of, sources):
        yield part


async def sse_events(
    metrics: Metrics,
    run: EngineRun,
    first: list | None,
    w,
    model: str,
    route: str,
    info_of: Callable[[Done], protocol.PyroDashInfo],
    sources: bool = False,
):
    """`run`'s events (`first`: its first batch, already read) as the server-sent events of writer `w`
    (`pyrodash.server.front`), one write per batch; the last write holds the closing events and `w.END`. `sources`:
    each delta says who wrote it. An engine error after the status line is an error event in the stream (as the API
    does); the response is counted in `metrics` after its last byte."""
    status = "200"
    out = w.opening()
    done: Done | None = None

    def info() -> dict:
        body = info_of(done).model_dump()
        body["overhead_ms"] = round(run.clock.overhead_s() * 1e3, 3)
        return body

    try:
        try:
            batch = first
            while batch is not None:  # one write per batch of ready events, one SSE event per delta
                for ev in batch:
                    if isinstance(ev, (SLMDelta, LLMDelta)):
                        if ev.text and sources:
                            out.append(w.tagged(ev.text, {"source": "slm" if isinstance(ev, SLMDelta) else "llm"}))
                        elif ev.text:
                            out.append(w.delta(ev.text))
                    elif isinstance(ev, Handoff) and sources:
                        out.append(w.tagged("", {"source": "handoff", "handoff": ev.slm_tokens}))
                    elif isinstance(ev, Done):
                        done = ev
                        out.extend(w.closing(ev, info))
                if out and done is None:  # (the last events wait for the run's end: one write with the end)
                    yield "".join(out)
                    out = []
                batch = await run.next_batch()
        except Exception as e:  # noqa: BLE001 - the status line is sent: report in the stream, as the API does
            err = errors.failure(e)
            status = str(err.status)
            metrics.errors.inc(kind="client" if err.status < 500 else "upstream")
            out.append(w.failure(err))
        out.append(w.END)
        yield "".join(out)
    except BaseException:  # the client went away (cancelled, or the generator closed early)
        status = "499"
        metrics.errors.inc(kind="disconnect")
        raise
    finally:
        run.cancel()
        if done is not None:  # after the last byte (the response does not wait for the metrics)
            metrics.observe_done(done, model, run.elapsed, run.ttft, run.clock.overhead_s())
        metrics.requests.inc(route=route, model=model, status=status)
