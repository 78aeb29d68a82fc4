"""Batched generation for curation, the Stage 2 measurement and the Stage 3 reward, over any backend, with a progress
bar: `pyrodash.backends.retry.run_requests` (in-process models in left-padded batches, HTTP LLMs as concurrent calls
under a `FailurePolicy`) over the requests a slice at a time.

    gens = generate(backend, [GenRequest(messages=..., prefix=..., max_tokens=256), ...], desc="base SLM")

Each result is a `GenResult` (`pyrodash.backends.base`); a call that failed after its retries has finish_reason
"error" and its `error`.
"""

from __future__ import annotations

from collections.abc import Callable

from pyrodash.backends.base import Batches, GenRequest, GenResult
from pyrodash.backends.retry import run_requests


def progress(desc: str | None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(desc or ""), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=desc is None
    )


def generate(backend, reqs: list[GenRequest], desc: str | None = None, **options) -> list[GenResult]:
    """Results for `reqs`, in order: `run_requests(backend, reqs, **options)` (its `batch_size`, `concurrency`,
    `policy`, `on_result`; here batch_size 32 and concurrency 16 unless given) a slice at a time, so that the bar
    named `desc` moves (none without a `desc`). `on_result(i, gen)` is called as each result arrives (caches append
    there)."""
    options = {"batch_size": 32, "concurrency": 16, **options}
    on_result: Callable[[int, GenResult], None] | None = options.pop("on_result", None)
    size, concurrency = options["batch_size"], options["concurrency"]
    step = size if isinstance(backend, Batches) else max(size, concurrency) * 4
    out: list[GenResult] = []
    with progress(desc) as bar:
        task = bar.add_task("", total=len(reqs))
        for start in range(0, len(reqs), step):

            def arrived(j: int, g: GenResult, _start: int = start) -> None:
                bar.advance(task, 1)
                if on_result is not None:
                    on_result(_start + j, g)

            out.extend(run_requests(backend, reqs[start : start + step], on_result=arrived, **options))
    return out
