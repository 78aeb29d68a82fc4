"""How an HTTP LLM continues a partial trace: the request body and the stream parser of each continuation mode.

    wire = Wire("continue")                       # or completion | instruct | prefix | anthropic
    path, body = build_request(wire, req, model="llm", render=None)
    state = StreamState(); state.feed(json_event)  # -> text delta; then state.finish / stop_reason / usage

Modes: `continue` (vLLM / SGLang chat continuation), `completion` (raw `/v1/completions`), `instruct` (plain chat),
`prefix` (DeepSeek's prefix completion), `anthropic` (the Messages API, an assistant prefill). `Wire` also holds what
the start-up probe learned about the endpoint. Each mode's request and the sampling fields sent: docs/internals.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

from pyrodash.backends.base import GenRequest
from pyrodash.chat import ToolCall, new_call_id

MODES = ("continue", "completion", "instruct", "prefix", "anthropic")
CONTINUE_NOTE = "Continue your previous message from exactly where it stops; do not repeat it."
ANTHROPIC_VERSION = "2023-06-01"
BIAS_LIMIT = 100.0
NEUTRAL_TOP_P = 1.0  # GenRequest's default, no nucleus cut: left out of request bodies (the server's default applies)


@dataclass
class Wire:
    mode: str = "continue"
    max_tokens_field: str = "max_tokens"
    dropped: set[str] = field(default_factory=set)  # request fields the endpoint rejected
    prefill: bool = True  # anthropic: the model accepts an assistant prefill

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"continuation mode {self.mode!r}: use one of {', '.join(MODES)} (or auto)")

    @property
    def continues_prefix(self) -> bool:
        """True when the endpoint continues an assistant prefix token for token (else: hand off as instruct)."""
        if self.mode == "anthropic":
            return self.prefill
        return self.mode != "instruct"

    def describe(self) -> str:
        extra = [f"{self.max_tokens_field}"] if self.max_tokens_field != "max_tokens" else []
        extra += [f"without {f}" for f in sorted(self.dropped)]
        if self.mode == "anthropic" and not self.prefill:
            extra.append("no prefill: instruct form")
        return self.mode + (f" ({', '.join(extra)})" if extra else "")


def build_request(
    wire: Wire, req: GenRequest, model: str, render: Callable[[list[dict]], str] | None = None
) -> tuple[str, dict]:
    """(path relative to the base URL, JSON body) of the streamed request for `req` in `wire`'s mode."""
    if wire.mode == "anthropic":
        return "/messages", _anthropic_body(wire, req, model)
    if wire.mode == "completion":
        if render is None:
            raise ValueError("completion mode renders the chat template locally: give tokenizer: DIR in the spec")
        body: dict = {
            "model": model,
            "prompt": (render(req.messages, req.tools) if req.messages else "") + req.prefix,
            "max_tokens": req.max_tokens,
        }  # (tools: in the rendered prompt; the engine reads the calls from the text)
        path = "/completions"
    else:
        msgs = list(req.messages)
        if req.prefix:
            if wire.mode == "continue":
                msgs.append({"role": "assistant", "content": req.prefix})
            elif wire.mode == "prefix":
                msgs.append({"role": "assistant", "content": req.prefix, "prefix": True})
            else:  # instruct: no extension field can continue the prefix; ask for it in words
                msgs += [{"role": "assistant", "content": req.prefix}, {"role": "user", "content": CONTINUE_NOTE}]
        body = {"model": model, "messages": msgs, wire.max_tokens_field: req.max_tokens}
        if req.prefix and wire.mode == "continue":
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if req.tools:  # the server's own tool parser returns structured calls (`delta.tool_calls`)
            body["tools"] = list(req.tools)
        path = "/chat/completions"
    body.update({"temperature": req.temperature, "stream": True, "stream_options": {"include_usage": True}})
    if req.top_p != NEUTRAL_TOP_P:  # sent only when set: Anthropic (also behind a proxy) refuses it with temperature
        body["top_p"] = req.top_p
    if req.seed is not None:
        body["seed"] = req.seed
    if req.stop:
        body["stop"] = list(req.stop)
    if req.stop_token_ids:
        body["stop_token_ids"] = list(req.stop_token_ids)
    if req.logit_bias:
        body["logit_bias"] = {str(k): max(-BIAS_LIMIT, min(BIAS_LIMIT, v)) for k, v in req.logit_bias.items()}
    if req.top_logprobs > 0 and wire.mode == "completion":
        body["logprobs"] = req.top_logprobs
    elif req.top_logprobs > 0:
        body["logprobs"] = True
        body["top_logprobs"] = req.top_logprobs
    for f in wire.dropped:
        body.pop(f, None)
    return path, body


