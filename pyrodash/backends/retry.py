"""The call policy of batch LLM work (Cost_base, curation, Stage 3 rewards, evaluation baselines): retries with
backoff for what may pass (network errors, timeouts, 408, 429, 5xx), none for client errors, a bound on concurrency
(the caller's semaphore), and a failed call returned as a value rather than raised, so one error never ends a run.

    policy = RetryPolicy(retries=3, backoff_s=1.0, timeout_s=300)
    gen, error = await call_with_retry(backend, req, policy)     # error is None on success
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from pyrodash.backends.base import GenChunk, GenRequest


@dataclass(frozen=True)
class RetryPolicy:
    retries: int = 3  # further attempts after a failed call that may pass on retry
    backoff_s: float = 1.0  # wait before retry k: backoff_s * 2**(k-1), +-25% jitter
    timeout_s: float = 600.0  # longest wait for one whole call

    def __post_init__(self) -> None:
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError("RetryPolicy: retries >= 0, backoff_s >= 0 and timeout_s > 0 are required")


async def _once(backend, req: GenRequest) -> tuple[str, list[int], GenChunk]:
    parts: list[str] = []
    ids: list[int] = []
    last = GenChunk()
    async for chunk in backend.stream(req):
        parts.append(chunk.text)
        ids.extend(chunk.token_ids)
        if chunk.finish_reason is not None:
            last = chunk
    return "".join(parts), ids, last


async def call_with_retry(
    backend, req: GenRequest, policy: RetryPolicy
) -> tuple[tuple[str, list[int], GenChunk] | None, str | None]:
    """((text, token ids, last chunk), None) on success; (None, "the last error") when every attempt failed."""
    error = None
    for attempt in range(policy.retries + 1):
        if attempt:
            await asyncio.sleep(policy.backoff_s * 2 ** (attempt - 1) * random.uniform(0.75, 1.25))
        try:
            return await asyncio.wait_for(_once(backend, req), policy.timeout_s), None
        except (asyncio.TimeoutError, TimeoutError):
            error = f"attempt {attempt + 1}: no answer within {policy.timeout_s}s"
        except Exception as e:  # noqa: BLE001 - every failure is judged by the policy
            error = f"attempt {attempt + 1}: {type(e).__name__}: {e}"
            if not getattr(e, "retryable", True):
                break
    return None, error
