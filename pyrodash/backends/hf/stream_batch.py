"""The in-process backend's streams decoded together: requests that arrive while the model is busy wait in a queue,
and the decode thread takes every waiting request at once and decodes them as one batch (`HFBackend._decode_streams`),
each stream still getting its own tokens as they come. A relay's answers (eval, Stage 3's rollouts, the relay oracle)
and a server's concurrent requests stream their calls one by one; alone, each decode step of a tiny model is per-op
overhead, so a batch of 8 costs little more than one (benchmarks/decode_loop.py).

    batcher = StreamBatcher(backend._decode_streams)
    batcher.submit(StreamJob(prompt_ids, req, put, cancel))     # put(item): the stream's queue; cancel: its client left

`max_batch` bounds a batch (1: one by one, first come first served). A request whose stream is cancelled before its
batch starts is dropped; one cancelled mid-decode leaves the batch before its next token. One decode thread at a time
per backend, started when a request arrives and none runs, ending when the queue is empty (`threads`: what
`HFBackend.aclose` joins).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from pyrodash.backends.base import GenRequest


@dataclass
class StreamJob:
    """One streamed request waiting for the decode thread."""

    prompt: list[int]
    req: GenRequest
    put: Callable[[object], None]  # hands an item (a chunk, the end, an error) to the stream's consumer
    cancel: threading.Event  # set when the stream's consumer went away


class StreamBatcher:
    """A queue of `StreamJob`s and the thread that decodes them in batches with `decode(jobs)`."""

    def __init__(self, decode: Callable[[list[StreamJob]], None], max_batch: int | None = None):
        self.decode = decode
        # at most this many requests a batch, the first waiting first; 1: one by one in the order they came
        self.max_batch = max_batch
        self._queue: list[StreamJob] = []
        self._lock = threading.Lock()
        self._worker: threading.Thread | None = None
        self.threads: set[threading.Thread] = set()  # decode threads that may still be running
        self.batches = 0  # batches decoded
        self.jobs = 0  # requests decoded in them

    def submit(self, job: StreamJob) -> None:
        with self._lock:
            self._queue.append(job)
            if self._worker is None:
                # not a daemon: a daemon thread killed inside torch aborts the process at exit (HFBackend.aclose joins)
                self._worker = threading.Thread(target=self._run, name="pyrodash-hf-decode")
                self.threads = {t for t in self.threads if t.is_alive()} | {self._worker}
                self._worker.start()

    def _take(self) -> list[StreamJob]:
        """Every waiting request whose consumer is still there; none left: the thread ends (under the lock, so a
        request submitted now starts a new one)."""
        with self._lock:
            waiting = [j for j in self._queue if not j.cancel.is_set()]
            n = len(waiting) if self.max_batch is None else self.max_batch
            jobs, self._queue = waiting[:n], waiting[n:]
            if not jobs:
                self._worker = None
            return jobs

    def _run(self) -> None:
        while jobs := self._take():
            self.batches, self.jobs = self.batches + 1, self.jobs + len(jobs)
            try:
                self.decode(jobs)
            except BaseException as e:  # noqa: BLE001 - handed to every consumer of the batch
                for j in jobs:
                    j.put(e)
