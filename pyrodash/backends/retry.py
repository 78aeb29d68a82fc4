"""The call policy of batch LLM work (Cost_base, curation, Stage 3 rewards, evaluation baselines) and its one stream
collector: retries with jittered backoff for what may pass (network errors, timeouts, 408, 429, 5xx), none for client
errors, a timeout on each whole call, a bound on concurrency, and a failed call returned as a value (a `GenResult`
with finish_reason "error") rather than raised, so one error never ends a run.

    gens = run_requests(backend, reqs, batch_size=16, concurrency=8)       # in order; batched where it can be
    gen = await call_with_retry(backend, req, RetryPolicy(retries=3, backoff_s=1.0, timeout_s=300))
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from pyrodash.backends.base import GenChunk, GenRequest, GenResult


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # further attempts after a failed call that may pass on retry
    backoff_s: float = 1.0  # wait before retry k: backoff_s * 2**(k-1), +-25% jitter
    timeout_s: float = 600.0  # longest wait for one whole call

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError("RetryPolicy: retries >= 0, backoff_s >= 0 and timeout_s > 0 are required")


def backoff_delay(backoff_s: float, attempt: int) -> float:
    """Seconds to wait before attempt `attempt` (1 = the first retry): backoff_s * 2**(attempt-1), +-25% jitter so
    that calls failed together do not come back together."""
    return backoff_s * 2 ** (attempt - 1) * random.uniform(0.75, 1.25)


async def collect(backend, req: GenRequest) -> GenResult:
    """One call: the backend's stream for `req`, read to its end (and closed), as one result. Raises what it raises."""
    parts: list[str] = []
    ids: list[int] = []
    tops: list[dict[str, float]] = []
    last = GenChunk()
    async with contextlib.aclosing(backend.stream(req)) as it:
        async for chunk in it:
            parts.append(chunk.text)
            ids.extend(chunk.token_ids)
            tops.extend(chunk.top_logprobs or [])
            if chunk.finish_reason is not None:
                last = chunk
    return GenResult(
        text="".join(parts),
        token_ids=ids,
        # a stream that never said why it ended is not known to be complete
        finish_reason=last.finish_reason or "length",
        stop_token_id=last.stop_token_id,
        prompt_tokens=int(last.prompt_tokens or 0),
        completion_tokens=int(last.completion_tokens or len(ids)),
        top_logprobs=tops or None,
        cached_tokens=int(last.cached_tokens or 0),
        usage_estimated=last.usage_estimated,
    )


async def call_with_retry(backend, req: GenRequest, policy: RetryPolicy) -> GenResult:
    """`collect` under `policy`; when every attempt failed, a result with finish_reason "error" and the last error."""
    error = None
    for attempt in range(policy.retries + 1):
        if attempt:
            await asyncio.sleep(backoff_delay(policy.backoff_s, attempt))
        try:
            return await asyncio.wait_for(collect(backend, req), policy.timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            error = f"attempt {attempt + 1}: no answer within {policy.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - every failure is judged by the policy
            error = f"attempt {attempt + 1}: {type(e).__name__}: {e}"
            if not getattr(e, "retryable", True):
                break
    return GenResult(text="", finish_reason="error", error=error)


async def arun_requests(
    backend,
    reqs: list[GenRequest],
    concurrency: int = 16,
    policy: RetryPolicy | None = None,
    on_result: Callable[[int, GenResult], None] | None = None,
) -> list[GenResult]:
    """All requests at once (at most `concurrency` in flight), results in order; `on_result(i, gen)` as each
    arrives."""
    sem = asyncio.Semaphore(max(1, concurrency))
    policy = policy or RetryPolicy()

    async def one(i: int, r: GenRequest) -> GenResult:
        async with sem:
            g = await call_with_retry(backend, r, policy)
        if on_result is not None:
            on_result(i, g)
        return g

    return list(await asyncio.gather(*(one(i, r) for i, r in enumerate(reqs))))


def run_requests(
    backend,
    reqs: list[GenRequest],
    batch_size: int = 16,
    concurrency: int = 8,
    policy: RetryPolicy | None = None,
    on_result: Callable[[int, GenResult], None] | None = None,
) -> list[GenResult]:
    """Results for `reqs`, in order: in left-padded batches when the backend has `generate_batch` (in-process; `eos`
    told from its `eos_ids`), else `concurrency` streams at a time under `policy` (`arun_requests`)."""
    if not reqs:
        return []
    if not hasattr(backend, "generate_batch"):
        return asyncio.run(arun_requests(backend, reqs, concurrency, policy, on_result))
    eos_ids = getattr(backend, "eos_ids", set())
    out = backend.generate_batch(reqs, batch_size=batch_size)
    for i, r in enumerate(out):
        r.eos = (
            r.finish_reason == "stop" and r.stop_token_id is None and bool(r.token_ids) and r.token_ids[-1] in eos_ids
        )
        if on_result is not None:
            on_result(i, r)
    return out
