"""The typed conversation and the typed answer: what every wire API converts its request into, and what the engine's
`Done` carries back as blocks (text, tool calls) with its finish reason.

    tools = Tools.of([ToolSpec("lookup", "Look a value up", {"type": "object", ...})], ToolChoice("auto"))
    msgs = [Message("user", "What is g(3)?"),
            Message("assistant", "", tool_calls=(ToolCall("call_1", "lookup", '{"x": 3}'),)),
            Message("tool", "7", tool_call_id="call_1")]
    dicts = to_dicts(msgs)           # the OpenAI-shaped dicts the engine, the backends and chat templates read
    text = render_chat(tokenizer, dicts, tools.schemas())   # the one place a chat template is rendered

A tool call's `arguments` is JSON text, as on OpenAI's wire; `template_messages` gives a chat template the parsed
object (what Hugging Face templates expect). `by` says which model wrote a call ("slm" or "llm"; "" for a call a
client sent back in its history). docs/serving.md#tools.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

from jinja2 import TemplateError

ROLES = ("system", "user", "assistant", "tool")
CHOICES = ("auto", "none")  # a choice that forces a call is refused at the wire (the engine cannot promise one)


@dataclass(frozen=True)
class ToolSpec:
    """A function the model may call: its name, what it does, and its parameters' JSON schema."""

    name: str
    description: str = ""
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})

    def schema(self) -> dict:
        """OpenAI's function-tool shape (what chat templates and chat endpoints take)."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolChoice:
    """Whether the model may call a tool: "auto" (it decides) or "none" (it may not: no tool is shown to it)."""

    mode: str = "auto"

    def __post_init__(self) -> None:
        if self.mode not in CHOICES:
            raise ValueError(f"tool_choice {self.mode!r}: use one of {', '.join(CHOICES)}")


@dataclass(frozen=True)
class Tools:
    """The tools of one request: the specs, the choice, and whether several calls may come in one answer."""

    specs: tuple[ToolSpec, ...] = ()
    choice: ToolChoice = ToolChoice()
    parallel: bool = True

    @classmethod
    def of(cls, specs, choice: ToolChoice | None = None, parallel: bool | None = None) -> Tools | None:
        """The request's tools, or None when there are none to offer (no specs, or tool_choice "none")."""
        choice = choice or ToolChoice()
        if not specs or choice.mode == "none":
            return None
        return cls(tuple(specs), choice, True if parallel is None else bool(parallel))

    def schemas(self) -> list[dict]:
        return [s.schema() for s in self.specs]


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    """One call of a function: its id, name and arguments (JSON text), and which model wrote it."""

    id: str
    name: str
    arguments: str = "{}"
    by: str = ""

    def args(self) -> object:
        """The arguments as JSON (a dict for any well-formed call); the text itself when it does not parse."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments

    def wire(self) -> dict:
        """OpenAI's `tool_calls` entry."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}

    def record(self) -> dict:
        """The record's form: id, name, arguments, by."""
        return {"id": self.id, "name": self.name, "arguments": self.arguments, "by": self.by}


@dataclass(frozen=True)
class Message:
    """One message of a conversation: system, user, assistant (text and/or tool calls), or a tool's result."""

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None  # a tool message: the call it answers
    name: str | None = None  # a tool message: the function's name, where the wire gave it

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"message role {self.role!r}: use one of {', '.join(ROLES)}")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant message carries tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool message needs its tool_call_id (and only a tool message has one)")

    def to_dict(self) -> dict:
        d: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            d["tool_calls"] = [c.wire() for c in self.tool_calls]
        if self.tool_call_id is not None:
            d["tool_call_id"] = self.tool_call_id
            if self.name:
                d["name"] = self.name
        return d


def to_dicts(messages) -> list[dict]:
    """A conversation as the OpenAI-shaped dicts the engine and the backends read (dicts pass through)."""
    return [m.to_dict() if isinstance(m, Message) else m for m in messages]


def has_tool_turns(messages: list[dict]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def template_messages(messages: list[dict]) -> list[dict]:
    """`messages` as a chat template reads them: each tool call's arguments parsed into an object (Hugging Face
    templates write `arguments | tojson`), the rest unchanged."""
    out = []
    for m in messages:
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for c in calls:
                fn = dict(c.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args)
                    except ValueError:
                        pass  # (a malformed call from history is shown as its text)
                fixed.append({**c, "function": fn})
            m = {**m, "tool_calls": fixed}
        out.append(m)
    return out


class TemplateRefused(ValueError):
    """A model's chat template cannot show this conversation: tools it has no place for, or a role it refuses. A
    property of the model, not of the request's shape (the server's 400 `unsupported_for_model`)."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param  # the request field it concerns: "tools" or "messages"


def render_chat(tokenizer, messages: list[dict], tools: list[dict] | None = None, generation: bool = True) -> str:
    """The one rendering of a chat template: `tokenizer.apply_chat_template` over `messages` (tool calls' arguments
    as objects) with the request's `tools` (OpenAI function schemas; None: no tools), as text. A template that
    cannot show tools or a tool turn raises `TemplateRefused` naming what it refused."""
    kwargs = {"tokenize": False, "add_generation_prompt": generation}
    template = getattr(tokenizer, "chat_template", None)
    if tools:
        if isinstance(template, str) and "tools" not in template:
            raise TemplateRefused(
                "this model's chat template shows no tools, so it cannot be offered any: serve a model whose template "
                "takes `tools`, or send the request without them",
                "tools",
            )
        kwargs["tools"] = tools
    shown = template_messages(messages) if has_tool_turns(messages) else messages
    try:
        return tokenizer.apply_chat_template(shown, **kwargs)
    except TemplateError as e:  # (a role or a field the template refuses)
        raise TemplateRefused(f"the model's chat template refused the conversation: {e}", "messages") from e


CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # a call's markup in Hermes-style templates


def without_open_call(text: str) -> str:
    """`text` less a tool call left open at its end (`<tool_call>` with no `</tool_call>` after it): what a retry or
    a mesh takeover continues, so that the call is written again whole, never continued half-way."""
    start = text.rfind(CALL_OPEN)
    return text[:start] if start >= 0 and text.find(CALL_CLOSE, start) < 0 else text


@dataclass(frozen=True)
class TextBlock:
    text: str


def answer_blocks(text: str, calls: list[ToolCall]) -> list[TextBlock | ToolCall]:
    """An answer as ordered blocks: its text (when there is any), then its tool calls (as every wire orders them)."""
    return ([TextBlock(text)] if text else []) + list(calls)
