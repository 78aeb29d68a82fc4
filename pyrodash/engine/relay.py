"""The engine's handoff loop (`RelayRun`), from an answer's first `<offload>` on: LLM call, SLM resumes, LLM call ...
With `max_llm_calls` 1 it is Algorithm 1's single handoff (one call writes the rest of the answer; the stream driver
puts it on the wire as `<offload>` arrives). Above 1, relay: the LLM continues the packed trace only up to the end of
the step (`step_sep` as the API's stop sequence, at most `step_max_tokens`), its text is appended and the SLM resumes
on its own context (its text and the `<offload>` tokens it emitted, with the LLM's steps: one token sequence, as a tool
call stays in a model's context); the last allowed call writes the rest. The LLM reads the packed trace (no
`<offload>`). The loop drives the engine's public steps (`llm_call` with a typed `LLMCall`, `failure_outcome`,
`slm_fallback`) and keeps the answer's segments and handoffs on its `Turn`, whose `done` builds the `Done`.

    engine = CollaborateEngine(slm, llm, prompts, prices, relay=RelayConfig(max_llm_calls=4))
    done = engine.run("...")          # or max_llm_calls=4 per request; 1 (the default) is the single handoff

An LLM call that does not end at a step end (an in-process LLM ignored the stop sequence, or the cap was reached)
turns the rest of the answer into a single handoff, said in `Done.relay_fallback`; an HTTP endpoint that writes past
the separator is cut there by its client (`GenChunk.client_stop`). Per request (a serve operating point's `relay:`):
`step_sep` / `step_max_tokens` on the `EngineRequest` (`relay_for`). When and why: docs/relay.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pyrodash.backends import literal
from pyrodash.backends.base import GenChunk
from pyrodash.cost import Usage
from pyrodash.engine.requests import EngineRequest, LLMCall
from pyrodash.engine.turn import Turn, llm_segments
from pyrodash.events import Event, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN, pack

# why a relay answer became a single handoff (`Done.relay_fallback`)
STOP_IGNORED = "stop_ignored"  # the LLM wrote past the step separator: the endpoint does not honour `stop`
STEP_CAP = "step_cap"  # the LLM reached step_max_tokens before a step end
EMPTY_STEP = "empty_step"  # the LLM stopped at once, before any text
TOOLS = "tools"  # the request offers tools: a single handoff (a step's stop could cut a tool call in two)


@dataclass(frozen=True)
class RelayConfig:
    max_llm_calls: int = 1  # LLM calls per answer; 1 = the single handoff (Algorithm 1 as it is)
    step_sep: str = "\n\n"  # the end of a step: the LLM's stop sequence, put back after its step
    step_max_tokens: int = 64  # the cap of one relay step (not of the last call, which writes the rest)

    def __post_init__(self) -> None:
        check_calls(self.max_llm_calls)
        if not self.step_sep:
            raise ValueError("relay step_sep must be a non-empty string (the end of a step)")
        if self.step_max_tokens <= 0:
            raise ValueError(f"relay step_max_tokens={self.step_max_tokens} must be positive")


def check_calls(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"max_llm_calls={n!r} must be a positive integer (1: a single handoff)")
    return n


def calls_for(config: RelayConfig, request: EngineRequest | dict) -> int:
    """The LLM calls a request may make: its own `max_llm_calls`, else the engine's."""
    n = request.get("max_llm_calls") if isinstance(request, dict) else request.max_llm_calls
    return config.max_llm_calls if n is None else check_calls(n)


def relay_for(config: RelayConfig, request: EngineRequest | dict) -> RelayConfig:
    """The relay a request runs: its own `max_llm_calls`, `step_sep` and `step_max_tokens` where set (a serve
    operating point's `relay:`), else the engine's (a ValueError names a bad one)."""
    own = request if isinstance(request, dict) else vars(request)
    sep, cap = own.get("step_sep"), own.get("step_max_tokens")
    return dataclasses.replace(
        config,
        max_llm_calls=1 if own.get("tools") is not None else calls_for(config, request),
        step_sep=config.step_sep if sep is None else sep,
        step_max_tokens=config.step_max_tokens if cap is None else cap,
    )


