"""HTTP LLM/SLM backend: OpenAI-compatible servers (vLLM, SGLang, `pyrodash serve-model`, `transformers serve`,
LiteLLM, OpenAI, DeepSeek, ...) and Anthropic's Messages API.

    backend = OpenAICompatBackend("http://127.0.0.1:8000/v1", model="slm", api_key_env="OPENAI_API_KEY")
    async for chunk in backend.stream(GenRequest(messages=[...], stop_token_ids=[offload_id])): ...
    llm = OpenAICompatBackend.from_endpoint(LLMEndpoint.parse("http://host/v1#big")); llm.resolve()  # probe

Streams with `stream_options.include_usage`, so the last chunk carries the server's token usage
(`prompt_tokens_details.cached_tokens` / DeepSeek's `prompt_cache_hit_tokens` -> `cached_tokens`). How a partial
trace is continued is the continuation mode (`pyrodash.backends.continuation`); `mode="auto"` is detected by
`resolve()` (`pyrodash.backends.probe`) before the first call. A chunk with `finish_reason` is yielded as soon as the
server sends it (the engine starts its LLM request on an `<offload>` stop right then), and the last chunk repeats it
with the usage. Which stop token ended a generation comes from vLLM's `stop_reason` (the token id), never from the
text. Usage the server did not report is counted with a local tokenizer (`tokenizer=DIR`, or the model name when it
is a local model dir), else estimated (4 characters a token; one token per streamed chunk), and the last chunk says
`usage_estimated=True`. Errors are `BackendError`s with the HTTP status: 4xx other than 408/429 are not retryable.
Keys never appear in error messages. Generation requests to a plain-http endpoint (no proxy configured for it) go
through a lean HTTP/1.1 client (`_LeanPool`: kept-alive connections, the request's head and JSON body in one socket
write, the SSE body parsed straight from the socket buffer); everything else (https, proxies, GET /models,
/tokenize) through one `httpx.AsyncClient` per event loop; `PYRODASH_HTTP_CLIENT=httpx` sends everything through
httpx. Connections are reused (kept alive 120 s; a stream is read to its end after `data: [DONE]` so its connection
goes back to the pool; `warm()` opens one ahead of the first handoff); closing a stream early closes its connection,
so the server stops generating. `token_id()` asks a local tokenizer or the server's vLLM-style `POST /tokenize`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
import urllib.request
import zlib
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlparse

import httpx

from pyrodash.backends import literal
from pyrodash.backends.base import BackendError, GenChunk, GenRequest, public_name
from pyrodash.backends.continuation import ANTHROPIC_VERSION, StreamState, Wire, build_request, trimmed_prefill
from pyrodash.backends.deadline import LazyDeadline
from pyrodash.backends.endpoint import LLMEndpoint, redact
from pyrodash.backends.probe import probe_llm

log = logging.getLogger("pyrodash.llm")
CHARS_PER_TOKEN = 4  # the estimate when neither the server nor a local tokenizer counts
KEEPALIVE_S = 120.0
_scan = json.JSONDecoder().scan_once  # json's C scanner (json.loads less its whitespace regexes and Python frames)
DRAIN_S = 0.5  # the longest a response is read after its [DONE] (to reuse its connection)


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
        self.last_headers: httpx.Headers | None = None  # of the last generation response (the probe reads them)
        self.config_error: str | None = None  # a misconfiguration found by the probe (reported by /health)
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._last_used = 0.0
        self._ids: dict[str, int | None] = {}
        self._urls: dict[str, httpx.URL] = {}
        self._req_headers: dict[int, httpx.Headers] = {}
        self._timeout_ext = self._timeout().as_dict()
        self._lean_ok = lean_ok(self.base)  # plain http, no proxy: generation requests skip httpx (`_LeanPool`)
        self._lean: _LeanPool | None = None
        self._lean_headers: dict | None = None
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
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)
            self._client = httpx.AsyncClient(timeout=self._timeout(), limits=limits, headers=self.headers)
            self._client_loop = loop
        return self._client

    async def warm(self) -> None:
        """Open (or keep open) a pooled connection before the first handoff: a TCP connect when the lean client
        has no idle connection (plain http), else a cheap GET /models when the connection may have gone idle.
        Failures are ignored (the handoff itself reports them)."""
        lean = self._lean_pool()
        if lean is not None:
            with contextlib.suppress(Exception):
                await lean.warm()
            return
        if time.monotonic() - self._last_used < KEEPALIVE_S / 2:
            return
        self._last_used = time.monotonic()
        try:
            await self.client().get(f"{self.base}/models", timeout=5)
        except Exception:  # noqa: BLE001 - warming is best effort
            pass

    def _lean_pool(self) -> _LeanPool | None:
        """This event loop's lean connection pool (plain-http endpoints), else None (httpx sends)."""
        if not self._lean_ok:
            return None
        headers, pool = self.headers, self._lean
        if pool is None or pool.loop is not asyncio.get_running_loop() or headers != self._lean_headers:
            if pool is not None and pool.loop is asyncio.get_running_loop():
                pool.close()
            pool = self._lean = _LeanPool(self.base, headers, self.timeout_s, min(self.timeout_s, 10.0))
            self._lean_headers = headers
        return pool

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

    def _render(self, messages: list[dict]) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

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
        trimmed = trimmed_prefill(wire, req)
        st, texts, n_chunks = StreamState(), [], 0
        self._last_used = time.monotonic()
        try:
            async with self._post(path, body) as resp:
                self.last_headers = resp.headers
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")
                    msg = f"HTTP {resp.status_code} from {self.base}: {_error_message(text)}"
                    raise BackendError(self.redact(msg), status=resp.status_code, param=_error_param(text))
                chunks, buf, ended = resp.aiter_bytes(), b"", False
                async for raw in chunks:
                    if b"\r" in raw:  # SSE lines may end in \r\n or \r
                        raw = raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                    buf += raw
                    if b"\n" not in raw:
                        continue
                    *lines, buf = buf.split(b"\n")
                    for line in lines:
                        if not line.startswith(b"data:"):
                            continue
                        data = line[5:].strip()
                        if data == b"[DONE]":
                            ended = True
                            break
                        try:
                            obj = _json(data.decode())
                        except ValueError as e:  # (UnicodeDecodeError included)
                            shown = data[:200].decode(errors="replace")
                            raise BackendError(f"unreadable event from {self.base}: {shown!r}") from e
                        had_finish = st.finish is not None
                        text, lps = st.feed(obj)
                        if st.error is not None:
                            raise BackendError(self.redact(f"error event from {self.base}: {st.error}"))
                        if text and trimmed and not texts:
                            text = text[len(text) - len(text.lstrip()) :] if text[:1].isspace() else text
                        if text or lps:
                            texts.append(text)
                            n_chunks += 1
                            yield GenChunk(text=text, top_logprobs=lps)
                        if st.finish is not None and not had_finish:  # the stop, as soon as it is known
                            yield GenChunk(finish_reason=st.finish, stop_token_id=_stop_id(st.stop_reason))
                    if ended:
                        break
                if ended:  # read the rest of the body (its end): only a fully read response's connection is
                    await _drain(chunks)  # put back in the pool, else the next request opens a new one
        except httpx.ConnectError as e:
            raise BackendError(f"cannot connect to {self.base}: {type(e).__name__}", reached_server=False) from e
        except httpx.TimeoutException as e:
            raise BackendError(f"timeout after {self.timeout_s}s from {self.base}: {type(e).__name__}") from e
        except httpx.HTTPError as e:
            raise BackendError(self.redact(f"HTTP error from {self.base}: {type(e).__name__}: {e}")) from e
        finally:
            self._last_used = time.monotonic()
        if st.finish is None:
            raise BackendError(f"the stream from {self.base} ended without a finish_reason")
        prompt, completion, estimated = st.prompt_tokens, st.completion_tokens, False
        if prompt is None:  # counted locally (template tokens left out) or estimated; marked either way
            src = body.get("prompt")
            if src is None:
                src = str(body.get("system", "")) + "".join(str(m.get("content", "")) for m in body["messages"])
            prompt, estimated = self._count(src)[0], True
        if completion is None:
            counted, est = self._count("".join(texts))
            completion = max(counted, n_chunks) if est else counted
            estimated = True
        yield GenChunk(
            finish_reason=st.finish,
            stop_token_id=_stop_id(st.stop_reason),
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=st.cached_tokens,
            usage_estimated=estimated,
        )

    @contextlib.asynccontextmanager
    async def _post(self, path: str, body: dict):
        """POST `body` (JSON encoded here) and stream the response. A plain-http endpoint gets it through the lean
        client (`_LeanPool`: one write of prepared bytes, the response parsed from the socket buffer); any other
        through httpx, with the request built by hand (URL parsed once, the client's headers merged once), not
        through `client.stream`, whose per-request URL, header and cookie merging is most of its client time."""
        content = json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        lean = self._lean_pool()
        if lean is not None:
            resp = await lean.post(path, content)
        else:
            client = self.client()
            url = self._urls.get(path)
            if url is None:
                url = self._urls[path] = httpx.URL(f"{self.base}{path}")
            headers = self._req_headers.get(id(client))
            if headers is None:
                headers = httpx.Headers(client.headers)
                headers["content-type"] = "application/json"
                self._req_headers = {id(client): headers}
            req = httpx.Request(
                "POST", url, headers=headers, content=content, extensions={"timeout": self._timeout_ext}
            )
            resp = await client.send(req, stream=True)
        try:
            yield resp
        finally:
            await resp.aclose()

    async def health(self) -> None:
        """Raise when the endpoint is misconfigured (the probe's finding) or does not list its models."""
        if self.config_error:
            raise ValueError(self.config_error)
        r = await self.client().get(f"{self.base}/models", timeout=5)
        if r.status_code != 200:
            raise ConnectionError(f"GET {self.base}/models answered {r.status_code}")

    async def aclose(self) -> None:
        if self._lean is not None and self._lean.loop is asyncio.get_running_loop():
            self._lean.close()
        self._lean = None
        if self._client is not None and self._client_loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client = None
        self._req_headers = {}  # a new client may reuse the old one's id() (and has its own headers)


