"""The one request-validation layer of `pyrodash serve`: from raw bytes to the engine's typed request, or a 4xx.

    raw = await read_json(request, limit)                     # 413 over limits.max_body_bytes / 400 invalid_json
    req = parse(ChatCompletionRequest, raw)                   # 400: lone surrogates, unsupported/unknown fields, types
    model, call = engine_request(app, req, kind)              # 404 model, 400 token limits: an EngineRequest
    call = await check_context(app, call, budget_param(req))  # 400 context_length_exceeded (in-process models)

A parameter the engine cannot honour is refused by name unless neutral (`n: 1`, `tools: []` ...), OpenAI's metadata
fields are accepted without effect, other unknown fields are refused unless `allow_unknown_fields`; client text is
marked (`pyrodash.backends.literal`) so special-token strings stay plain characters. An implicit budget shrinks to fit
the context; the prompts' sizes are the engine's (`CollaborateEngine.prepare`). The rules: docs/serving.md.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json

from fastapi import FastAPI, Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from pyrodash import chat
from pyrodash.backends import literal
from pyrodash.backends.base import KnowsSpecials
from pyrodash.engine import EngineRequest
from pyrodash.engine.conversation import ContextLengthError
from pyrodash.engine.range_rule import RangeRule
from pyrodash.prompts import OFFLOAD_TOKEN
from pyrodash.server import errors, protocol

SAMPLING_EPS = 1e-5
# chat markup common to the models PyroDash serves, refused as tokens even when a backend's tokenizer is remote
DEFAULT_SPECIALS = (OFFLOAD_TOKEN, "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")
# parameter -> (its neutral values, what to say)
UNSUPPORTED: dict[str, tuple[tuple, str]] = {
    "functions": ((None, []), "the deprecated `functions` are not supported: send them as `tools`"),
    "function_call": ((None, "none"), "the deprecated `function_call` is not supported: send `tool_choice`"),
    "response_format": ((None, {"type": "text"}), "only plain text output is supported (response_format text)"),
    "echo": ((None, False), "echo is not supported"),
    "best_of": ((None, 1), "best_of > 1 is not supported"),
    "suffix": ((None, ""), "suffix (insertion) is not supported"),
    "n": ((None, 1), "only n=1 is supported"),
    "logprobs": ((None, False, 0), "logprobs are not supported by the Collaborate Engine"),
    "top_logprobs": ((None, 0), "top_logprobs are not supported by the Collaborate Engine"),
    "logit_bias": ((None, {}), "logit_bias is not supported (offload_bias is PyroDash's own bias)"),
    "presence_penalty": ((None, 0, 0.0), "presence_penalty is not supported"),
    "frequency_penalty": ((None, 0, 0.0), "frequency_penalty is not supported"),
    "audio": ((None,), "audio output is not supported"),
    "modalities": ((None, ["text"]), "only the text modality is supported"),
    "prediction": ((None,), "predicted outputs are not supported"),
    "web_search_options": ((None,), "web search is not supported"),
    "reasoning_effort": ((None,), "reasoning_effort is not supported"),
    "verbosity": ((None, "medium"), "verbosity is not supported"),
}
# the top-level fields OpenAI's API documents for each route; accepted here (used, refused by name in UNSUPPORTED
# unless neutral, or metadata without effect), with the request model's own fields (PyroDash's extras)
OPENAI_CHAT_FIELDS = frozenset(
    {
        "messages",
        "model",
        "audio",
        "frequency_penalty",
        "function_call",
        "functions",
        "logit_bias",
        "logprobs",
        "max_completion_tokens",
        "max_tokens",
        "metadata",
        "modalities",
        "n",
        "parallel_tool_calls",
        "prediction",
        "presence_penalty",
        "prompt_cache_key",
        "reasoning_effort",
        "response_format",
        "safety_identifier",
        "seed",
        "service_tier",
        "stop",
        "store",
        "stream",
        "stream_options",
        "temperature",
        "tool_choice",
        "tools",
        "top_logprobs",
        "top_p",
        "user",
        "verbosity",
        "web_search_options",
    }
)
OPENAI_TEXT_FIELDS = frozenset(
    {
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    }
)


# ---------------------------------------------------------------- the body


async def read_json(request: Request, limit: int) -> object:
    """The request body as JSON: 413 above `limit` bytes (checked while reading), 400 when it does not parse."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise protocol.APIError(
            413, f"Request body of {declared} bytes exceeds the limit of {limit} bytes.", code="request_too_large"
        )
    parts, size = [], 0
    try:
        async for part in request.stream():
            size += len(part)
            if size > limit:
                raise protocol.APIError(
                    413, f"Request body exceeds the limit of {limit} bytes.", code="request_too_large"
                )
            parts.append(part)
    except ClientDisconnect:  # the client stopped sending half-way: its fault, not the server's (no 500)
        raise protocol.APIError(499, "client closed request", code="client_closed") from None
    body = b"".join(parts)
    if not body.strip():
        raise protocol.APIError(400, "The request body is empty: send a JSON object.", code="invalid_json")
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise protocol.APIError(
            400, f"We could not parse the JSON body of your request: {e}", code="invalid_json"
        ) from e


