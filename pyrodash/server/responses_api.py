"""OpenAI's Responses API (POST /v1/responses) in front of the engine: the request (`ResponsesRequest`), its
conversion into the engine's request (`instructions` and `input` as chat messages), the response object and its
event stream (`ResponsesWriter`). docs/serving.md.

`input` is a string or a list of items: messages whose content is a string or text parts, and a tool loop's
`function_call` and `function_call_output` items; `tools` are function tools (the answer's calls come back as
`function_call` output items). Hosted tools, stored responses (`previous_response_id`, `conversation`), files and
images, reasoning and background runs are refused by name (400). `max_output_tokens` is the joint answer's TOTAL
budget (SLM + LLM); `temperature` omitted is 0 (greedy).
"""

from __future__ import annotations

import json
import uuid
from json.encoder import encode_basestring
from typing import Annotated, Literal

from pydantic import Field, field_validator

from pyrodash import chat
from pyrodash.events import Done
from pyrodash.server import protocol, validation
from pyrodash.server.front import Front, FrontRequest, chat_message, text_only, tool_types

_PARTS = ("input_text", "output_text")  # text parts (output_text: an earlier assistant turn's)
_ITEMS = ("message", "function_call", "function_call_output")  # the input items a tool loop sends
_NO_STORE = "this server keeps no responses or conversations: send the whole conversation in `input`"


class InputText(protocol._Strict):
    """A text part of an input message (`input_text`; `output_text` in an earlier assistant turn)."""

    type: Literal[_PARTS]
    text: str


class InputMessage(protocol._Strict):
    """An input item: a message with text content (`type` "message" or omitted, as the SDKs send it)."""

    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[InputText]

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class FunctionCallItem(protocol._Strict):
    """An earlier answer's tool call, sent back in `input` (as the Agents SDK does)."""

    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None


class FunctionCallOutput(protocol._Strict):
    """A tool's result for the call `call_id`."""

    type: Literal["function_call_output"]
    call_id: str
    output: str
    id: str | None = None
    status: str | None = None


class FunctionTool(protocol._Strict):
    """A function the model may call (the Responses API's flat tool shape)."""

    type: Literal["function"]
    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None

    def spec(self) -> chat.ToolSpec:
        params = self.parameters if self.parameters is not None else {"type": "object", "properties": {}}
        return chat.ToolSpec(self.name, self.description or "", params)


class TextFormat(protocol._Strict):
    type: Literal["text"]


class TextConfig(protocol._Strict):
    format: TextFormat | None = None
    verbosity: Literal["medium"] | None = None


