"""One LLM call of a turn under the failure policy (Lines 6-7 of Algorithm 1): the request it continues, its
attempts (retries continue from what already arrived, so no text is duplicated or lost), their billing, and the
early call the stream driver puts on the wire as `<offload>` arrives. The engine's steps: `CollaborateEngine.llm_call`
and the batch driver call these, passing the engine (`eng`) whose models, prices and policy they use.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from pyrodash.backends.base import Backend, GenChunk, GenRequest, Tokenizes, estimate_tokens
from pyrodash.backends.deadline import LazyDeadline
from pyrodash.backends.retry import backoff_delay
from pyrodash.chat import without_open_call
from pyrodash.engine.requests import TO_THE_END, LLMCall
from pyrodash.engine.tool_parser import ToolCallParser
from pyrodash.engine.turn import Turn
from pyrodash.events import LLMDelta, LLMFailure
from pyrodash.prompts import pack

if TYPE_CHECKING:
    from pyrodash.engine.core import CollaborateEngine

_UNCANCEL = hasattr(asyncio, "timeout")  # Python >= 3.11 (Task.uncancel, cancelling)


class EarlyCall:
    """The first LLM attempt, started as a task the moment the SLM's `<offload>` stop arrives, so the request is on
    the wire while the SLM stream is still being drained (its usage chunk, [DONE]). `stream()` replays the first
    chunk (or its exception) and then continues the same backend stream."""

    def __init__(self, llm: Backend, req: GenRequest):
        self.req = req
        self._it = llm.stream(req)
        self._first = asyncio.ensure_future(anext(self._it, None))

    async def stream(self):
        try:
            ch = await self._first
            while ch is not None:
                yield ch
                ch = await anext(self._it, None)
        finally:
            await self._it.aclose()

    async def cancel(self) -> None:
        self._first.cancel()
        with contextlib.suppress(BaseException):
            await self._first
        with contextlib.suppress(BaseException):
            await self._it.aclose()


class Within:
    """`await within(it)`: the next chunk of `it` (None at its end), or TimeoutError when none came `timeout_s` after
    it was asked for; the caller's time between two asks (its yields) never counts. One timer per stream
    (`LazyDeadline`), not an `asyncio.timeout` per chunk. Asks come from the task that made it; `close()` when
    done."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.task = asyncio.current_task()
        self.deadline = LazyDeadline(asyncio.get_running_loop(), self._expire)
        self.cancelling = -1  # once expired: the task's cancel requests before this one (as asyncio.timeout)

    async def __call__(self, it):
        if not _UNCANCEL:  # Python 3.10: a cancel cannot be told apart from the timeout's own
            return await asyncio.wait_for(anext(it, None), self.timeout_s)
        self.deadline.start(self.timeout_s)
        try:
            return await anext(it, None)
        except asyncio.CancelledError as e:
            if self.cancelling >= 0 and self.task.uncancel() <= self.cancelling:
                raise TimeoutError from e
            raise
        finally:
            self.deadline.stop()

    def _expire(self) -> None:
        self.cancelling = self.task.cancelling()
        self.task.cancel()

    def close(self) -> None:
        self.deadline.close()


async def llm_call(
    eng: CollaborateEngine, t: Turn, early: EarlyCall | None = None, call: LLMCall = TO_THE_END
) -> AsyncIterator[LLMDelta]:
    """Lines 6-7: one LLM call (`attempts`); with tools, its text as content only (a call's markup held back:
    the calls are read into the answer's blocks when its `Done` is built)."""
    parser = tool_parser_of(t, "llm")
    async with contextlib.aclosing(attempts(eng, t, early, call)) as it:
        async for ev in it:
            if piece := shown(parser, ev.text):
                yield LLMDelta(piece)
    if parser is not None and (rest := parser.finish()):
        yield LLMDelta(rest)


