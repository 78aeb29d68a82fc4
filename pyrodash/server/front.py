"""A wire API the server speaks in front of the one engine (a `Front`): its route, its request model, how a
validated request becomes the engine's `EngineRequest`, its answer's body, its event-stream writer and its error body.
`pyrodash.server.serving.ServingCompletions` runs every front the same way (validate, pace, trace, run, answer).

    CHAT, TEXT                   OpenAI's /v1/chat/completions and /v1/completions (here)
    responses_api.FRONT          OpenAI's Responses API, /v1/responses
    messages_api.FRONT           Anthropic's Messages API, /v1/messages

A stream writer (`ChunkWriter` for chat and text) has `opening()`, `delta(text)`, `tagged(text, pyrodash)`,
`closing(done, info)` (the events after the last delta; `info()` is the `pyrodash` object as a dict), `failure(err)`
(an error after the status line) and `END` (what ends the body).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from fastapi import FastAPI
from pydantic import BaseModel, Field

from pyrodash import chat
from pyrodash.engine import EngineRequest
from pyrodash.events import Done
from pyrodash.server import protocol, validation
from pyrodash.server.sse import ChunkWriter


@dataclass(frozen=True)
class Front:
    """One wire API: what differs between the completion routes (the rest is `ServingCompletions`)."""

    route: str
    wire: type[BaseModel]
    operation: str  # the trace's gen_ai.operation.name
    convert: Callable[[FastAPI, BaseModel], tuple[str, EngineRequest]]  # (model name, the engine's request) or 4xx
    body: Callable[[Done, str, protocol.PyroDashInfo, BaseModel], dict]  # the unary answer, as JSON
    writer: Callable[[str, BaseModel], object]  # the stream's event writer for (model, request)
    error_body: Callable[[protocol.APIError], dict] = protocol.APIError.body
    answer: type[BaseModel] | None = None  # the unary answer's model (OpenAPI)
    error_model: type[BaseModel] = protocol.ErrorResponse  # the error body's model (OpenAPI)


class FrontRequest(protocol._Strict):
    """What another wire API's request gives `validation.engine_request`, beside its own fields: the model, the
    sampling fields and PyroDash's extras (as a chat request has them), its messages as chat messages
    (`chat_messages()`), its joint budget (`requested_max_tokens()`, named `BUDGET_PARAM` on the wire) and its stop
    strings (`stop_list()`). `API_FIELDS`: the top-level fields its API documents (others are refused by name unless
    `allow_unknown_fields`); `UNSUPPORTED`: its fields the engine cannot honour, refused by name unless neutral."""

    API_FIELDS: ClassVar[frozenset[str]] = frozenset()
    UNSUPPORTED: ClassVar[dict[str, tuple[tuple, str]]] = {}
    PARTS: ClassVar[tuple[type[BaseModel], ...]] = ()
    BUDGET_PARAM: ClassVar[str] = "max_tokens"
    seed: ClassVar[None] = None  # (no seed in these APIs)

    model: str | None = None  # an operating point listed by /v1/models; None = the server's default
    stream: bool | None = False
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    # PyroDash extras, as on chat: the SLM's <offload> bias, each model's own cap, mode / stream sources / range
    offload_bias: float | None = Field(None, ge=-100.0, le=100.0, allow_inf_nan=False)
    max_tokens_per_model: protocol.PositiveInt | None = Field(
        None, description="PyroDash: at most this many output tokens from each model (SLM, LLM)."
    )
    pyrodash: protocol.PyroDashOptions | None = None

    def chat_messages(self) -> list[chat.Message]:
        raise NotImplementedError

    def requested_max_tokens(self) -> int | None:
        raise NotImplementedError

    def stop_list(self) -> list[str] | None:
        return None


def chat_message(role: str, text: str) -> chat.Message:
    """A chat message the engine takes (from another API's already validated message)."""
    return chat.Message("system" if role == "developer" else role, text)


def text_only(value: object, param: str, parts: tuple[str, ...], why: str) -> None:
    """400 naming the first content part of `value` (a list of parts, as sent) whose `type` is another than `parts`
    (an image, a file, a tool result ...); anything else is left to the request model's own validation."""
    for j, part in enumerate(value if isinstance(value, list) else ()):
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(kind, str) and kind not in parts:
            raise protocol.APIError(
                400,
                f"{param}.{j}.type: content of type {kind[:40]!r} is not supported ({why}); send "
                f"{' or '.join(parts)} parts.",
                param=f"{param}.{j}.type",
                code="unsupported_value",
            )


def tool_types(value: object, allowed: tuple[str | None, ...], kind: str, send: str) -> object:
    """`value` (a request's `tools`, as sent), or a 400 naming the first tool whose `type` is not `allowed` (the
    API's hosted or server tools: `kind`, with what to `send` instead)."""
    for i, tool in enumerate(value if isinstance(value, list) else ()):
        t = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(t, str) and t not in allowed:
            raise protocol.APIError(
                400,
                f"tools.{i}.type: {kind} ({t[:40]!r}) are not supported; send {send}.",
                param=f"tools.{i}.type",
                code="unsupported_value",
            )
    return value


def sources(req: BaseModel) -> bool:
    """Whether the request asked each streamed delta to say who wrote it (`pyrodash.sources`)."""
    opts = getattr(req, "pyrodash", None)
    return bool(opts and opts.sources)


def _include_usage(req: BaseModel) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _chat_body(done: Done, model: str, info: protocol.PyroDashInfo, req: BaseModel) -> dict:
    calls = [c.wire() for c in done.tool_calls] or None
    message = protocol.ResponseMessage(content=done.output or (None if calls else ""), tool_calls=calls)
    choice = protocol.Choice(message=message, finish_reason=done.finish_reason)
    usage = protocol.UsageInfo.from_done(done)
    body = protocol.ChatCompletion(
        id=protocol.new_id(), created=protocol.now(), model=model, choices=[choice], usage=usage, pyrodash=info
    ).model_dump()
    if calls is None:  # (a message without calls carries no `tool_calls` key, as OpenAI's)
        del body["choices"][0]["message"]["tool_calls"]
    return body


def _text_body(done: Done, model: str, info: protocol.PyroDashInfo, req: BaseModel) -> dict:
    choice = protocol.CompletionChoice(text=done.output, finish_reason=done.finish_reason)
    usage = protocol.UsageInfo.from_done(done)
    body = protocol.Completion(
        id=protocol.new_id("cmpl"), created=protocol.now(), model=model, choices=[choice], usage=usage, pyrodash=info
    )
    return body.model_dump()


CHAT = Front(
    route="/v1/chat/completions",
    wire=protocol.ChatCompletionRequest,
    operation="chat",
    convert=lambda app, req: validation.engine_request(app, req, "chat"),
    body=_chat_body,
    writer=lambda model, req: ChunkWriter(protocol.new_id(), protocol.now(), model, "chat", _include_usage(req)),
    answer=protocol.ChatCompletion,
)
TEXT = Front(
    route="/v1/completions",
    wire=protocol.CompletionRequest,
    operation="text_completion",
    convert=lambda app, req: validation.engine_request(app, req, "text"),
    body=_text_body,
    writer=lambda model, req: ChunkWriter(protocol.new_id("cmpl"), protocol.now(), model, "text", _include_usage(req)),
    answer=protocol.Completion,
)
