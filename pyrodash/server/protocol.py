"""Wire format of `pyrodash serve`: OpenAI chat-completions requests, responses and error bodies (pydantic models).

Requests are validated strictly (no "1" for 1, no NaN): a wrong type is a 400, never a guess. Parameters the engine
cannot honour are declared with their neutral value only (`n: 1`, `tools: []` ...); `pyrodash.server.validation`
refuses the rest by name. PyroDash adds `offload_bias`, `max_tokens_per_model` and `pyrodash` (`PyroDashOptions`) to
a request, and the `pyrodash` object (`PyroDashInfo`) to a response. `max_tokens` is the TOTAL budget of the joint
SLM + LLM answer; `temperature` defaults to 0 (greedy: the operating points were measured so). docs/serving.md.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import fields
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, field_validator

from pyrodash import chat
from pyrodash.events import Done, LLMFailure
from pyrodash.record import Record

_RECORD_FIELDS = fields(Record)

DEFAULT_TEMPERATURE = 0.0  # greedy when omitted (see the module docstring)
_URL_RE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
# host:port (127.0.0.1:8001, localhost:8000, llm:8001, [::1]:80) and local paths of 2+ parts (/data/runs/q/stage1)
_HOSTPORT_RE = re.compile(r"(?<![\w.:/-])(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?):\d{1,5}\b")
_PATH_RE = re.compile(r"(?<![\w.~:/-])(?:~|[A-Za-z]:)?(?:[/\\][\w.@+~-]+){2,}[/\\]?")
_PROTECTED: set[str] = set()  # configured addresses and paths (`protect`): never shown to a client


def _json_int(v: object) -> object:
    """JSON Schema's integer: 5.0 is the integer 5 (strings and booleans stay refused by the strict int check)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2**64:
        return int(v)
    return v


def _int(ge: int, le: int | None = None):
    """An integer field type with its bounds in the JSON schema (minimum/maximum) that takes 5.0 as 5."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_json_int)]


PositiveInt, ZeroInt, SeedInt = _int(1), _int(0, 0), _int(-(2**63), 2**64 - 1)
_STOP_SCHEMA = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 4},
        {"type": "null"},
    ],
    "default": None,
    "title": "Stop",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="allow")


# ---------------------------------------------------------------- requests


class TextPart(_Strict):
    type: Literal["text"]
    text: str


def _message_schema(schema: dict) -> None:
    """JSON Schema of a message: `content` is required (a string or text parts, not null) for system, developer and
    user messages, optional for an assistant message, required with `tool_call_id` for a tool result (as OpenAI's
    API declares it)."""
    props, content = schema["properties"], schema["properties"]["content"]
    given = {**content, "anyOf": [b for b in content.get("anyOf", [content]) if b.get("type") != "null"]}
    given.pop("default", None)
    plain = {k: v for k, v in props.items() if k not in ("tool_calls", "tool_call_id")}
    asking = {
        "type": "object",
        "properties": {**plain, "role": {"enum": ["system", "developer", "user"], "type": "string"}, "content": given},
        "required": ["role", "content"],
        "not": {"anyOf": [{"required": ["tool_calls"]}, {"required": ["tool_call_id"]}]},
    }
    answering = {
        "type": "object",
        "properties": {**{k: v for k, v in props.items() if k != "tool_call_id"}, "role": {"const": "assistant"}},
        "required": ["role"],
        "not": {"required": ["tool_call_id"]},
    }
    result = {
        "type": "object",
        "properties": {**plain, "role": {"const": "tool"}, "content": given, "tool_call_id": {"type": "string"}},
        "required": ["role", "content", "tool_call_id"],
        "not": {"required": ["tool_calls"]},
    }
    title = schema.get("title", "ChatMessage")
    schema.clear()
    schema.update(title=title, anyOf=[asking, answering, result])


class FunctionCall(_Strict):
    """A call's function as the wire carries it: its name and its arguments as JSON text."""

    name: str
    arguments: str