class ResponsesRequest(FrontRequest):
    """POST /v1/responses: what PyroDash honours, the metadata it accepts without effect, and the rest declared with
    its neutral value only (`UNSUPPORTED` refuses anything else by name)."""

    API_FIELDS = frozenset(
        {"background", "conversation", "include", "input", "instructions", "max_output_tokens", "max_tool_calls",
         "metadata", "model", "parallel_tool_calls", "previous_response_id", "prompt", "prompt_cache_key",
         "prompt_cache_retention", "reasoning", "safety_identifier", "service_tier", "store", "stream",
         "stream_options", "temperature", "text", "tool_choice", "tools", "top_logprobs", "top_p", "truncation",
         "user"}
    )  # fmt: skip
    UNSUPPORTED = {
        "max_tool_calls": ((None,), "max_tool_calls is not supported (each request is one answer)"),
        "previous_response_id": ((None,), _NO_STORE),
        "conversation": ((None,), _NO_STORE),
        "prompt": ((None,), "stored prompts are not supported: send `instructions` and `input`"),
        "reasoning": ((None,), "reasoning options are not supported"),
        "include": ((None, []), "no extra output (include) is produced"),
        "background": ((None, False), "background responses are not supported"),
        "top_logprobs": ((None, 0), "logprobs are not supported by the Collaborate Engine"),
    }
    PARTS = (InputMessage, InputText, TextConfig, TextFormat, FunctionCallItem, FunctionCallOutput, FunctionTool)
    BUDGET_PARAM = "max_output_tokens"

    input: (
        Annotated[str, Field(min_length=1)]
        | Annotated[list[InputMessage | FunctionCallItem | FunctionCallOutput], Field(min_length=1)]
    )
    instructions: str | None = None
    max_output_tokens: protocol.PositiveInt | None = Field(
        None, description="The TOTAL output budget of the joint answer (SLM + LLM tokens)."
    )
    temperature: float | None = Field(
        None, ge=0.0, le=2.0, allow_inf_nan=False, description="Omitted or null: 0 (greedy), unlike OpenAI's 1."
    )
    text: TextConfig | None = None
    truncation: Literal["auto", "disabled"] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto"] | None = None  # (a forced call: `validation.forced_tool_choice`)
    include: list[str] | None = Field(None, max_length=0)
    parallel_tool_calls: bool | None = None
    stream_options: dict | None = None
    # OpenAI metadata fields: accepted, no effect on the answer (nothing is stored)
    metadata: dict[str, str] | None = None
    store: bool | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _text_items_only(cls, v: object) -> object:
        """400 naming the first input item that is not a message (a tool call, a reasoning item, a reference) or a
        content part that is not text (an image, a file, audio), before the union's own errors."""
        for i, item in enumerate(v if isinstance(v, list) else ()):
            kind = item.get("type", "message") if isinstance(item, dict) else "message"
            if isinstance(kind, str) and kind not in _ITEMS:
                raise protocol.APIError(
                    400,
                    f"input.{i}.type: input items of type {kind[:40]!r} are not supported (reasoning items, item "
                    "references, hosted tools' calls); send messages, function_call and function_call_output items.",
                    param=f"input.{i}.type",
                    code="unsupported_value",
                )
            if isinstance(item, dict) and kind == "message":
                text_only(item.get("content"), f"input.{i}.content", _PARTS, "files, images and audio")
        return v

    @field_validator("tools", mode="before")
    @classmethod
    def _function_tools_only(cls, v: object) -> object:
        return tool_types(v, ("function",), "hosted tools", "function tools")

    def chat_messages(self) -> list[chat.Message]:
        """`instructions` as a system message, then `input` (a string: one user message); a run of function_call
        items is one assistant message's calls (after that message's text, when it came just before), and each
        function_call_output a tool message."""
        out = [chat_message("system", self.instructions)] if self.instructions else []
        if isinstance(self.input, str):
            return [*out, chat_message("user", self.input)]
        for item in self.input:
            if isinstance(item, FunctionCallOutput):
                out.append(chat.Message("tool", item.output, tool_call_id=item.call_id))
            elif isinstance(item, FunctionCallItem):
                call = chat.ToolCall(item.call_id, item.name, item.arguments)
                prev = out.pop() if out and out[-1].role == "assistant" else chat.Message("assistant")
                out.append(chat.Message("assistant", prev.content, tool_calls=(*prev.tool_calls, call)))
            else:
                out.append(chat_message(item.role, item.text()))
        return out

    def tool_request(self) -> tuple[list[chat.ToolSpec], str | None, bool | None]:
        return [t.spec() for t in self.tools or ()], self.tool_choice, self.parallel_tool_calls

    def requested_max_tokens(self) -> int | None:
        return self.max_output_tokens


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def usage(done: Done) -> dict:
    """Both models' tokens together (as chat's `usage`): input = SLM + LLM input, output = SLM + LLM output."""
    u = done.usage
    given, out = u.slm_in + u.llm_in, u.slm_out + u.llm_out
    return {
        "input_tokens": given,
        "input_tokens_details": {"cached_tokens": u.llm_cached_in},
        "output_tokens": out,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": given + out,
    }


def shell(rid: str, model: str, req: ResponsesRequest) -> dict:
    """The response object before any output (`status` in_progress): what the stream's first events carry."""
    temperature = req.temperature if req.temperature is not None else protocol.DEFAULT_TEMPERATURE
    return {
        "id": rid,
        "object": "response",
        "created_at": protocol.now(),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": _choice(req),
        "tools": [t.model_dump(exclude_none=True) for t in req.tools or ()],
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "truncation": req.truncation or "disabled",
        "usage": None,
        "user": req.user,
        "metadata": req.metadata or {},
    }


def _choice(req: ResponsesRequest) -> str:
    return req.tool_choice or ("auto" if req.tools else "none")


def call_item(call: chat.ToolCall, status: str = "completed") -> dict:
    """A `function_call` output item: one tool call of the answer (`call_id` is what its output names)."""
    fid = "fc_" + call.id.removeprefix("call_")
    return {"id": fid, "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": call.arguments}  # fmt: skip


