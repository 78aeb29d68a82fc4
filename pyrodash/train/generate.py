"""Batched generation for curation, the Stage 2 measurement and the Stage 3 reward, over any backend:
in-process models (`HFBackend.generate_batch`, left-padded batches) or HTTP LLMs (concurrent requests with
asyncio.gather) under a `RetryPolicy` (`pyrodash.backends.retry`).

    gens = generate(backend, [GenRequest(messages=..., prefix=..., max_tokens=256), ...], desc="base SLM")

Each result is a `Gen`: decoded text (never the stop token), the generated ids (the stop token included), the
billed prompt/completion token counts and which stop token ended it (None when none did).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field

from pyrodash.backends.base import GenRequest
from pyrodash.backends.retry import RetryPolicy, call_with_retry


@dataclass
class Gen:
    text: str
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stop_token_id: int | None = None
    finish_reason: str = "stop"  # "stop" | "length" | "error" (the call failed after its retries: see `error`)
    error: str | None = None
    usage_estimated: bool = False
    cached_tokens: int = 0


def progress(desc: str | None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(
        TextColumn(desc or ""), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), disable=desc is None
    )


def generate(
    backend,
    reqs: list[GenRequest],
    batch_size: int = 32,
    concurrency: int = 16,
    desc: str | None = None,
    policy: RetryPolicy | None = None,
    on_result: Callable[[int, Gen], None] | None = None,
) -> list[Gen]:
    """Results for `reqs`, in order. Batched when the backend has `generate_batch`, else concurrent streams under
    `policy` (retries; a call that still fails is a `Gen` with finish_reason "error" and its `error`, never an
    exception). `on_result(i, gen)` is called as each result arrives (caches append there)."""
    out: list[Gen] = []
    step = batch_size if hasattr(backend, "generate_batch") else max(batch_size, concurrency) * 4
    with progress(desc) as bar:
        task = bar.add_task("", total=len(reqs))
        for start in range(0, len(reqs), step):
            chunk = reqs[start : start + step]
            if hasattr(backend, "generate_batch"):
                for j, r in enumerate(backend.generate_batch(chunk, batch_size=batch_size)):
                    out.append(
                        Gen(
                            text=r.text,
                            token_ids=list(r.token_ids),
                            prompt_tokens=r.prompt_tokens,
                            completion_tokens=r.completion_tokens,
                            stop_token_id=r.stop_token_id,
                            finish_reason=r.finish_reason,
                        )
                    )
                    if on_result is not None:
                        on_result(start + j, out[-1])
                bar.advance(task, len(chunk))
            else:

                def done(j: int, g: Gen, _start: int = start) -> None:
                    bar.advance(task, 1)
                    if on_result is not None:
                        on_result(_start + j, g)

                out.extend(asyncio.run(arun_requests(backend, chunk, concurrency, policy, done)))
    return out


async def _run_one(backend, req: GenRequest, sem: asyncio.Semaphore, policy: RetryPolicy) -> Gen:
    async with sem:
        got, error = await call_with_retry(backend, req, policy)
    if got is None:
        return Gen(text="", finish_reason="error", error=error)
    text, ids, last = got
    return Gen(
        text=text,
        token_ids=ids,
        prompt_tokens=int(last.prompt_tokens or 0),
        completion_tokens=int(last.completion_tokens or len(ids)),
        stop_token_id=last.stop_token_id,
        finish_reason=last.finish_reason or "stop",
        usage_estimated=last.usage_estimated,
    )


async def arun_requests(
    backend,
    reqs: list[GenRequest],
    concurrency: int = 16,
    policy: RetryPolicy | None = None,
    on_result: Callable[[int, Gen], None] | None = None,
) -> list[Gen]:
    """All requests at once (at most `concurrency` in flight), results in order; `on_result` as each arrives."""
    sem = asyncio.Semaphore(max(1, concurrency))
    policy = policy or RetryPolicy()

    async def one(i: int, r: GenRequest) -> Gen:
        g = await _run_one(backend, r, sem, policy)
        if on_result is not None:
            on_result(i, g)
        return g

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs))))
