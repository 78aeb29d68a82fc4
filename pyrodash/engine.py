"""The Collaborate Engine: Algorithm 1 of the paper (`alg:ce-decode`) as an async stream of typed events.

    engine = CollaborateEngine(slm, llm, get_prompts("qwen-math-v1"), Prices.from_yaml("paper"))
    async for ev in engine.stream("What is 17 * 23?"):   # SLMDelta | Handoff | LLMDelta | Done
        ...
    done = engine.run("What is 17 * 23?")                  # blocking, returns events.Done

Lines 1-2: the SLM decodes from (P_s, q), with `<offload>` registered as a stop token *id* (never matched in text)
and `offload_bias` added to its logit. Lines 9-11: without `<offload>` the SLM's answer is returned and the LLM is
never called. Lines 3-5: the `<offload>` stop ends SLM decoding; Pack(O_s) is the text before it. Lines 6-8: one LLM
call with (P_l, q, Pack(O_s)); the joint output is O_s || O_l.

Handoff styles: "continue" (default, as in the paper: the LLM continues the partial trace as its own assistant
message: messages = [P_l] + query, assistant prefix = Pack(O_s)); "instruct" (the user message is
`prompts.handoff_template` with the question and the partial solution as text).

An LLM endpoint that cannot continue a prefix (`llm.continues_prefix` False: continuation mode instruct, or an
Anthropic model without prefill) gets the "instruct" request whatever the configured style.

Handoff latency: the LLM request is sent as soon as the SLM's `<offload>` stop arrives (before its usage chunk and
the end of its stream), and `llm.warm()` keeps a pooled connection open from the start of each request.

Failure policy (LLM errors and timeouts): `retries` more attempts with exponential backoff (client errors, 4xx other
than 408/429, are not retried: they fail the same way again); a retry continues from
everything already streamed (O_s plus any LLM text that arrived), so no text is duplicated or lost. Then
`on_error="fallback"`: the SLM resumes from that text with `<offload>` banned and `Done.fallback` is True; or
`on_error="raise"`: the stream raises `EngineError`, whose `.done` is the final record (finish_reason "error",
usage of every attempt, the error messages). `Usage.llm_calls` counts the LLM attempts that reached the server.

Conversations (`pyrodash.conversation`): a list of messages is one user turn with its history; `<offload>` is
stripped from every earlier message, each model's request is trimmed to its context window (oldest earlier turns first,
`Done.trimmed`), and `Done.turn` / `Done.segments` say which turn this is and who wrote what in it. An LLM that is
several endpoints (`pyrodash.backends.mesh`) reports one entry per upstream call on its last chunk; each is billed
at its endpoint's prices (`Done.llm_endpoints`) and counted in `llm_calls`.

Handoff share (`handoff_share` < 1, an operating-point knob beside `offload_bias`): only that share of requests may
hand off, chosen by a fixed hash of the request's messages (`handoff_admitted`); the others run with `<offload>`
banned from the first token and the SLM answers alone (`Done.handoff_admitted` False). It mixes the trained policy
with the SLM alone per request, so a lower share costs less in proportion; a negative `offload_bias` instead delays
handoffs, and on a hard problem a delayed handoff often comes after a wrong step and pays the LLM for a lost answer.
Token budget: `max_tokens` bounds each model's decoding separately (the SLM, including a fallback resume; the LLM).
`max_total_tokens` (optional, what `pyrodash serve` makes of a request's `max_tokens`) bounds the joint answer:
SLM + LLM output tokens (the `<offload>` stop token included, as billed) never exceed it, each model decodes at most
what is left of it, and a request that runs out gets `finish_reason: "length"` (a handoff with nothing left for the
LLM makes no LLM call).
Usage is what the backends report (the tokenizer's counts in process, the server's `usage` over HTTP); only for a
server that reports none are counts estimated (`Done.usage_estimated`: SLM output as one token per streamed chunk;
an HTTP backend counts what its server did not report with a local tokenizer or estimates it).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pyrodash import conversation as conv
from pyrodash.backends.base import Backend, GenChunk, GenRequest
from pyrodash.cost import Prices, Usage, endpoint_bill
from pyrodash.events import Done, Event, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts, pack

BAN = float("-inf")


def check_share(share: float) -> float:
    """A handoff share as a float in [0, 1], or a ValueError naming the range."""
    if not 0.0 <= float(share) <= 1.0:
        raise ValueError(f"handoff_share={share} must be in [0, 1] (the share of requests that may hand off)")
    return float(share)


def handoff_admitted(messages: list[dict], share: float) -> bool:
    """Whether a request may hand off under a handoff share: a fixed hash of its non-system messages, uniform in
    [0, 1), is below `share`. Deterministic (a request and its retries agree), and a share s admits about s of any
    set of distinct requests."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    key = json.dumps([[m.get("role"), m.get("content")] for m in messages if m.get("role") != "system"])
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64 < share


