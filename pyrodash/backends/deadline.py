"""A deadline for each of a series of waits (the next chunk of a stream, the next bytes of a response), on one timer.

An `asyncio.timeout` or `call_later` per wait makes and cancels a timer per streamed token. Here a wait only notes
its deadline (`start`) and clears it when over (`stop`); the one timer is moved on lazily: when it fires for a wait
that is over, it re-arms for the pending one's deadline, or waits for the next `start`. `on_expire()` runs (on the
event loop) only when the pending wait has passed its own deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


class LazyDeadline:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_expire: Callable[[], None]) -> None:
        self.loop, self.on_expire = loop, on_expire
        self.deadline: float | None = None  # the pending wait's deadline (loop time); None between waits
        self.armed = 0.0  # the deadline the timer is set for
        self.handle: asyncio.TimerHandle | None = None

    def start(self, timeout_s: float) -> None:
        """A wait begins: it may last `timeout_s`."""
        self.deadline = self.loop.time() + timeout_s
        if self.handle is None or self.deadline < self.armed:
            self.close()
            self.armed, self.handle = self.deadline, self.loop.call_at(self.deadline, self._fire)

    def stop(self) -> None:
        """The wait is over (answered, failed or cancelled)."""
        self.deadline = None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None

    def _fire(self) -> None:
        self.handle = None
        if self.deadline is None:  # between two waits: the next one arms the timer
            return
        if self.deadline > self.armed:  # armed for an earlier wait, over since
            self.armed, self.handle = self.deadline, self.loop.call_at(self.deadline, self._fire)
        else:
            self.on_expire()
