"""`FailurePolicy`, the one failure policy of an LLM call (the serve config's `failure:`, the engine's, batch work's),
and batch LLM work's stream collector (Cost_base, curation, Stage 3 rewards, evaluation baselines): retries with
jittered backoff for what may pass (network errors, timeouts, 408, 429, 5xx), none for client errors, a timeout on
each wait for the next chunk, a bound on concurrency, and a failed call returned as a value (a `GenResult` with
finish_reason "error") rather than raised, so one error never ends a run.

    gens = run_requests(backend, reqs, batch_size=16, concurrency=8)       # in order; batched where it can be
    gen = await call_with_retry(backend, req, FailurePolicy(retries=3, backoff_s=1.0, timeout_s=300))
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass

from pyrodash.backends.base import Batches, GenChunk, GenRequest, GenResult

ON_ERROR = ("fallback", "raise")


@dataclass(frozen=True)
class FailurePolicy:
    """How an LLM call may fail: the defaults are a served request's (the serve config's `failure:`); batch work
    runs under `BATCH`. A ValueError names the `failure.` key to change."""

    retries: int = 2  # further attempts after a failed call that may pass on retry (not after a client error)
    backoff_s: float = 0.2  # wait before retry k: backoff_s * 2**(k-1), +-25% jitter (`backoff_delay`)
    timeout_s: float = 60.0  # longest wait for the LLM's next chunk (the first one included)
    on_error: str = "fallback"  # then: "fallback" (the SLM finishes, <offload> banned) | "raise" (the request fails)

    def __post_init__(self) -> None:
        if self.on_error not in ON_ERROR:
            raise ValueError(f"failure.on_error={self.on_error!r}: choose one of {ON_ERROR}")
        for key, v in (("retries", self.retries), ("backoff_s", self.backoff_s), ("timeout_s", self.timeout_s)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ValueError(f"failure.{key}={v!r} must be a number")
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError("failure: retries and backoff_s must be >= 0 and timeout_s > 0")


BATCH = FailurePolicy(retries=3, backoff_s=1.0, timeout_s=600.0)  # batch work's: patient, many calls in flight


def backoff_delay(backoff_s: float, attempt: int) -> float:
    """Seconds to wait before attempt `attempt` (1 = the first retry): backoff_s * 2**(attempt-1), +-25% jitter so
    that calls failed together do not come back together."""
    return backoff_s * 2 ** (attempt - 1) * random.uniform(0.75, 1.25)


async def collect(backend, req: GenRequest, timeout_s: float | None = None) -> GenResult:
    """One call: the backend's stream for `req`, read to its end (and closed), as one result. Raises what it raises;
    a TimeoutError when no chunk came within `timeout_s` (None: no limit)."""
    parts: list[str] = []
    ids: list[int] = []
    tops: list[dict[str, float]] = []
    last = GenChunk()
    async with contextlib.aclosing(backend.stream(req)) as it:
        while (chunk := await asyncio.wait_for(anext(it, None), timeout_s)) is not None:
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


async def call_with_retry(backend, req: GenRequest, policy: FailurePolicy) -> GenResult:
    """`collect` under `policy`; when every attempt failed, a result with finish_reason "error" and the last error."""
    error = None
    for attempt in range(policy.retries + 1):
        if attempt:
            await asyncio.sleep(backoff_delay(policy.backoff_s, attempt))
        try:
            return await collect(backend, req, policy.timeout_s)
        except (asyncio.TimeoutError, TimeoutError):
            error = f"attempt {attempt + 1}: no chunk within {policy.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - every failure is judged by the policy
            error = f"attempt {attempt + 1}: {type(e).__name__}: {e}"
            if not getattr(e, "retryable", True):
                break
    return GenResult(text="", finish_reason="error", error=error)


async def arun_requests(
    backend,
    reqs: list[GenRequest],
    concurrency: int = 16,
    policy: FailurePolicy | None = None,
    on_result: Callable[[int, GenResult], None] | None = None,
) -> list[GenResult]:
    """All requests at once (at most `concurrency` in flight), results in order; `on_result(i, gen)` as each
    arrives."""
    sem = asyncio.Semaphore(max(1, concurrency))
    policy = policy or BATCH

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
    policy: FailurePolicy | None = None,
    on_result: Callable[[int, GenResult], None] | None = None,
) -> list[GenResult]:
    """Results for `reqs`, in order: in left-padded batches when the backend has `generate_batch` (in-process; `eos`
    told from its `eos_ids`), else `concurrency` streams at a time under `policy` (`arun_requests`)."""
    if not reqs:
        return []
    if not isinstance(backend, Batches):
        return asyncio.run(arun_requests(backend, reqs, concurrency, policy, on_result))
    eos_ids = backend.eos_ids
    out = backend.generate_batch(reqs, batch_size=batch_size)
    for i, r in enumerate(out):
        r.eos = (
            r.finish_reason == "stop" and r.stop_token_id is None and bool(r.token_ids) and r.token_ids[-1] in eos_ids
        )
        if on_result is not None:
            on_result(i, r)
    return out
