"""One local model behind an OpenAI-compatible API with vLLM's extras: `pyrodash serve-model PATH --port P`.

    app = build_model_app(HFBackend("path/to/model"))      # FastAPI; or `pyrodash serve-model PATH`
    with serve_in_thread(app) as url:                       # "http://127.0.0.1:<free port>/v1" (tests, benchmarks)
        ...

Routes: `GET /v1/models`, `POST /v1/chat/completions` and `/v1/completions` (unary or SSE), `POST /tokenize` (vLLM's
shape), `GET /health`. vLLM extras: `stop_token_ids`, `logit_bias`, `continue_final_message`, `logprobs`, `seed`;
`stop_reason` is the stop token id (or string) that ended generation. Errors in OpenAI's shape; a client that
disconnects stops generation.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator

from pydantic import BaseModel, ConfigDict

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.chat import render_chat


class _Sampling(BaseModel):
    """The fields both generation routes take (OpenAI's, and vLLM's `stop_token_ids`)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict | None = None
    logit_bias: dict[str, float] | None = None
    stop_token_ids: list[int] | None = None  # a vLLM extra


class ChatRequest(_Sampling):
    messages: list[dict]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    # vLLM extras
    continue_final_message: bool = False
    add_generation_prompt: bool = True


class CompletionRequest(_Sampling):
    prompt: str
    max_tokens: int = 16
    logprobs: int | None = None


class TokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    prompt: str | None = None
    messages: list[dict] | None = None
    add_special_tokens: bool = True


class RequestError(ValueError):
    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def to_gen_request(r: ChatRequest, default_max_tokens: int) -> GenRequest:
    """Map an OpenAI/vLLM chat request onto the backend protocol (RequestError on what we do not serve)."""
    if r.n != 1:
        raise RequestError("only n=1 is supported", "n")
    if not r.messages:
        raise RequestError("messages must not be empty", "messages")
    msgs, prefix = list(r.messages), ""
    if r.continue_final_message:
        if r.add_generation_prompt:
            raise RequestError("continue_final_message needs add_generation_prompt=false", "add_generation_prompt")
        if msgs[-1].get("role") != "assistant":
            raise RequestError("continue_final_message needs a final assistant message", "messages")
        prefix, msgs = str(msgs[-1].get("content") or ""), msgs[:-1]
    elif not r.add_generation_prompt:
        raise RequestError(
            "add_generation_prompt=false is only served with continue_final_message=true", "add_generation_prompt"
        )
    for m in msgs:
        if not isinstance(m.get("content"), str):
            raise RequestError("message content must be a string", "messages")
    stop = [r.stop] if isinstance(r.stop, str) else list(r.stop or [])
    try:
        bias = {int(k): float(v) for k, v in (r.logit_bias or {}).items()}
    except ValueError as e:
        raise RequestError("logit_bias keys must be token ids", "logit_bias") from e
    k = (r.top_logprobs or 0) if r.logprobs else 0
    max_tokens = r.max_completion_tokens or r.max_tokens or default_max_tokens
    return GenRequest(
        messages=msgs,
        prefix=prefix,
        max_tokens=max_tokens,
        temperature=r.temperature,
        top_p=r.top_p,
        seed=r.seed,
        stop=stop,
        stop_token_ids=list(r.stop_token_ids or []),
        logit_bias=bias,
        top_logprobs=k,
    )


def completion_to_gen_request(r: CompletionRequest) -> GenRequest:
    """A raw-prompt request (/v1/completions): messages=[] and the prompt as the prefix."""
    if r.n != 1:
        raise RequestError("only n=1 is supported", "n")
    shared = r.model_dump(include=set(_Sampling.model_fields))  # the sampling fields both routes take
    chat = ChatRequest(
        **shared,
        messages=[{"role": "user", "content": ""}],
        max_tokens=r.max_tokens,
        logprobs=bool(r.logprobs),
        top_logprobs=r.logprobs,
    )
    req = to_gen_request(chat, r.max_tokens)
    req.messages, req.prefix = [], r.prompt
    return req