async def attempts(
    eng: CollaborateEngine, t: Turn, early: EarlyCall | None = None, call: LLMCall = TO_THE_END
) -> AsyncIterator[LLMDelta]:
    """One LLM call (`call`: what it continues, its cap and stop; the default is the single handoff's,
    to the end of the answer), under the failure policy (retries continue from what already arrived, so no text
    is duplicated or lost). Sets `t.finish` on success; leaves it None when every attempt failed."""
    pol, mark = eng.failure, len(t.llm_text)  # t.llm_text[mark:]: this call's text
    for attempt in range(pol.retries + 1):
        left = t.left() if call.cap is None else min(call.cap, t.left())
        if left <= 0:  # the joint budget is spent (by the SLM, or by LLM text that arrived before a failure)
            if early is not None and attempt == 0:
                await early.cancel()
            t.finish = "length"
            return
        if attempt:
            await asyncio.sleep(backoff_delay(pol.backoff_s, attempt))  # the backends' own: jittered
        lreq, stream = await _attempt(eng, t, left, early if attempt == 0 else None, call, t.llm_text[mark:])
        if stream is None:  # the budget's gate: no reservation covers this call, so it is not made
            why = "not made: its worst case does not fit the budget's hard cap"
            t.failures.append(LLMFailure(attempt + 1, "not_made", why, reached_server=False))
            return
        got, attempt_text = GenChunk(), ""
        streamed = 0  # tokens received in this attempt (billed if the stream breaks before reporting usage)
        within = Within(pol.timeout_s)  # the timeout never spans a yield
        try:
            async with contextlib.aclosing(stream) as it:
                while True:
                    ch = await within(it)
                    if ch is None:
                        break
                    streamed += len(ch.token_ids) or int(bool(ch.text))
                    if ch.text:
                        t.llm_text += ch.text
                        attempt_text += ch.text
                        yield LLMDelta(ch.text)
                    if ch.finish_reason is not None:
                        got = ch
        except Exception as e:  # noqa: BLE001 - every LLM failure (timeouts included) goes through the policy
            if not _attempt_failed(eng, t, e, got, streamed, attempt_text, lreq, attempt):
                return
            continue
        finally:
            within.close()
        attempt_done(eng, t, got, attempt_text)
        return


async def _attempt(
    eng: CollaborateEngine, t: Turn, left: int, early: EarlyCall | None, call: LLMCall, so_far: str
) -> tuple[GenRequest, AsyncIterator[GenChunk] | None]:
    """(request, stream) of one LLM attempt: the early call when it asked for what is left, else a new one;
    stream None when the request's gate (`EngineRequest.gate`) did not let the call be made."""
    if early is not None and early.req.max_tokens == left:
        return early.req, early.stream()
    if early is not None:  # (only if a token count was off) not the request we need
        await early.cancel()
    lreq, dropped = llm_req(eng, t, left, call, so_far)
    t.trimmed["llm"] = max(t.trimmed["llm"], dropped)
    if t.gate is not None and not await t.gate(lreq):
        return lreq, None
    return lreq, eng.llm.stream(lreq)


def _attempt_failed(
    eng: CollaborateEngine,
    t: Turn,
    e: Exception,
    got: GenChunk,
    streamed: int,
    text: str,
    lreq: GenRequest,
    attempt: int,
) -> bool:
    """Bill and record a failed LLM attempt; whether another may follow (not after a client error, nor once the
    LLM answering alone wrote text it cannot continue)."""
    reached = int(getattr(e, "reached_server", True))
    rep = getattr(e, "usage", None)
    if isinstance(rep, GenChunk):
        got = rep
    # a call the server took (not refused with a status) bills its prompt whether or not usage came back: charged at
    # the model's own count, else the conservative estimate, with the tokens that streamed (both marked estimates)
    taken = reached and getattr(e, "status", None) is None
    if (got.completion_tokens is None and streamed) or (taken and got.prompt_tokens is None and not got.endpoints):
        t.estimated = True
        got = GenChunk(
            prompt_tokens=got.prompt_tokens or prompt_bound(eng.llm, lreq),
            completion_tokens=streamed if got.completion_tokens is None else got.completion_tokens,
            cached_tokens=got.cached_tokens,
            endpoints=got.endpoints,
        )
    t.failures.append(failure_of(e, attempt + 1, eng.failure.timeout_s))
    t.bill_llm(got, calls_of(eng, got, text, reached, str(t.failures[-1])), reached)
    if not getattr(e, "retryable", True):  # a client error: the same request fails the same way
        return False
    return not (t.mode == "llm" and t.llm_text)  # alone, the LLM cannot continue its own text: no retry


