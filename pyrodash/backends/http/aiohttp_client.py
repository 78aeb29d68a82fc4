"""The upstream HTTP client of `OpenAICompatBackend`'s generation requests to https upstreams, through a proxy, or
with credentials in the URL: aiohttp, one `ClientSession` per event loop, kept-alive connections. Plain-http upstreams
go through the lean client (`backends/http/lean_client.py`, same interface); GET /models and the probe through httpx.

    client = UpstreamClient("https://api.openai.com/v1", timeout_s=60)
    async with client.post_stream("/chat/completions", body_bytes, headers) as resp:  # an aiohttp.ClientResponse
        async for raw in resp.content.iter_any(): ...
        await client.drain(resp)  # after `data: [DONE]`: the body's end, so the connection goes back to the pool

A response closed before its end closes its connection (the server stops generating). Which client where, and
why: docs/scaling.md, "Upstream HTTP client".
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import time
import urllib.request
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from urllib.parse import urlparse

import aiohttp
from multidict import CIMultiDict
from yarl import URL

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


# per task: whether the request being sent got a kept-alive connection from the pool (set by `_Connector.connect`)
_REUSED: contextvars.ContextVar[bool] = contextvars.ContextVar("pyrodash_http_reused", default=False)


class _Connector(aiohttp.TCPConnector):
    """aiohttp's TCP connector that says, for each request, whether its connection was kept alive from an earlier
    one (`_REUSED`) and when it was handed to the request (`sent_at`, just before the request is written). aiohttp's
    trace signals tell the same but cost 30-45 µs of CPU per request."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.used: weakref.WeakSet = weakref.WeakSet()  # the connections (protocols) that carried a request
        self.sent_at: float | None = None

    async def connect(self, req, traces, timeout):
        conn = await super().connect(req, traces, timeout)
        proto = conn.protocol
        _REUSED.set(proto in self.used)
        self.used.add(proto)
        self.sent_at = time.perf_counter()
        return conn


async def _closing(aclose: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    try:
        yield
    finally:
        await aclose()


async def at_loop_end(aclose: Callable[[], Awaitable[None]]) -> AsyncIterator[None]:
    """Have `aclose()` run as the running event loop ends, through an async generator left open after its first step:
    the loop finalizes it (`asyncio.run` runs `loop.shutdown_asyncgens()`). Keep the returned generator as long as
    the resource lives (collected, it is finalized then). `engine.run()` makes a loop per call: a session or socket
    left open would be reported as unclosed when collected."""
    closer = _closing(aclose)
    await anext(closer)
    return closer


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
        self._urls: dict[str, URL] = {}  # per path, parsed once
        self._headers: tuple[dict, CIMultiDict] | None = None  # the last request's headers, as given and as sent
        self.last_used = 0.0

    @property
    def sent_at(self) -> float | None:
        """perf_counter() when the last POST was handed its connection, just before its bytes were written."""
        return None if self._session is None else self._session.connector.sent_at

    async def session(self) -> aiohttp.ClientSession:
        """This event loop's session (made on its first use in a loop, closed at the loop's end at the latest)."""
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            conn = _Connector(limit=256, limit_per_host=0, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(connector=conn, timeout=self.timeout)
            self._loop = loop
            self._closer = await at_loop_end(self._session.close)
        return self._session

    def _prepared(self, path: str, headers: dict) -> tuple[URL, CIMultiDict]:
        """The request's URL and headers, built once (again when the headers change: a new key). The headers name
        what aiohttp would otherwise add to every request (Accept, Accept-Encoding, User-Agent)."""
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self.base + path)
        if self._headers is None or self._headers[0] != headers:
            sent = CIMultiDict({"Accept": "*/*", "Accept-Encoding": "gzip, deflate", "User-Agent": "pyrodash"})
            sent.update(headers)
            self._headers = (headers, sent)
        return url, self._headers[1]

    async def _send(self, path: str, content: bytes, headers: dict) -> aiohttp.ClientResponse:
        """The POST, sent once more on a new connection when a kept-alive one turns out closed by the server as the
        request went out (uvicorn's keep-alive timeout can race a request). On a new connection the same failure is
        an error (the caller's policy decides)."""
        session = await self.session()
        url, sent = self._prepared(path, headers)
        for attempt in (0, 1):
            _REUSED.set(False)
            try:
                return await session.post(url, data=content, headers=sent, proxy=self._proxy)
            except _STALE:
                if attempt == 0 and _REUSED.get():
                    continue
                raise
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

    async def drain(self, resp: aiohttp.ClientResponse) -> None:
        await drain(resp)

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


async def drain(resp, errors: tuple[type[BaseException], ...] = (aiohttp.ClientError,)) -> None:
    """Read what is left of a response body after `data: [DONE]`, for at most DRAIN_S, so that its connection goes
    back to the pool (a server that keeps the stream open after [DONE] only costs its connection); `errors`: the
    client's own, ignored as timeouts are."""

    async def rest() -> None:
        async for _ in resp.content.iter_any():
            pass

    with contextlib.suppress(TimeoutError, asyncio.TimeoutError, *errors):
        if hasattr(asyncio, "timeout"):  # Python >= 3.11: no extra task
            async with asyncio.timeout(DRAIN_S):
                await rest()
        else:
            await asyncio.wait_for(rest(), DRAIN_S)