class ToolCallParam(_Strict):
    """An assistant message's tool call (OpenAI's `tool_calls` entry)."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDef(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # (accepted: the engine does not constrain decoding to the schema)


class ToolParam(_Strict):
    """A function the model may call (chat's `tools` entry)."""

    type: Literal["function"]
    function: FunctionDef

    def spec(self) -> chat.ToolSpec:
        f = self.function
        params = f.parameters if f.parameters is not None else {"type": "object", "properties": {}}
        return chat.ToolSpec(f.name, f.description or "", params)


class ChatMessage(_Strict):
    """A chat message; `content` may be missing or null only in an assistant message (`validation.parse` refuses
    the rest with OpenAI's `missing_required_parameter`)."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=_message_schema)

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallParam] | None = None  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)

    def to_message(self) -> chat.Message:
        """The typed message the engine takes ("developer" is OpenAI's new "system")."""
        calls = tuple(chat.ToolCall(c.id, c.function.name, c.function.arguments) for c in self.tool_calls or ())
        role = "system" if self.role == "developer" else self.role
        return chat.Message(role, self.text(), tool_calls=calls, tool_call_id=self.tool_call_id)


class StreamOptions(_Strict):
    include_usage: bool = False


class ResponseFormatText(_Strict):
    type: Literal["text"]


class RangeRuleOptions(_Strict):
    """A request's own range rule (`pyrodash.engine.range_rule`): both unset turns the rule off for it. Its keys are
    the rule's own fields, so any other key is a 400 (it would otherwise reach `RangeRule(...)`)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    max_turns: _int(0) | None = None  # the last user turn the SLM may take (0: none)
    max_context_tokens: PositiveInt | None = None  # the most tokens the SLM's prompt may hold


class PyroDashOptions(_Strict):
    """The request's `pyrodash` object (the playground sends it; any client may)."""

    # "collab": the Collaborate Engine (default); "slm" / "llm": that model answers alone, as the `slm`/`llm`
    # baselines of `pyrodash eval` do (no system prompt added, `<offload>` banned), for side-by-side comparisons
    mode: Literal["collab", "slm", "llm"] = "collab"
    # stream chunks carry `pyrodash: {"source": "slm"|"llm"}` on each content delta, and one
    # `pyrodash: {"source": "handoff", "handoff": N}` chunk (empty delta) where `<offload>` fired
    sources: bool = False
    # the SLM's range for this request (past it the LLM answers alone, `routed: "range"`); None: the operating point's
    range_rule: RangeRuleOptions | None = None
    # LLM calls per answer: above 1 the LLM writes one step per handoff and the SLM resumes (relay); with `sources`
    # each LLM step streams tagged "llm" and each further handoff as a "handoff" chunk. None: the operating point's
    max_llm_calls: PositiveInt | None = None


class _Sampling(_Strict):
    """Fields shared by both request kinds (`model` first, as in OpenAI's reference)."""

    model: str | None = None  # an operating point listed by /v1/models; None = the server's default
    max_tokens: PositiveInt | None = Field(
        None,
        description="The TOTAL output budget of the joint answer (SLM + "
        "LLM tokens); omitted: the server's default_max_tokens, shrunk to fit the "
        "context.",
    )
    n: Literal[1] | None = Field(None, description="Only 1 is supported.")
    seed: SeedInt | None = None
    stop: Annotated[str | list[str] | None, WithJsonSchema(_STOP_SCHEMA)] = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(
        DEFAULT_TEMPERATURE,
        ge=0.0,
        le=2.0,
        allow_inf_nan=False,
        description="Omitted or null: 0 (greedy), unlike OpenAI's 1.",
    )
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    user: str | None = None
    # PyroDash extra: added to the SLM's <offload> logit (higher = hand off to the LLM more often)
    offload_bias: float | None = Field(None, ge=-100.0, le=100.0, allow_inf_nan=False)
    # PyroDash extra: the most tokens either model may decode (the total is max_tokens)
    max_tokens_per_model: PositiveInt | None = Field(
        None,
        description="PyroDash: at most this many output tokens from each model (SLM, LLM); the total is max_tokens.",
    )
    # OpenAI parameters accepted with their neutral value only (anything else is a 400 unsupported_parameter)
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None
    suffix: Literal[""] | None = None
    logit_bias: dict[str, float] | None = Field(None, max_length=0)
    presence_penalty: float | None = Field(None, ge=0.0, le=0.0)
    frequency_penalty: float | None = Field(None, ge=0.0, le=0.0)
    pyrodash: PyroDashOptions | None = None  # PyroDash extra: mode (collab / slm / llm) and stream sources

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if len(items) > 4:
            raise ValueError("at most 4 stop sequences")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    def stop_list(self) -> list[str] | None:
        if self.stop is None:
            return None
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: Literal[False] | None = None
    top_logprobs: ZeroInt | None = None
    max_completion_tokens: PositiveInt | None = Field(None, description="Same as max_tokens (wins over it).")
    tools: list[ToolParam] | None = None
    # auto or none: a call the engine would have to force ("required", a named function) is refused by name before
    # validation (`validation.forced_tool_choice`), since it does not constrain a model's decoding
    tool_choice: Literal["none", "auto"] | None = None
    response_format: ResponseFormatText | None = None
    # OpenAI metadata fields: accepted, no effect on the answer
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def chat_messages(self) -> list[chat.Message]:
        return [m.to_message() for m in self.messages]

    def tool_request(self) -> tuple[list[chat.ToolSpec], str | None, bool | None]:
        """(the tools' specs, the tool_choice as a mode or a function's name, parallel_tool_calls)."""
        return [t.spec() for t in self.tools or ()], self.tool_choice, self.parallel_tool_calls


class CompletionRequest(_Sampling):
    """Legacy `/v1/completions`: the prompt goes to the engine as a question (the prompt set's template applies)."""

    prompt: str = Field(min_length=1)
    logprobs: ZeroInt | None = None


# ---------------------------------------------------------------- responses


class LLMOnlyEstimate(_Out):
    """How `llm_only_cost_usd` was counted: the LLM's prices times these tokens."""

    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    estimated: bool  # False only in mode "llm", where the LLM did answer alone
    method: str  # how prompt_tokens / completion_tokens were obtained (see pyrodash.server.estimates)


class PyroDashInfo(_Out):
    """Where the tokens and dollars of one request went: the request's record (`pyrodash.record.Record`, the fields
    `pyrodash eval` writes, without `output`: the text is the response's message), then what the server adds."""

    finish_reason: str = "stop"
    slm_in: int
    slm_out: int
    llm_in: int
    llm_out: int
    llm_cached_in: int
    llm_calls: int
    handoff: int | None  # SLM tokens decoded before <offload>, or None when the SLM answered alone
    cost_usd: float
    offload_bias: float
    handoff_share: float = 1.0  # the share of requests that may hand off, in effect for this one
    handoff_admitted: bool = True  # False: outside the engine's handoff_share, so the SLM answered alone
    fallback: bool  # the LLM failed and the SLM finished the answer
    llm_errors: list[str] = []  # every failed LLM attempt (retried, or ending in the fallback), in order
    llm_failures: list[dict] = []  # the same attempts typed: attempt, kind, status, reached_server (no message)
    usage_estimated: bool = False  # some token counts were not reported by a server (counted locally / estimated)
    turn: int = 1  # which user turn of the conversation this response answers
    trimmed: dict[str, int] = Field(default_factory=dict)  # earlier messages dropped to fit each model's window
    segments: list[dict] = Field(default_factory=list)  # who wrote what in this turn: {by, endpoint?, text}
    llm_endpoints: list[dict] = Field(default_factory=list)  # per LLM endpoint: calls, tokens, price, cost_usd
    latency_s: float = 0.0  # the engine's time for this request
    mode: str = "collab"  # who answered: "collab" (the engine), "slm" or "llm" alone (request `pyrodash.mode`)
    routed: str | None = None  # "range": past the SLM's range (the operating point's range rule), the LLM alone
    llm_prior_in: int = 0  # the part of llm_in an earlier LLM call of this answer sent (relay; a prefix cache's)
    slm_cached_in: int = 0  # the part of slm_in the SLM served from its prefix cache (not billed)
    handoffs: list[int] = Field(default_factory=list)  # every handoff position (relay: several)
    relay_fallback: str | None = None  # why a relay answer became a single handoff (stop_ignored, step_cap, empty_step)
    cost_usd_by_component: dict[str, float] | None = None  # cost_usd split into slm_in, slm_out, llm_in, llm_out
    tool_calls: list[dict] = Field(default_factory=list)  # the answer's tool calls: {id, name, arguments, by}
    tool_call_errors: list[str] = Field(default_factory=list)  # what a model wrote as a call that could not be read
    # what the LLM alone would have billed for this answer: an ESTIMATE except in mode "llm" (then it is cost_usd);
    # how it is counted: `llm_only_estimate` below and pyrodash.server.estimates.llm_only_estimate
    llm_only_cost_usd: float | None = None
    llm_only_estimate: LLMOnlyEstimate | None = None
    # which model wrote the answer: "collab" (the served SLM, handing off to the LLM), "slm" (the served SLM alone,
    # `<offload>` banned: a Stage 2/3 SLM may stop before a final answer), "base_slm" (the server's base SLM,
    # `base_slm:` in the serve config, answering alone), "llm" (the LLM alone)
    answered_by: str = "collab"
    # with llm_errors: the server log's key for this request, where the LLM errors' full text is (None without)
    request_id: str | None = None
    # the dollar budget this request drew on and the operating point it got from its pacer: name, state (paced,
    # policy, capped, ...), spend_fraction, handoff_share / offload_bias, target and measured $/hour, the period's
    # spend and cap, store (pyrodash.server.budget.budgets); None when the server holds no budget for it
    budget: dict | None = None

    @classmethod
    def from_done(
        cls,
        done: Done,
        mode: str = "collab",
        llm_only_estimate: object = None,
        answered_by: str | None = None,
        request_id: str | None = None,
    ) -> PyroDashInfo:
        """The record (`Record.from_done`: every field but `output`, the cost split included), the LLM's errors as a
        client may see them (a reason code each: `reason`; the server logs the full text under `request_id`),
        endpoint names `scrub`bed, and the LLM-only estimate the serving layer computed (any object or dict with
        `LLMOnlyEstimate`'s fields; `pyrodash.server.estimates`)."""
        r = Record.from_done(done)  # (its lists and dicts are copies already: no deep `to_json` copy needed)
        rec = {f.name: getattr(r, f.name) for f in _RECORD_FIELDS if f.name != "output"}
        for part in (*rec["segments"], *rec["llm_endpoints"]):
            if isinstance(part.get("endpoint"), str):
                part["endpoint"] = scrub(part["endpoint"])
        rec.update(
            llm_errors=[reason(f) for f in done.failures],
            llm_failures=[{k: v for k, v in f.items() if k != "message"} for f in rec["llm_failures"]],  # no upstream
            mode=mode,
            answered_by=answered_by or mode,
            request_id=request_id if done.errors else None,
        )
        rec["cost_usd_by_component"] = rec["cost_usd_by_component"] or None  # (a Done built without prices)
        info = cls(**rec)
        if llm_only_estimate is not None:
            est = LLMOnlyEstimate.model_validate(llm_only_estimate, from_attributes=True)
            info.llm_only_cost_usd, info.llm_only_estimate = est.cost_usd, est
        return info


def protect(*texts: object) -> None:
    """Never show these strings to a client (the serve config's model paths and endpoint URLs: `build_app` calls
    this); `scrub` removes them wherever they appear. Process-wide and only ever added to."""
    _PROTECTED.update(t for t in (str(x).strip() for x in texts if x) if len(t) >= 4)


def scrub(text: str) -> str:
    """`text` as a client may see it: without the configured model paths and endpoint addresses (`protect`), URLs,
    host:port pairs and local paths (an internal backend address or a server directory must not reach a client)."""
    for known in sorted(_PROTECTED, key=len, reverse=True):
        if known in text:
            text = text.replace(known, "<hidden>")
    text = _URL_RE.sub("<backend>", text)
    text = _HOSTPORT_RE.sub("<backend>", text)
    return _PATH_RE.sub("<path>", text)


# the reason code a client sees for each kind of LLM failure (`pyrodash.events.FAILURE_KINDS`); {status}: the HTTP
# status of a refused request
REASONS = {
    "http": "upstream_http_{status}",
    "unreachable": "upstream_unreachable",
    "timeout": "upstream_timeout",
    "incomplete": "upstream_incomplete",
    "error_event": "upstream_error_event",
    "bad_response": "upstream_bad_response",
    "all_endpoints_failed": "all_endpoints_failed",
    "not_made": "budget_hard_cap",
    "error": "upstream_error",
}


def reason(failure: LLMFailure) -> str:
    """One LLM failure as a client may see it: "attempt N: <reason code>", e.g. "attempt 1: upstream_http_500",
    "attempt 2: upstream_timeout"; no upstream text, address or path (those stay in the server's log)."""
    return f"attempt {failure.attempt}: " + REASONS[failure.kind].format(status=failure.status)


class PromptTokensDetails(_Out):
    cached_tokens: int = 0


class UsageInfo(_Out):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None

    @classmethod
    def from_done(cls, done: Done) -> UsageInfo:
        """Both models' tokens together: input = SLM + LLM input, output = SLM + LLM output."""
        u = done.usage
        prompt, completion = u.slm_in + u.llm_in, u.slm_out + u.llm_out
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=u.llm_cached_in),
        )


class ResponseMessage(_Out):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[dict] | None = None  # OpenAI's `tool_calls` entries: {id, type: function, function}


class Choice(_Out):
    index: int = 0
    message: ResponseMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletion(_Out):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: UsageInfo
    pyrodash: PyroDashInfo


class CompletionChoice(_Out):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None


class Completion(_Out):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    pyrodash: PyroDashInfo | None = None


class ModelCard(_Out):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pyrodash"
    offload_bias: float
    handoff_share: float = 1.0  # below 1: only that share of requests may hand off (the others: the SLM alone)
    range_rule: dict[str, int | None] | None = None  # past it the LLM answers alone: {max_turns, max_context_tokens}


class ModelList(_Out):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ---------------------------------------------------------------- errors


class ErrorInfo(_Out):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(_Out):
    error: ErrorInfo


class APIError(Exception):
    """A request the server refuses: rendered as OpenAI's error body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict:
        info = ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        return ErrorResponse(error=info).model_dump()


def new_id(prefix: str = "chatcmpl") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())
