"""Typed events of the Collaborate Engine's stream (Algorithm 1) and the final record of one request."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pyrodash.chat import ToolCall, answer_blocks
from pyrodash.cost import Usage


@dataclass
class SLMDelta:
    """Text decoded by the SLM (Line 9 of Algorithm 1)."""

    text: str


@dataclass
class Handoff:
    """The SLM emitted `<offload>` (Lines 3-5): SLM decoding stopped, the partial trace was packed."""

    slm_tokens: int  # SLM tokens decoded before <offload> (the handoff position)
    packed: str  # Pack(O_s), the context sent to the LLM


@dataclass
class LLMDelta:
    """Text decoded by the LLM after the handoff (Line 7)."""

    text: str


# what went wrong in a failed LLM attempt (`LLMFailure.kind`); the server maps each to a reason code
FAILURE_KINDS = (
    "http",  # the server refused the request (`status`)
    "unreachable",  # no connection: the request never reached the model
    "timeout",  # no chunk (or no answer) within the policy's timeout_s
    "incomplete",  # the stream broke or ended without saying why
    "error_event",  # the server sent an error event in the stream
    "bad_response",  # an event that could not be read
    "all_endpoints_failed",  # every endpoint of a mesh failed
    "not_made",  # the budget's hard cap left no room for the call
    "error",  # anything else the backend raised
)


@dataclass(frozen=True)
class LLMFailure:
    """One failed LLM attempt, typed: which attempt (1 = the first call), what went wrong (`FAILURE_KINDS`), the HTTP
    status of a refused request, whether it reached the server (billed as a call), and the backend's message (may
    name an upstream address: for logs, never for a client). `str()` is the one-line form of `Done.errors`."""

    attempt: int
    kind: str
    message: str
    status: int | None = None
    reached_server: bool = True

    def __post_init__(self) -> None:
        assert self.kind in FAILURE_KINDS, self.kind

    def __str__(self) -> str:
        return f"attempt {self.attempt}: {self.message}"


@dataclass
class Done:
    """The final record of a request (Line 8 / 11)."""

    output: str  # the joint output O_s || O_l (never contains <offload>, nor a tool call's markup)
    slm_text: str
    llm_text: str
    usage: Usage
    cost_usd: float
    finish_reason: str  # "stop" | "length" | "tool_calls" | "error"
    handoff: int | None  # SLM tokens before the handoff, or None when the SLM answered alone
    offload_bias: float = 0.0
    handoff_share: float = 1.0  # the share of requests that may hand off, in effect for this one
    handoff_admitted: bool = True  # False: outside the handoff_share, so the SLM answered alone
    fallback: bool = False  # the LLM failed and the SLM finished the answer with <offload> banned
    errors: list[str] = field(default_factory=list)  # failed LLM attempts, one line each (`str(LLMFailure)`)
    failures: list[LLMFailure] = field(default_factory=list)  # the same attempts, typed
    usage_estimated: bool = False  # some counts were not reported by a server (counted locally or estimated)
    latency_s: float = 0.0
    turn: int = 1  # the number of this user turn in its conversation (1 = a single question)
    trimmed: dict = field(default_factory=lambda: {"slm": 0, "llm": 0})  # earlier messages dropped per model
    # who wrote what in this turn, in streamed order, each piece of text once: {"by": "slm", "text"} |
    # {"by": "llm", "endpoint", "text"} | {"by": "slm", "text", "fallback": True} (after a failed handoff)
    segments: list[dict] = field(default_factory=list)
    # per LLM endpoint: {endpoint, calls, llm_in, llm_out, llm_cached_in, chars, price, cost_usd} (a mesh has several)
    llm_endpoints: list[dict] = field(default_factory=list)
    mode: str = "collab"  # who answered: "collab" (Algorithm 1), "slm" or "llm" alone
    routed: str | None = None  # "range": a collab request past the SLM's range, answered by the LLM alone
    # relay (pyrodash.engine.relay): every handoff position (SLM tokens before each `<offload>`), and why the answer
    # became a single handoff part-way (stop_ignored, step_cap, empty_step); [] / None: not a relay answer
    handoffs: list[int] = field(default_factory=list)
    relay_fallback: str | None = None
    # cost_usd by billed component (`pyrodash.cost.COMPONENTS`), each LLM endpoint at its own prices: sums to cost_usd
    cost_usd_by_component: dict[str, float] = field(default_factory=dict)
    # the answer's tool calls after its text, each saying which model wrote it (`ToolCall.by`); finish "tool_calls"
    tool_calls: list[ToolCall] = field(default_factory=list)
    # what a model wrote as a tool call that could not be read as one (dropped, never shown as content), one line each
    tool_call_errors: list[str] = field(default_factory=list)

    def blocks(self) -> list:
        """The answer as ordered blocks: its text (`chat.TextBlock`, when there is any), then its tool calls."""
        return answer_blocks(self.output, self.tool_calls)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["usage"] = self.usage.to_dict()
        return d


Event = SLMDelta | Handoff | LLMDelta | Done