# ---- the lean HTTP/1.1 client of plain-http endpoints -----------------------------------------------------------
LEAN_ENV = "PYRODASH_HTTP_CLIENT"  # "httpx": every request through httpx (the lean client is for http:// only anyway)
_MAX_HEAD = 64 * 1024  # a response's status line + headers
_PAUSE_AT = 1 << 20  # unread response bytes above which the socket stops being read (back-pressure)


def lean_ok(url: str) -> bool:
    """Whether requests to `url` may go through `_LeanPool`: plain http://, no proxy that httpx would use for it
    (HTTP_PROXY / ALL_PROXY unless NO_PROXY bypasses the host), and not switched off ($PYRODASH_HTTP_CLIENT=httpx)."""
    if os.environ.get(LEAN_ENV, "").strip().lower() == "httpx":
        return False
    u = urlparse(url)
    if u.scheme != "http" or not u.hostname or u.username or u.password:
        return False
    proxies = urllib.request.getproxies()
    if proxies.get("http") or proxies.get("all"):
        return bool(urllib.request.proxy_bypass(u.hostname))
    return True


class _H1(asyncio.Protocol):
    """One HTTP/1.1 connection: received bytes accumulate in `buf`; `more()` waits for the next ones."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.buf, self.eof, self.exc = loop, bytearray(), False, None
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.paused, self.idle_since, self.got = False, 0.0, False  # got: a response's first bytes arrived
        self.read_deadline = LazyDeadline(loop, self._expire)  # one timer per connection, not one per read

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if len(self.buf) > _PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof, self.exc = True, exc
        self._wake()
        self.read_deadline.close()

    def _wake(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_result(None)

    def consumed(self) -> None:
        if self.paused and len(self.buf) < _PAUSE_AT // 2:
            self.paused = False
            self.transport.resume_reading()

    async def more(self, timeout_s: float) -> None:
        """Wait until more bytes arrived (httpx.ReadTimeout after `timeout_s`; httpx.RemoteProtocolError when the
        server closed the connection first)."""
        if self.eof:
            raise httpx.RemoteProtocolError("the server closed the connection in the middle of a response")
        self.consumed()
        w = self.waiter = self.loop.create_future()
        self.read_deadline.start(timeout_s)
        try:
            await w
        finally:
            self.waiter = None
            self.read_deadline.stop()

    def _expire(self) -> None:
        w = self.waiter
        if w is not None and not w.done():
            w.set_exception(httpx.ReadTimeout("no response bytes within the read timeout"))

    def reusable(self) -> bool:
        t = self.transport
        return not self.eof and not self.buf and t is not None and not t.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class _LeanResponse:
    """A streamed HTTP/1.1 response read from an `_H1` (the part of httpx.Response that `stream()` uses)."""

    def __init__(self, pool: _LeanPool, conn: _H1, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.pool, self.conn, self.status_code = pool, conn, status
        self._raw_headers = headers
        self._headers: httpx.Headers | None = None
        self._inflate = None
        self.done, self.keep = False, True
        te = cl = None
        for k, v in headers:
            if k == b"transfer-encoding":
                te = v.lower()
            elif k == b"content-length":
                cl = v
            elif k == b"connection" and b"close" in v.lower():
                self.keep = False
            elif k == b"content-encoding" and v.strip().lower() not in (b"", b"identity"):
                enc = v.strip().lower()
                if enc not in (b"gzip", b"deflate"):
                    raise httpx.DecodingError(f"unsupported content-encoding {enc.decode(errors='replace')!r}")
                self._inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by its header
        if te is not None and b"chunked" in te:
            self.mode, self.left = "chunked", -1  # -1: a chunk-size line is next
        elif cl is not None:
            if not cl.strip().isdigit():
                raise httpx.RemoteProtocolError("malformed content-length")
            self.mode, self.left = "length", int(cl)
            self.done = self.left == 0
        else:
            self.mode, self.left, self.keep = "close", 0, False  # read to the end of the connection

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._raw_headers)
        return self._headers

    def _decode(self) -> bytes:
        """The body bytes decodable from the connection's buffer now (sets `done` at the body's end)."""
        buf = self.conn.buf
        if self.mode == "length":
            take = min(self.left, len(buf))
            out = bytes(buf[:take])
            del buf[:take]
            self.left -= take
            self.done = self.left == 0
            return out
        if self.mode == "close":
            out = bytes(buf)
            buf.clear()
            self.done = self.conn.eof and not out
            return out
        parts = []
        while True:
            if self.left > 0:  # inside a chunk's data
                take = min(self.left, len(buf))
                if not take:
                    break
                parts.append(bytes(buf[:take]))
                del buf[:take]
                self.left -= take
                if self.left == 0:
                    self.left = -2  # its CRLF is next
                continue
            if self.left == -2:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise httpx.RemoteProtocolError("malformed chunked body")
                del buf[:2]
                self.left = -1
                continue
            i = buf.find(b"\r\n")
            if i < 0:
                if len(buf) > 4096:
                    raise httpx.RemoteProtocolError("malformed chunked body")
                break
            line = bytes(buf[:i])
            del buf[: i + 2]
            if self.left == -3:  # trailers, up to an empty line
                if not line:
                    self.done = True
                    break
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise httpx.RemoteProtocolError("malformed chunk size") from None
            self.left = size if size else -3
        return b"".join(parts)

    async def _read(self) -> bytes:
        """The next body bytes (waiting for some), b"" at the end of the body."""
        while not self.done:
            out = self._decode()
            if self._inflate is not None and out:
                out = self._inflate.decompress(out)
            if out:
                return out
            if self.done:
                break
            if self.mode == "close" and self.conn.eof:
                self.done = True
                break
            await self.conn.more(self.pool.read_s)
        return b""

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        while True:
            out = await self._read()
            if not out:
                return
            yield out

    async def aread(self) -> bytes:
        return b"".join([b async for b in self.aiter_bytes()])

    async def aclose(self) -> None:
        conn, self.conn = self.conn, None
        if conn is None:
            return
        if self.done and self.keep and conn.reusable():
            self.pool.put(conn)
        else:  # a response not read to its end: closing the connection tells the server to stop generating
            conn.close()


class _LeanPool:
    """Kept-alive HTTP/1.1 connections to one plain-http endpoint, and a streamed POST over them: the request line,
    headers and JSON body are one write of bytes prepared once per path (only Content-Length and the body change),
    and responses are parsed straight from the socket buffer. This is the per-request path of a handoff; httpx is
    still the client of everything else (GET /models, /tokenize, https endpoints, proxies)."""

    def __init__(self, url: str, headers: dict, timeout_s: float, connect_s: float, max_idle: int = 64) -> None:
        u = urlparse(url)
        self.host, self.port = u.hostname, u.port or 80
        host = u.hostname if u.port is None else f"{u.hostname}:{u.port}"
        if ":" in (u.hostname or "") and not host.startswith("["):
            host = f"[{u.hostname}]" + (f":{u.port}" if u.port else "")
        self.host_header = host
        self.prefix = u.path.rstrip("/")
        self.headers = {
            "accept": "*/*",
            "accept-encoding": "identity",
            "connection": "keep-alive",
            "user-agent": "pyrodash",
            **{k.lower(): v for k, v in headers.items()},
            "content-type": "application/json",
        }
        self.read_s, self.connect_s, self.max_idle = timeout_s, connect_s, max_idle
        self.idle: list[_H1] = []
        self.loop = asyncio.get_running_loop()
        self._heads: dict[str, bytes] = {}
        self.sent_at: float | None = None  # perf_counter() when the last request was handed to its socket

    def head(self, path: str) -> bytes:
        """The request's bytes up to the Content-Length value (for `path` relative to the base URL)."""
        h = self._heads.get(path)
        if h is None:
            lines = [
                f"POST {self.prefix}{path} HTTP/1.1",
                f"host: {self.host_header}",
                *(f"{k}: {v}" for k, v in self.headers.items()),
            ]
            h = self._heads[path] = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")
        return h

    async def _connect(self) -> _H1:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _H1(self.loop), self.host, self.port), self.connect_s
            )
        except (asyncio.TimeoutError, TimeoutError):
            raise httpx.ConnectTimeout(f"no connection within {self.connect_s}s") from None
        except OSError as e:
            raise httpx.ConnectError(f"{type(e).__name__}: {e.strerror or e}") from None
        return conn

    def _take(self) -> _H1 | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable() and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    def put(self, conn: _H1) -> None:
        conn.idle_since = time.monotonic()
        if len(self.idle) >= self.max_idle:
            self.idle.pop(0).close()
        self.idle.append(conn)

    async def warm(self) -> None:
        """One connection open in the pool (a TCP connect, no request) unless one is already idle."""
        if not any(c.reusable() for c in self.idle):
            self.put(await self._connect())

    async def post(self, path: str, content: bytes) -> _LeanResponse:
        data = b"%s%d\r\n\r\n%s" % (self.head(path), len(content), content)
        for attempt in (0, 1):
            conn = self._take()
            reused = conn is not None
            if conn is None:
                conn = await self._connect()
            conn.got = False
            try:
                # the request is handed to the socket (benchmarks read it; stamped before the write, which on
                # loopback may return only after the kernel ran the server that it woke)
                self.sent_at = time.perf_counter()
                conn.transport.write(data)
                return await self._response(conn)
            except httpx.RemoteProtocolError:
                conn.close()
                # a kept-alive connection the server closed as the request went out: the request never reached
                # it (no byte of a response came back), so it is sent once more on a new connection
                if reused and attempt == 0 and not conn.got and not conn.buf:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def _response(self, conn: _H1) -> _LeanResponse:
        while True:  # interim 1xx responses are skipped
            while (end := conn.buf.find(b"\r\n\r\n")) < 0:
                if len(conn.buf) > _MAX_HEAD:
                    raise httpx.RemoteProtocolError("response headers too long")
                await conn.more(self.read_s)
            conn.got = True
            head = bytes(conn.buf[:end])
            del conn.buf[: end + 4]
            status_line, *lines = head.split(b"\r\n")
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise httpx.RemoteProtocolError(f"malformed status line {status_line[:80]!r}")
            status = int(parts[1])
            headers = []
            for line in lines:
                k, sep, v = line.partition(b":")
                if not sep:
                    raise httpx.RemoteProtocolError("malformed response header")
                headers.append((k.strip().lower(), v.strip()))
            if 100 <= status < 200 and status != 101:
                continue
            return _LeanResponse(self, conn, status, headers)

    def close(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle = []


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what is left of a response body after `data: [DONE]`, for at most DRAIN_S (a server that keeps the
    stream open after [DONE] only costs its connection, which closing the response then drops)."""

    async def rest() -> None:
        async for _ in chunks:
            pass

    with contextlib.suppress(TimeoutError, asyncio.TimeoutError, httpx.HTTPError):
        if hasattr(asyncio, "timeout"):  # Python >= 3.11: no extra task
            async with asyncio.timeout(DRAIN_S):
                await rest()
        else:
            await asyncio.wait_for(rest(), DRAIN_S)


def _json(text: str):
    """One event's JSON value (`text` has no whitespace around it); ValueError when it is not exactly one."""
    try:
        obj, end = _scan(text, 0)
    except StopIteration:
        raise ValueError(f"no JSON value: {text[:50]!r}") from None
    if end != len(text):
        raise ValueError(f"extra data after the JSON value at {end}")
    return obj


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
