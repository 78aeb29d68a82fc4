"""The Collaborate Engine: Algorithm 1 of the paper (`alg:ce-decode`) as an async stream of typed events.

    engine = CollaborateEngine(slm, llm, get_prompts("qwen-math-v1"), Prices.from_yaml("paper"))
    async for ev in engine.stream("What is 17 * 23?"):   # or an EngineRequest; SLMDelta | Handoff | LLMDelta | Done
        ...
    done = engine.run("What is 17 * 23?")                  # blocking, returns events.Done

The SLM decodes under P_s with `<offload>` a stop token id (`offload_bias` on its logit); without it the SLM's
answer is returned, with it one LLM call continues Pack(O_s) ("continue", or "instruct" for an LLM that cannot
continue a prefix), put on the wire as the stop arrives. LLM failures: retries that continue what streamed, then an
SLM fallback or `EngineError`. Conversations, token budgets, handoff share, the batch driver: docs/architecture.md.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from pyrodash.backends.base import Backend, ContinuesPrefix, GenChunk, GenRequest, Renders, Tokenizes, Warms
from pyrodash.backends.retry import FailurePolicy
from pyrodash.chat import to_dicts
from pyrodash.cost import Prices
from pyrodash.engine import batch as batch_driver
from pyrodash.engine import conversation as conv
from pyrodash.engine import fitting
from pyrodash.engine import llm_call as llm_step
from pyrodash.engine.fitting import PromptSize
from pyrodash.engine.llm_call import EarlyCall
from pyrodash.engine.range_rule import ROUTED, RangeRule
from pyrodash.engine.relay import TOOLS, RelayConfig, RelayRun, calls_for, relay_for
from pyrodash.engine.requests import (
    BAN,
    TO_THE_END,
    EngineRequest,
    LLMCall,
    check_share,
    handoff_admitted,
    handoff_request,
    sampling_fields,
    slm_chat,
    total_budget,
)
from pyrodash.engine.tool_parser import split
from pyrodash.engine.turn import Turn
from pyrodash.events import Done, Event, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts, pack


class EngineError(RuntimeError):
    """The LLM failed after all retries and the policy is on_error="raise"; `.done` is the request's record."""

    def __init__(self, message: str, done: Done):
        super().__init__(message)
        self.done = done


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
        require_offload: bool = True,
        llm_max_tokens: int | None = None,
        range_rule: RangeRule | None = None,
        relay: RelayConfig | None = None,
    ):
        if handoff_style not in ("continue", "instruct"):
            raise ValueError(f"handoff_style={handoff_style!r}: use 'continue' or 'instruct'")
        if max_tokens <= 0:
            raise ValueError(f"max_tokens={max_tokens} must be positive")
        self.handoff_share = check_share(handoff_share)
        self.slm, self.llm, self.prompts, self.prices = slm, llm, prompts, prices
        self.handoff_style = handoff_style
        self.offload_bias = float(offload_bias)
        self.max_tokens = max_tokens  # each model's budget (the SLM's, and the LLM's unless llm_max_tokens is set)
        self.llm_max_tokens = llm_max_tokens
        if llm_max_tokens is not None and llm_max_tokens <= 0:
            raise ValueError(f"llm_max_tokens={llm_max_tokens} must be positive")
        self.failure = failure or FailurePolicy()
        self.range_rule = RangeRule.of(range_rule)  # past the SLM's range: the LLM alone (off: no limit set)
        self.relay = relay or RelayConfig()  # max_llm_calls 1: the single handoff
        ctx = context or conv.ContextLimits()
        self.context = conv.ContextLimits(  # None = the backend's own window when it knows one (in-process models)
            slm=ctx.slm if ctx.slm is not None else conv.backend_context(slm),
            llm=ctx.llm if ctx.llm is not None else conv.backend_context(llm),
        )
        self._bg: set[asyncio.Task] = set()
        try:
            self.offload_id = slm.token_id(OFFLOAD_TOKEN)
        except ValueError:  # a server that cannot tokenize: fine for a model answering alone
            if require_offload:
                raise
            self.offload_id = None
        if self.offload_id is None and require_offload:
            raise ValueError(
                f"the SLM {slm.name!r} has no {OFFLOAD_TOKEN} token in its vocabulary: "
                "run Stage 1 (pyrodash train stage1) or pyrodash.tokens.add_offload_token first"
            )

    # ---- messages and requests -----------------------------------------------------------------------------
    def messages(self, question: str | list[dict]) -> list[dict]:
        """A question as chat messages; a conversation's history is plain text (`<offload>` stripped)."""
        if isinstance(question, str):
            return self.prompts.plain_messages(question)
        question = to_dicts(question) if isinstance(question, list) else question
        if not isinstance(question, list) or not question or not all(isinstance(m, dict) for m in question):
            raise ValueError("a question is a str or a non-empty list of chat messages (`chat.Message`s or dicts)")
        return conv.clean_history(question)

    def _fit(self, side: str, req: GenRequest) -> int:
        """Trim `req.messages` (in place) to `side`'s context window; the messages dropped (`fitting.fit`)."""
        return fitting.fit(self.slm if side == "slm" else self.llm, getattr(self.context, side), req)

    @property
    def max_llm_calls(self) -> int:
        """LLM calls per answer unless a request says otherwise (1: the single handoff; more: relay)."""
        return self.relay.max_llm_calls

    @property
    def llm_style(self) -> str:
        """The handoff style in use: "instruct" when the LLM endpoint cannot continue a prefix."""
        prefix = not isinstance(self.llm, ContinuesPrefix) or self.llm.continues_prefix
        return self.handoff_style if prefix else "instruct"

    def llm_request(
        self, messages: list[dict], partial: str, max_tokens: int, sampling: dict, tools: list[dict] | None = None
    ) -> GenRequest:
        """The single handoff request (Line 6) in the style in use (`llm_style`), trimmed to the LLM's window."""
        return self.llm_request_fitted(messages, partial, max_tokens, sampling, tools)[0]

    def llm_request_fitted(
        self, messages: list[dict], partial: str, max_tokens: int, sampling: dict, tools: list[dict] | None = None
    ) -> tuple[GenRequest, int]:
        """(`llm_request`, the earlier messages dropped to fit it to the LLM's context window)."""
        req = handoff_request(self.prompts, self.llm_style, messages, partial, max_tokens, sampling, tools)
        return req, self._fit("llm", req)

    def _share(self, handoff_share: float | None) -> float:
        """A request's handoff share: the one asked for (checked), else the engine's."""
        return self.handoff_share if handoff_share is None else check_share(handoff_share)

    def slm_request(self, question: str | list[dict], **options) -> GenRequest:
        """The SLM's request (Lines 1-2): P_s + the query, `<offload>` as a stop id with `offload_bias` on it
        (banned when the request is outside `handoff_share`, default the engine's). `options`: see `EngineRequest`."""
        return self.turn(question, **options).req

    def turn(self, question: str | list[dict] | EngineRequest, mode: str = "collab", **options) -> Turn:
        """A request's `Turn`: its messages, the first model's request, budgets and knobs (`options`: the fields of
        `EngineRequest`). Mode "collab" runs Algorithm 1; "slm" / "llm" is one model answering alone (the
        conversation as given, no system prompt added, `<offload>` banned where the SLM has it, as the `slm` / `llm`
        baselines of `pyrodash eval` do)."""
        r = question if isinstance(question, EngineRequest) else EngineRequest.of(question, mode=mode, **options)
        messages = self.messages(r.question)
        total = total_budget(r.max_total_tokens)
        per_model = self.max_tokens if r.max_tokens is None else int(r.max_tokens)
        if per_model <= 0:
            raise ValueError(f"max_tokens={per_model} must be positive")
        first = per_model if total is None else min(per_model, total)
        bias = self.offload_bias if r.offload_bias is None else float(r.offload_bias)
        share = self._share(r.handoff_share)
        sampling = sampling_fields(r.temperature, r.top_p, r.seed, r.stop)
        mode, routed = self._route(r, messages)
        admitted = mode != "collab" or handoff_admitted(messages, share)
        schemas = r.tools.schemas() if r.tools is not None else None
        req, side = self._first_request(mode, messages, first, bias if admitted else BAN, sampling, schemas)
        dropped = self._fit(side, req)
        llm_max = per_model if self.llm_max_tokens is None or r.max_tokens is not None else self.llm_max_tokens
        if mode == "llm":
            req.max_tokens = llm_max if total is None else min(llm_max, total)
        return Turn(
            mode=mode,
            routed=routed,
            messages=messages,
            req=req,
            per_model=per_model,
            llm_max=llm_max,
            total=total,
            bias=bias,
            share=share,
            admitted=admitted,
            number=conv.turn_number(messages),
            sampling={k: getattr(req, k) for k in ("seed", "stop", "temperature", "top_p")},
            trimmed={"slm": 0, "llm": 0} | {side: dropped},
            gate=r.gate,
            tools=r.tools,
            formats={"slm": tool_format(self.slm), "llm": tool_format(self.llm)},
            relay_fallback=TOOLS if r.tools is not None and calls_for(self.relay, r) > 1 else None,
        )

    def route(self, r: EngineRequest) -> tuple[str, str | None]:
        """(the mode `r` will run in, why it was routed): what a budget reserves for before the request runs."""
        return self._route(r, self.messages(r.question))

    def _route(self, r: EngineRequest, messages: list[dict]) -> tuple[str, str | None]:
        """(the mode a request runs in, why it was routed): a collab request past the SLM's range (the request's
        `range_rule`, else the engine's) runs as the LLM alone, routed "range"; any other runs as asked."""
        rule = self.range_rule if r.range_rule is None else r.range_rule
        if r.mode != "collab" or not rule.active:
            return r.mode, None
        slm = self.slm

        def prompt_tokens() -> int | None:
            if not isinstance(slm, Tokenizes):
                return None
            return len(slm.prompt_ids(GenRequest(messages=slm_chat(self.prompts, messages))))

        return ("llm", ROUTED) if rule.reason(conv.turn_number(messages), prompt_tokens) else ("collab", None)

    def _first_request(
        self, mode: str, messages: list[dict], first: int, bias: float, sampling: dict, tools: list[dict] | None
    ) -> tuple[GenRequest, str]:
        """(the first model's request, its side): in mode "collab" the SLM's under P_s with `<offload>` a stop id
        carrying `bias` (an SLM without `<offload>`, require_offload=False, hands off only when told to: abatch);
        else the conversation as given to the model answering alone (`<offload>` banned for the SLM)."""
        if mode == "collab":
            oid = [] if self.offload_id is None else [self.offload_id]
            req = GenRequest(
                messages=slm_chat(self.prompts, messages),
                max_tokens=first,
                stop_token_ids=oid,
                logit_bias={self.offload_id: bias} if bias and oid else {},
                tools=tools,
                **sampling,
            )
            return req, "slm"
        ban = {self.offload_id: BAN} if mode == "slm" and self.offload_id is not None else {}
        return GenRequest(messages=list(messages), max_tokens=first, logit_bias=ban, tools=tools, **sampling), mode

    # ---- what the server asks before and after a request: its prompts' sizes, the LLM-only prompt ----------
    def prepare(self, request: EngineRequest) -> list[PromptSize]:
        """The request's prompts fitted to their models' windows and measured for a context-length check: each
        in-process model that counts its prompt gets a `PromptSize` (its first request, and the LLM's handoff
        request without a partial answer; a long conversation is trimmed first, so only what is still too long is
        over its window). The request itself stays as it is: when it runs, its prompts are fitted again, and the
        models render and tokenize each once (`pyrodash.engine.fitting`). Raises `ContextLengthError` when the current
        message alone is too long, ValueError when a prompt cannot be rendered for its model."""
        messages = self.messages(request.question)
        budget = request.max_tokens or 1
        if request.mode == "collab":
            first = self.turn(request)
        else:  # a model answering alone: the collaborative requests bound its prompt
            first = self.turn(messages, max_tokens=budget, range_rule=RangeRule(), tools=request.tools)
        routed = request.mode == "collab" and first.routed  # past the SLM's range: the SLM never reads this prompt
        total = min(budget, request.max_total_tokens or budget)  # the most one model decodes
        sizes = []
        for side, backend, build in (
            *([] if routed else [("SLM", self.slm, lambda: first.req)]),
            ("LLM", self.llm, lambda: self.llm_request_fitted(messages, "", budget, {}, first.req.tools)[0]),
        ):
            if fitting.counts_prompts(backend) and (window := backend.context_window()) is not None:
                sizes.append(PromptSize(side, fitting.prompt_size(backend, build(), total, window), window))
        return sizes

    def counts_prompts(self) -> bool:
        """Whether a model of this engine counts its prompts against a context window (in-process models): only
        then has `prepare` anything to measure."""
        return fitting.counts_prompts(self.slm) or fitting.counts_prompts(self.llm)

    def llm_only_prompt(self, request: EngineRequest, solo: Done | None = None) -> tuple[int, str] | None:
        """(input tokens of the LLM-only request: the conversation without P_s, whose tokenizer counted them), or
        None when no backend can count; from what this request measured already when it can:
        - an in-process LLM counts it (a prompt the context check or the handoff rendered or counted already, as
          when the prompt set has no LLM system prompt, comes from the model's memo);
        - an endpoint LLM, the SLM's tokenizer counts it: when this engine's in-process SLM answered alone (mode
          "slm", `solo` its Done) and nothing was dropped to fit, its billed input is that count. Else it is counted
          here (history dropped: the estimate counts the whole conversation)."""
        counts = isinstance(self.llm, Tokenizes)
        if solo is not None and not counts and self._billed_alone(solo):
            return solo.usage.slm_in, "slm"
        messages = self.messages(request.question)
        for side in ("llm", "slm"):
            backend = getattr(self, side)
            if isinstance(backend, Tokenizes):
                with contextlib.suppress(Exception):  # a tokenizer that cannot render this conversation
                    tools = request.tools.schemas() if request.tools is not None else None
                    return len(backend.prompt_ids(GenRequest(messages=messages, tools=tools))), side
        return None

    def _billed_alone(self, solo: Done) -> bool:
        """Whether `solo`'s billed SLM input is its own tokenizer's count of the conversation as given."""
        slm = self.slm
        return (
            solo.mode == "slm"
            and not solo.trimmed.get("slm")
            and not solo.usage_estimated
            and solo.usage.slm_in > 0
            and isinstance(slm, Tokenizes)
            and issubclass(type(slm), Renders)
        )

    # ---- the steps of Algorithm 1, shared by both drivers ---------------------------------------------------
    def slm_finished(self, t: Turn, text: str, final: GenChunk, seen: int) -> bool:
        """Lines 3-5 / 9-11: bill the SLM's decoding and say whether it ended in `<offload>` (a handoff; in a batch,
        an SLM result with finish_reason "offload" is a handoff told from outside: the oracle's)."""
        slm_out = t.bill_slm(final, seen)
        if t.tools is not None:  # the text as content, and the calls it wrote (a half call before `<offload>` goes)
            text, t.slm_calls, errors = split(text, t.formats["slm"], "slm")
            t.tool_errors += errors
        outcome = segment_outcome(t.mode != "slm" and self.offloaded(final), t.slm_calls)
        if outcome != "offload":  # Line 11: the SLM answered alone (text, or tool calls)
            t.slm_text, t.finish = text, "tool_calls" if outcome == "tool_calls" else final.finish_reason or "length"
            return False
        t.slm_text, t.handoff = text, max(slm_out - 1, 0)  # Pack(O_s) excludes <offload>
        return True

    def offloaded(self, final: GenChunk) -> bool:
        """Whether an SLM segment ended in `<offload>` (its last chunk `final`; in a batch, an SLM result with
        finish_reason "offload" is a handoff told from outside: the oracle's)."""
        return final.finish_reason == "offload" or (
            self.offload_id is not None and final.stop_token_id == self.offload_id
        )

    async def llm_call(
        self, t: Turn, early: EarlyCall | None = None, call: LLMCall = TO_THE_END
    ) -> AsyncIterator[LLMDelta]:
        """Lines 6-7: one LLM call of turn `t` under the failure policy (`pyrodash.engine.llm_call`; `call`: what
        it continues, its cap and stop, by default the single handoff's); sets `t.finish` unless every attempt
        failed."""
        async with contextlib.aclosing(llm_step.llm_call(self, t, early, call)) as it:
            async for ev in it:
                yield ev

    async def slm_fallback(self, t: Turn, written: str | None = None) -> AsyncIterator[SLMDelta]:
        """After a failed handoff: the SLM resumes from everything so far (`written`, else the SLM's and the LLM's
        text) with `<offload>` banned."""
        slm_out = t.usage.slm_out
        left = min(max(t.per_model - slm_out, 1), t.left("slm"))
        if left <= 0:  # nothing left of the joint budget to finish with
            t.finish = "length"
            return
        freq = GenRequest(
            messages=t.req.messages,
            prefix=t.slm_text + t.llm_text if written is None else written,
            max_tokens=left,
            logit_bias={self.offload_id: BAN},
            **t.sampling,
        )
        fin, seen, parser = GenChunk(), 0, llm_step.tool_parser_of(t, "slm")
        async with contextlib.aclosing(self.slm.stream(t.slm_request(freq))) as it:
            async for ch in it:
                seen += len(ch.token_ids) or bool(ch.text)
                if ch.text:
                    t.fb_text += ch.text
                    if shown := llm_step.shown(parser, ch.text):
                        yield SLMDelta(shown)
                if ch.finish_reason is not None:
                    fin = ch
        if parser is not None and (rest := parser.finish()):
            yield SLMDelta(rest)
        t.bill_slm(fin, seen)
        t.fallback, t.finish = True, fin.finish_reason or "length"

    def failure_outcome(self, t: Turn) -> EngineError | None:
        """After every LLM attempt failed: the turn ends in "error" when it has no fallback (on_error="raise", or
        the LLM answering alone) and this returns the error the stream raises (a batch records it instead); else
        None, and the SLM falls back (`slm_fallback`)."""
        if self.failure.on_error == "raise" or t.mode == "llm":  # alone, the LLM has no SLM to fall back on
            t.finish = "error"
            return EngineError(f"the LLM failed {len(t.errors)} time(s): {t.errors[-1]}", t.done(self.prices))
        return None

    # ---- driver 1: one request, events as they come (the server, `pyrodash generate`) ------------------------
    async def stream(self, question: str | list[dict] | EngineRequest, **options) -> AsyncIterator[Event]:
        """Algorithm 1 for one request as typed events: SLMDelta* [Handoff LLMDelta* SLMDelta*] Done. The request is
        an `EngineRequest` (the server's, maybe carrying the Turn `prepare` built for it), or a question with the
        request's fields as keyword arguments (mode, offload_bias, max_tokens, max_total_tokens, temperature, top_p,
        seed, stop, handoff_share)."""
        r = EngineRequest.of(question, **options)
        t = self.turn(r)
        if t.mode == "llm":  # the LLM alone (asked for, or past the SLM's range): one call, no SLM to fall back on
            async for ev in self.llm_call(t):
                yield ev
            if t.finish is None:  # every LLM attempt failed
                raise self.failure_outcome(t)
            yield t.done(self.prices)
            return
        relay = relay_for(self.relay, r)
        if t.mode == "collab" and relay.max_llm_calls > 1:
            t.cache_key = object()  # the answer's SLM requests share their KV (an in-process SLM's prefix cache)
        early: EarlyCall | None = None  # the single handoff's call, put on the wire as `<offload>` arrives
        try:
            async for ev in self.slm_segment(t, early_call=relay.max_llm_calls == 1):
                if isinstance(ev, EarlyCall):
                    early = ev
                else:
                    yield ev
        except BaseException:
            if early is not None:
                await early.cancel()
            raise
        if t.handoff is None:
            yield t.done(self.prices)
            return
        run = RelayRun(self, t, relay)  # the handoffs: LLM call, SLM resumes, ... (one call: Algorithm 1's)
        yield Handoff(slm_tokens=t.handoff, packed=run.trace)
        async for ev in run.resume(early):
            yield ev
        yield t.done(self.prices)

    async def slm_segment(self, t: Turn, early_call: bool = True) -> AsyncIterator[SLMDelta | EarlyCall]:
        """Lines 1-2, 9-10: the SLM decodes, `<offload>` a stop token id. With `early_call` (the stream driver) the
        handoff request is put on the wire the moment the stop arrives (an `EarlyCall`, yielded to the driver),
        before the SLM's stream is drained."""
        if early_call:
            self._warm_llm()
        text, final, seen, counted, early = "", GenChunk(), 0, True, False
        parser = llm_step.tool_parser_of(t, "slm")  # with tools: a call's markup is held back, never streamed as text
        async with contextlib.aclosing(self.slm.stream(t.slm_request())) as it:
            async for ch in it:
                seen += len(ch.token_ids) or bool(ch.text)
                counted = counted and (bool(ch.token_ids) or not ch.text)  # exact token counts as we go
                if ch.text:
                    text += ch.text
                    if shown := llm_step.shown(parser, ch.text):
                        yield SLMDelta(shown)
                if ch.finish_reason is not None:
                    final = ch
                    # the LLM's budget is known now unless a joint budget needs the SLM's exact count
                    # (`seen` counts every streamed id, the <offload> stop's own chunk included, as slm_out does)
                    b, total = t.llm_max, t.total
                    left_now = b if total is None else min(b, total - seen) if counted else 0
                    if (
                        early_call
                        and not early
                        and t.mode == "collab"
                        and ch.stop_token_id == self.offload_id
                        and left_now > 0
                        and not (parser is not None and parser.calls)  # complete calls end the segment: no handoff
                    ):
                        partial = pack(split(text, t.formats["slm"])[0] if parser is not None else text)
                        ereq, dropped = self.llm_request_fitted(t.messages, partial, left_now, t.sampling, t.req.tools)
                        t.trimmed["llm"] = max(t.trimmed["llm"], dropped)
                        early = True
                        if t.gate is None or await t.gate(ereq):  # (denied: `_attempt` asks again)
                            yield EarlyCall(self.llm, ereq)
                            await asyncio.sleep(0)  # let it put the request on the wire before the SLM is drained
        if parser is not None and (rest := parser.finish()):
            yield SLMDelta(rest)
        self.slm_finished(t, text, final, seen)

    # ---- driver 2: many requests, batched generation where the backend can (eval, training, calibration) ----
    async def abatch(self, questions: list, **kw) -> list[Done]:
        """Algorithm 1 for many requests, one `Done` each (in order), equal to what `stream` gives for each: the
        batch driver (`pyrodash.engine.batch.abatch`: mode, options, slm_results, batch_size, concurrency,
        stop_at_handoff, desc)."""
        return await batch_driver.abatch(self, questions, **kw)

    def batch(self, questions: list, **kw) -> list[Done]:
        """Blocking `abatch` (not from inside a running event loop: use `await engine.abatch(...)` there)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.abatch(questions, **kw))
        raise ValueError("CollaborateEngine.batch() was called inside an event loop; use `await engine.abatch(...)`")

    # ---- helpers -------------------------------------------------------------------------------------------
    def _warm_llm(self) -> None:
        """Keep a connection to an HTTP LLM open ahead of the handoff (`llm.warm()`, best effort, in background)."""
        if isinstance(self.llm, Warms):
            task = asyncio.ensure_future(self.llm.warm())
            self._bg.add(task)
            task.add_done_callback(self._bg.discard)

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


def segment_outcome(offloaded: bool, calls: list) -> str:
    """How an SLM segment ends, the one rule both drivers use: "tool_calls" when it wrote complete calls (an
    `<offload>` after them changes nothing: the calls are the answer), else "offload" (a handoff), else "answer"."""
    if calls:
        return "tool_calls"
    return "offload" if offloaded else "answer"


def tool_format(backend) -> str:
    """How a model writes tool calls (`pyrodash.engine.tool_parser.FAMILIES`): the backend's own word, else "hermes"."""
    return getattr(backend, "tool_format", None) or "hermes"