def _logprobs(chunk: GenChunk) -> dict | None:
    if not chunk.top_logprobs:
        return None
    content = []
    for top in chunk.top_logprobs:
        best = max(top.items(), key=lambda kv: kv[1]) if top else ("", 0.0)
        content.append(
            {
                "token": chunk.text or best[0],
                "logprob": top.get(chunk.text, best[1]),
                "top_logprobs": [{"token": t, "logprob": v} for t, v in top.items()],
            }
        )
    return {"content": content}


def _usage(final: GenChunk) -> dict:
    p, c = final.prompt_tokens or 0, final.completion_tokens or 0
    out = {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}
    if final.cached_tokens is not None:  # only a figure the model gave (none: a client may estimate its own)
        out["prompt_tokens_details"] = {"cached_tokens": final.cached_tokens}
    return out


def _error(status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
    """OpenAI's error shape: {"error": {message, type, param, code}} with HTTP `status`."""
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": status}}, status)


async def _invalid(_request, exc):
    """A request the pydantic models refuse: 400 naming the first bad field."""
    first = exc.errors()[0] if exc.errors() else {}
    loc = ".".join(str(x) for x in first.get("loc", ())[1:]) or None
    return _error(400, f"invalid request: {first.get('msg', exc)} ({loc})", loc)


def _sse(payload: dict) -> str:
    return "data: " + json.dumps(payload) + "\n\n"


def _completion_logprobs(req: GenRequest, chunks: list[GenChunk]) -> dict | None:
    """/v1/completions' logprobs block of `chunks` (None unless the request asked for logprobs)."""
    if not req.top_logprobs:
        return None
    tops = [d for c in chunks for d in (c.top_logprobs or [])]
    return {"tokens": [c.text for c in chunks], "top_logprobs": tops}


class ModelRoutes:
    """The routes of one served model: `backend` under the name `name`."""

    def __init__(self, backend, name: str, default_max_tokens: int):
        self.backend, self.name, self.default_max_tokens = backend, name, default_max_tokens

    async def health(self):
        return {"status": "ok"}

    async def models(self):
        return {"object": "list", "data": [{"id": self.name, "object": "model", "created": 0, "owned_by": "pyrodash"}]}

    async def tokenize(self, r: TokenizeRequest):
        tok = getattr(self.backend, "tokenizer", None)
        if tok is None:
            return _error(404, "this backend has no local tokenizer")
        if r.messages is not None:
            text = render_chat(tok, r.messages)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            ids = tok.encode(r.prompt or "", add_special_tokens=r.add_special_tokens)
        return {"tokens": list(ids), "count": len(ids), "max_model_len": getattr(tok, "model_max_length", None)}

    def _wrong_model(self, model: str | None):
        """A 404 when the request names a model other than this one; None when it is served here."""
        if model in (None, self.name):
            return None
        msg = f"model {model!r} is not served here; this server serves {self.name!r}"
        return _error(404, msg, "model", "not_found_error")

    async def chat(self, r: ChatRequest):
        """POST /v1/chat/completions: unary, or SSE chunks (usage last with `stream_options.include_usage`)."""
        if (wrong := self._wrong_model(r.model)) is not None:
            return wrong
        try:
            req = to_gen_request(r, self.default_max_tokens)
        except RequestError as e:
            return _error(400, str(e), e.param)
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": self.name}
        if not r.stream:
            return await self._chat_unary(req, head)
        from fastapi.responses import StreamingResponse

        include_usage = bool((r.stream_options or {}).get("include_usage"))
        return StreamingResponse(self._chat_events(req, head, include_usage), media_type="text/event-stream")

    async def _chat_unary(self, req: GenRequest, head: dict) -> dict:
        text, lps, final = "", [], GenChunk()
        async with contextlib.aclosing(self.backend.stream(req)) as it:
            async for ch in it:
                text += ch.text
                lp = _logprobs(ch)
                lps += lp["content"] if lp else []
                if ch.finish_reason is not None:
                    final = ch
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": {"content": lps} if req.top_logprobs else None,
            "finish_reason": final.finish_reason,
            "stop_reason": final.stop_token_id,
        }
        return {**head, "object": "chat.completion", "choices": [choice], "usage": _usage(final)}

    async def _parts(self, req: GenRequest):
        """The backend's stream for `req` as (chunk, last): each chunk with text or log-probabilities, then the chunk
        that carried the finish reason and usage (an empty one if the stream gave none) with last=True."""
        final = GenChunk()
        async with contextlib.aclosing(self.backend.stream(req)) as it:
            async for ch in it:
                if ch.finish_reason is not None:
                    final = ch
                if ch.text or ch.top_logprobs:
                    yield ch, False
        yield final, True

    async def _chat_events(self, req: GenRequest, head: dict, include_usage: bool):
        def sse(choices: list, **extra) -> str:
            return _sse({**head, "object": "chat.completion.chunk", "choices": choices, **extra})

        yield sse([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
        final = GenChunk()
        async for ch, last in self._parts(req):
            if last:
                final = ch
            else:
                yield sse(
                    [{"index": 0, "delta": {"content": ch.text}, "logprobs": _logprobs(ch), "finish_reason": None}]
                )
        reason = final.finish_reason or "length"
        yield sse([{"index": 0, "delta": {}, "finish_reason": reason, "stop_reason": final.stop_token_id}])
        if include_usage:
            yield sse([], usage=_usage(final))
        yield "data: [DONE]\n\n"

    async def completions(self, r: CompletionRequest):
        """POST /v1/completions: a raw prompt, unary or SSE, with the same extras as chat."""
        if (wrong := self._wrong_model(r.model)) is not None:
            return wrong
        try:
            req = completion_to_gen_request(r)
        except RequestError as e:
            return _error(400, str(e), e.param)
        head = {
            "id": f"cmpl-{uuid.uuid4().hex[:24]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
        }
        if not r.stream:
            return await self._completion_unary(req, head)
        from fastapi.responses import StreamingResponse

        include_usage = bool((r.stream_options or {}).get("include_usage"))
        return StreamingResponse(self._completion_events(req, head, include_usage), media_type="text/event-stream")

    async def _completion_unary(self, req: GenRequest, head: dict) -> dict:
        async with contextlib.aclosing(self.backend.stream(req)) as it:
            chunks = [ch async for ch in it]
        final = chunks[-1] if chunks else GenChunk()
        choice = {
            "index": 0,
            "text": "".join(c.text for c in chunks),
            "logprobs": _completion_logprobs(req, chunks[:-1]),
            "finish_reason": final.finish_reason,
            "stop_reason": final.stop_token_id,
        }
        return {**head, "choices": [choice], "usage": _usage(final)}

    async def _completion_events(self, req: GenRequest, head: dict, include_usage: bool):
        final = GenChunk()
        async for ch, last in self._parts(req):
            if last:
                final = ch
            else:
                choice = {"index": 0, "text": ch.text, "logprobs": _completion_logprobs(req, [ch])}
                yield _sse({**head, "choices": [{**choice, "finish_reason": None}]})
        reason = final.finish_reason or "length"
        fin = {"index": 0, "text": "", "finish_reason": reason, "stop_reason": final.stop_token_id}
        yield _sse({**head, "choices": [fin]})
        if include_usage:
            yield _sse({**head, "choices": [], "usage": _usage(final)})
        yield "data: [DONE]\n\n"


def build_model_app(backend, model_name: str | None = None, default_max_tokens: int = 512):
    """FastAPI app serving `backend` (anything speaking the Backend protocol, e.g. an HFBackend)."""
    from fastapi import FastAPI
    from fastapi.exceptions import RequestValidationError

    name = model_name or backend.name
    app = FastAPI(title="pyrodash model server")
    app.state.backend = backend
    app.state.model_name = name
    routes = ModelRoutes(backend, name, default_max_tokens)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.get("/health")(routes.health)
    app.get("/v1/models")(routes.models)
    app.post("/tokenize")(routes.tokenize)
    app.post("/v1/chat/completions")(routes.chat)
    app.post("/v1/completions")(routes.completions)
    return app


@contextlib.contextmanager
def serve_in_thread(app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> Iterator[str]:
    """Run `app` with uvicorn in a background thread on `host` (a free port when `port=0`); yields the
    ".../v1" base URL and stops the server on exit."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=log_level, access_log=False, lifespan="off", timeout_graceful_shutdown=1)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="pyrodash-uvicorn")
    thread.start()
    deadline = time.time() + 20
    while not server.started:
        if not thread.is_alive() or time.time() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
