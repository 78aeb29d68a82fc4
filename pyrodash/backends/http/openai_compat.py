"""HTTP LLM/SLM backend: OpenAI-compatible servers (vLLM, SGLang, `pyrodash serve-model`, LiteLLM, OpenAI, DeepSeek,
...) and Anthropic's Messages API; generations through the lean client on plain http (`lean_client.py`), else
aiohttp (`aiohttp_client.py`); the rest through httpx.

    backend = OpenAICompatBackend("http://127.0.0.1:8000/v1", model="slm", api_key_env="OPENAI_API_KEY")
    async for chunk in backend.stream(GenRequest(messages=[...], stop_token_ids=[offload_id])): ...
    llm = OpenAICompatBackend.from_endpoint(LLMEndpoint.parse("http://host/v1#big")); llm.resolve()  # probe

A chunk with `finish_reason` is yielded as soon as the server sends it (its stop token from vLLM's `stop_reason`),
and the last chunk repeats it with the usage: the server's (`stream_options.include_usage`, cached tokens included),
else counted with a local tokenizer or estimated (4 characters a token), marked `usage_estimated=True`. The
continuation mode is `continuation.py` (`mode="auto"`: detected by `resolve()`, `probe.py`).
Errors are `BackendError`s with the HTTP status (4xx other than 408/429 not retryable), never showing the key.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlparse

import aiohttp
import httpx

from pyrodash.backends import literal
from pyrodash.backends.base import BackendError, GenChunk, GenRequest, public_name
from pyrodash.backends.http.aiohttp_client import UpstreamClient
from pyrodash.backends.http.continuation import ANTHROPIC_VERSION, StreamState, Wire, build_request, trimmed_prefill
from pyrodash.backends.http.endpoint import LLMEndpoint, redact
from pyrodash.backends.http.lean_client import LeanClient, LeanConnectError, LeanError, lean_ok
from pyrodash.backends.http.probe import probe_llm
from pyrodash.chat import render_chat

log = logging.getLogger("pyrodash.llm")
CHARS_PER_TOKEN = 4  # the estimate when neither the server nor a local tokenizer counts
TEMPLATE_TOKENS = 16  # a chat template's tokens around one message (role markers, separators), counted generously
_scan = json.JSONDecoder().scan_once  # json's C scanner (json.loads less its whitespace regexes and Python frames)


class OpenAICompatBackend:
    def __init__(
        self,
        url: str,
        model: str | None = None,
        api_key_env: str | None = None,
        timeout_s: float = 60.0,
        tokenizer: str | None = None,
        extra_body: dict | None = None,
        name: str | None = None,
        prompt_mode: str | None = None,
        mode: str | None = None,
    ):
        spec = {
            "url": url,
            "model": model,
            "api_key_env": api_key_env,
            "timeout_s": timeout_s,
            "tokenizer": tokenizer,
            "extra_body": extra_body,
            "name": name,
            "prompt_mode": prompt_mode,
        }
        ep = LLMEndpoint.parse({k: v for k, v in spec.items() if v is not None}, mode)
        if prompt_mode is None and mode is None:
            ep.mode = "continue"  # an SLM / a plain backend: vLLM-style continuation, no probe
        self._setup(ep)

    @classmethod
    def from_endpoint(cls, ep: LLMEndpoint) -> OpenAICompatBackend:
        self = cls.__new__(cls)
        self._setup(ep)
        return self

    def _setup(self, ep: LLMEndpoint) -> None:
        self.endpoint = ep
        self.base = ep.url.rstrip("/")
        self.root = self.base[: -len("/v1")] if self.base.endswith("/v1") else self.base
        self.api_key = ep.api_key
        self.timeout_s = float(ep.timeout_s)
        self.tokenizer_dir = ep.tokenizer
        self.extra_body = dict(ep.extra_body)
        self._model = ep.model
        self.name = ep.name or public_name(ep.model, "endpoint")  # never the URL: names reach clients and records
        self.mode = ep.mode  # as configured; `wire.mode` is the one in use once resolved
        self.wire: Wire | None = None if ep.mode == "auto" else Wire(ep.mode)
        if self.wire is not None and self.wire.mode == "completion" and not self.local_tokenizer_dir():
            raise ValueError(
                "mode completion renders the chat template locally: give tokenizer: DIR in the LLM "
                "spec (the model's tokenizer directory)"
            )
        self.report = None  # the probe's ProbeReport once resolve() ran
        self.provider: str | None = None  # the provider's shape when the probe found it ("anthropic"), else None
        self.last_headers = None  # of the last generation response, case-insensitive (the probe reads them)
        self.config_error: str | None = None  # a misconfiguration found by the probe (reported by /health)
        # generation requests: the lean client where it can go (plain http, no proxy), else aiohttp
        self.http = (LeanClient if lean_ok(self.base) else UpstreamClient)(self.base, self.timeout_s)
        self._client: httpx.AsyncClient | None = None  # the rest (GET /models, the probe), one per event loop
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._ids: dict[str, int | None] = {}
        self._tok = None
        self._tok_missing = False

    # ---- plumbing ------------------------------------------------------------------------------------------
    @property
    def prompt_mode(self) -> str:  # the former name of the two modes it had
        return "completion" if self.wire is not None and self.wire.mode == "completion" else "chat"

    @property
    def headers(self) -> dict:
        if self.wire is not None:  # (read on every request: no URL parsing on this path)
            anthropic = self.wire.mode == "anthropic"
        else:
            host = (urlparse(self.base).hostname or "").lower()
            anthropic = self.mode == "anthropic" or (
                self.mode == "auto" and (host.endswith("anthropic.com") or self.provider == "anthropic")
            )
        if anthropic:
            h = {"anthropic-version": ANTHROPIC_VERSION}
            return {**h, "x-api-key": self.api_key} if self.api_key else h
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def redact(self, text: str) -> str:
        return redact(text, self.api_key)

    def _timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 10.0))

    def client(self) -> httpx.AsyncClient:
        """This event loop's httpx client (GET /models, the probe; generation requests go through `self.http`)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(timeout=self._timeout(), headers=self.headers)
            self._client_loop = loop
        return self._client

    async def warm(self) -> None:
        """Keep a pooled connection open ahead of the first handoff (best effort: a cheap GET /models when the
        connections may have gone idle)."""
        await self.http.warm(self.headers)

    @property
    def model(self) -> str:
        """The model name; without one in the spec, the server's first model (GET /v1/models)."""
        if self._model is None:
            try:
                r = httpx.get(f"{self.base}/models", headers=self.headers, timeout=self._timeout())
                r.raise_for_status()
                self._model = r.json()["data"][0]["id"]
            except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError) as e:
                raise ValueError(
                    self.redact(f"{self.base}/models did not name a model ({e}); add '#MODEL' to the URL")
                ) from e
        return self._model

    @model.setter
    def model(self, name: str) -> None:
        self._model = name

    @property
    def known_model(self) -> str | None:
        """The model name when known (the spec's, or the one the probe settled), without asking the server."""
        return self._model

    def local_tokenizer_dir(self) -> str | None:
        """A local tokenizer for this model: the spec's `tokenizer`, or the model name when it is a model dir."""
        if self.tokenizer_dir:
            return self.tokenizer_dir
        if self._model and (Path(self._model) / "tokenizer_config.json").exists():
            return self._model
        return None

    @property
    def tokenizer(self):
        if self._tok is None:
            path = self.local_tokenizer_dir()
            if path is None:
                raise ValueError(f"{self.name}: no local tokenizer; give tokenizer: DIR in the spec")
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(path)
        return self._tok

    def _count(self, text: str) -> tuple[int, bool]:
        """(tokens in `text`, estimated?) with the local tokenizer when there is one."""
        if not self._tok_missing and self.local_tokenizer_dir():
            try:
                return len(self.tokenizer.encode(text, add_special_tokens=False)), False
            except Exception:  # noqa: BLE001 - an unreadable tokenizer: estimate instead
                self._tok_missing = True
        return max(1, round(len(text) / CHARS_PER_TOKEN)) if text else 0, True

    def prompt_bound(self, body: dict) -> int:
        """Input tokens of a sent request whose server reported none, never fewer than it read: a rendered prompt
        counted by the local tokenizer; else every message's text (its tool calls, the tools' schemas) counted by the
        local tokenizer, or bounded by its UTF-8 bytes without one, plus `TEMPLATE_TOKENS` around each message."""
        if isinstance(body.get("prompt"), str):
            n, estimated = self._count(body["prompt"])
            return n if not estimated else len(body["prompt"].encode())
        msgs = body.get("messages") or []
        parts = [str(body.get("system", "")), json.dumps(body.get("tools") or "")]
        parts += [m.get("content") if isinstance(m.get("content"), str) else json.dumps(m) for m in msgs]
        text = "".join(p for p in parts if p)
        n, estimated = self._count(text)
        return (len(text.encode()) if estimated else n) + TEMPLATE_TOKENS * (len(msgs) + 1)

    def _render(self, messages: list[dict], tools: list[dict] | None = None) -> str:
        return render_chat(self.tokenizer, messages, tools)

    def token_id(self, token: str) -> int | None:
        if token in self._ids:
            return self._ids[token]
        if self.local_tokenizer_dir():
            tid = self.tokenizer.convert_tokens_to_ids(token)
            tid = None if tid is None or tid == self.tokenizer.unk_token_id else int(tid)
        else:
            body = {"model": self.model, "prompt": token, "add_special_tokens": False}
            try:
                r = httpx.post(f"{self.root}/tokenize", json=body, headers=self.headers, timeout=self._timeout())
            except httpx.HTTPError as e:
                raise ValueError(f"cannot reach {self.root}/tokenize ({type(e).__name__}); is the server up?") from e
            if r.status_code != 200:
                raise ValueError(
                    f"{self.root}/tokenize answered {r.status_code}: give the model's tokenizer "
                    "directory in the backend spec (tokenizer: DIR)"
                )
            toks = r.json().get("tokens", [])
            tid = int(toks[0]) if len(toks) == 1 else None
        self._ids[token] = tid
        return tid

    # ---- continuation mode ---------------------------------------------------------------------------------
    def resolve(self, raise_on_unreachable: bool = True):
        """Probe the endpoint once (mode auto: detect; else verify) and log the choice; returns the ProbeReport.
        A misconfiguration raises a one-line ValueError (and stays in `config_error` for /health)."""
        rep = probe_llm(self)
        self.report = rep
        if rep.error and (rep.reachable or raise_on_unreachable):
            self.config_error = rep.error
            raise ValueError(rep.error)
        self.config_error = rep.error
        if rep.mode and rep.warning:  # the probe could not tell by measurement: it picked by the provider's shape
            log.warning("LLM %s: continuation mode %s: %s", self.name, rep.mode, rep.warning)
        elif rep.mode:
            log.info("LLM %s: continuation mode %s (%s)", self.name, rep.mode, rep.mode_reason)
        else:  # unreachable at start-up: probed again at the first handoff, reported by /health meanwhile
            log.warning("LLM %s: %s (probed again at the first handoff)", self.name, rep.error)
        return rep

    @property
    def continues_prefix(self) -> bool:
        """Whether this endpoint continues an assistant prefix (else the engine hands off in its instruct style)."""
        return True if self.wire is None else self.wire.continues_prefix

    def body(self, req: GenRequest) -> dict:
        return self._build(req)[1]

    def _build(self, req: GenRequest, wire: Wire | None = None) -> tuple[str, dict]:
        wire = wire or self.wire or Wire("continue")
        # special-token text a client sent (marked by the server) must not become the remote model's real token
        msgs = [
            {**m, "content": literal.defang(m["content"])} if isinstance(m.get("content"), str) else m
            for m in req.messages
        ]
        req = dataclasses.replace(req, messages=msgs)
        path, body = build_request(wire, req, self.model, self._render if wire.mode == "completion" else None)
        body.update(self.extra_body)
        return path, body

    async def _ensure_wire(self) -> Wire:
        if self.wire is None:  # mode auto and the start-up probe could not reach the server: probe now
            try:
                await asyncio.to_thread(self.resolve)
            except ValueError as e:
                raise BackendError(str(e), reached_server=False, status=None) from e
        return self.wire

    # ---- the protocol --------------------------------------------------------------------------------------
    async def stream(self, req: GenRequest, wire: Wire | None = None) -> AsyncIterator[GenChunk]:
        wire = wire or await self._ensure_wire()
        path, body = self._build(req, wire)
        reader = _StreamReader(self, trimmed_prefill(wire, req), [] if req.top_logprobs else req.stop)
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        headers = {**self.headers, "content-type": "application/json"}
        try:
            async with self.http.post_stream(path, content, headers) as resp:
                self.last_headers = resp.headers
                if resp.status != 200:
                    text = (await resp.read()).decode(errors="replace")
                    msg = f"HTTP {resp.status} from {self.base}: {_error_message(text)}"
                    raise BackendError(self.redact(msg), status=resp.status, param=_error_param(text))
                async for raw in resp.content.iter_any():
                    for chunk in reader.feed(raw):
                        yield chunk
                    if reader.ended:
                        break
                if reader.ended and not reader.cut:  # read the rest of the body (its end): only a fully read response's
                    await self.http.drain(resp)  # connection goes back to the pool; a cut one is closed on exit
        except (aiohttp.ClientConnectorError, LeanConnectError) as e:
            raise BackendError(f"cannot connect to {self.base}: {type(e).__name__}", reached_server=False) from e
        except (asyncio.TimeoutError, TimeoutError) as e:  # the clients' connect and read timeouts
            raise BackendError(
                f"timeout after {self.timeout_s}s from {self.base}: {type(e).__name__}", kind="timeout"
            ) from e
        except (aiohttp.ClientError, LeanError) as e:
            raise BackendError(
                self.redact(f"HTTP error from {self.base}: {type(e).__name__}: {e}"), kind="incomplete"
            ) from e
        yield reader.last(body)

    async def health(self) -> None:
        """Raise when the endpoint is misconfigured (the probe's finding) or does not list its models."""
        if self.config_error:
            raise ValueError(self.config_error)
        r = await self.client().get(f"{self.base}/models", timeout=5)
        if r.status_code != 200:
            raise ConnectionError(f"GET {self.base}/models answered {r.status_code}")

    async def aclose(self) -> None:
        await self.http.aclose()
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None


