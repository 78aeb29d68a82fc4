"""OpenAI-compatible HTTP backend (vLLM, `pyrodash serve-model`, `transformers serve`, OpenAI, DeepSeek, ...).

    backend = OpenAICompatBackend("http://127.0.0.1:8000/v1", model="slm", api_key_env="OPENAI_API_KEY")
    async for chunk in backend.stream(GenRequest(messages=[...], stop_token_ids=[offload_id])): ...

Streams `/v1/chat/completions` with `stream_options.include_usage`, so the last chunk carries the server's exact
token usage (`prompt_tokens_details.cached_tokens` -> `cached_tokens`). vLLM extras are sent only when a request
needs them: `stop_token_ids`; an assistant prefix to continue (`continue_final_message: true`,
`add_generation_prompt: false`); `logit_bias` (clamped to [-100, 100] as vLLM and OpenAI do: -100 is a ban);
`logprobs`/`top_logprobs`. `prompt_mode="completion"` instead renders the chat template locally (`tokenizer=DIR`)
and sends the raw prompt + prefix to `/v1/completions` (thinking models whose templates rewrite a final assistant
message, e.g. drop its `<think>` part). Which stop token ended a generation comes from vLLM's `stop_reason` (the
token id), never from the text. One `httpx.AsyncClient` per event loop (connection reuse); closing the stream
closes the HTTP response, so the server stops generating. `token_id()` asks a local tokenizer (`tokenizer=DIR`) or the
server's vLLM-style `POST /tokenize`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator

import httpx

from pyrodash.backends import literal
from pyrodash.backends.base import BackendError, GenChunk, GenRequest

BIAS_LIMIT = 100.0


class OpenAICompatBackend:
    def __init__(self, url: str, model: str | None = None, api_key_env: str | None = None, timeout_s: float = 60.0,
                 tokenizer: str | None = None, extra_body: dict | None = None, name: str | None = None,
                 prompt_mode: str = "chat"):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"backend url {url!r} must start with http:// or https:// (e.g. http://host:8000/v1)")
        self.base = url.rstrip("/")
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        self.api_key = None
        if api_key_env:
            self.api_key = os.environ.get(api_key_env)
            if not self.api_key:
                raise ValueError(f"environment variable {api_key_env} (api_key_env) is not set: export the API key")
        self.timeout_s = float(timeout_s)
        if prompt_mode not in ("chat", "completion"):
            raise ValueError(f"prompt_mode={prompt_mode!r}: use 'chat' (/v1/chat/completions) or 'completion'")
        if prompt_mode == "completion" and not tokenizer:
            raise ValueError("prompt_mode='completion' renders the chat template locally: give tokenizer=DIR")
        self.prompt_mode = prompt_mode
        self.tokenizer_dir = tokenizer
        self.extra_body = dict(extra_body or {})
        self._model = model
        self.name = name or f"{self.base}#{model or ''}"
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._ids: dict[str, int | None] = {}
        self._tok = None

    # ---- plumbing ------------------------------------------------------------------------------------------
    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))

    def client(self) -> httpx.AsyncClient:
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
            self._client = httpx.AsyncClient(timeout=self._timeout(), limits=limits, headers=self.headers)
            self._client_loop = loop
        return self._client

    @property
    def model(self) -> str:
        """The model name; without one in the spec, the server's first model (GET /v1/models)."""
        if self._model is None:
            try:
                r = httpx.get(f"{self.base}/models", headers=self.headers, timeout=self._timeout())
                r.raise_for_status()
                self._model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
                raise ValueError(f"{self.base}/models did not name a model ({e}); add '#MODEL' to the URL") from e
        return self._model

    @property
    def tokenizer(self):
        if self._tok is None:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(self.tokenizer_dir)
        return self._tok

    def token_id(self, token: str) -> int | None:
        if token in self._ids:
            return self._ids[token]
        if self.tokenizer_dir:
            tid = self.tokenizer.convert_tokens_to_ids(token)
            tid = None if tid is None or tid == self.tokenizer.unk_token_id else int(tid)
        else:
            body = {"model": self.model, "prompt": token, "add_special_tokens": False}
            try:
                r = httpx.post(f"{self.root}/tokenize", json=body, headers=self.headers, timeout=self._timeout())
            except httpx.HTTPError as e:
                raise ValueError(f"cannot reach {self.root}/tokenize ({e}); is the server up?") from e
            if r.status_code != 200:
                raise ValueError(f"{self.root}/tokenize answered {r.status_code}: give the model's tokenizer "
                                 "directory in the backend spec (tokenizer: DIR)")
            toks = r.json().get("tokens", [])
            tid = int(toks[0]) if len(toks) == 1 else None
        self._ids[token] = tid
        return tid

    def body(self, req: GenRequest) -> dict:
        # special-token text a client sent (marked by the server) must not become the remote model's real token
        msgs = [{**m, "content": literal.defang(m["content"])} if isinstance(m.get("content"), str) else m
                for m in req.messages]
        body: dict = {"model": self.model, "messages": msgs, "max_tokens": req.max_tokens,
                      "temperature": req.temperature, "top_p": req.top_p, "stream": True,
                      "stream_options": {"include_usage": True}}
        if self.prompt_mode == "completion":  # the raw prompt: chat template + generation prompt + prefix
            del body["messages"]
            body["prompt"] = (self.tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
                              if msgs else "") + req.prefix
        elif req.prefix:
            body["messages"] = msgs + [{"role": "assistant", "content": req.prefix}]
            body["continue_final_message"] = True
            body["add_generation_prompt"] = False
        if req.seed is not None:
            body["seed"] = req.seed
        if req.stop:
            body["stop"] = list(req.stop)
        if req.stop_token_ids:
            body["stop_token_ids"] = list(req.stop_token_ids)
        if req.logit_bias:
            body["logit_bias"] = {str(k): max(-BIAS_LIMIT, min(BIAS_LIMIT, v)) for k, v in req.logit_bias.items()}
        if req.top_logprobs > 0 and self.prompt_mode == "completion":
            body["logprobs"] = req.top_logprobs
        elif req.top_logprobs > 0:
            body["logprobs"] = True
            body["top_logprobs"] = req.top_logprobs
        body.update(self.extra_body)
        return body

    # ---- the protocol --------------------------------------------------------------------------------------
    async def stream(self, req: GenRequest) -> AsyncIterator[GenChunk]:
        body = self.body(req)
        finish: str | None = None
        stop_reason = None
        usage: dict = {}
        route = "completions" if self.prompt_mode == "completion" else "chat/completions"
        try:
            async with self.client().stream("POST", f"{self.base}/{route}", json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    raise BackendError(f"HTTP {resp.status_code} from {self.base}: {_error_message(text)}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    obj = json.loads(data)
                    if "error" in obj:
                        raise BackendError(f"error event from {self.base}: {_error_message(data)}")
                    if obj.get("usage"):
                        usage = obj["usage"]
                    for choice in obj.get("choices") or []:
                        text = choice.get("text") or (choice.get("delta") or {}).get("content") or ""
                        lps, lp = None, choice.get("logprobs") or {}
                        if lp.get("content"):  # chat format
                            lps = [{t["token"]: t["logprob"] for t in c.get("top_logprobs") or []}
                                   for c in lp["content"]]
                        elif lp.get("top_logprobs"):  # completions format
                            lps = [dict(d or {}) for d in lp["top_logprobs"]]
                        if choice.get("finish_reason"):
                            finish = choice["finish_reason"]
                            stop_reason = choice.get("stop_reason")
                        if text or lps:
                            yield GenChunk(text=text, top_logprobs=lps)
        except httpx.ConnectError as e:
            raise BackendError(f"cannot connect to {self.base}: {e}", reached_server=False) from e
        except httpx.TimeoutException as e:
            raise BackendError(f"timeout after {self.timeout_s}s from {self.base}: {type(e).__name__}") from e
        except httpx.HTTPError as e:
            raise BackendError(f"HTTP error from {self.base}: {type(e).__name__}: {e}") from e
        if finish is None:
            raise BackendError(f"the stream from {self.base} ended without a finish_reason")
        details = usage.get("prompt_tokens_details") or {}
        yield GenChunk(finish_reason=finish, stop_token_id=stop_reason if isinstance(stop_reason, int) else None,
                       prompt_tokens=usage.get("prompt_tokens"), completion_tokens=usage.get("completion_tokens"),
                       cached_tokens=details.get("cached_tokens"))

    async def aclose(self) -> None:
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


def _error_message(text: str) -> str:
    try:
        obj = json.loads(text)
        err = obj.get("error", obj)
        return str(err.get("message", err) if isinstance(err, dict) else err)[:500]
    except (ValueError, AttributeError):
        return text[:500]