def _bad_unicode(obj: object, path: str = "") -> str | None:
    """The JSON path of the first string (or key) holding a lone surrogate, else None."""
    stack = [(obj, path)]
    while stack:
        o, p = stack.pop()
        if isinstance(o, str):
            if not o.isascii():
                try:
                    o.encode("utf-8")
                except UnicodeEncodeError:
                    return p or "body"
        elif isinstance(o, dict):
            for k, v in o.items():
                kp = f"{p}.{k}" if p else str(k)
                if isinstance(k, str) and not k.isascii():
                    try:
                        k.encode("utf-8")
                    except UnicodeEncodeError:
                        return p or "body"
                stack.append((v, kp))
        elif isinstance(o, list):
            stack.extend((v, f"{p}.{i}" if p else str(i)) for i, v in enumerate(o))
    return None


def _fields(model: type[BaseModel]) -> set[str]:
    names: set[str] = set()
    for m in (
        model,
        protocol.ChatMessage,
        protocol.TextPart,
        protocol.StreamOptions,
        protocol.ResponseFormatText,
        protocol.PyroDashOptions,
        protocol.ToolParam,
        protocol.FunctionDef,
        protocol.ToolCallParam,
        protocol.FunctionCall,
        *getattr(model, "PARTS", ()),  # another wire API's nested models (their field names make error params)
    ):
        names |= set(m.model_fields)
    return names


def known_fields(model: type[BaseModel]) -> frozenset[str]:
    """The top-level fields a request of this kind may carry (its API's for its route, and the model's own)."""
    api = getattr(model, "API_FIELDS", None)  # another wire API names its own (pyrodash.server.front)
    if api is None:
        api = OPENAI_CHAT_FIELDS if model is protocol.ChatCompletionRequest else OPENAI_TEXT_FIELDS
    return api | frozenset(model.model_fields)


def _unknown(model: type[BaseModel], obj: dict) -> None:
    """400 naming the top-level fields neither OpenAI's API nor PyroDash knows, as OpenAI words it."""
    known = known_fields(model)
    unknown = sorted(str(k) for k in obj if k not in known)
    if unknown:
        shown = ", ".join(k[:100] for k in unknown[:10]) + (
            f" (and {len(unknown) - 10} more)" if len(unknown) > 10 else ""
        )
        noun = "argument" if len(unknown) == 1 else "arguments"
        raise protocol.APIError(
            400, f"Unrecognized request {noun} supplied: {shown}", param=unknown[0][:100], code="unknown_parameter"
        )


def _missing_content(req: BaseModel) -> None:
    """400 for a system, developer, user or tool message without content (only an assistant message may omit it),
    a tool message without its `tool_call_id`, and tool fields on a message of another role."""
    for i, m in enumerate(getattr(req, "messages", None) or []):
        missing = None
        if m.content is None and m.role != "assistant":
            missing = f"messages.{i}.content"
        elif getattr(m, "role", None) == "tool" and getattr(m, "tool_call_id", None) is None:
            missing = f"messages.{i}.tool_call_id"
        if missing:
            raise protocol.APIError(
                400, f"Missing required parameter: '{missing}'.", param=missing, code="missing_required_parameter"
            )
        for name, role in (("tool_calls", "assistant"), ("tool_call_id", "tool")):
            if getattr(m, name, None) is not None and m.role != role:
                param = f"messages.{i}.{name}"
                raise protocol.APIError(
                    400, f"{param}: only a message of role '{role}' carries {name}.", param=param, code="invalid_value"
                )


