"""One engine request as an owned asyncio task, and its rendering as OpenAI SSE chunks.

The engine's stream runs in its own task (`EngineRun`) that feeds a queue; the HTTP side only reads the queue. When
the client goes away, the HTTP side calls `cancel()`: the task gets exactly one CancelledError, so the engine's own
cleanup (closing the SLM and LLM upstream streams, which stops their generation) runs to the end instead of being
cut short by the web server's cancel scope. Every live `EngineRun` is kept in a set (`app.state.runs`) so shutdown can
cancel what is left and tests can see that nothing keeps running.

`RequestClock` is where a request's time goes: its arrival (the server's ASGI entry) and the time its engine run
spent waiting for the engine's next event (the engine and the models behind it: the upstream HTTP requests and
streams). Wall time less that wait is the time spent in PyroDash's server itself (`x-pyrodash-overhead-ms`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from json.encoder import encode_basestring  # json.dumps(str, ensure_ascii=False) without an encoder per call

from pyrodash.events import Done, Event

_END = object()


class RequestClock:
    """One request's time: `t0` its arrival (perf_counter), `engine_s` the time its engine run waited for events."""

    __slots__ = ("t0", "engine_s")

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.engine_s = 0.0

    def overhead_s(self, now: float | None = None) -> float:
        """Seconds spent in the server itself so far: wall time less the engine's."""
        return (time.perf_counter() if now is None else now) - self.t0 - self.engine_s


class EngineRun:
    """Runs `engine.stream(prompt, **kwargs)` in a task; `events()` yields its events, re-raising its error.
    `clock` (optional) accumulates the time spent waiting for the engine's events; `observe(event, t)` (optional,
    tracing) sees each event as it comes out of the engine, and `None` when the engine starts."""

    def __init__(
        self,
        engine,
        prompt: str | list[dict],
        kwargs: dict,
        registry: set,
        sem: asyncio.Semaphore,
        on_exit: Callable[[], None] | None = None,
        clock: RequestClock | None = None,
        observe: Callable[[object, float], None] | None = None,
    ):
        # the engine's events, then _END (after the engine's error, if any); the reader waits on `_waiter` when empty
        # (a deque and one future: asyncio.Queue's per-item bookkeeping is per streamed token here)
        self.items: deque = deque()
        self._waiter: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()
        self.t0 = time.perf_counter()
        self.clock = clock if clock is not None else RequestClock(self.t0)
        self.ttft: float | None = None
        self.cancelled = False
        self.task = asyncio.create_task(self._pump(engine, prompt, kwargs, sem, observe))
        registry.add(self)
        self.task.add_done_callback(lambda _t: registry.discard(self))
        if on_exit is not None:
            self.task.add_done_callback(lambda _t: on_exit())

    async def _pump(self, engine, prompt, kwargs: dict, sem: asyncio.Semaphore, observe) -> None:
        clock, put, now = self.clock, self._put, time.perf_counter
        try:
            async with sem:
                stream = engine.stream(prompt, **kwargs)
                try:
                    t = now()
                    if observe is not None:
                        observe(None, t)
                    async for ev in stream:  # the time between two events is the engine's (and its models')
                        t1 = now()
                        clock.engine_s += t1 - t
                        if observe is not None:
                            observe(ev, t1)
                        put(ev)
                        t = now()
                finally:
                    await stream.aclose()
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            self._put(e)
        finally:
            self._put(_END)

    def _put(self, item) -> None:
        self.items.append(item)
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def next_batch(self) -> list[Event] | None:
        """The next events in order, grouped: every event that was ready when the reader woke up (so a reader
        slower than the models, on a loaded server, writes several tokens with one socket send). None at the end;
        the engine's error is raised in its place, after the events that came before it."""
        items = self.items
        while not items:
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        batch: list[Event] = []
        while items:
            item = items[0]
            if item is _END or isinstance(item, BaseException):
                if batch:  # the end (or the error) is handed out by the next call
                    return batch
                if item is _END:  # (it stays: every later call returns None too)
                    return None
                items[0] = _END  # the error is raised once, then the end
                raise item
            items.popleft()
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

    def usage(self, usage: dict, pyrodash: dict) -> str:
        return self.head + f'"choices":[],"usage":{json.dumps(usage)},"pyrodash":{json.dumps(pyrodash)}}}\n\n'

    @staticmethod
    def error(body: dict) -> str:
        return f"data: {json.dumps(body)}\n\n"

    DONE = "data: [DONE]\n\n"
    DONE_BYTES = DONE.encode()
