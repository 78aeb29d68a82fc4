"""TEST DOUBLES of the LLM providers we cannot reach from a test (OpenAI, DeepSeek, Anthropic), written from their
public API rules, each serving a REAL model (an `HFBackend`) behind its wire format on 127.0.0.1.

    app = openai_double(llm_backend, key="sk-test-...", reasoning=True)
    with serve_in_thread(app) as url: ...             # url ends in /v1; app.state.calls lists generation bodies

What each one enforces (the rules PyroDash must get right; everything else about the provider is not modelled):
- `openai_double`: `Authorization: Bearer <key>` required (401 `invalid_api_key`, the message echoing a redacted key
  as OpenAI does); strict request fields: an unknown top-level field is a 400 "Unrecognized request argument
  supplied: X", an unknown message field a 400 naming it; an unknown model a 404 `model_not_found`. A final assistant
  message is an earlier turn (a fresh answer follows; no continuation). `reasoning=True` (o-series / GPT-5 style):
  `max_tokens` is a 400 `unsupported_parameter` (use `max_completion_tokens`), a temperature or top_p other than 1
  a 400 `unsupported_value`. Streaming: `chat.completion.chunk`s, usage only with `stream_options.include_usage`,
  in a last chunk with `choices: []` (`prompt_tokens_details.cached_tokens`, `completion_tokens_details`).
  `usage=False` makes a server that never reports usage. `stop` is honoured (the model stops before it);
  `prompt_cache=True` reports as cached the previous call's prompt when this one extends it (a prefix cache, modelled
  per call without the providers' block sizes and minimum lengths), else 0.
- `deepseek_double`: key required; unknown fields are ignored (a lenient server); chat prefix completion
  (`{"role": "assistant", "content": ..., "prefix": true}` as the last message) continues the prefix, on the beta
  base path only (`/beta`; elsewhere a 400); usage with `prompt_cache_hit_tokens` / `prompt_cache_miss_tokens`
  (`prompt_cache=True`: as OpenAI's).
- `anthropic_double`: the Messages API: `x-api-key` (401 `authentication_error`) and `anthropic-version` (400)
  headers; `max_tokens` required; unknown fields 400 "Extra inputs are not permitted"; `temperature` and `top_p`
  together a 400; roles user/assistant only (system is top-level); message `content` and `system` are a string or a
  list of content blocks (text blocks are read; any other block type is a 400 here); a final assistant message is a
  prefill that the model continues, which may not end in whitespace (400); `prefill=False`: a model that refuses
  prefill (400).
  Streaming events: message_start (input usage), content_block_start/delta/stop, message_delta (stop_reason,
  output_tokens), message_stop. `stop_sequences` honoured; `prompt_cache=True`: `cache_read_input_tokens` (the
  earlier prompt this one extends) beside `input_tokens` (the rest).
The model behind every double decodes greedily (sampling is not what these doubles stand in for).
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from pyrodash.backends.base import GenChunk, GenRequest

OPENAI_CHAT_FIELDS = {
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "n",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "reasoning_effort",
    "metadata",
    "store",
    "service_tier",
    "prediction",
    "modalities",
    "audio",
    "web_search_options",
    "prompt_cache_key",
    "safety_identifier",
    "verbosity",
}
OPENAI_MESSAGE_FIELDS = {"role", "content", "name", "tool_calls", "tool_call_id", "refusal", "audio"}
ANTHROPIC_FIELDS = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
}


def _openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None, kind: str = "invalid_request_error"
) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status)


def _masked(key: str) -> str:
    return f"{key[:3]}{'*' * 20}{key[-4:]}" if len(key) > 8 else "***"


class PrefixCache:
    """A provider's prompt cache, modelled per call: the prompt tokens of the latest earlier prompt that this one
    extends (the same messages, the text so far a prefix of this one's) are served from cache."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def hit(self, req: GenRequest, prompt_tokens: int) -> int:
        key = json.dumps(req.messages[:-1]) + "\x00" + str((req.messages or [{}])[-1].get("content", "")) + req.prefix
        best = max((n for k, n in self.seen if key.startswith(k)), default=0)
        self.seen.append((key, prompt_tokens))
        return min(best, prompt_tokens)


async def _run(backend, req: GenRequest) -> tuple[list[str], GenChunk]:
    texts, final = [], GenChunk()
    async with contextlib.aclosing(backend.stream(req)) as it:
        async for ch in it:
            if ch.text:
                texts.append(ch.text)
            if ch.finish_reason is not None:
                final = ch
    return texts, final


def _openai_like(
    backend,
    model: str,
    key: str,
    *,
    reasoning: bool = False,
    usage: bool = True,
    deepseek: bool = False,
    prompt_cache: bool = False,
) -> FastAPI:
    app = FastAPI()
    app.state.calls = []
    cache = PrefixCache() if prompt_cache else None

    def auth(request: Request) -> JSONResponse | None:
        got = request.headers.get("authorization", "")
        if got != f"Bearer {key}":
            token = got.removeprefix("Bearer ").strip()
            shown = f": {_masked(token)}" if token else ""
            return _openai_error(
                401,
                f"Incorrect API key provided{shown}. You can find your API key in your account settings.",
                code="invalid_api_key",
            )
        return None

    @app.get("/v1/models")
    @app.get("/beta/models")
    @app.get("/models")
    async def models(request: Request):
        if (bad := auth(request)) is not None:
            return bad
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "double"}]}

    async def chat(request: Request, beta: bool):
        if (bad := auth(request)) is not None:
            return bad
        body = await request.json()
        if not deepseek:
            for f in body:
                if f not in OPENAI_CHAT_FIELDS:
                    return _openai_error(400, f"Unrecognized request argument supplied: {f}")
        msgs = list(body.get("messages") or [])
        for i, m in enumerate(msgs):
            extra = set(m) - OPENAI_MESSAGE_FIELDS - ({"prefix", "reasoning_content"} if deepseek else set())
            if extra:
                return _openai_error(
                    400, f"Invalid 'messages[{i}]': unknown field '{sorted(extra)[0]}'.", param=f"messages[{i}]"
                )
        if body.get("model") != model:
            return _openai_error(
                404,
                f"The model `{body.get('model')}` does not exist or you do not have access to it.",
                code="model_not_found",
            )
        if reasoning:
            if "max_tokens" in body:
                return _openai_error(
                    400,
                    "Unsupported parameter: 'max_tokens' is not supported with this model. "
                    "Use 'max_completion_tokens' instead.",
                    "max_tokens",
                    "unsupported_parameter",
                )
            for f in ("temperature", "top_p"):
                if f in body and body[f] != 1:
                    return _openai_error(
                        400,
                        f"Unsupported value: '{f}' does not support {body[f]} with this "
                        "model. Only the default (1) value is supported.",
                        f,
                        "unsupported_value",
                    )
        prefix = ""
        if deepseek and msgs and msgs[-1].get("role") == "assistant" and msgs[-1].get("prefix"):
            if not beta:
                return _openai_error(
                    400, "Prefix completion is a beta feature: use base_url https://api.deepseek.com/beta"
                )
            prefix, msgs = str(msgs[-1]["content"]), msgs[:-1]
        app.state.calls.append(body)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 256
        stop = body.get("stop") or []
        req = GenRequest(
            messages=[{"role": m["role"], "content": m["content"]} for m in msgs],
            prefix=prefix,
            max_tokens=int(max_tokens),
            stop=[stop] if isinstance(stop, str) else list(stop),
        )
        rid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())

        def usage_of(final: GenChunk) -> dict:
            p, c = final.prompt_tokens or 0, final.completion_tokens or 0
            u = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
            if deepseek:
                u.update(prompt_cache_hit_tokens=hit, prompt_cache_miss_tokens=p - hit)
            else:
                u.update(
                    prompt_tokens_details={"cached_tokens": hit}, completion_tokens_details={"reasoning_tokens": 0}
                )
            return u

        texts, final = await _run(backend, req)
        hit = cache.hit(req, final.prompt_tokens or 0) if cache is not None else 0
        if not body.get("stream"):
            msg = {"role": "assistant", "content": "".join(texts)}
            out = {
                "id": rid,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [{"index": 0, "message": msg, "finish_reason": final.finish_reason}],
            }
            if usage:
                out["usage"] = usage_of(final)
            return out
        include = usage and bool((body.get("stream_options") or {}).get("include_usage"))

        def chunk(choices: list, **extra) -> str:
            return (
                "data: "
                + json.dumps(
                    {
                        "id": rid,
                        "object": "chat.completion.chunk",
                        "created": created,
                        "model": model,
                        "choices": choices,
                        **extra,
                    }
                )
                + "\n\n"
            )

        def events():
            yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for t in texts:
                yield chunk([{"index": 0, "delta": {"content": t}, "finish_reason": None}])
            yield chunk([{"index": 0, "delta": {}, "finish_reason": final.finish_reason or "length"}])
            if include:
                yield chunk([], usage=usage_of(final))
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_v1(request: Request):
        return await chat(request, beta=False)

    @app.post("/beta/chat/completions")
    async def chat_beta(request: Request):
        return await chat(request, beta=True)

    return app