class RelayRun:
    """One answer's handoffs from its first on (`t`: the turn after the SLM's first segment); `cfg.max_llm_calls` 1:
    the single handoff."""

    def __init__(self, engine, t: Turn, cfg: RelayConfig, raise_errors: bool = True):
        self.e, self.t, self.n, self.cfg = engine, t, cfg.max_llm_calls, cfg
        self.raise_errors = raise_errors  # the stream driver raises EngineError; a batch records finish "error"
        # the answer's segments and handoffs, kept on the Turn (its `done` builds the relay's Done from them)
        self.segments = t.segments = [{"by": "slm", "text": t.slm_text}] if t.slm_text else []
        self.handoffs = [t.handoff] if t.handoff is not None else []
        t.handoffs = self.handoffs if self.n > 1 else []  # (a single handoff's Done lists none: `Done.handoff`)
        self.trace = pack(t.slm_text)  # everything written so far, as the next LLM request continues it
        self.context = self.trace + OFFLOAD_TOKEN  # the SLM's context: the trace with its own `<offload>` tokens
        self.llm_budget, self.base_stop = t.llm_max, list(t.sampling.get("stop") or [])
        self.prior = 0  # the longest prompt an earlier LLM call of this answer read
        self.text, self.calls = "", 0  # the last LLM call's text; LLM calls made

    async def resume(self, early=None) -> AsyncIterator[Event]:
        """LLM step, SLM, LLM step ... until the answer ends; every LLM call billed on its own. `early`: the first
        call, put on the wire by the SLM's segment as `<offload>` arrived (`llm_call.EarlyCall`), or None."""
        t = self.t
        while t.finish is None:
            self.calls += 1
            step = self.calls < self.n and t.relay_fallback is None
            async for ev in self._llm(step, early if self.calls == 1 else None):
                yield ev
            if t.finish is None:  # every attempt failed: the engine's failure policy
                async for ev in self._failed():
                    yield ev
                return
            if not step or not self._step_ended():
                continue
            async for ev in self._slm():
                yield ev
            if t.finish is None:
                yield Handoff(slm_tokens=self.handoffs[-1], packed=self.trace)

    async def _llm(self, step: bool, early=None) -> AsyncIterator[LLMDelta]:
        """One LLM call continuing the trace: to the step's end (`step`), else to the end of the answer."""
        t = self.t
        left = self.llm_budget - t.usage.llm_out
        if left <= 0:
            if early is not None:
                await early.cancel()
            t.finish = "length"
            return
        call = LLMCall(
            written=self.trace,
            cap=min(left, self.cfg.step_max_tokens) if step else left,
            stop=(*self.base_stop, self.cfg.step_sep) if step else tuple(self.base_stop),
        )
        first, mark = len(t.calls), len(t.llm_text)
        async for ev in self.e.llm_call(t, early, call=call):
            yield ev
        self._bill_prior(first)
        self.text = t.llm_text[mark:]
        self.segments += llm_segments(t.calls[first:])
        if self.text:
            self.trace += self.text
            self.context += _as_text(self.text)

    def _step_ended(self) -> bool:
        """After a step call that succeeded: whether the SLM resumes (the LLM stopped at a step end). Else the
        answer ended (EOS, the joint budget) or the relay falls back to a single handoff for the rest."""
        t, text, sep = self.t, self.text, self.cfg.step_sep
        if sep in text:  # the endpoint ignored `stop`: it may have written the whole answer
            t.relay_fallback = STOP_IGNORED
            t.finish = None if t.finish == "length" and t.left() > 0 else t.finish
            return False
        if not text and t.finish != "length":  # a step end before any text: nothing to resume on
            t.relay_fallback, t.finish = EMPTY_STEP, None
            return False
        if t.finish == "length":
            if self.llm_budget - t.usage.llm_out > 0 and (t.total is None or t.left() > 0):
                t.relay_fallback, t.finish = STEP_CAP, None  # the LLM writes the rest in one more call
            return False
        # "stop": at the step separator (or at EOS: then the SLM ends at once and the separator is taken back)
        self.trace += self.cfg.step_sep
        self.context += self.cfg.step_sep
        self._extend_llm(self.cfg.step_sep)
        t.finish = None
        return True

    def _extend_llm(self, text: str) -> None:
        if self.segments and self.segments[-1]["by"] == "llm":
            self.segments[-1]["text"] += text
        else:
            self.segments.append({"by": "llm", "endpoint": self.e.llm.name, "text": text})

    async def _slm(self) -> AsyncIterator[SLMDelta | LLMDelta]:
        """The SLM resumes on its own context under P_s (`<offload>` a stop id, as in its first segment). The step's
        separator is streamed (an LLMDelta) once the SLM writes or hands off: an SLM that ends at once takes it back."""
        t = self.t
        left = min(t.per_model - t.usage.slm_out, t.left("slm"))
        if left <= 0:  # the SLM's budget is spent: the answer ends at the LLM's step
            self._take_back_sep()
            t.finish = "length"
            return
        req = t.slm_request(dataclasses.replace(t.req, prefix=self.context, max_tokens=left))
        text, fin, seen = "", GenChunk(), 0
        async for ch in _aiter(self.e.slm.stream(req)):
            seen += len(ch.token_ids) or bool(ch.text)
            if ch.text:
                if not text:
                    yield LLMDelta(self.cfg.step_sep)
                text += ch.text
                yield SLMDelta(ch.text)
            if ch.finish_reason is not None:
                fin = ch
        before = t.usage.slm_out
        out, offload = t.bill_slm(fin, seen), self.e.offloaded(fin)
        if not text and not offload:  # the LLM's step was the answer's last: no separator after it
            self._take_back_sep()
        elif text:
            self.segments.append({"by": "slm", "text": text})
            self.trace += text
            self.context += _as_text(text)
        if offload:
            self.context += OFFLOAD_TOKEN
            if not text:
                yield LLMDelta(self.cfg.step_sep)
            self.handoffs.append(before - len(self.handoffs) + max(out - 1, 0))
        else:
            t.finish = fin.finish_reason or "length"

    def _take_back_sep(self) -> None:
        """The separator put after the LLM's step (never streamed) leaves the trace and the record."""
        n = len(self.cfg.step_sep)
        self.trace, self.segments[-1]["text"] = self.trace[:-n], self.segments[-1]["text"][:-n]
        self.context = self.context[:-n]

    async def _failed(self) -> AsyncIterator[SLMDelta]:
        """Every attempt of an LLM call failed: an error (on_error="raise"), else the SLM finishes (no `<offload>`) on
        the packed trace, as after a failed single handoff."""
        err = self.e.failure_outcome(self.t)
        if err is not None and self.raise_errors:
            raise err
        t = self.t
        if err is None and t.finish is None:
            # after the first call the SLM finishes on its text and the LLM's, as a single handoff's does; after a
            # resume, on the packed trace (the request's stop strings: the answer's end, not a step's)
            written = None if self.calls == 1 else self.trace
            async for ev in self.e.slm_fallback(t, written=written):
                yield ev
            if t.fb_text:
                self.segments.append({"by": "slm", "text": t.fb_text, "fallback": True})

    def _bill_prior(self, first: int) -> None:
        """Split the input of the calls made since `first`: the part an earlier call of this answer already sent (what a
        prefix cache can serve), recorded on each call entry and in the usage."""
        for c in self.t.calls[first:]:
            prior = min(self.prior, c.get("llm_in", 0))
            c["llm_prior_in"] = prior
            self.t.usage += Usage(llm_prior_in=prior)
            self.prior = max(self.prior, c.get("llm_in", 0))