def message_item(mid: str, text: str, status: str) -> dict:
    """The one assistant message of the output, with its one output_text part."""
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return {"id": mid, "type": "message", "status": status, "role": "assistant", "content": [part]}


def finished(base: dict, mid: str, done: Done, info: dict) -> dict:
    """The response object once the run is done: completed, or incomplete at the token budget."""
    cut = done.finish_reason == "length"
    status = "incomplete" if cut else "completed"
    return {
        **base,
        "status": status,
        "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
        "output": [message_item(mid, done.output, status), *(call_item(c) for c in done.tool_calls)],
        "output_text": done.output,
        "usage": usage(done),
        "pyrodash": info,
    }


def body(done: Done, model: str, info: protocol.PyroDashInfo, req: ResponsesRequest) -> dict:
    return finished(shell(new_id("resp"), model, req), new_id("msg"), done, info.model_dump())


class ResponsesWriter:
    """The Responses API's stream (`pyrodash.server.front`'s writer): response.created, response.in_progress,
    response.output_item.added, response.content_part.added, response.output_text.delta..., response.output_text.done,
    response.content_part.done, response.output_item.done, response.completed (or response.incomplete), each with
    its `sequence_number`; text deltas from a precomputed template (the hot path). A tagged delta (`pyrodash.sources`)
    carries `pyrodash: {source}`; the handoff is an empty delta with `pyrodash: {source: "handoff", handoff: N}`."""

    END = ""

    def __init__(self, model: str, req: ResponsesRequest) -> None:
        self.seq, self.mid = 0, new_id("msg")
        self.base = shell(new_id("resp"), model, req)
        self.at = {"item_id": self.mid, "output_index": 0, "content_index": 0}
        self.delta_pre = (
            'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            f'"item_id":"{self.mid}","output_index":0,"content_index":0,"delta":'
        )

    def event(self, kind: str, **fields) -> str:
        self.seq += 1
        data = json.dumps({"type": kind, **fields, "sequence_number": self.seq - 1})
        return f"event: {kind}\ndata: {data}\n\n"

    def opening(self) -> list[str]:
        item = {**message_item(self.mid, "", "in_progress"), "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return [
            self.event("response.created", response=self.base),
            self.event("response.in_progress", response=self.base),
            self.event("response.output_item.added", output_index=0, item=item),
            self.event("response.content_part.added", **self.at, part=part),
        ]

    def delta(self, text: str) -> str:
        self.seq += 1
        return f'{self.delta_pre}{encode_basestring(text)},"logprobs":[],"sequence_number":{self.seq - 1}}}\n\n'

    def tagged(self, text: str, pyrodash: dict) -> str:
        return self.event("response.output_text.delta", **self.at, delta=text, logprobs=[], pyrodash=pyrodash)

    def closing(self, done: Done, info) -> list[str]:
        final = finished(self.base, self.mid, done, info())
        item = final["output"][0]
        out = [
            self.event("response.output_text.done", **self.at, text=done.output, logprobs=[]),
            self.event("response.content_part.done", **self.at, part=item["content"][0]),
            self.event("response.output_item.done", output_index=0, item=item),
        ]
        for k in range(1, len(done.tool_calls) + 1):
            out += self._call_events(k, final["output"][k])
        return [*out, self.event(f"response.{final['status']}", response=final)]

    def _call_events(self, index: int, item: dict) -> list[str]:
        """One function_call item's events: added (no arguments yet), its arguments as one delta, done."""
        at = {"item_id": item["id"], "output_index": index}
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item={**item, "arguments": "", "status": "in_progress"},
            ),
            self.event("response.function_call_arguments.delta", **at, delta=item["arguments"]),
            self.event("response.function_call_arguments.done", **at, arguments=item["arguments"]),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def failure(self, err: protocol.APIError) -> str:
        """An error after the status line: the `error` event, then response.failed."""
        failed = {**self.base, "status": "failed", "error": {"code": err.code or err.type, "message": err.message}}
        return self.event("error", code=err.code, message=err.message, param=err.param) + self.event(
            "response.failed", response=failed
        )


FRONT = Front(
    route="/v1/responses",
    wire=ResponsesRequest,
    operation="chat",
    convert=lambda app, req: validation.engine_request(app, req, "chat"),
    body=body,
    writer=ResponsesWriter,
)
