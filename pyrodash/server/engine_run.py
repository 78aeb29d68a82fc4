"""One engine request as an owned asyncio task (`EngineRun`), and the watcher that cancels it when the client goes
away.

The engine's stream runs in its own task that feeds a queue; the HTTP side only reads the queue. When the client goes
away, the HTTP side calls `cancel()`: the task gets exactly one CancelledError, so the engine's own cleanup (closing
the SLM and LLM upstream streams, which stops their generation) runs to the end instead of being cut short by the web
server's cancel scope. Every live `EngineRun` is kept in a set (`app.state.runs`) so shutdown can cancel what is left
and tests can see that nothing keeps running.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Callable

from fastapi import Request

from pyrodash.engine import EngineRequest
from pyrodash.events import Done, Event
from pyrodash.server import errors
from pyrodash.server.clock import RequestClock

_END = object()


class EngineRun:
    """Runs `engine.stream(request)` in a task; `events()` yields its events, re-raising its error.
    `clock` (optional) accumulates the time spent waiting for the engine's events; `observe(event, t)` (optional,
    tracing) sees each event as it comes out of the engine, and `None` when the engine starts."""

    def __init__(
        self,
        engine,
        request: EngineRequest,
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
        self.task = asyncio.create_task(self._pump(engine, request, sem, observe))
        registry.add(self)
        self.task.add_done_callback(lambda _t: registry.discard(self))
        if on_exit is not None:
            self.task.add_done_callback(lambda _t: on_exit())

    async def _pump(self, engine, request: EngineRequest, sem: asyncio.Semaphore, observe) -> None:
        clock, put, now = self.clock, self._put, time.perf_counter
        try:
            async with sem:
                stream = engine.stream(request)
                try:
                    if observe is not None:
                        observe(None, now())
                    clock.engine_wait(now())
                    async for ev in stream:  # the time between two events is the engine's (and its models')
                        t1 = now()
                        clock.engine_event(t1)
                        if observe is not None:
                            observe(ev, t1)
                        put(ev)
                        clock.engine_wait(now())
                finally:
                    clock.engine_event(now())
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


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def watch(request: Request, run: EngineRun) -> asyncio.Future:
    """A task that waits for the client to go away and then cancels `run` (and with it both upstream requests)."""
    watcher = asyncio.ensure_future(_disconnected(request))
    watcher.add_done_callback(lambda w: w.cancelled() or run.cancel())
    return watcher


def gone(watcher: asyncio.Future) -> bool:
    return watcher.done() and not watcher.cancelled()


async def first_batch(request: Request, run: EngineRun) -> tuple[asyncio.Future | None, list | None]:
    """(the disconnect watcher, None when the client is gone; the run's first events). The stream's response keeps
    the watcher. An engine error raised before any event becomes an APIError."""
    watcher = watch(request, run)
    try:
        first = await run.next_batch()
    except Exception as e:  # noqa: BLE001 - mapped to an OpenAI error
        watcher.cancel()
        raise errors.failure(e) from e
    if gone(watcher):
        return None, None
    return watcher, first
