"""The one record of an answered request, built from the engine's `Done`: what `pyrodash eval` writes as a JSON line
(beside the example's id, gold, grade and meta), what `pyrodash serve` returns in a response's `pyrodash` object
(without `output`: the text is the response's message) and what the playground draws. One set of field names, one
segment order (as streamed), each piece of text once; reports read records through `read_record` only.

    rec = Record.from_done(done).to_json()
    rec = read_record(json.loads(line))      # also reads the records of runs made before this format
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pyrodash.cost import Usage
from pyrodash.events import Done

USAGE_FIELDS = (
    "slm_in",
    "slm_out",
    "llm_in",
    "llm_out",
    "llm_cached_in",
    "llm_calls",
    "llm_prior_in",
    "slm_cached_in",
)


@dataclass
class Record:
    output: str  # the joint answer, in streamed order
    finish_reason: str  # "stop" | "length" | "tool_calls" | "error"
    mode: str  # "collab" (Algorithm 1), "slm" or "llm" alone
    slm_in: int  # SLM prompt tokens, over all its segments
    slm_out: int  # the <offload> stop token included, as billed
    llm_in: int  # LLM prompt tokens (the packed trace), over all its calls
    llm_out: int  # LLM output tokens
    llm_cached_in: int  # the part of llm_in the provider reported as served from its cache
    llm_calls: int  # LLM calls that reached a server (retries and every endpoint of a mesh included)
    cost_usd: float  # dollars of the answer at the run's price sheet
    handoff: int | None  # SLM tokens before <offload>; None: no handoff
    offload_bias: float  # the operating point's bias on the <offload> logit
    handoff_share: float  # and its share of requests that may hand off
    handoff_admitted: bool  # False: outside the handoff share, the SLM answered alone
    fallback: bool  # the LLM failed and the SLM finished the answer (its segment says `fallback: true`)
    llm_errors: list[str] = field(default_factory=list)  # every failed LLM attempt, one line each
    usage_estimated: bool = False  # a server reported no token counts: counted locally or estimated
    turn: int = 1  # the user turn answered (1: the first)
    trimmed: dict = field(default_factory=lambda: {"slm": 0, "llm": 0})  # history messages dropped to fit
    segments: list[dict] = field(default_factory=list)  # {"by": "slm"|"llm", "text", "endpoint"?, "fallback"?}
    llm_endpoints: list[dict] = field(default_factory=list)  # per LLM endpoint: calls, tokens, price, cost_usd
    latency_s: float = 0.0  # wall time of the answer
    llm_prior_in: int = 0  # the part of llm_in an earlier LLM call of this answer already sent (a cache can serve it)
    handoffs: list[int] = field(default_factory=list)  # every handoff position, in order (relay: several)
    relay_fallback: str | None = None  # why a relay answer became a single handoff (relay.py: stop_ignored ...)
    routed: str | None = None  # "range": past the SLM's range, the LLM answered alone (`mode` "llm")
    slm_cached_in: int = 0  # the part of slm_in the SLM served from its prefix cache (its KV kept: not billed)
    # every failed LLM attempt, typed (`pyrodash.events.LLMFailure`): attempt, kind, message, status, reached_server
    llm_failures: list[dict] = field(default_factory=list)
    cost_usd_by_component: dict = field(default_factory=dict)  # cost_usd split: slm_in, slm_out, llm_in, llm_out
    tool_calls: list[dict] = field(default_factory=list)  # the answer's tool calls: {id, name, arguments, by}
    tool_call_errors: list[str] = field(default_factory=list)  # calls a model wrote that could not be read (dropped)

    @classmethod
    def from_done(cls, done: Done) -> Record:
        u = done.usage
        return cls(
            output=done.output,
            finish_reason=done.finish_reason,
            mode=done.mode,
            slm_in=u.slm_in,
            slm_out=u.slm_out,
            llm_in=u.llm_in,
            llm_out=u.llm_out,
            llm_cached_in=u.llm_cached_in,
            llm_calls=u.llm_calls,
            cost_usd=done.cost_usd,
            handoff=done.handoff,
            offload_bias=done.offload_bias,
            handoff_share=done.handoff_share,
            handoff_admitted=done.handoff_admitted,
            fallback=done.fallback,
            llm_errors=list(done.errors),
            usage_estimated=done.usage_estimated,
            turn=done.turn,
            trimmed=dict(done.trimmed),
            segments=[dict(s) for s in done.segments],
            llm_endpoints=[dict(e) for e in done.llm_endpoints],
            latency_s=done.latency_s,
            llm_prior_in=u.llm_prior_in,
            handoffs=list(done.handoffs) or ([done.handoff] if done.handoff is not None else []),
            relay_fallback=done.relay_fallback,
            routed=done.routed,
            slm_cached_in=u.slm_cached_in,
            llm_failures=[asdict(f) for f in done.failures],
            cost_usd_by_component=dict(done.cost_usd_by_component),
            tool_calls=[c.record() for c in done.tool_calls],
            tool_call_errors=list(done.tool_call_errors),
        )

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def usage(self) -> Usage:
        return Usage(**{k: getattr(self, k) for k in USAGE_FIELDS})


def read_record(r: dict) -> dict:
    """A stored line in this format. Lines written before it (usage nested under "usage", segments keyed "model")
    are converted in memory; the file is left as it is."""
    if "usage" in r and isinstance(r["usage"], dict):
        r = dict(r)
        nested = r.pop("usage")
        for k in USAGE_FIELDS:
            r.setdefault(k, nested.get(k, 0))
    if any("model" in s and "by" not in s for s in r.get("segments") or []):
        r = dict(r)
        r["segments"] = [
            {"by": s.get("by", s.get("model")), **{k: v for k, v in s.items() if k != "model"}} for s in r["segments"]
        ]
    return r


def usage_of(r: dict) -> Usage:
    """The four token components (LLM calls, the prior part of the LLM input) of a stored record, old or new."""
    r = read_record(r)
    return Usage(**{k: int(r.get(k) or 0) for k in USAGE_FIELDS})
