"""Batched generation for curation, the Stage 2 measurement and the Stage 3 reward, over any backend:
in-process models (`HFBackend.generate_batch`, left-padded batches) or HTTP LLMs (concurrent requests with
asyncio.gather).

    gens = generate(backend, [GenRequest(messages=..., prefix=..., max_tokens=256), ...], desc="base SLM")

Each result is a `Gen`: decoded text (never the stop token), the generated ids (the stop token included), the
billed prompt/completion token counts and which stop token ended it (None when none did).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from pyrodash.backends.base import GenRequest


@dataclass
class Gen:
    text: str
    token_ids: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    stop_token_id: int | None = None
    finish_reason: str = "stop"


def progress(desc: str | None):
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn(desc or ""), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    disable=desc is None)


def generate(backend, reqs: list[GenRequest], batch_size: int = 32, concurrency: int = 16,
             desc: str | None = None) -> list[Gen]:
    """Results for `reqs`, in order. Batched when the backend has `generate_batch`, else concurrent streams."""
    out: list[Gen] = []
    step = batch_size if hasattr(backend, "generate_batch") else max(batch_size, concurrency) * 4
    with progress(desc) as bar:
        task = bar.add_task("", total=len(reqs))
        for start in range(0, len(reqs), step):
            chunk = reqs[start:start + step]
            if hasattr(backend, "generate_batch"):
                for r in backend.generate_batch(chunk, batch_size=batch_size):
                    out.append(Gen(text=r.text, token_ids=list(r.token_ids), prompt_tokens=r.prompt_tokens,
                                   completion_tokens=r.completion_tokens, stop_token_id=r.stop_token_id,
                                   finish_reason=r.finish_reason))
            else:
                out.extend(asyncio.run(arun_requests(backend, chunk, concurrency)))
            bar.advance(task, len(chunk))
    return out


async def _run_one(backend, req: GenRequest, sem: asyncio.Semaphore) -> Gen:
    async with sem:
        parts: list[str] = []
        ids: list[int] = []
        last = None
        async for chunk in backend.stream(req):
            parts.append(chunk.text)
            ids.extend(chunk.token_ids)
            last = chunk
        if last is None:
            return Gen(text="", finish_reason="error")
        return Gen(text="".join(parts), token_ids=ids, prompt_tokens=int(last.prompt_tokens or 0),
                   completion_tokens=int(last.completion_tokens or len(ids)), stop_token_id=last.stop_token_id,
                   finish_reason=last.finish_reason or "stop")


async def arun_requests(backend, reqs: list[GenRequest], concurrency: int = 16) -> list[Gen]:
    """All requests at once (at most `concurrency` in flight), results in order."""
    sem = asyncio.Semaphore(max(1, concurrency))
    return list(await asyncio.gather(*(_run_one(backend, r, sem) for r in reqs)))