def attempt_done(eng: CollaborateEngine, t: Turn, got: GenChunk, text: str) -> None:
    """Bill a finished LLM attempt and end the turn."""
    t.bill_llm(got, calls_of(eng, got, text, 1, None), 1)
    t.finish = got.finish_reason or "stop"


def calls_of(eng: CollaborateEngine, got: GenChunk, text: str, reached: int, error: str | None) -> list[dict]:
    """The per-endpoint entries of one LLM attempt: a composite backend's own (`GenChunk.endpoints`), else one
    entry for this backend, billed at the engine's price sheet."""
    if got.endpoints:
        return [dict(e) for e in got.endpoints]
    return [
        {
            "endpoint": eng.llm.name,
            "calls": reached,
            "llm_in": got.prompt_tokens or 0,
            "llm_out": got.completion_tokens or 0,
            "llm_cached_in": got.cached_tokens or 0,
            "cache_reported": got.cached_tokens is not None,  # the provider gave a cached figure (0 included)
            "client_stop": got.client_stop,  # closed by the client at a stop string the server wrote past
            "text": text,
            "prices": None,
            "error": error,
            "tool_calls": list(got.tool_calls or ()),  # structured calls a chat endpoint returned
        }
    ]


def llm_req(
    eng: CollaborateEngine, t: Turn, left: int, call: LLMCall = TO_THE_END, so_far: str | None = None
) -> tuple[GenRequest, int]:
    """The LLM's request for what is left of the call and the earlier messages dropped to fit it: the handoff
    request continuing what was written (`call.written`, else Pack of the SLM's text) and the call's text so far
    (`so_far`, else the turn's LLM text: a retry continues what arrived), or in mode "llm" the question itself."""
    sampling = t.sampling if call.stop is None else {**t.sampling, "stop": list(call.stop)}
    if t.mode == "llm":  # the fitted request again, with what is left to decode
        return GenRequest(messages=t.req.messages, max_tokens=left, tools=t.req.tools, **sampling), 0
    written = pack(t.slm_text) if call.written is None else call.written
    so_far = t.llm_text if so_far is None else so_far
    if t.tools is not None:  # a retry writes a half-written call again from its start
        so_far = without_open_call(so_far)
    return eng.llm_request_fitted(t.messages, written + so_far, left, sampling, t.req.tools)


def prompt_bound(backend: Backend, req: GenRequest) -> int:
    """Input tokens of a request that broke before the server reported usage: the backend's own count where it can
    count, else `estimate_tokens` (characters / 3: above what a tokenizer gives for text)."""
    if isinstance(backend, Tokenizes):
        return len(backend.prompt_ids(req))
    return estimate_tokens(req.messages, req.prefix, req.tools)


def failure_of(e: Exception, attempt: int, timeout_s: float) -> LLMFailure:
    """A failed LLM attempt as the record keeps it: a backend's typed error, else the engine's own timeout (no chunk
    within `timeout_s`), else whatever was raised ("error")."""
    if not str(e):
        return LLMFailure(attempt, "timeout", f"{type(e).__name__} (no chunk within {timeout_s}s)")
    kind = getattr(e, "kind", None) or ("timeout" if isinstance(e, TimeoutError) else "error")
    status = getattr(e, "status", None)
    return LLMFailure(attempt, kind, f"{type(e).__name__}: {e}", status, bool(getattr(e, "reached_server", True)))


def tool_parser_of(t: Turn, side: str) -> ToolCallParser | None:
    """A stream's tool-call parser for `side`'s text when the turn offers tools, else None."""
    return ToolCallParser(t.formats[side], side) if t.tools is not None else None


def shown(parser: ToolCallParser | None, text: str) -> str:
    """What of a streamed piece a client sees: all of it without tools, else the parser's content."""
    return text if parser is None else parser.feed(text)
