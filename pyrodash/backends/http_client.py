"""The upstream HTTP client of `OpenAICompatBackend`: httpx, one `AsyncClient` per event loop, kept-alive connections.

    client = UpstreamClient("http://127.0.0.1:8000/v1", timeout_s=60)
    async with client.post_stream("/chat/completions", body_bytes, headers) as resp:
        chunks = resp.aiter_bytes(); ...; await drain(chunks)  # after `data: [DONE]`: the body's end, connection kept

A streamed response read to its end goes back to httpx's pool; one closed early closes its connection (the server
stops generating). Why httpx, and what it replaced: docs/scaling.md, "Upstream HTTP client".
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import time
import urllib.request
from collections.abc import AsyncIterator

import httpcore
import httpx

KEEPALIVE_S = 120.0  # how long an idle connection is kept (the server may close it sooner: httpx then drops it)
DRAIN_S = 0.5  # the longest a response is read after its [DONE] (to reuse its connection)


class _OneWrite(httpcore.AsyncNetworkStream):
    """A connection whose writes go out together at its next read. httpcore writes a request's head and its body
    apart; the server would wake up for each (and on few cores the client lose its core to it each time)."""

    def __init__(self, stream: httpcore.AsyncNetworkStream) -> None:
        self._stream, self._held = stream, b""

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._held += buffer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        if self._held:
            held, self._held = self._held, b""
            await self._stream.write(held, timeout)
        return await self._stream.read(max_bytes, timeout)

    async def aclose(self) -> None:
        self._held = b""
        await self._stream.aclose()

    async def start_tls(self, ssl_context, server_hostname: str | None = None, timeout: float | None = None):
        return _OneWrite(await self._stream.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str):
        return self._stream.get_extra_info(info)


class _OneWriteBackend(httpcore.AnyIOBackend):
    async def connect_tcp(self, *args, **kwargs) -> httpcore.AsyncNetworkStream:
        return _OneWrite(await super().connect_tcp(*args, **kwargs))


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """httpx's default TLS settings, made once per process (loading the CA bundle takes ~0.1 s)."""
    return httpx.create_ssl_context()


def _transport(limits: httpx.Limits) -> httpx.AsyncHTTPTransport | None:
    """httpx's transport with its connection pool made again with `_OneWrite` connections (httpx takes no network
    backend; `_pool` is where it keeps its httpcore pool: checked, so an httpx that moves it fails here, loudly).
    None (httpx's own transport, which alone applies them) when the environment names a proxy: httpx reads the
    same `urllib.request.getproxies()`."""
    proxies = urllib.request.getproxies()
    if any(proxies.get(scheme) for scheme in ("http", "https", "all")):
        return None
    transport = httpx.AsyncHTTPTransport(verify=_ssl_context(), limits=limits)
    if not isinstance(getattr(transport, "_pool", None), httpcore.AsyncConnectionPool):
        raise RuntimeError(f"httpx {httpx.__version__}: no httpcore pool at AsyncHTTPTransport._pool")
    transport._pool = httpcore.AsyncConnectionPool(
        ssl_context=_ssl_context(),
        max_connections=limits.max_connections,
        max_keepalive_connections=limits.max_keepalive_connections,
        keepalive_expiry=limits.keepalive_expiry,
        network_backend=_OneWriteBackend(),
    )
    return transport


class _Attempt:
    """httpx's `trace` extension for one request: whether it opened a new connection, when its bytes went out."""

    def __init__(self) -> None:
        self.opened, self.sent_at = False, None

    async def __call__(self, name: str, info: dict) -> None:
        if name == "connection.connect_tcp.started":
            self.opened = True
        elif name == "http11.receive_response_headers.started":  # `_OneWrite` sends the request's bytes then
            self.sent_at = time.perf_counter()


