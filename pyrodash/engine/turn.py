"""One request's way through Algorithm 1 (`Turn`), and the one place its record (`events.Done`) is built.

The engine's two drivers (`CollaborateEngine.stream`, one request with events as they come, and
`CollaborateEngine.batch`, many requests with batched generation) move a `Turn` through the same steps and end in
`Turn.done`, so every caller (server, `generate`, eval, Stage 3, calibration, the oracle) gets the same `Done`:
the same text, segments in streamed order (each piece of text once), token counts and dollars.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.chat import ToolCall, Tools
from pyrodash.cost import Prices, Usage, endpoint_bill
from pyrodash.engine import tool_parser
from pyrodash.events import Done, LLMFailure

MODES = ("collab", "slm", "llm")


def llm_segments(calls: list[dict]) -> list[dict]:
    """The segments of an LLM call's attempts (`Turn.calls` entries), in streamed order: one per stretch of text by
    one endpoint (a retry on the same endpoint continues its segment; a mesh's next endpoint starts one)."""
    segments: list[dict] = []
    for c in calls:
        if not c.get("text"):
            continue
        if segments and segments[-1]["endpoint"] == c["endpoint"]:
            segments[-1]["text"] += c["text"]
        else:
            segments.append({"by": "llm", "endpoint": c["endpoint"], "text": c["text"]})
    return segments  # the Collaborate Engine; the SLM alone; the LLM alone


@dataclass
class Turn:
    """The state of one request: what was asked, what each model wrote so far, and what it was billed."""

    mode: str  # one of MODES
    messages: list[dict]  # the conversation as the models read it (`<offload>` stripped from earlier turns)
    req: GenRequest  # the first model's request: the SLM's (collab, slm) or the LLM's (llm)
    per_model: int  # tokens the SLM may decode
    llm_max: int  # tokens the LLM may decode
    total: int | None  # the joint budget (SLM + LLM output tokens), None: none
    bias: float  # the offload_bias asked for
    share: float  # the handoff_share in effect
    admitted: bool  # inside the handoff share
    sampling: dict  # temperature, top_p, seed, stop: shared by every request of this turn
    number: int  # which user turn of its conversation (1: a single question)
    trimmed: dict  # earlier messages dropped to fit each model's window
    t0: float = field(default_factory=time.perf_counter)
    usage: Usage = field(default_factory=Usage)
    slm_text: str = ""  # the SLM's text before a handoff (or its whole answer)
    llm_text: str = ""  # the LLM's text, over every attempt
    fb_text: str = ""  # the SLM's text after a failed handoff (`<offload>` banned)
    handoff: int | None = None  # SLM tokens before `<offload>`; None: no handoff
    calls: list[dict] = field(default_factory=list)  # one entry per LLM attempt (endpoint, tokens, text, error)
    failures: list[LLMFailure] = field(default_factory=list)  # failed LLM attempts, in order (`fail`)
    estimated: bool = False  # some token counts were not reported by a server
    finish: str | None = None  # set when the turn is over
    fallback: bool = False  # the SLM finished after the LLM failed
    routed: str | None = None  # "range": past the SLM's range (`pyrodash.engine.range_rule`), the LLM alone
    cache_key: object | None = None  # a relay answer's: on each of its SLM requests (`GenRequest.cache_key`)
    gate: object | None = None  # `EngineRequest.gate`: asked before each LLM call (a budget's hard cap)
    # a relay answer (pyrodash.engine.relay): its segments as written and every handoff position, and why it became a
    # single handoff part-way; segments None: a single handoff's, built from the texts and calls in `done`
    segments: list[dict] | None = None
    handoffs: list[int] = field(default_factory=list)
    relay_fallback: str | None = None
    # tools (`EngineRequest.tools`): each model's tool-call format (`pyrodash.engine.tool_parser`), the SLM's calls (its
    # segment's outcome, `slm_finished`) and what could not be read as a call; the LLM's are read in `done`
    tools: Tools | None = None
    formats: dict = field(default_factory=lambda: {"slm": "hermes", "llm": "hermes"})
    slm_calls: list[ToolCall] = field(default_factory=list)
    tool_errors: list[str] = field(default_factory=list)

    def slm_request(self, req: GenRequest | None = None) -> GenRequest:
        """An SLM request of this turn (`req`, else the first one), with the answer's `cache_key`: an in-process SLM
        keeps its KV for the answer's next request (relay)."""
        out = self.req if req is None else req
        if self.cache_key is not None:
            out.cache_key = self.cache_key
        return out

    def left(self, side: str = "llm") -> int:
        """Tokens the next model (`side`) may decode: its own limit, and what is left of the joint budget (output so
        far = SLM + LLM output tokens, as billed)."""
        own = self.llm_max if side == "llm" else self.per_model
        if self.total is None:
            return own
        return min(own, self.total - self.usage.slm_out - self.usage.llm_out)

    @property
    def errors(self) -> list[str]:
        """The failed attempts, one line each (`Done.errors`)."""
        return [str(f) for f in self.failures]

    def bill_slm(self, final: GenChunk, seen: int) -> int:
        """Add one SLM segment to the bill and return its output tokens: `final` is its last chunk (usage), `seen`
        the chunks it streamed (one per token), counted with its stop token when the server reported no usage."""
        out = final.completion_tokens
        if out is None:  # a server that reports no usage: one streamed chunk per token, plus the stop token
            out, self.estimated = seen + (final.stop_token_id is not None), True
        self.estimated = self.estimated or final.usage_estimated
        self.usage += Usage(slm_in=final.prompt_tokens or 0, slm_out=out, slm_cached_in=final.cached_tokens or 0)
        return out

    def bill_llm(self, got: GenChunk, calls: list[dict], reached: int) -> None:
        """Add one LLM attempt to the bill: `got` is its last chunk (usage), `calls` its per-endpoint entries (a mesh
        reports several upstream calls in one attempt, `got.endpoints`)."""
        self.calls += calls
        self.usage += Usage(
            llm_in=got.prompt_tokens or 0,
            llm_out=got.completion_tokens or 0,
            llm_cached_in=got.cached_tokens or 0,
            llm_calls=sum(c["calls"] for c in got.endpoints) if got.endpoints else reached,
        )
        self.estimated = self.estimated or got.usage_estimated

    def done(self, prices: Prices) -> Done:
        """The record: joint text in streamed order (SLM, LLM, then any fallback text), one segment per stretch of
        text by one writer, each model's tokens, and dollars (every LLM call at its endpoint's price)."""
        bill = endpoint_bill(self.calls, prices)
        segments = [dict(s) for s in self.segments] if self.segments is not None else self._segments()
        calls, call_errors, finish = self._tool_calls(segments)
        u = self.usage
        split = Usage(slm_in=u.slm_in, slm_out=u.slm_out, slm_cached_in=u.slm_cached_in).components(prices)
        for e in bill:  # each LLM endpoint at its own prices
            for part, usd in e["cost_usd_by_component"].items():
                split[part] += usd
        return Done(
            output="".join(s["text"] for s in segments),
            slm_text="".join(s["text"] for s in segments if s["by"] == "slm"),
            llm_text="".join(s["text"] for s in segments if s["by"] == "llm"),
            usage=self.usage,
            cost_usd=sum(split.values()),
            cost_usd_by_component=split,
            finish_reason=finish,
            handoff=self.handoff,
            offload_bias=self.bias,
            handoff_share=self.share,
            handoff_admitted=self.admitted,
            fallback=self.fallback,
            errors=self.errors,
            failures=list(self.failures),
            usage_estimated=self.estimated,
            latency_s=time.perf_counter() - self.t0,
            turn=self.number,
            trimmed=dict(self.trimmed),
            segments=segments,
            llm_endpoints=bill,
            mode=self.mode,
            routed=self.routed,
            handoffs=list(self.handoffs),
            relay_fallback=self.relay_fallback,
            tool_calls=calls,
            tool_call_errors=call_errors,
        )

    def _tool_calls(self, segments: list[dict]) -> tuple[list[ToolCall], list[str], str]:
        """(the answer's tool calls, what could not be read as one, its finish reason), the calls' markup taken out
        of `segments` (in place; a segment left empty goes): the SLM's calls (read when its segment ended), then each
        later segment's in its writer's format and any calls a chat endpoint returned structured."""
        finish = self.finish or "error"
        if self.tools is None:
            return [], [], finish
        calls, errors = list(self.slm_calls), list(self.tool_errors)
        for seg in segments:
            if seg["by"] == "llm" or seg.get("fallback"):
                seg["text"], found, bad = tool_parser.split(seg["text"], self.formats[seg["by"]], seg["by"])
                calls += found
                errors += bad
        segments[:] = [s for s in segments if s["text"]]
        calls += [c for e in self.calls for c in e.get("tool_calls") or ()]
        if calls and not self.tools.parallel and len(calls) > 1:
            errors.append(f"parallel_tool_calls is false: {len(calls) - 1} call(s) after the first dropped")
            calls = calls[:1]
        if calls and finish in ("stop", "length"):
            finish = "tool_calls"
        return calls, errors, finish

    def _segments(self) -> list[dict]:
        """A turn's segments without a relay: the SLM's text, the LLM's (`llm_segments`), then any fallback text."""
        segments = [{"by": "slm", "text": self.slm_text}] if self.slm_text else []
        segments += llm_segments(self.calls)
        if self.fb_text:
            segments.append({"by": "slm", "text": self.fb_text, "fallback": True})
        return segments
