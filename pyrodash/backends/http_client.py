"""The upstream HTTP client of `OpenAICompatBackend`'s generation requests: aiohttp, one `ClientSession` per event
loop, kept-alive connections (the backend's other calls, GET /models and the probe, go through httpx).

    client = UpstreamClient("http://127.0.0.1:8000/v1", timeout_s=60)
    async with client.post_stream("/chat/completions", body_bytes, headers) as resp:  # an aiohttp.ClientResponse
        async for raw in resp.content.iter_any(): ...
        await drain(resp)  # after `data: [DONE]`: the body's end, so the connection goes back to the pool

A response closed before its end closes its connection (the server stops generating). Why aiohttp, and what it
replaced: docs/scaling.md, "Upstream HTTP client".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator
from types import SimpleNamespace
from urllib.parse import urlparse

import aiohttp

KEEPALIVE_S = 120.0  # how long an idle connection is kept (the server may close it sooner: it is then dropped)
# idle time after which `warm()` opens a connection again: uvicorn (vLLM, SGLang, `pyrodash serve-model`) closes idle
# connections after 5 s; https APIs keep them longer
WARM_AFTER_S = {"http": 4.0, "https": KEEPALIVE_S / 2}
DRAIN_S = 0.5  # the longest a response is read after its [DONE] (to reuse its connection)
# what a kept-alive connection that the server closed as the request went out raises (before any response)
_STALE = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def env_proxy(url: str) -> str | None:
    """The proxy that the environment names for `url` (HTTP_PROXY / HTTPS_PROXY / ALL_PROXY unless NO_PROXY bypasses
    the host), read once per client instead of at every request."""
    u = urlparse(url)
    proxies = urllib.request.getproxies()
    proxy = proxies.get(u.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(u.hostname or ""):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


async def _opened(session, ctx, params) -> None:
    ctx.trace_request_ctx.opened = True


async def _sent(session, ctx, params) -> None:
    ctx.trace_request_ctx.sent_at = time.perf_counter()


def _trace() -> aiohttp.TraceConfig:
    """Per request (its `trace_request_ctx`): whether it opened a new connection, when its bytes went out."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_create_start.append(_opened)
    trace.on_request_headers_sent.append(_sent)
    return trace


async def _closed_with_its_loop(session: aiohttp.ClientSession) -> AsyncIterator[None]:
    """An async generator left open after its first step: the event loop finalizes it as it ends (`asyncio.run`
    runs `loop.shutdown_asyncgens()`), which closes `session` on its own loop (`engine.run()` makes a loop per call;
    a session left open would be reported as unclosed when collected)."""
    try:
        yield
    finally:
        await session.close()


class UpstreamClient:
    """Streamed POSTs to one base URL (`http(s)://host/v1`), through the running event loop's session."""

    def __init__(self, base: str, timeout_s: float) -> None:
        self.base = base.rstrip("/")
        # `sock_read` bounds each wait for the next bytes, never the whole stream
        self.timeout = aiohttp.ClientTimeout(total=None, connect=min(timeout_s, 10.0), sock_read=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: AsyncIterator[None] | None = None  # closes the session as its loop ends
        self._proxy = env_proxy(self.base)
        self._warm_after_s = WARM_AFTER_S.get(urlparse(self.base).scheme, KEEPALIVE_S / 2)
        self.last_used = 0.0
        self.sent_at: float | None = None  # perf_counter() when the last POST's head was written

    async def session(self) -> aiohttp.ClientSession:
        """This event loop's session (made on its first use in a loop, closed at the loop's end at the latest)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            conn = aiohttp.TCPConnector(limit=256, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(connector=conn, timeout=self.timeout, trace_configs=[_trace()])
            self._loop = loop
            self._closer = _closed_with_its_loop(self._session)
            await anext(self._closer)
        return self._session

    async def _send(self, path: str, content: bytes, headers: dict) -> aiohttp.ClientResponse:
        """The POST, sent once more on a new connection when a kept-alive one turns out closed by the server as the
        request went out (uvicorn's keep-alive timeout can race a request). On a new connection the same failure is
        an error (the caller's policy decides)."""
        session = await self.session()
        for attempt in (0, 1):
            trace = SimpleNamespace(opened=False, sent_at=None)
            try:
                return await session.post(
                    self.base + path, data=content, headers=headers, proxy=self._proxy, trace_request_ctx=trace
                )
            except _STALE:
                if attempt == 0 and not trace.opened:
                    continue
                raise
            finally:
                self.sent_at = trace.sent_at
        raise AssertionError("unreachable")

    @contextlib.asynccontextmanager
    async def post_stream(self, path: str, content: bytes, headers: dict) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST `content` (JSON bytes, `headers` with its content type) and stream the response; on exit its
        connection goes back to the pool when the body was read to its end, else it is closed."""
        self.last_used = time.monotonic()
        resp = await self._send(path, content, headers)
        try:
            yield resp
        finally:
            if resp.content.is_eof():
                resp.release()
            else:
                resp.close()
            self.last_used = time.monotonic()

    async def warm(self, headers: dict) -> None:
        """A cheap GET /models when the server may have closed the pool's idle connections, so the next request
        finds one open; failures are ignored (the request itself reports them)."""
        if time.monotonic() - self.last_used < self._warm_after_s:
            return
        self.last_used = time.monotonic()
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, TimeoutError):
            async with (await self.session()).get(
                self.base + "/models", headers=headers, proxy=self._proxy, timeout=aiohttp.ClientTimeout(total=5)
            ) as resp:
                await resp.read()

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None


async def drain(resp: aiohttp.ClientResponse) -> None:
    """Read what is left of a response body after `data: [DONE]`, for at most DRAIN_S, so that its connection goes
    back to the pool (a server that keeps the stream open after [DONE] only costs its connection)."""

    async def rest() -> None:
        async for _ in resp.content.iter_any():
            pass

    with contextlib.suppress(TimeoutError, asyncio.TimeoutError, aiohttp.ClientError):
        if hasattr(asyncio, "timeout"):  # Python >= 3.11: no extra task
            async with asyncio.timeout(DRAIN_S):
                await rest()
        else:
            await asyncio.wait_for(rest(), DRAIN_S)