@dataclass(frozen=True)
class FailurePolicy:
    retries: int = 2  # further attempts after the first failed LLM call
    backoff_s: float = 0.2  # wait before retry k: backoff_s * 2**(k-1)
    timeout_s: float = 60.0  # longest wait for the LLM's next chunk (the first one included)
    on_error: str = "fallback"  # "fallback" (the SLM finishes) | "raise" (EngineError)

    def __post_init__(self) -> None:
        if self.on_error not in ("fallback", "raise"):
            raise ValueError(f"FailurePolicy.on_error={self.on_error!r}: use 'fallback' or 'raise'")
        if self.retries < 0 or self.backoff_s < 0 or self.timeout_s <= 0:
            raise ValueError("FailurePolicy: retries >= 0, backoff_s >= 0 and timeout_s > 0 are required")


class _EarlyCall:
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


class EngineError(RuntimeError):
    """The LLM failed after all retries and the policy is on_error="raise"; `.done` is the request's record."""

    def __init__(self, message: str, done: Done):
        super().__init__(message)
        self.done = done


async def _next_within(it, timeout_s: float):
    """The next chunk of `it` (None at its end), or TimeoutError after `timeout_s`."""
    if hasattr(asyncio, "timeout"):  # Python >= 3.11: no extra task per chunk
        async with asyncio.timeout(timeout_s):
            return await anext(it, None)
    return await asyncio.wait_for(anext(it, None), timeout_s)


def _with_system(system: str, messages: list[dict]) -> list[dict]:
    """Put `system` first; a caller's own system message is kept after it in the same system turn."""
    if not system:
        return list(messages)
    if messages and messages[0].get("role") == "system":
        return [{"role": "system", "content": f"{system}\n\n{messages[0]['content']}"}] + list(messages[1:])
    return [{"role": "system", "content": system}] + list(messages)


def sampling_fields(temperature: float | None, top_p: float | None, seed: int | None,
                    stop: list[str] | None) -> dict:
    """The sampling fields of a `GenRequest` from a caller's options (unset temperature/top_p: the backend default)."""
    sampling: dict = {"seed": seed, "stop": list(stop or [])}
    if temperature is not None:
        sampling["temperature"] = float(temperature)
    if top_p is not None:
        sampling["top_p"] = float(top_p)
    return sampling


def handoff_request(
    prompts: Prompts, style: str, messages: list[dict], partial: str, max_tokens: int, sampling: dict | None = None
) -> GenRequest:
    """The LLM request of a handoff (Line 6): "continue" = [P_l] + messages with Pack(O_s) as the assistant prefix;
    "instruct" = [P_l] + one user message `handoff_template` with the last user question and the partial text."""
    sampling = sampling or {}
    if style == "continue":
        msgs = _with_system(prompts.completion_system, messages)
        return GenRequest(messages=msgs, prefix=partial, max_tokens=max_tokens, **sampling)
    if style != "instruct":
        raise ValueError(f"handoff style {style!r}: use 'continue' or 'instruct'")
    cur = conv.current_turn_index(messages)
    question = messages[cur]["content"] if cur >= 0 else ""
    user = prompts.handoff_template.format(question=question, partial=partial)
    history = list(messages[:cur]) if cur >= 0 else []  # earlier turns (and the caller's system text) stay
    msgs = _with_system(prompts.completion_system, history + [{"role": "user", "content": user}])
    return GenRequest(messages=msgs, max_tokens=max_tokens, **sampling)


def _total_budget(max_total_tokens: int | None) -> int | None:
    if max_total_tokens is None:
        return None
    if isinstance(max_total_tokens, bool) or not isinstance(max_total_tokens, int) or max_total_tokens <= 0:
        raise ValueError(f"max_total_tokens={max_total_tokens!r} must be a positive integer (or None: no joint limit)")
    return max_total_tokens


def _left(per_model: int, total: int | None, usage: Usage) -> int:
    """Tokens the next model may decode: its own limit, and what is left of the joint budget (output so far =
    SLM + LLM output tokens, as billed)."""
    if total is None:
        return per_model
    return min(per_model, total - usage.slm_out - usage.llm_out)