class _StreamReader:
    """One streamed response's SSE body -> GenChunks: text and logprobs as they come, the stop as soon as the server
    sends it, and a last chunk with the usage (counted locally or estimated, and marked so, when not reported).

    A matched stop string never reaches the caller (`GenChunk.text`'s contract), also from a server that returns it in
    its text (`transformers serve` does): while `stops` are set, the text's tail that could begin one is held back
    until the next text or the stop, and dropped when the answer stopped on it. A server that writes on past a stop
    string (it ignores `stop`, or was not sent it: `continuation.client_stops`) is cut there: the text before it, a
    "stop", and the stream is closed (`cut`; billed for what arrived, `GenChunk.client_stop`). Not with logprobs
    (their positions are the server's): requests that ask for them send no stop strings here."""

    def __init__(self, backend: OpenAICompatBackend, trimmed: bool, stops: list[str] | tuple[str, ...] = ()) -> None:
        self.backend, self.trimmed = backend, trimmed  # trimmed: the prefill lost its trailing space (continuation)
        self.st, self.texts, self.n_chunks = StreamState(), [], 0  # texts: as the server sent them (for its usage)
        self.buf, self.ended = b"", False  # ended: `data: [DONE]` came (or the stream was cut)
        self.stops, self.held = [x for x in stops if x], ""
        self.cut = False  # the client stopped reading at a stop string the server wrote past

    def feed(self, raw: bytes) -> list[GenChunk]:
        """The chunks of the events that the body's next bytes `raw` complete."""
        if b"\r" in raw:  # SSE lines may end in \r\n or \r
            raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        self.buf += raw
        if b"\n" not in raw:
            return []
        *lines, self.buf = self.buf.split(b"\n")
        out: list[GenChunk] = []
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                self.ended = True
                break
            try:
                obj = _json(data.decode())
            except ValueError as e:  # (UnicodeDecodeError included)
                shown = data[:200].decode(errors="replace")
                raise BackendError(f"unreadable event from {self.backend.base}: {shown!r}", kind="bad_response") from e
            self._event(obj, out)
            if self.cut:
                self.ended = True
                break
        return out

    def _event(self, obj: dict, out: list[GenChunk]) -> None:
        st = self.st
        had_finish = st.finish is not None
        text, lps = st.feed(obj)
        if st.error is not None:
            raise BackendError(
                self.backend.redact(f"error event from {self.backend.base}: {st.error}"), kind="error_event"
            )
        if text and self.trimmed and not self.texts:
            text = text.lstrip()
        if text or lps:
            self.texts.append(text)
            self.n_chunks += 1
            shown = self._hold(text) if self.stops else text
            if shown or lps:
                out.append(GenChunk(text=shown, top_logprobs=lps))
        if self.cut and not had_finish:
            st.finish, st.stop_reason, st.completion_tokens = "stop", None, None  # counted from what arrived
            out.append(GenChunk(finish_reason="stop", client_stop=True))
        elif st.finish is not None and not had_finish:  # the stop, as soon as it is known
            if self.held:
                rest = self._release(st.finish)
                if rest:
                    out.append(GenChunk(text=rest))
            out.append(GenChunk(finish_reason=st.finish, stop_token_id=_stop_id(st.stop_reason)))

    def _hold(self, text: str) -> str:
        """The part of the text so far that no stop string can still claim; the rest stays in `held`."""
        text = self.held + text
        at = _written_past(text, self.stops)
        if at is not None:
            self.held, self.cut = "", True
            return text[:at]
        keep = max((k for x in self.stops for k in range(1, len(x) + 1) if text.endswith(x[:k])), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    def _release(self, finish: str) -> str:
        """The held tail at the stop: dropped where the answer stopped on a stop string the server returned."""
        held, self.held = self.held, ""
        return "" if finish == "stop" and held in self.stops else held

    def last(self, body: dict) -> GenChunk:
        """The stream's last chunk: its stop again, with the usage (`body`: the request, to count its prompt)."""
        st, backend = self.st, self.backend
        if st.finish is None:
            raise BackendError(f"the stream from {backend.base} ended without a finish_reason", kind="incomplete")
        prompt, completion, estimated = st.prompt_tokens, st.completion_tokens, False
        if prompt is None:  # the server reported none: a bound of what it read, marked as an estimate
            prompt, estimated = backend.prompt_bound(body), True
        if completion is None:
            counted, est = backend._count("".join(self.texts))  # what arrived (a cut stream's too)
            completion = max(counted, self.n_chunks) if est else counted
            estimated = True
        return GenChunk(
            finish_reason=st.finish,
            stop_token_id=_stop_id(st.stop_reason),
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=st.cached_tokens,
            usage_estimated=estimated,
            client_stop=self.cut,
            tool_calls=st.tool_calls() or None,
        )


def _json(text: str):
    """One event's JSON value (`text` has no whitespace around it); ValueError when it is not exactly one."""
    try:
        obj, end = _scan(text, 0)
    except StopIteration:
        raise ValueError(f"no JSON value: {text[:50]!r}") from None
    if end != len(text):
        raise ValueError(f"extra data after the JSON value at {end}")
    return obj


def _written_past(text: str, stops: list[str]) -> int | None:
    """Where the first stop string in `text` begins when the text goes on after it (the server did not stop
    there), else None (a stop string at the very end may still be the server's own stop: held)."""
    found = [i for x in stops if 0 <= (i := text.find(x)) and i + len(x) < len(text)]
    return min(found) if found else None


def _stop_id(stop_reason: object) -> int | None:
    return stop_reason if isinstance(stop_reason, int) and not isinstance(stop_reason, bool) else None


def _error_obj(text: str) -> dict:
    try:
        obj = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(obj, dict):
        return {}
    err = obj.get("error", obj.get("detail", obj))
    return err if isinstance(err, dict) else {"message": err}


def _error_message(text: str) -> str:
    err = _error_obj(text)
    return str(err.get("message", err) if err else text)[:500]


def _error_param(text: str) -> str | None:
    p = _error_obj(text).get("param")
    return p if isinstance(p, str) else None
