"""Anthropic's Messages API (POST /v1/messages) in front of the engine: the request (`MessagesRequest`), its
conversion into the engine's request (`system` and `messages` as chat messages), the message object, its event
stream (`MessagesWriter`) and Anthropic's error body (`error_body`). docs/serving.md.

`system` and each message's content are a string or content blocks: text, and a tool loop's `tool_use` (an earlier
answer's call) and `tool_result` blocks; `tools` are client tools (`name`, `description`, `input_schema`), the
answer's calls come back as `tool_use` blocks with stop reason `tool_use`. Images, documents, server tools and
extended thinking are refused by name (400). `max_tokens` (required, as Anthropic's API requires it) is the joint
answer's TOTAL budget (SLM + LLM); `temperature` omitted is 0 (greedy). The key comes as `x-api-key` or
`Authorization: Bearer` (`pyrodash.server.auth`); the `anthropic-version` header is accepted and not checked.
"""

from __future__ import annotations

import json
import uuid
from json.encoder import encode_basestring
from typing import Annotated, Literal

from pydantic import BaseModel, Field, WithJsonSchema, field_validator

from pyrodash import chat
from pyrodash.events import Done
from pyrodash.server import protocol, validation
from pyrodash.server.front import Front, FrontRequest, chat_message, text_only, tool_types

_NOT_TEXT = "images, documents and server tools' blocks"
_BLOCKS = ("text", "tool_use", "tool_result")
# HTTP status -> Anthropic's error type
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    499: "invalid_request_error",
}


class TextBlock(protocol._Strict):
    """A text content block (its `cache_control` and `citations` are accepted without effect)."""

    type: Literal["text"]
    text: str


class ToolUseBlock(protocol._Strict):
    """An earlier answer's tool call, sent back in an assistant message."""

    type: Literal["tool_use"]
    id: str
    name: str
    input: dict


class ToolResultBlock(protocol._Strict):
    """A tool's result for the call `tool_use_id`, in a user message (its text, or text blocks)."""

    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


def _text(content) -> str:
    if content is None:
        return ""
    return content if isinstance(content, str) else "".join(b.text for b in content if isinstance(b, TextBlock))


class Message(protocol._Strict):
    role: Literal["user", "assistant"]
    content: str | list[TextBlock | ToolUseBlock | ToolResultBlock]

    def to_chat(self) -> list[chat.Message]:
        """The chat messages this message is: an assistant's text with its calls; a user's tool results (one tool
        message each), then its text when it has any."""
        blocks = [] if isinstance(self.content, str) else self.content
        if self.role == "assistant":
            calls = tuple(
                chat.ToolCall(b.id, b.name, json.dumps(b.input)) for b in blocks if isinstance(b, ToolUseBlock)
            )
            return [chat.Message("assistant", _text(self.content), tool_calls=calls)]
        results = [chat.Message("tool", _text(b.content), tool_call_id=b.tool_use_id) for b in blocks
                   if isinstance(b, ToolResultBlock)]  # fmt: skip
        text = _text(self.content)
        return [*results, *([chat.Message("user", text)] if text or not results else [])]


class ToolDef(protocol._Strict):
    """A client tool the model may call."""

    type: Literal["custom"] | None = None
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_-]+$")
    description: str | None = None
    input_schema: dict
    cache_control: dict | None = None

    def spec(self) -> chat.ToolSpec:
        return chat.ToolSpec(self.name, self.description or "", self.input_schema)


class ToolChoice(protocol._Strict):
    """auto or none (a forced call, `any` or `tool`, is refused by name: `validation.forced_tool_choice`)."""

    type: Literal["auto", "none"]
    disable_parallel_tool_use: bool | None = None