class UpstreamClient:
    """Requests to one base URL (`http(s)://host/v1`), through the running event loop's `httpx.AsyncClient`."""

    def __init__(self, base: str, timeout_s: float) -> None:
        self.base = base.rstrip("/")
        self.timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        self._timeout_ext = self.timeout.as_dict()
        self._client: httpx.AsyncClient | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._urls: dict[str, httpx.URL] = {}
        self._headers: tuple[httpx.AsyncClient, dict, httpx.Headers] | None = None  # (client, given, merged)
        self.last_used = 0.0
        self.sent_at: float | None = None  # perf_counter() when the last POST's bytes were about to be written

    def client(self, headers: dict | None = None) -> httpx.AsyncClient:
        """This event loop's client (made on first use in a loop; `headers` are its defaults then)."""
        loop = asyncio.get_running_loop()
        if self._client is None or self._loop is not loop or self._client.is_closed:
            limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=KEEPALIVE_S)
            self._client = httpx.AsyncClient(
                timeout=self.timeout,
                limits=limits,
                transport=_transport(limits),
                verify=_ssl_context(),
                headers=headers or {},
            )
            self._loop, self._headers = loop, None
        return self._client

    def _request(self, client: httpx.AsyncClient, path: str, content: bytes, headers: dict, trace) -> httpx.Request:
        """The POST, built by hand (URL parsed once per path, headers merged once per client and headers) rather
        than by `client.stream`, whose per-request URL, header and cookie merging is most of httpx's client time."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(f"{self.base}{path}")
        cached = self._headers
        if cached is None or cached[0] is not client or cached[1] != headers:
            merged = httpx.Headers(client.headers)
            merged.update(headers)
            merged["content-type"] = "application/json"
            cached = self._headers = (client, dict(headers), merged)
        ext = {"timeout": self._timeout_ext, "trace": trace}
        return httpx.Request("POST", url, headers=cached[2], content=content, extensions=ext)

    @contextlib.asynccontextmanager
    async def post_stream(self, path: str, content: bytes, headers: dict) -> AsyncIterator[httpx.Response]:
        """POST `content` (JSON bytes) to `base + path` and stream the response; closed on exit (its connection goes
        back to the pool only when the body was read to its end). A kept-alive connection that the server closed as
        the request went out (it failed before a response head came back) is retried once on a new connection, as
        uvicorn's keep-alive timeout can race a request; on a new connection the same failure is an error (the
        caller's policy decides)."""
        client = self.client(headers)
        self.last_used = time.monotonic()
        for attempt in (0, 1):
            trace = _Attempt()
            try:
                resp = await client.send(self._request(client, path, content, headers, trace), stream=True)
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
                if attempt == 0 and not trace.opened:
                    continue
                raise
            finally:
                self.sent_at = trace.sent_at
            break
        try:
            yield resp
        finally:
            await resp.aclose()
            self.last_used = time.monotonic()

    async def get(self, path: str, headers: dict, timeout_s: float = 5.0) -> httpx.Response:
        return await self.client(headers).get(f"{self.base}{path}", timeout=timeout_s)

    async def warm(self, headers: dict) -> None:
        """A cheap GET /models when the connections may have gone idle, so the next request finds one open; failures
        are ignored (the request itself reports them)."""
        if time.monotonic() - self.last_used < KEEPALIVE_S / 2:
            return
        self.last_used = time.monotonic()
        with contextlib.suppress(httpx.HTTPError):
            await self.get("/models", headers)

    async def aclose(self) -> None:
        if self._client is not None and self._loop is asyncio.get_running_loop():
            await self._client.aclose()
        self._client, self._headers = None, None


async def drain(chunks: AsyncIterator[bytes]) -> None:
    """Read what is left of a response body after `data: [DONE]`, for at most DRAIN_S, so that httpx puts its
    connection back in the pool (a server that keeps the stream open after [DONE] only costs its connection)."""

    async def rest() -> None:
        async for _ in chunks:
            pass

    with contextlib.suppress(TimeoutError, asyncio.TimeoutError, httpx.HTTPError):
        if hasattr(asyncio, "timeout"):  # Python >= 3.11: no extra task
            async with asyncio.timeout(DRAIN_S):
                await rest()
        else:
            await asyncio.wait_for(rest(), DRAIN_S)
