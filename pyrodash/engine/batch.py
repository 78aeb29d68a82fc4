"""The batch driver of Algorithm 1 (`CollaborateEngine.abatch`): many requests, one `Done` each, equal to what the
stream driver gives for each. The SLM and the LLM decode in left-padded batches when the backend runs in process
(`generate_batch`), else as streams; relays run their handoff loops side by side. Eval, Stage 3 and calibration call
it through the engine.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TYPE_CHECKING

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from pyrodash.backends.base import Batches, BatchesStreams, GenChunk, GenRequest, GenResult, Tokenizes
from pyrodash.engine import llm_call as llm_step
from pyrodash.engine.relay import RelayRun, key_relay_turns, relay_runs
from pyrodash.engine.turn import Turn
from pyrodash.events import Done

if TYPE_CHECKING:
    from pyrodash.engine.core import CollaborateEngine


async def abatch(
    eng: CollaborateEngine,
    questions: list,
    mode: str = "collab",
    options: list[dict] | None = None,
    slm_results: list[GenResult | None] | None = None,
    batch_size: int = 16,
    concurrency: int = 8,
    stop_at_handoff: bool = False,
    desc: str | None = None,
) -> list[Done]:
    """Algorithm 1 for many requests, one `Done` each (in order), equal to what `stream` gives for each. The SLM
    and the LLM decode in left-padded batches when the backend runs in process (`generate_batch`), else as
    `concurrency` streams at a time. `options[i]`: request i's options (see `turn`). `slm_results[i]`: an SLM
    generation made elsewhere (Stage 3's rollouts, the oracle's cut answers) used instead of decoding; a stop
    at the `<offload>` id is a handoff. An LLM that fails every attempt never raises here: under
    on_error="raise" the request's Done has finish_reason "error" (what `EngineError.done` would carry).
    `stop_at_handoff`: only the SLM runs (Lines 1-5); a request that would hand off ends with finish_reason
    "handoff" and its `handoff` position, and no LLM call is made (calibrating a target LLM-call rate).
    `desc`: a rich progress bar with this label (SLM decodings, then LLM calls). Relays run `batch_size` at once
    when both models decode waiting streams together (`BatchesStreams`), else `concurrency` at once."""
    options = options if options is not None else [{}] * len(questions)
    if len(options) != len(questions) or (slm_results is not None and len(slm_results) != len(questions)):
        raise ValueError("abatch: options and slm_results need one entry per question")
    turns = [eng.turn(q, mode=mode, **o) for q, o in zip(questions, options)]
    sem = asyncio.Semaphore(max(1, concurrency))

    async def limited(aw: Awaitable):
        async with sem:
            return await aw

    if mode != "llm":
        if not stop_at_handoff:
            key_relay_turns(eng, turns, options)
        await _slm_batch(eng, turns, slm_results, batch_size, limited, desc)
    # the handoffs, as the stream driver runs them; an in-process LLM's single handoffs in batches (`_llm_batch`)
    batched = isinstance(eng.llm, Batches)
    runs = {} if stop_at_handoff else relay_runs(eng, turns, options, single=not batched)
    need = [t for i, t in enumerate(turns) if t.finish is None and i not in runs]  # batched handoffs, mode "llm"
    if stop_at_handoff:
        for t in need:
            t.finish = "handoff"
        return [t.done(eng.prices) for t in turns]
    await _handoffs(eng, need, batched, batch_size, limited, desc)
    together = isinstance(eng.slm, BatchesStreams) and isinstance(eng.llm, BatchesStreams)  # (a relay's calls)
    await _relays(list(runs.values()), batch_size if together else concurrency)
    return [t.done(eng.prices) for t in turns]


async def _handoffs(
    eng: CollaborateEngine, need: list[Turn], batched: bool, batch_size: int, limited, desc: str | None
) -> None:
    """The single handoffs of many turns (and mode "llm"): an in-process LLM's in batches (`_llm_batch`, shortest
    prompts first), else as streams (`limited`); a turn whose every attempt failed gets the failure policy."""
    if batched:
        calls = []  # (turn, its LLM request, the earlier messages dropped to fit it): the turns with tokens left
        for t in need:
            if t.left() <= 0:
                t.finish = "length"
            else:
                calls.append((t, *llm_step.llm_req(eng, t, t.left())))
        calls = _shortest_first(eng.llm, calls, lambda c: c[1])
        with _progress(desc, "LLM", len(need)) as step:
            step(len(need) - len(calls))
            for k in range(0, len(calls), batch_size):
                await _llm_batch(eng, calls[k : k + batch_size], batch_size)
                step(len(calls[k : k + batch_size]))
    else:
        await asyncio.gather(*(limited(_drain(eng.llm_call(t))) for t in need))
    for t in need:
        if t.finish is None:  # every LLM attempt failed
            eng.failure_outcome(t)  # no fallback: finish_reason "error" (never raised from a batch)
            if t.finish is None:
                await _drain(eng.slm_fallback(t))


async def _relays(runs: list[RelayRun], at_once: int) -> None:
    """The relays' handoff loops, `at_once` at a time. Their calls are streams: with both models in process the
    waiting ones are decoded as one batch (`pyrodash.backends.hf.stream_batch`)."""
    sem = asyncio.Semaphore(max(1, at_once))

    async def relay(run: RelayRun) -> None:
        async with sem:
            await _drain(run.resume())

    await asyncio.gather(*(relay(run) for run in runs))


async def _slm_batch(
    eng: CollaborateEngine, turns: list[Turn], slm_results: list | None, batch_size: int, limited, desc: str | None
) -> None:
    """Lines 1-5 for many turns: the SLM generations given (`slm_results`), the rest decoded in batches when the
    SLM runs in process, else as streams (`limited`: at most `concurrency` at a time)."""
    given = slm_results or [None] * len(turns)
    todo = [i for i, r in enumerate(given) if r is None and turns[i].mode != "llm"]  # routed: the LLM's
    if todo and isinstance(eng.slm, Batches):
        given = list(given)
        reqs_of = {i: turns[i].slm_request() for i in todo}
        todo = _shortest_first(eng.slm, todo, reqs_of.get)
        with _progress(desc, "SLM", len(todo)) as step:
            for k in range(0, len(todo), batch_size):
                part = todo[k : k + batch_size]
                reqs = [reqs_of[i] for i in part]
                for i, r in zip(part, eng.slm.generate_batch(reqs), strict=True):
                    given[i] = r
                step(len(part))
        todo = []
    await asyncio.gather(*(limited(_drain(eng.slm_segment(turns[i], early_call=False))) for i in todo))
    for t, r in zip(turns, given):
        if r is not None and t.mode != "llm":
            eng.slm_finished(t, r.text, _final_chunk(r), len(r.token_ids))


async def _llm_batch(eng: CollaborateEngine, calls: list[tuple[Turn, GenRequest, int]], batch_size: int) -> None:
    """The LLM calls of many turns ((turn, request, messages dropped to fit it), `_handoffs`) as one batched
    in-process generation (an in-process model does not fail the way an endpoint does: no retries)."""
    for t, _, dropped in calls:
        t.trimmed["llm"] = max(t.trimmed["llm"], dropped)
    results = eng.llm.generate_batch([req for _, req, _ in calls], batch_size=batch_size)
    for (t, _, _), r in zip(calls, results, strict=True):
        t.llm_text += r.text
        llm_step.attempt_done(eng, t, _final_chunk(r), r.text)  # billed and ended as a streamed call is


def _final_chunk(r: GenResult) -> GenChunk:
    """A finished generation's last chunk (what a stream ends with)."""
    return GenChunk(
        finish_reason=r.finish_reason,
        stop_token_id=r.stop_token_id,
        prompt_tokens=r.prompt_tokens,
        completion_tokens=r.completion_tokens,
        cached_tokens=getattr(r, "cached_tokens", None) or None,
        usage_estimated=getattr(r, "usage_estimated", False),
    )


def _shortest_first(backend, items: list, request_of) -> list:
    """`items` ordered by the prompt tokens of their requests (`request_of(item)`), shortest first, for a backend
    whose tokenizer is here (in process): the batches cut from the list then hold prompts of similar lengths, so a
    left-padded batch prefills little padding (a conversation's sixth turn no longer pads its first). Each answer is
    the one it gets in any batch; the caller keeps its own order for the results."""
    if not isinstance(backend, Tokenizes) or len(items) < 2:
        return list(items)
    sizes = [len(backend.prompt_ids(request_of(x))) for x in items]
    return [items[j] for j in sorted(range(len(items)), key=sizes.__getitem__)]


@contextlib.contextmanager
def _progress(desc: str | None, what: str, total: int):
    """A rich progress bar `desc (what)` over `total` items (a no-op without `desc`); yields `advance(n)`."""
    if desc is None or total == 0:
        yield lambda n: None
        return
    with Progress(TextColumn(f"{desc} ({what})"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()) as bar:
        task = bar.add_task("", total=total)
        yield lambda n: bar.advance(task, n)


async def _drain(gen: AsyncIterator) -> None:
    async with contextlib.aclosing(gen) as it:
        async for _ in it:
            pass