def _as_text(text: str) -> str:
    """Written text as it goes into the SLM's context: an `<offload>` spelled out in it (a model that wrote the
    characters) stays characters (`literal`), so only the engine's own handoff marks are the token."""
    return literal.mark(text, [OFFLOAD_TOKEN])


def without_offload(context: str) -> str:
    """An SLM context without the engine's `<offload>` tokens (literal-marked text kept as it is): the prefix a
    model without a trained `<offload>` reads (`pyrodash.eval.oracle.GoldPlacement`)."""
    pieces = literal.split(context)
    return "".join(literal.mark(p, [p]) if lit else p.replace(OFFLOAD_TOKEN, "") for p, lit in pieces)


async def _aiter(stream):
    it = aiter(stream)
    try:
        async for ch in it:
            yield ch
    finally:
        await it.aclose()


def key_relay_turns(engine, turns: list[Turn], options: list[dict]) -> None:
    """The batch driver's turns that may relay (collab, max_llm_calls > 1) get a `cache_key` before their first SLM
    segment, as the stream driver gives its turn: the SLM keeps that segment's KV for the resumes."""
    for t, o in zip(turns, options):
        if t.mode == "collab" and calls_for(engine.relay, o) > 1:
            t.cache_key = object()


def relay_runs(engine, turns: list[Turn], options: list[dict], single: bool = False) -> dict[int, RelayRun]:
    """The batch driver's handoffs run as the stream driver's (by index): a `RelayRun` per collab turn that handed off
    with max_llm_calls > 1, and with `single` (an LLM that does not generate in batches) with one call too."""
    out = {}
    for i, (t, o) in enumerate(zip(turns, options)):
        cfg = relay_for(engine.relay, o)
        calls_ok = cfg.max_llm_calls > 1 or single
        if t.mode == "collab" and calls_ok and t.handoff is not None and t.finish is None:
            out[i] = RelayRun(engine, t, cfg, raise_errors=False)
    return out
