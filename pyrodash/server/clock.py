"""Where a request's time goes: `RequestClock` (its arrival, and the time its engine run waited for the engine's
next event: the engine and the models behind it) and `Timing`, the ASGI middleware around the whole app that gives
each request a clock and each response `x-pyrodash-overhead-ms`: wall time less the engine's, the time spent in
PyroDash's server itself. A traced request's spans are built once its last byte is out (`pyrodash.server.tracing`).
"""

from __future__ import annotations

import logging
import time

log = logging.getLogger("pyrodash.serve")
OVERHEAD_HEADER = b"x-pyrodash-overhead-ms"


class RequestClock:
    """One request's time: `t0` its arrival (perf_counter), `engine_s` the time its engine run waited for events,
    `waiting_since` when the wait in progress began (None between waits)."""

    __slots__ = ("t0", "engine_s", "waiting_since")

    def __init__(self, t0: float | None = None) -> None:
        self.t0 = time.perf_counter() if t0 is None else t0
        self.engine_s = 0.0
        self.waiting_since: float | None = None

    def engine_wait(self, start: float) -> None:
        """The engine run starts waiting for its next event."""
        self.waiting_since = start

    def engine_event(self, now: float) -> None:
        """The event came: the wait was the engine's."""
        if self.waiting_since is not None:
            self.engine_s += now - self.waiting_since
            self.waiting_since = None

    def overhead_s(self, now: float | None = None) -> float:
        """Seconds spent in the server itself so far: wall time less the engine's, a wait in progress included (so
        the figure never falls as a request goes on: a header taken mid-wait is at most the final figure)."""
        now = time.perf_counter() if now is None else now
        engine = self.engine_s + (now - self.waiting_since if self.waiting_since is not None else 0.0)
        return now - self.t0 - engine


class Timing:
    """ASGI middleware around the whole app (error handlers included): each HTTP request gets a `RequestClock`
    (`request.state.clock`), each response `x-pyrodash-overhead-ms` at its status line, and a traced request's spans
    are built once its last byte is out (`request.state.trace`, see `pyrodash.server.tracing`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        clock = RequestClock()
        state = scope.setdefault("state", {})
        state["clock"] = clock
        status = [500]

        async def timed(message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                overhead = b"%.3f" % (clock.overhead_s() * 1e3)
                message = {**message, "headers": [*message.get("headers", ()), (OVERHEAD_HEADER, overhead)]}
            await send(message)

        try:
            await self.app(scope, receive, timed)
        finally:
            trace = state.get("trace")
            if trace is not None:
                try:
                    trace.end(status[0], overhead_ms=clock.overhead_s() * 1e3)
                except Exception:  # noqa: BLE001 - a tracing failure never fails a request
                    log.exception("tracing: the spans of a request could not be built")
