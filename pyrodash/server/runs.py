"""One engine request as an owned asyncio task, and its rendering as OpenAI SSE chunks.

The engine's stream runs in its own task (`EngineRun`) that feeds a queue; the HTTP side only reads the queue. When
the client goes away, the HTTP side calls `cancel()`: the task gets exactly one CancelledError, so the engine's own
cleanup (closing the SLM and LLM upstream streams, which stops their generation) runs to the end instead of being
cut short by the web server's cancel scope. Every live `EngineRun` is kept in a set (`app.state.runs`) so shutdown can
cancel what is left and tests can see that nothing keeps running.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from pyrodash.events import Done, Event

_END = object()


class EngineRun:
    """Runs `engine.stream(prompt, **kwargs)` in a task; `events()` yields its events, re-raising its error."""

    def __init__(self, engine, prompt: str | list[dict], kwargs: dict, registry: set, sem: asyncio.Semaphore,
                 on_exit: Callable[[], None] | None = None):
        self.queue: asyncio.Queue = asyncio.Queue()
        self.t0 = time.perf_counter()
        self.ttft: float | None = None
        self.cancelled = False
        self._held: list = []  # taken from the queue, not handed out yet
        self.task = asyncio.create_task(self._pump(engine, prompt, kwargs, sem))
        registry.add(self)
        self.task.add_done_callback(lambda _t: registry.discard(self))
        if on_exit is not None:
            self.task.add_done_callback(lambda _t: on_exit())

    async def _pump(self, engine, prompt, kwargs: dict, sem: asyncio.Semaphore) -> None:
        try:
            async with sem:
                stream = engine.stream(prompt, **kwargs)
                try:
                    async for ev in stream:
                        self.queue.put_nowait(ev)
                finally:
                    await stream.aclose()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            self.queue.put_nowait(e)
        finally:
            self.queue.put_nowait(_END)

    async def next_batch(self) -> list[Event] | None:
        """The next events in order, grouped: every event that was ready when the reader woke up (so a reader
        slower than the models, on a loaded server, writes several tokens with one socket send). None at the end;
        the engine's error is raised in its place, after the events that came before it."""
        items, self._held = self._held or [await self.queue.get()], []
        while not self.queue.empty():
            items.append(self.queue.get_nowait())
        batch: list[Event] = []
        for i, item in enumerate(items):
            if item is _END or isinstance(item, BaseException):
                if batch:
                    self._held = items[i:]  # the end (or the error) is handed out by the next call
                    return batch
                self._held = [_END]
                if item is _END:
                    return None
                raise item
            if self.ttft is None and getattr(item, "text", ""):
                self.ttft = time.perf_counter() - self.t0
            batch.append(item)
        return batch

    async def batches(self) -> AsyncIterator[list[Event]]:
        while (batch := await self.next_batch()) is not None:
            yield batch

    async def events(self) -> AsyncIterator[Event]:
        async for batch in self.batches():
            for ev in batch:
                yield ev

    async def done(self) -> Done:
        last = None
        async for ev in self.events():
            last = ev
        if not isinstance(last, Done):
            raise RuntimeError("the engine stream ended without a Done event")
        return last

    def cancel(self) -> None:
        """Cancel the run, once: a second CancelledError would interrupt the cleanup that the first one started
        (closing the upstream HTTP stream), and the upstream server would keep generating for nobody."""
        if not self.cancelled and not self.task.done():
            self.cancelled = True
            self.task.cancel()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.t0


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
        return self.head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,' \
            '"finish_reason":null}]' + tail + "}\n\n"

    def delta(self, text: str) -> str:
        return self.delta_pre + json.dumps(text, ensure_ascii=False) + self.delta_post

    def tagged(self, text: str, pyrodash: dict) -> str:
        """A content delta that also carries a `pyrodash` object (request `pyrodash.sources`: who wrote it)."""
        post = self.delta_post[: -len("}\n\n")]
        return f'{self.delta_pre}{json.dumps(text, ensure_ascii=False)}{post},"pyrodash":{json.dumps(pyrodash)}}}\n\n'

    def finish(self, reason: str) -> str:
        tail = ',"usage":null' if self.include_usage else ""
        if self.kind == "chat":
            choice = f'{{"index":0,"delta":{{}},"logprobs":null,"finish_reason":{json.dumps(reason)}}}'
        else:
            choice = f'{{"index":0,"text":"","logprobs":null,"finish_reason":{json.dumps(reason)}}}'
        return self.head + f'"choices":[{choice}]' + tail + "}\n\n"

    def usage(self, usage: dict, pyrodash: dict) -> str:
        return self.head + f'"choices":[],"usage":{json.dumps(usage)},"pyrodash":{json.dumps(pyrodash)}}}\n\n'

    @staticmethod
    def error(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"

    DONE = "data: [DONE]\n\n"