def _anthropic_message(m: dict) -> dict:
    """A chat message in the Messages API's shape: an assistant's calls as `tool_use` blocks, a tool result as a
    user's `tool_result` block."""
    if m.get("role") == "tool":
        block = {"type": "tool_result", "tool_use_id": m.get("tool_call_id"), "content": str(m.get("content") or "")}
        return {"role": "user", "content": [block]}
    if not m.get("tool_calls"):
        return {"role": m["role"], "content": m["content"]}
    blocks = [{"type": "text", "text": m["content"]}] if m.get("content") else []
    for c in m["tool_calls"]:
        args = c["function"]["arguments"]
        blocks.append({"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                       "input": json.loads(args) if isinstance(args, str) else args})  # fmt: skip
    return {"role": "assistant", "content": blocks}


def _anthropic_body(wire: Wire, req: GenRequest, model: str) -> dict:
    system = "\n\n".join(str(m["content"]) for m in req.messages if m.get("role") == "system")
    msgs = [_anthropic_message(m) for m in req.messages if m.get("role") != "system"]
    if not msgs and req.prefix:
        msgs = [{"role": "user", "content": CONTINUE_NOTE}]
    if req.prefix:
        prefill = req.prefix.rstrip()  # "final assistant content cannot end with trailing whitespace"
        if wire.prefill and prefill:
            msgs.append({"role": "assistant", "content": prefill})
        elif prefill:
            msgs += [{"role": "assistant", "content": prefill}, {"role": "user", "content": CONTINUE_NOTE}]
    body: dict = {
        "model": model,
        "max_tokens": req.max_tokens,
        "messages": msgs,
        "stream": True,
        "temperature": req.temperature,
    }  # not top_p too: newer models refuse both at once
    if system:
        body["system"] = system
    if req.tools:
        body["tools"] = [
            {"name": t["function"]["name"], "description": t["function"].get("description", ""),
             "input_schema": t["function"].get("parameters") or {"type": "object"}}
            for t in req.tools
        ]  # fmt: skip
    sent = [x for x in req.stop if x not in client_stops(wire, req)]
    if sent:
        body["stop_sequences"] = sent
    for f in wire.dropped:
        body.pop(f, None)
    return body


def client_stops(wire: Wire, req: GenRequest) -> list[str]:
    """The stop strings the client enforces alone: with an Anthropic prefill that lost trailing whitespace, a
    whitespace stop (a relay's `"\n\n"`) would match the whitespace the model writes back first and end the call
    empty, so it is not sent; the stream is read from the first non-blank text and cut at the next one
    (`openai_compat._StreamReader`)."""
    if not trimmed_prefill(wire, req):
        return []
    return [x for x in req.stop if x and not x.strip()]


def trimmed_prefill(wire: Wire, req: GenRequest) -> str:
    """The trailing whitespace an Anthropic prefill lost (the continuation then starts without it)."""
    if wire.mode != "anthropic" or not wire.prefill or not req.prefix:
        return ""
    return req.prefix[len(req.prefix.rstrip()) :]


@dataclass
class StreamState:
    """Reads one streamed response (OpenAI chat / completions chunks or Anthropic events)."""

    finish: str | None = None
    stop_reason: object = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    error: str | None = None
    calls: dict = field(default_factory=dict)  # index -> {id, name, arguments}: structured tool calls as they stream
    odd_usage: bool = False  # a reported count was not a non-negative integer (left out: counted or bounded instead)

    def tool_calls(self) -> list[ToolCall]:
        """The structured calls the stream carried (a chat endpoint's `delta.tool_calls`, Anthropic's `tool_use`)."""
        return [ToolCall(c["id"] or new_call_id(), c["name"], c["arguments"] or "{}", "llm") for _, c in
                sorted(self.calls.items())]  # fmt: skip

    def _count(self, usage: dict, key: str, default: int | None) -> int | None:
        """A token count the server reported (`usage[key]`, else `default` when it gave none): a non-negative
        integer, or None when it is not one (negative, fractional, NaN, a string: `odd_usage`), so that the reader
        counts or bounds it instead and marks the usage estimated."""
        if key not in usage:
            return default
        v = usage[key]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not (v >= 0 and math.isfinite(v) and v == int(v)):
            self.odd_usage = True
            return None
        return int(v)

    def _call(self, index: int) -> dict:
        return self.calls.setdefault(index, {"id": "", "name": "", "arguments": ""})

    def feed(self, obj: dict) -> tuple[str, list[dict] | None]:
        """(text delta, top logprobs) of one event; sets `error` on an error event."""
        kind = obj.get("type")
        if kind is not None and kind != "error" and "choices" not in obj:
            return self._anthropic(obj)
        if "error" in obj:
            err = obj["error"]
            self.error = str(err.get("message", err) if isinstance(err, dict) else err)[:500]
            return "", None
        if obj.get("usage"):
            u = obj["usage"]
            self.prompt_tokens = self._count(u, "prompt_tokens", self.prompt_tokens)
            self.completion_tokens = self._count(u, "completion_tokens", self.completion_tokens)
            details = u.get("prompt_tokens_details") or {}
            details = details if isinstance(details, dict) else {}
            cached = self._count(details, "cached_tokens", None) if "cached_tokens" in details else None
            cached = cached if cached is not None else self._count(u, "prompt_cache_hit_tokens", None)  # DeepSeek
            if cached is not None:
                self.cached_tokens = cached
        text, lps = "", None
        for choice in obj.get("choices") or []:
            text += choice.get("text") or (choice.get("delta") or {}).get("content") or ""
            for tc in (choice.get("delta") or {}).get("tool_calls") or []:
                c, fn = self._call(tc.get("index", 0)), tc.get("function") or {}
                c["id"] += tc.get("id") or ""
                c["name"] += fn.get("name") or ""
                c["arguments"] += fn.get("arguments") or ""
            lp = choice.get("logprobs") or {}
            if lp.get("content"):  # chat format
                lps = [{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []} for c in lp["content"]]
            elif lp.get("top_logprobs"):  # completions format
                lps = [dict(d or {}) for d in lp["top_logprobs"]]
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                self.stop_reason = choice.get("stop_reason")
        return text, lps

    def _anthropic(self, obj: dict) -> tuple[str, None]:
        kind = obj["type"]
        if kind == "message_start":
            u = (obj.get("message") or {}).get("usage") or {}
            cached = self._count(u, "cache_read_input_tokens", 0) or 0
            created = self._count(u, "cache_creation_input_tokens", 0) or 0
            given = self._count(u, "input_tokens", 0)
            self.prompt_tokens = None if given is None else given + cached + created
            self.cached_tokens = cached
            self.completion_tokens = self._count(u, "output_tokens", None)
        elif kind == "content_block_start" and (obj.get("content_block") or {}).get("type") == "tool_use":
            block, c = obj["content_block"], self._call(obj.get("index", 0))
            c["id"], c["name"] = block.get("id") or "", block.get("name") or ""
        elif kind == "content_block_delta":
            delta = obj.get("delta") or {}
            if delta.get("type") == "input_json_delta":
                self._call(obj.get("index", 0))["arguments"] += delta.get("partial_json") or ""
            return (delta.get("text") or "") if delta.get("type") == "text_delta" else "", None
        elif kind == "message_delta":
            reason = (obj.get("delta") or {}).get("stop_reason")
            if reason:
                self.finish = {"max_tokens": "length", "tool_use": "tool_calls"}.get(reason, "stop")
                self.stop_reason = (obj.get("delta") or {}).get("stop_sequence")
            out = self._count(obj.get("usage") or {}, "output_tokens", None)
            if out is not None:
                self.completion_tokens = out
        return "", None