class MessagesRequest(FrontRequest):
    """POST /v1/messages: what PyroDash honours, the metadata it accepts without effect, and the rest refused by
    name unless neutral (`UNSUPPORTED`)."""

    API_FIELDS = frozenset(
        {"model", "messages", "max_tokens", "system", "stop_sequences", "temperature", "top_p", "top_k", "stream",
         "metadata", "service_tier", "tools", "tool_choice", "thinking", "container", "mcp_servers", "cache_control",
         "diagnostics", "inference_geo", "output_config", "speed", "user_profile_id", "workspace_id"}
    )  # fmt: skip
    UNSUPPORTED = {
        "thinking": ((None, {"type": "disabled"}), "extended thinking is not supported"),
        "top_k": ((None,), "top_k is not supported (top_p is)"),
        "container": ((None,), "containers (code execution) are not supported"),
        "mcp_servers": ((None, []), "MCP servers are not supported"),
        "output_config": ((None,), "output configuration (structured output, effort) is not supported"),
        "diagnostics": ((None,), "diagnostics are not supported"),
        "speed": ((None,), "speed options are not supported"),
    }
    PARTS = (Message, TextBlock, ToolUseBlock, ToolResultBlock, ToolDef, ToolChoice)

    messages: list[Message] = Field(min_length=1)
    max_tokens: protocol.PositiveInt = Field(description="The TOTAL output budget of the joint answer (SLM + LLM).")
    system: str | list[TextBlock] | None = None
    # (each non-empty: the schema says so too, so a schema-valid request is never refused for an empty one)
    stop_sequences: list[Annotated[str, WithJsonSchema({"type": "string", "minLength": 1})]] | None = Field(
        None, max_length=4
    )
    temperature: float | None = Field(
        None, ge=0.0, le=1.0, allow_inf_nan=False, description="Omitted or null: 0 (greedy), unlike Anthropic's 1."
    )
    tools: list[ToolDef] | None = None
    tool_choice: ToolChoice | None = None
    mcp_servers: list[dict] | None = Field(None, max_length=0)
    # Anthropic metadata fields: accepted, no effect on the answer
    metadata: dict | None = None
    service_tier: str | None = None
    cache_control: dict | None = None  # (prompt caching is the backends' own)
    inference_geo: str | None = None
    user_profile_id: str | None = None
    workspace_id: str | None = None

    @field_validator("system", mode="before")
    @classmethod
    def _system_text(cls, v: object) -> object:
        text_only(v, "system", ("text",), _NOT_TEXT)
        return v

    @field_validator("messages", mode="before")
    @classmethod
    def _messages_text(cls, v: object) -> object:
        for i, m in enumerate(v if isinstance(v, list) else ()):
            if isinstance(m, dict):
                text_only(m.get("content"), f"messages.{i}.content", _BLOCKS, _NOT_TEXT)
        return v

    @field_validator("tools", mode="before")
    @classmethod
    def _client_tools_only(cls, v: object) -> object:
        return tool_types(v, ("custom",), "server tools", "client tools")

    @field_validator("stop_sequences")
    @classmethod
    def _stops(cls, v: list[str] | None) -> list[str] | None:
        if v is not None and any(s == "" for s in v):
            raise ValueError("stop sequences must be non-empty strings")
        return v

    def chat_messages(self) -> list[chat.Message]:
        """`system` as a system message, then the conversation (`Message.to_chat`)."""
        head = [chat_message("system", _text(self.system))] if self.system else []
        return [*head, *(c for m in self.messages for c in m.to_chat())]

    def tool_request(self) -> tuple[list[chat.ToolSpec], str | None, bool | None]:
        """(specs, tool_choice: auto or none, parallel calls)."""
        c = self.tool_choice
        choice = None if c is None else c.type
        parallel = None if c is None or c.disable_parallel_tool_use is None else not c.disable_parallel_tool_use
        return [t.spec() for t in self.tools or ()], choice, parallel

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def stop_list(self) -> list[str] | None:
        return list(self.stop_sequences) if self.stop_sequences else None


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorBody(BaseModel):
    """Anthropic's error body: `{"type": "error", "error": {"type", "message"}}`."""

    type: Literal["error"] = "error"
    error: ErrorDetail