class CollaborateEngine:
    def __init__(
        self,
        slm: Backend,
        llm: Backend,
        prompts: Prompts,
        prices: Prices,
        handoff_style: str = "continue",
        offload_bias: float = 0.0,
        max_tokens: int = 512,
        failure: FailurePolicy | None = None,
        context: conv.ContextLimits | None = None,
        handoff_share: float = 1.0,
    ):
        if handoff_style not in ("continue", "instruct"):
            raise ValueError(f"handoff_style={handoff_style!r}: use 'continue' or 'instruct'")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens={max_tokens} must be positive")
        self.handoff_share = check_share(handoff_share)
        self.slm, self.llm, self.prompts, self.prices = slm, llm, prompts, prices
        self.handoff_style = handoff_style
        self.offload_bias = float(offload_bias)
        self.max_tokens = max_tokens
        self.failure = failure or FailurePolicy()
        ctx = context or conv.ContextLimits()
        self.context = conv.ContextLimits(  # None = the backend's own window when it knows one (in-process models)
            slm=ctx.slm if ctx.slm is not None else conv.backend_context(slm),
            llm=ctx.llm if ctx.llm is not None else conv.backend_context(llm),
        )
        self._bg: set[asyncio.Task] = set()
        oid = slm.token_id(OFFLOAD_TOKEN)
        if oid is None:
            raise ValueError(
                f"the SLM {getattr(slm, 'name', slm)!r} has no {OFFLOAD_TOKEN} token in its vocabulary: "
                "run Stage 1 (pyrodash train stage1) or pyrodash.tokens.add_offload_token first"
            )
        self.offload_id = oid

    # ---- messages ------------------------------------------------------------------------------------------
    def messages(self, question: str | list[dict]) -> list[dict]:
        """A question as chat messages; a conversation's history is plain text (`<offload>` stripped)."""
        if isinstance(question, str):
            return self.prompts.plain_messages(question)
        if not isinstance(question, list) or not question or not all(isinstance(m, dict) for m in question):
            raise ValueError("a question is a str or a non-empty list of chat messages ({'role', 'content'} dicts)")
        return conv.clean_history(question)

    def _fit(self, side: str, req: GenRequest) -> int:
        """Trim `req.messages` (in place) to `side`'s context window by the rule of pyrodash.conversation; returns
        the number of messages dropped."""
        backend, limit = (self.slm if side == "slm" else self.llm), getattr(self.context, side)
        if limit is None:
            return 0
        render = getattr(backend, "render", None)  # in-process: a prompt never has more tokens than UTF-8 bytes,
        if callable(render) and len(render(req).encode()) + req.max_tokens <= limit:  # so no tokenizing when it fits
            return 0
        count, _ = conv.token_counter(backend, req.prefix)
        req.messages, dropped = conv.fit_context(req.messages, count, limit, req.max_tokens)
        return dropped

    @property
    def llm_style(self) -> str:
        """The handoff style in use: "instruct" when the LLM endpoint cannot continue a prefix."""
        return self.handoff_style if getattr(self.llm, "continues_prefix", True) else "instruct"

    def llm_request(self, messages: list[dict], partial: str, max_tokens: int, sampling: dict) -> GenRequest:
        """The single handoff request (Line 6) in the style in use (`llm_style`), trimmed to the LLM's window."""
        return self._handoff(messages, partial, max_tokens, sampling)[0]

    def _handoff(self, messages: list[dict], partial: str, max_tokens: int, sampling: dict) -> tuple[GenRequest, int]:
        """(`llm_request`, earlier messages dropped to fit the LLM's context window)."""
        req = handoff_request(self.prompts, self.llm_style, messages, partial, max_tokens, sampling)
        return req, self._fit("llm", req)

    def _share(self, handoff_share: float | None) -> float:
        """A request's handoff share: the one asked for (checked), else the engine's."""
        return self.handoff_share if handoff_share is None else check_share(handoff_share)

    def slm_request(
        self,
        question: str | list[dict],
        offload_bias: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        handoff_share: float | None = None,
    ) -> GenRequest:
        """The SLM's request (Lines 1-2): P_s + the query, `<offload>` as a stop id with `offload_bias` on it
        (banned when the request is outside `handoff_share`, default the engine's)."""
        bias = self.offload_bias if offload_bias is None else float(offload_bias)
        share = self._share(handoff_share)
        budget = self.max_tokens if max_tokens is None else int(max_tokens)
        if budget <= 0:
            raise ValueError(f"max_tokens={budget} must be positive")
        sampling = sampling_fields(temperature, top_p, seed, stop)
        messages = self.messages(question)
        if not handoff_admitted(messages, share):
            bias = BAN
        slm_msgs = _with_system(self.prompts.offload_system, messages)
        req = GenRequest(
            messages=slm_msgs,
            max_tokens=budget,
            stop_token_ids=[self.offload_id],
            logit_bias={self.offload_id: bias} if bias else {},
            **sampling,
        )
        self._fit("slm", req)
        return req

    # ---- Algorithm 1 ---------------------------------------------------------------------------------------
    async def stream(
        self,
        question: str | list[dict],
        offload_bias: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        max_total_tokens: int | None = None,
        handoff_share: float | None = None,
    ) -> AsyncIterator[Event]:
        t0 = time.perf_counter()
        messages = self.messages(question)
        total = _total_budget(max_total_tokens)
        per_model = self.max_tokens if max_tokens is None else int(max_tokens)
        if total is not None:
            max_tokens = min(per_model, total)
        # Lines 1-2, 9-10: SLM decoding; <offload> is a stop token id
        req = self.slm_request(messages, offload_bias, max_tokens, temperature, top_p, seed, stop, handoff_share)
        # the bias asked for (a request outside handoff_share runs with <offload> banned: Done.handoff_admitted)
        bias = self.offload_bias if offload_bias is None else float(offload_bias)
        admitted = handoff_admitted(messages, self._share(handoff_share))
        budget, slm_msgs = per_model, req.messages
        sampling = {"seed": req.seed, "stop": req.stop, "temperature": req.temperature, "top_p": req.top_p}
        turn = {"turn": conv.turn_number(messages), "trimmed": {
            "slm": len(_with_system(self.prompts.offload_system, messages)) - len(slm_msgs), "llm": 0}}
        calls: list[dict] = []  # one entry per LLM call: endpoint, tokens, text, price
        usage = Usage()
        slm_text, llm_text = "", ""
        final, seen = GenChunk(), 0
        estimated, counted = False, True
        early = None  # the LLM's first attempt, started the moment the <offload> stop arrives
        self._warm_llm()
        try:
            async with contextlib.aclosing(self.slm.stream(req)) as it:
                async for ch in it:
                    seen += len(ch.token_ids) or bool(ch.text)
                    counted = counted and (bool(ch.token_ids) or not ch.text)  # exact token counts as we go
                    if ch.text:
                        slm_text += ch.text
                        yield SLMDelta(ch.text)
                    if ch.finish_reason is not None:
                        final = ch
                        # the LLM's budget is known now unless a joint budget needs the SLM's exact count
                        # (`seen` counts every streamed id, the <offload> stop's own chunk included, as slm_out does)
                        left_now = budget if total is None else min(budget, total - seen) if counted else 0
                        if early is None and ch.stop_token_id == self.offload_id and left_now > 0:
                            ereq, dropped = self._handoff(messages, pack(slm_text), left_now, sampling)
                            turn["trimmed"]["llm"] = max(turn["trimmed"]["llm"], dropped)
                            early = _EarlyCall(self.llm, ereq)
                            await asyncio.sleep(0)  # let it put the request on the wire before the SLM is drained
            slm_out = final.completion_tokens
            if slm_out is None:  # a server that reports no usage: one streamed chunk per token, plus the stop token
                slm_out = seen + (final.stop_token_id is not None)
                estimated = True
            estimated = estimated or final.usage_estimated
            usage += Usage(slm_in=final.prompt_tokens or 0, slm_out=slm_out)
            if final.stop_token_id != self.offload_id:  # Line 11: the SLM answered alone
                done = self._done(slm_text, "", usage, final.finish_reason or "length", None, bias, t0, turn, calls,
                                  admitted=admitted)
                done.usage_estimated = estimated
                yield done
                return
        except BaseException:
            if early is not None:
                await early.cancel()
            raise

        # Lines 3-5: <offload> detected (it ended SLM decoding); Pack(O_s) excludes it
        handoff = max(slm_out - 1, 0)
        packed = pack(slm_text)
        yield Handoff(slm_tokens=handoff, packed=packed)

        # Lines 6-7: one LLM call (retries continue from what already arrived)
        errors: list[str] = []
        llm_finish: str | None = None
        pol = self.failure
        for attempt in range(pol.retries + 1):
            left = _left(budget, total, usage)
            if left <= 0:  # the joint budget is spent (by the SLM, or by LLM text that arrived before a failure)
                if early is not None and attempt == 0:
                    await early.cancel()
                llm_finish = "length"
                break
            if attempt:
                await asyncio.sleep(pol.backoff_s * 2 ** (attempt - 1))
            if attempt == 0 and early is not None and early.req.max_tokens == left:
                lreq, stream = early.req, early.stream()
            else:
                if early is not None and attempt == 0:  # (only if a token count was off) not the request we need
                    await early.cancel()
                lreq, dropped = self._handoff(messages, packed + llm_text, left, sampling)
                turn["trimmed"]["llm"] = max(turn["trimmed"]["llm"], dropped)
                stream = self.llm.stream(lreq)
            got, attempt_text = GenChunk(), ""
            streamed = 0  # tokens received in this attempt (billed if the stream breaks before reporting usage)
            try:
                async with contextlib.aclosing(stream) as it:
                    while True:
                        ch = await _next_within(it, pol.timeout_s)  # the timeout never spans a yield
                        if ch is None:
                            break
                        streamed += len(ch.token_ids) or int(bool(ch.text))
                        if ch.text:
                            llm_text += ch.text
                            attempt_text += ch.text
                            yield LLMDelta(ch.text)
                        if ch.finish_reason is not None:
                            got = ch
            except Exception as e:  # noqa: BLE001 - every LLM failure (timeouts included) goes through the policy
                reached = getattr(e, "reached_server", True)
                rep = getattr(e, "usage", None)
                if isinstance(rep, GenChunk):
                    got = rep
                if got.completion_tokens is None and streamed:
                    estimated = True  # the stream broke before the server reported usage: chunks counted
                    got = GenChunk(
                        prompt_tokens=got.prompt_tokens or self._prompt_tokens(self.llm, lreq),
                        completion_tokens=streamed,
                        cached_tokens=got.cached_tokens,
                        endpoints=got.endpoints,
                    )
                msg = (
                    f"attempt {attempt + 1}: {type(e).__name__}: {e}"
                    if str(e)
                    else f"attempt {attempt + 1}: {type(e).__name__} (no chunk within {pol.timeout_s}s)"
                )
                errors.append(msg)
                calls += self._calls(got, attempt_text, int(reached), msg)
                usage += Usage(
                    llm_in=got.prompt_tokens or 0,
                    llm_out=got.completion_tokens or 0,
                    llm_cached_in=got.cached_tokens or 0,
                    llm_calls=sum(c["calls"] for c in got.endpoints) if got.endpoints else int(reached),
                )
                estimated = estimated or got.usage_estimated
                if not getattr(e, "retryable", True):  # a client error: the same request fails the same way
                    break
                continue
            calls += self._calls(got, attempt_text, 1, None)
            estimated = estimated or got.usage_estimated
            usage += Usage(
                llm_in=got.prompt_tokens or 0,
                llm_out=got.completion_tokens or 0,
                llm_cached_in=got.cached_tokens or 0,
                llm_calls=sum(c["calls"] for c in got.endpoints) if got.endpoints else 1,
            )
            llm_finish = got.finish_reason or "stop"
            break

        if llm_finish is not None:  # Line 8: O_s || O_l
            done = self._done(slm_text, llm_text, usage, llm_finish, handoff, bias, t0, turn, calls)
            done.errors, done.usage_estimated = errors, estimated
            yield done
            return

        if pol.on_error == "raise":
            done = self._done(slm_text, llm_text, usage, "error", handoff, bias, t0, turn, calls)
            done.errors, done.usage_estimated = errors, estimated
            raise EngineError(f"the LLM failed {len(errors)} time(s): {errors[-1]}", done)

        # fallback: the SLM resumes from everything so far, <offload> banned
        left = min(max(budget - slm_out, 1), _left(budget, total, usage))
        if left <= 0:  # nothing left of the joint budget to finish with
            done = self._done(slm_text, llm_text, usage, "length", handoff, bias, t0, turn, calls)
            done.errors, done.usage_estimated = errors, estimated
            yield done
            return
        freq = GenRequest(
            messages=slm_msgs,
            prefix=slm_text + llm_text,
            max_tokens=left,
            logit_bias={self.offload_id: BAN},
            **sampling,
        )
        fb_text, fin = "", GenChunk()
        async with contextlib.aclosing(self.slm.stream(freq)) as it:
            async for ch in it:
                if ch.text:
                    fb_text += ch.text
                    yield SLMDelta(ch.text)
                if ch.finish_reason is not None:
                    fin = ch
        usage += Usage(slm_in=fin.prompt_tokens or 0, slm_out=fin.completion_tokens or 0)
        done = self._done(slm_text + fb_text, llm_text, usage, fin.finish_reason or "length", handoff, bias, t0, turn,
                          calls)
        done.output = slm_text + llm_text + fb_text
        if fb_text:
            done.segments.append({"by": "slm", "text": fb_text, "fallback": True})
        done.fallback, done.errors = True, errors
        done.usage_estimated = estimated or fin.usage_estimated or fin.completion_tokens is None
        yield done

    def _warm_llm(self) -> None:
        """Keep a connection to an HTTP LLM open ahead of the handoff (`llm.warm()`, best effort, in background)."""
        warm = getattr(self.llm, "warm", None)
        if warm is not None:
            task = asyncio.ensure_future(warm())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

    @staticmethod
    def _prompt_tokens(backend: Backend, req: GenRequest) -> int | None:
        """Input tokens of a request that broke before the server reported usage, when the backend can count."""
        count = getattr(backend, "prompt_ids", None)
        return len(count(req)) if callable(count) else None

    def _calls(self, got: GenChunk, text: str, reached: int, error: str | None) -> list[dict]:
        """The per-endpoint entries of one LLM attempt: a composite backend's own (`GenChunk.endpoints`), else one
        entry for this backend, billed at the engine's price sheet."""
        if got.endpoints:
            return [dict(e) for e in got.endpoints]
        return [{"endpoint": getattr(self.llm, "name", "llm"), "calls": reached, "llm_in": got.prompt_tokens or 0,
                 "llm_out": got.completion_tokens or 0, "llm_cached_in": got.cached_tokens or 0, "text": text,
                 "prices": None, "error": error}]  # fmt: skip

    def _done(
        self, slm_text: str, llm_text: str, usage: Usage, finish: str, handoff: int | None, bias: float, t0: float,
        turn: dict | None = None, calls: list[dict] | None = None, admitted: bool = True,
    ) -> Done:  # fmt: skip
        bill = endpoint_bill(calls or [], self.prices)
        slm_cost = Usage(slm_in=usage.slm_in, slm_out=usage.slm_out).cost(self.prices)
        segments = [{"by": "slm", "text": slm_text}] if slm_text else []
        for c in calls or []:
            if not c.get("text"):
                continue
            if segments and segments[-1]["by"] == "llm" and segments[-1]["endpoint"] == c["endpoint"]:
                segments[-1]["text"] += c["text"]
            else:
                segments.append({"by": "llm", "endpoint": c["endpoint"], "text": c["text"]})
        turn = turn or {}
        return Done(
            output=slm_text + llm_text,
            slm_text=slm_text,
            llm_text=llm_text,
            usage=usage,
            cost_usd=slm_cost + sum(e["cost_usd"] for e in bill),
            finish_reason=finish,
            handoff=handoff,
            offload_bias=bias,
            handoff_admitted=admitted,
            latency_s=time.perf_counter() - t0,
            turn=turn.get("turn", 1),
            trimmed=dict(turn.get("trimmed", {"slm": 0, "llm": 0})),
            segments=segments,
            llm_endpoints=bill,
        )

    # ---- conveniences --------------------------------------------------------------------------------------
    async def arun(self, question: str | list[dict], **kw) -> Done:
        done = None
        async with contextlib.aclosing(self.stream(question, **kw)) as it:
            async for ev in it:
                if isinstance(ev, Done):
                    done = ev
        assert done is not None
        return done

    def run(self, question: str | list[dict], **kw) -> Done:
        """Blocking `arun` (not from inside a running event loop: use `await engine.arun(...)` there)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.arun(question, **kw))
        raise ValueError("CollaborateEngine.run() was called inside an event loop; use `await engine.arun(...)`")

    async def arun_many(self, questions: list, concurrency: int = 8, **kw) -> list[Done]:
        """`arun` over many questions, at most `concurrency` at a time; results in input order."""
        if concurrency <= 0:
            raise ValueError(f"concurrency={concurrency} must be positive")
        sem = asyncio.Semaphore(concurrency)

        async def one(q):
            async with sem:
                return await self.arun(q, **kw)

        return list(await asyncio.gather(*(one(q) for q in questions)))

    async def aclose(self) -> None:
        await self.slm.aclose()
        if self.llm is not self.slm:
            await self.llm.aclose()