def parse(model: type[BaseModel], obj: object, allow_unknown: bool = False) -> BaseModel:
    """A validated request model, or a 400 naming the parameter. `allow_unknown`: top-level fields outside OpenAI's
    API and PyroDash's extras are ignored instead of refused (serve config `allow_unknown_fields`)."""
    where = _bad_unicode(obj)
    if where is not None:
        raise protocol.APIError(
            400,
            f"{where}: the text holds a lone UTF-16 surrogate (e.g. \\ud800), which is not valid "
            "Unicode; send well-formed UTF-8.",
            param=where,
            code="invalid_unicode",
        )
    if isinstance(obj, dict):
        if "tool_choice" in known_fields(model):  # (elsewhere an unknown field, refused as such below)
            forced_tool_choice(obj.get("tool_choice"))
        for name, (neutral, why) in {**UNSUPPORTED, **getattr(model, "UNSUPPORTED", {})}.items():
            if name == "logprobs":  # chat: a boolean; legacy completions: a count
                neutral = (None, False) if model is protocol.ChatCompletionRequest else (None, 0)
            if name in obj and not any(_same(obj[name], v) for v in neutral):
                code = "unsupported_value" if name in ("n", "logprobs") else "unsupported_parameter"
                raise protocol.APIError(
                    400,
                    f"Unsupported parameter: '{name}': {why}; remove it or send {_neutral(neutral)}.",
                    param=name,
                    code=code,
                )
        if not allow_unknown:
            _unknown(model, obj)
    try:
        req = model.model_validate(obj)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        known = _fields(model)
        # OpenAI-style param path: field names and list indices, without pydantic's union-branch tags
        param = ".".join(str(x) for x in err["loc"] if isinstance(x, int) or x in known) or None
        where = f"{param}: " if param else ""
        extra = f" ('{str(err['loc'][-1])[:40]}')" if err["type"] == "extra_forbidden" else ""  # the key refused
        raise protocol.APIError(400, f"{where}{err['msg']}{extra}", param=param, code="invalid_value") from None
    _missing_content(req)
    return req


def _same(a: object, b: object) -> bool:
    """JSON equality: 1 and 1.0 are the same number, false and 0 are not; {type: text, ...} is the text format."""
    if isinstance(a, dict) and isinstance(b, dict) and b.get("type") == "text":
        return a.get("type") == "text"
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _neutral(values: tuple) -> str:
    shown = [json.dumps(v) for v in values if v is not None]
    return "null" if not shown else " or ".join(shown)


# ---------------------------------------------------------------- what the engine gets


def specials(app: FastAPI) -> tuple[str, ...]:
    """Special-token strings of both models (cached per app): what client text may not produce as tokens."""
    cached = getattr(app.state, "specials", None)
    if cached is None:
        found = set(DEFAULT_SPECIALS)
        for side in ("slm", "llm"):
            backend = getattr(app.state.engine, side, None)  # (an engine without that side: a test double's)
            if isinstance(backend, KnowsSpecials):
                found |= set(backend.special_tokens())
        cached = app.state.specials = tuple(sorted(found, key=len, reverse=True))
    return cached


def _client_text(app: FastAPI, text: str) -> str:
    return literal.mark(literal.strip_markers(text), specials(app))


def engine_request(app: FastAPI, req: protocol._Sampling, kind: str) -> tuple[str, EngineRequest]:
    """(model name, the request the engine runs) for a validated wire request, or a 4xx. The context-length check
    comes after (`check_context`), off the event loop."""
    config = app.state.config
    model = req.model if req.model is not None else config.default_model
    if model not in config.operating_points:
        known = ", ".join(config.operating_points)
        raise protocol.APIError(
            404,
            f"The model `{model[:100]}` does not exist; this server offers: {known}.",
            param="model",
            code="model_not_found",
        )
    limit = config.limits.max_tokens
    total = req.requested_max_tokens()
    param = budget_param(req)
    if total is not None and total > limit:
        raise protocol.APIError(
            400, f"{param}={total} exceeds this server's limit of {limit}.", param=param, code="invalid_value"
        )
    per_model = req.max_tokens_per_model
    if per_model is not None and per_model > limit:
        raise protocol.APIError(
            400,
            f"max_tokens_per_model={per_model} exceeds this server's limit of {limit}.",
            param="max_tokens_per_model",
            code="invalid_value",
        )
    point = config.operating_points[model]
    bias = req.offload_bias if req.offload_bias is not None else point.offload_bias
    temperature = req.temperature if req.temperature is not None else protocol.DEFAULT_TEMPERATURE
    if temperature < SAMPLING_EPS:
        temperature = 0.0  # as vLLM does: a vanishing temperature is greedy decoding (and 1/T must stay finite)
    if kind == "chat":
        question: object = [_client_message(app, m) for m in chat_messages(req)]
    else:
        question = _client_text(app, req.prompt)
    opts = req.pyrodash or protocol.PyroDashOptions()
    call = EngineRequest(
        question,
        mode=opts.mode,
        offload_bias=bias,
        handoff_share=point.handoff_share,
        range_rule=point.range_rule if opts.range_rule is None else RangeRule(**opts.range_rule.model_dump()),
        max_llm_calls=point.max_llm_calls if opts.max_llm_calls is None else opts.max_llm_calls,
        step_sep=point.relay.get("step_sep"),
        step_max_tokens=point.relay.get("step_max_tokens"),
        max_tokens=per_model or total or config.limits.default_max_tokens,
        max_total_tokens=total or config.limits.default_max_tokens,
        explicit_budget=total is not None,
        temperature=temperature,
        top_p=req.top_p,
        seed=req.seed,
        stop=req.stop_list(),
        tools=tools_of(req) if kind == "chat" else None,
    )
    return model, call