def error_body(err: protocol.APIError) -> dict:
    """A refusal in Anthropic's shape (its error type from the status; the parameter named in the message)."""
    kind = ERROR_TYPES.get(err.status, "api_error")
    message = err.message if not err.param or err.param in err.message else f"{err.param}: {err.message}"
    return ErrorBody(error=ErrorDetail(type=kind, message=message)).model_dump()


def usage(done: Done) -> dict:
    """Both models' tokens: input = SLM + LLM input less the LLM's cache reads (`cache_read_input_tokens`, as
    Anthropic counts them apart), output = SLM + LLM output."""
    u = done.usage
    return {
        "input_tokens": u.slm_in + u.llm_in - u.llm_cached_in,
        "output_tokens": u.slm_out + u.llm_out,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": u.llm_cached_in,
    }


def stop_reason(done: Done) -> str:
    """`tool_use` for an answer with calls, `max_tokens` at the budget, else `end_turn` (a stop sequence that ended
    the answer is reported as end_turn: the engine does not say which of the two stopped it)."""
    if done.finish_reason == "tool_calls":
        return "tool_use"
    return "max_tokens" if done.finish_reason == "length" else "end_turn"


def tool_use(call: chat.ToolCall) -> dict:
    """A `tool_use` content block: one tool call of the answer (its `input` the parsed arguments)."""
    args = call.args()
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": args if isinstance(args, dict) else {}}


def shell(model: str) -> dict:
    return {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 0, "output_tokens": 0},
    }


def body(done: Done, model: str, info: protocol.PyroDashInfo, req: MessagesRequest) -> dict:
    out = shell(model)
    text = [{"type": "text", "text": done.output}] if done.output or not done.tool_calls else []
    out.update(content=[*text, *map(tool_use, done.tool_calls)], stop_reason=stop_reason(done), usage=usage(done))
    return {**out, "pyrodash": info.model_dump()}


class MessagesWriter:
    """Anthropic's stream (`pyrodash.server.front`'s writer): message_start, content_block_start, ping,
    content_block_delta (text_delta)..., content_block_stop, message_delta (stop_reason, usage, and the `pyrodash`
    object), message_stop. A tagged delta (`pyrodash.sources`) carries `pyrodash: {source}`; the handoff is an empty
    text_delta with `pyrodash: {source: "handoff", handoff: N}`."""

    END = ""
    DELTA_PRE = (
        'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":'
    )

    def __init__(self, model: str, req: MessagesRequest) -> None:
        self.start = shell(model)

    @staticmethod
    def event(kind: str, **fields) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    def opening(self) -> list[str]:
        return [
            self.event("message_start", message=self.start),
            self.event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            self.event("ping"),
        ]

    def delta(self, text: str) -> str:
        return f"{self.DELTA_PRE}{encode_basestring(text)}}}}}\n\n"

    def tagged(self, text: str, pyrodash: dict) -> str:
        return self.event("content_block_delta", index=0, delta={"type": "text_delta", "text": text}, pyrodash=pyrodash)

    def closing(self, done: Done, info) -> list[str]:
        delta = {"stop_reason": stop_reason(done), "stop_sequence": None}
        out = [self.event("content_block_stop", index=0)]
        for k, call in enumerate(done.tool_calls, start=1):  # each call a block: start, its input as one delta, stop
            block = tool_use(call)
            out += [
                self.event("content_block_start", index=k, content_block={**block, "input": {}}),
                self.event("content_block_delta", index=k, delta={"type": "input_json_delta",
                                                                  "partial_json": json.dumps(block["input"])}),
                self.event("content_block_stop", index=k),
            ]  # fmt: skip
        return [
            *out,
            self.event("message_delta", delta=delta, usage=usage(done), pyrodash=info()),
            self.event("message_stop"),
        ]

    @staticmethod
    def failure(err: protocol.APIError) -> str:
        return f"event: error\ndata: {json.dumps(error_body(err))}\n\n"


FRONT = Front(
    route="/v1/messages",
    wire=MessagesRequest,
    operation="chat",
    convert=lambda app, req: validation.engine_request(app, req, "chat"),
    body=body,
    writer=MessagesWriter,
    error_body=error_body,
    error_model=ErrorBody,
)