def openai_double(
    backend,
    model: str = "gpt-double",
    key: str = "sk-double-0123456789abcdef",
    reasoning: bool = False,
    usage: bool = True,
    prompt_cache: bool = False,
) -> FastAPI:
    """TEST DOUBLE of the OpenAI Chat Completions API (see the module docstring)."""
    return _openai_like(backend, model, key, reasoning=reasoning, usage=usage, prompt_cache=prompt_cache)


def deepseek_double(
    backend, model: str = "deepseek-chat", key: str = "sk-deepseek-0123456789abcdef", prompt_cache: bool = False
) -> FastAPI:
    """TEST DOUBLE of DeepSeek's OpenAI-style API with chat prefix completion on /beta (module docstring)."""
    return _openai_like(backend, model, key, deepseek=True, prompt_cache=prompt_cache)


def _anthropic_text(content) -> str | None:
    """The text of an Anthropic `content` (or `system`): a string, or a list of blocks of which only text blocks are
    modelled here; None when it is neither."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str) for b in content
    ):
        return "".join(b["text"] for b in content)
    return None


def anthropic_double(
    backend,
    model: str = "claude-double",
    key: str = "sk-ant-double-0123456789abcdef",
    prefill: bool = True,
    prompt_cache: bool = False,
) -> FastAPI:
    """TEST DOUBLE of Anthropic's Messages API (see the module docstring)."""
    app = FastAPI()
    app.state.calls = []
    cache = PrefixCache() if prompt_cache else None

    def err(status: int, kind: str, message: str) -> JSONResponse:
        return JSONResponse({"type": "error", "error": {"type": kind, "message": message}}, status)

    def check_headers(request: Request) -> JSONResponse | None:
        if request.headers.get("x-api-key") != key:
            return err(401, "authentication_error", "invalid x-api-key")
        if not request.headers.get("anthropic-version"):
            return err(400, "invalid_request_error", "anthropic-version: header is required")
        return None

    @app.get("/v1/models")
    async def models(request: Request):
        if (bad := check_headers(request)) is not None:
            return bad
        return {
            "data": [{"type": "model", "id": model, "display_name": model, "created_at": "2026-01-01T00:00:00Z"}],
            "has_more": False,
            "first_id": model,
            "last_id": model,
        }

    @app.post("/v1/messages")
    async def messages(request: Request):
        if (bad := check_headers(request)) is not None:
            return bad
        body = await request.json()
        for f in body:
            if f not in ANTHROPIC_FIELDS:
                return err(400, "invalid_request_error", f"{f}: Extra inputs are not permitted")
        if "max_tokens" not in body:
            return err(400, "invalid_request_error", "max_tokens: Field required")
        if body.get("model") != model:
            return err(404, "not_found_error", f"model: {body.get('model')}")
        if "temperature" in body and "top_p" in body:
            return err(
                400,
                "invalid_request_error",
                "`temperature` and `top_p` cannot both be specified for this model. Please use only one.",
            )
        msgs = list(body.get("messages") or [])
        if not msgs or any(m.get("role") not in ("user", "assistant") for m in msgs):
            return err(
                400,
                "invalid_request_error",
                "messages: roles must be 'user' or 'assistant' (system is a top-level field)",
            )
        texts = [_anthropic_text(m.get("content")) for m in msgs]
        system = _anthropic_text(body.get("system", ""))
        if system is None or None in texts:
            at = "system" if system is None else f"messages.{texts.index(None)}.content"
            return err(
                400,
                "invalid_request_error",
                f"{at}: a string or a list of text blocks (this test double models no other content)",
            )
        msgs = [{"role": m["role"], "content": t} for m, t in zip(msgs, texts, strict=True)]
        prefix = ""
        if msgs[-1]["role"] == "assistant":
            if not prefill:
                return err(
                    400,
                    "invalid_request_error",
                    "This model does not support assistant message prefill. "
                    "The conversation must end with a user message.",
                )
            prefix = msgs[-1]["content"]
            if prefix != prefix.rstrip():
                return err(
                    400,
                    "invalid_request_error",
                    "messages: final assistant content cannot end with trailing whitespace",
                )
            msgs = msgs[:-1]
        app.state.calls.append(body)
        sys_msg = [{"role": "system", "content": system}] if system else []
        req = GenRequest(
            messages=sys_msg + msgs,
            prefix=prefix,
            max_tokens=int(body["max_tokens"]),
            stop=list(body.get("stop_sequences") or []),
        )
        texts, final = await _run(backend, req)
        hit = cache.hit(req, final.prompt_tokens or 0) if cache is not None else 0
        usage_in = {"input_tokens": (final.prompt_tokens or 0) - hit, "cache_read_input_tokens": hit}
        mid = f"msg_{uuid.uuid4().hex[:12]}"
        stop = "max_tokens" if final.finish_reason == "length" else "end_turn"

        def ev(kind: str, **data) -> str:
            return f"event: {kind}\ndata: " + json.dumps({"type": kind, **data}) + "\n\n"

        def events():
            yield ev(
                "message_start",
                message={
                    "id": mid,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [],
                    "stop_reason": None,
                    "usage": {**usage_in, "output_tokens": 1},
                },
            )
            yield ev("content_block_start", index=0, content_block={"type": "text", "text": ""})
            yield ev("ping")
            for t in texts:
                yield ev("content_block_delta", index=0, delta={"type": "text_delta", "text": t})
            yield ev("content_block_stop", index=0)
            yield ev(
                "message_delta",
                delta={"stop_reason": stop, "stop_sequence": None},
                usage={"output_tokens": final.completion_tokens or 0},
            )
            yield ev("message_stop")

        if not body.get("stream"):
            return {
                "id": mid,
                "type": "message",
                "role": "assistant",
                "model": model,
                "stop_reason": stop,
                "content": [{"type": "text", "text": "".join(texts)}],
                "usage": {**usage_in, "output_tokens": final.completion_tokens},
            }
        return StreamingResponse(events(), media_type="text/event-stream")

    return app