def _client_message(app: FastAPI, m: chat.Message) -> chat.Message:
    """A client's message with its text (content, a call's arguments) marked as plain characters."""
    calls = tuple(dataclasses.replace(c, arguments=_client_text(app, c.arguments)) for c in m.tool_calls)
    return dataclasses.replace(m, content=_client_text(app, m.content), tool_calls=calls)


NO_FORCED_CALL = (
    "the Collaborate Engine cannot force a tool call (it does not constrain a model's decoding); send "
    "tool_choice 'auto' (the model decides) or 'none'"
)


def forced_tool_choice(choice: object) -> None:
    """400 `unsupported_value` for a `tool_choice` that forces a call, in any API's shape: chat's "required" or
    `{"type": "function", ...}`, the Responses API's `{"type": "function", "name"}`, the Messages API's
    `{"type": "any"}` or `{"type": "tool", "name"}` (`NO_FORCED_CALL`)."""
    given = choice if isinstance(choice, dict) else {"type": choice}
    if given.get("type") not in ("required", "function", "any", "tool"):
        return
    fn = given.get("function")
    name = fn.get("name") if isinstance(fn, dict) else given.get("name")
    shown = f"{given['type']} {str(name)[:64]!r}" if isinstance(name, str) else str(given["type"])
    msg = f"tool_choice {shown} is not supported: {NO_FORCED_CALL}."
    raise protocol.APIError(400, msg, param="tool_choice", code="unsupported_value")


def tools_of(req: BaseModel) -> chat.Tools | None:
    """The request's tools (`tool_request()`: specs, tool_choice auto or none, parallel_tool_calls), or None without
    any; 400 for a duplicate function name (a forced call was refused before: `forced_tool_choice`)."""
    own = getattr(req, "tool_request", None)
    if not callable(own):
        return None
    specs, choice, parallel = own()
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise protocol.APIError(400, f"tools: the function name {dupes[0]!r} is given twice.", param="tools")
    return chat.Tools.of(specs, chat.ToolChoice(choice or "auto"), parallel)


def chat_messages(req: BaseModel) -> list:
    """A chat-like request's messages (`ChatMessage`s; another wire API converts its own: `chat_messages()`)."""
    own = getattr(req, "chat_messages", None)
    return own() if callable(own) else req.messages


def budget_param(req: protocol._Sampling) -> str:
    """The wire name of the request's joint token budget (what an error about it names)."""
    own = getattr(req, "BUDGET_PARAM", None)  # another wire API's name for it (max_output_tokens)
    if own is not None:
        return own
    return "max_completion_tokens" if getattr(req, "max_completion_tokens", None) is not None else "max_tokens"


async def check_context(app: FastAPI, call: EngineRequest, param: str) -> EngineRequest:
    """The request once its prompts are known to fit (`CollaborateEngine.prepare`, off the event loop): 400
    `context_length_exceeded` when prompt tokens + the requested budget exceed a model's positions; an implicit
    (default) budget shrinks to fit instead. `param`: the budget's wire name. (The prompts the check renders and
    tokenizes are not rendered or tokenized again when the request runs: the models keep them.)"""
    try:
        sizes = await asyncio.to_thread(app.state.engine.prepare, call)
    except ContextLengthError as e:  # the current message alone is too long, even with no history left
        raise protocol.APIError(
            400,
            f"This model's maximum context length is {e.window} tokens; {e}.",
            param="messages",
            code="context_length_exceeded",
        ) from None
    except chat.TemplateRefused as e:  # this model cannot show the conversation (tools, a tool turn)
        raise protocol.APIError(400, protocol.scrub(str(e)), param=e.param, code="unsupported_for_model") from None
    except ValueError as e:  # the prompt cannot be rendered for this model (e.g. a role its template refuses)
        raise errors.failure(e) from None
    total = call.max_total_tokens
    for size in sizes:
        room = size.window - size.tokens
        own = min(call.max_tokens, total)  # what this model may decode: its own share of the joint budget
        if room < 1 or (call.explicit_budget and size.tokens + own > size.window):
            asked = f"{own} requested tokens" if call.explicit_budget else "no room for any output"
            raise protocol.APIError(
                400,
                f"This model's maximum context length is {size.window} tokens ({size.side}); the messages "
                f"take {size.tokens} tokens and {asked}. Shorten the messages or lower {param}.",
                param="messages" if room < 1 else param,
                code="context_length_exceeded",
            )
        if not call.explicit_budget and total > room:
            total = room
    if total != call.max_total_tokens:  # (the engine fits its request to the smaller budget itself)
        return dataclasses.replace(call, max_total_tokens=total, max_tokens=min(call.max_tokens, total))
    return call
