"""The upstream HTTP client of generation requests to plain-http servers (vLLM, SGLang, `pyrodash serve-model`):
HTTP/1.1 on kept-alive connections, a request's head and JSON body in one socket write of bytes prepared once per
path, the response parsed straight from the socket buffer. https, a proxy or credentials in the URL go through
aiohttp instead (`backends/http/aiohttp_client.py`); both have the same interface:

    client = LeanClient("http://127.0.0.1:8000/v1", timeout_s=60)  # when lean_ok(url)
    async with client.post_stream("/chat/completions", body_bytes, headers) as resp:  # a LeanResponse
        async for raw in resp.content.iter_any(): ...
        await client.drain(resp)  # after `data: [DONE]`: the body's end, so the connection goes back to the pool

Why this stays beside aiohttp (it adds ~0.4 ms to a relayed request's time to first token): docs/scaling.md,
"Upstream HTTP client".
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import zlib
from collections.abc import AsyncIterator
from urllib.parse import urlparse

from multidict import CIMultiDict

from pyrodash.backends.deadline import LazyDeadline
from pyrodash.backends.http.aiohttp_client import KEEPALIVE_S, at_loop_end, drain, env_proxy

MAX_HEAD = 64 * 1024  # a response's status line and headers
PAUSE_AT = 1 << 20  # unread response bytes above which the socket is not read (back-pressure)
MAX_IDLE = 64  # idle connections kept


class LeanError(Exception):
    """The server broke HTTP/1.1 or closed the connection before the response's end."""


class LeanConnectError(LeanError):
    """No connection to the server (refused, unreachable); the request never reached it."""


def lean_ok(url: str) -> bool:
    """Whether `url`'s requests may go through `LeanClient`: plain http://, no credentials in the URL, and no proxy
    named by the environment for its host."""
    u = urlparse(url)
    return u.scheme == "http" and bool(u.hostname) and not u.username and env_proxy(url) is None


class _H1(asyncio.Protocol):
    """One connection: received bytes accumulate in `buf`; `more()` waits for the next ones."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop, self.buf, self.eof = loop, bytearray(), False
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future | None = None
        self.paused, self.idle_since, self.got = False, 0.0, False  # got: a response's first bytes arrived
        self.read_deadline = LazyDeadline(loop, self._expire)  # one timer per connection, not one per read

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self.got = True
        if len(self.buf) > PAUSE_AT and not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.eof = True
        self._wake()
        self.read_deadline.close()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _expire(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(TimeoutError("no response bytes within the read timeout"))

    async def more(self, timeout_s: float) -> None:
        """Wait until more bytes arrived (TimeoutError after `timeout_s`; LeanError when the server closed first)."""
        if self.eof:
            raise LeanError("the server closed the connection in the middle of a response")
        if self.paused and len(self.buf) < PAUSE_AT // 2:
            self.paused = False
            self.transport.resume_reading()
        self.waiter = self.loop.create_future()
        self.read_deadline.start(timeout_s)
        try:
            await self.waiter
        finally:
            self.waiter = None
            self.read_deadline.stop()

    def reusable(self) -> bool:
        return not self.eof and not self.buf and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class LeanResponse:
    """A streamed response on an `_H1`: the part of `aiohttp.ClientResponse` that `OpenAICompatBackend` uses
    (`status`, `headers`, `read()`, `content.iter_any()`)."""

    def __init__(self, conn: _H1, read_s: float, status: int, headers: CIMultiDict) -> None:
        self.conn, self.read_s, self.status, self.headers = conn, read_s, status, headers
        self.content = self  # (aiohttp reads the body through `resp.content`)
        self.done, self.keep = False, "close" not in headers.get("connection", "").lower()
        self.inflate = None
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding not in ("", "identity"):
            if encoding not in ("gzip", "deflate"):
                raise LeanError(f"unsupported content-encoding {encoding!r}")
            self.inflate = zlib.decompressobj(zlib.MAX_WBITS | 32)  # gzip or zlib, by its header
        if "chunked" in headers.get("transfer-encoding", "").lower():
            self.mode, self.left = "chunked", -1  # -1: a chunk-size line is next
        elif "content-length" in headers:
            length = headers["content-length"].strip()
            if not length.isdigit():
                raise LeanError("malformed content-length")
            self.mode, self.left = "length", int(length)
            self.done = self.left == 0
        else:
            self.mode, self.left, self.keep = "close", 0, False  # read to the end of the connection

    def _decode(self) -> bytes:
        """The body bytes in the connection's buffer now (sets `done` at the body's end)."""
        buf = self.conn.buf
        if self.mode == "length":
            out = bytes(buf[: self.left])
            del buf[: self.left]
            self.left -= len(out)
            self.done = self.left == 0
            return out
        if self.mode == "close":
            out = bytes(buf)
            buf.clear()
            self.done = self.conn.eof and not out
            return out
        return self._dechunk(buf)

    def _dechunk(self, buf: bytearray) -> bytes:
        """Chunked framing; `left`: bytes left in the current chunk, or -1 (a size line next), -2 (the chunk's CRLF
        next), -3 (trailers, up to an empty line)."""
        parts = []
        while True:
            if self.left > 0:
                take = bytes(buf[: self.left])
                if not take:
                    break
                parts.append(take)
                del buf[: len(take)]
                self.left -= len(take)
                if self.left == 0:
                    self.left = -2
                continue
            if self.left == -2:
                if len(buf) < 2:
                    break
                if buf[:2] != b"\r\n":
                    raise LeanError("malformed chunked body")
                del buf[:2]
                self.left = -1
                continue
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > 4096:
                    raise LeanError("malformed chunked body")
                break
            line = bytes(buf[:end])
            del buf[: end + 2]
            if self.left == -3:
                if not line:
                    self.done = True
                    break
                continue
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise LeanError("malformed chunk size") from None
            self.left = size or -3
        return b"".join(parts)

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive, to its end."""
        while not self.done:
            out = self._decode()
            if out and self.inflate is not None:
                out = self.inflate.decompress(out)
            if out:
                yield out
            elif self.mode == "close" and self.conn.eof:
                self.done = True
            elif not self.done:
                await self.conn.more(self.read_s)

    async def read(self) -> bytes:
        return b"".join([part async for part in self.iter_any()])


class _Pool:
    """One event loop's kept-alive connections to the server."""

    def __init__(self, host: str, port: int, connect_s: float) -> None:
        self.host, self.port, self.connect_s = host, port, connect_s
        self.loop = asyncio.get_running_loop()
        self.idle: list[_H1] = []

    async def connect(self) -> _H1:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _H1(self.loop), self.host, self.port), self.connect_s
            )
        except (asyncio.TimeoutError, TimeoutError):
            raise TimeoutError(f"no connection within {self.connect_s}s") from None
        except OSError as e:
            raise LeanConnectError(f"{type(e).__name__}: {e.strerror or e}") from None
        return conn

    def take(self) -> _H1 | None:
        now = time.monotonic()
        while self.idle:
            conn = self.idle.pop()
            if conn.reusable() and now - conn.idle_since < KEEPALIVE_S:
                return conn
            conn.close()
        return None

    def put(self, conn: _H1) -> None:
        conn.idle_since = time.monotonic()
        if len(self.idle) >= MAX_IDLE:
            self.idle.pop(0).close()
        self.idle.append(conn)

    async def aclose(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle = []


class LeanClient:
    """Streamed POSTs to one plain-http base URL (`http://host:port/v1`), over the running event loop's pool."""

    def __init__(self, base: str, timeout_s: float) -> None:
        u = urlparse(base.rstrip("/"))
        self.host, self.port, self.prefix = u.hostname, u.port or 80, u.path
        self.host_header = u.netloc
        self.read_s, self.connect_s = timeout_s, min(timeout_s, 10.0)
        self._pool: _Pool | None = None
        self._closer: AsyncIterator[None] | None = None  # closes the pool's connections as its loop ends
        self._heads: dict[str, bytes] = {}  # per path: the request's bytes up to the Content-Length value
        self._headers: dict | None = None  # the headers `_heads` were made with
        self.sent_at: float | None = None  # perf_counter() when the last request was handed to its socket
        self.last_used = 0.0

    async def pool(self) -> _Pool:
        """This event loop's pool (made on its first use in a loop, closed at the loop's end at the latest)."""
        if self._pool is None or self._pool.loop is not asyncio.get_running_loop():
            self._pool = _Pool(self.host, self.port, self.connect_s)
            self._closer = await at_loop_end(self._pool.aclose)
        return self._pool

    def _head(self, path: str, headers: dict) -> bytes:
        if headers != self._headers:
            self._heads, self._headers = {}, dict(headers)
        head = self._heads.get(path)
        if head is None:
            fields = {"host": self.host_header, "accept": "*/*", "accept-encoding": "identity"}
            fields |= {"connection": "keep-alive", "user-agent": "pyrodash"}
            fields |= {k.lower(): v for k, v in headers.items()}
            lines = [f"POST {self.prefix}{path} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
            head = self._heads[path] = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")
        return head

    async def _send(self, path: str, content: bytes, headers: dict) -> LeanResponse:
        """The POST, sent once more on a new connection when a kept-alive one turns out closed by the server as the
        request went out (no byte of a response came back: it never reached the server). On a new connection the
        same failure is an error (the caller's policy decides)."""
        pool = await self.pool()
        data = b"%s%d\r\n\r\n%s" % (self._head(path, headers), len(content), content)
        for attempt in (0, 1):
            conn = pool.take()
            reused = conn is not None
            conn = conn or await pool.connect()
            conn.got = False
            try:
                # stamped before the write, which on loopback may return only after the kernel ran the server
                self.sent_at = time.perf_counter()
                conn.transport.write(data)
                return await self._response(conn)
            except LeanError:
                conn.close()
                if reused and attempt == 0 and not conn.got:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
        raise AssertionError("unreachable")

    async def _response(self, conn: _H1) -> LeanResponse:
        """The response's head, read from `conn` (interim 1xx responses skipped)."""
        while True:
            while (end := conn.buf.find(b"\r\n\r\n", 0, MAX_HEAD)) < 0:
                if len(conn.buf) > MAX_HEAD:
                    raise LeanError("response headers too long")
                await conn.more(self.read_s)
            status_line, *lines = bytes(conn.buf[:end]).decode("latin-1").split("\r\n")
            del conn.buf[: end + 4]
            parts = status_line.split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
                raise LeanError(f"malformed status line {status_line[:80]!r}")
            headers: CIMultiDict[str] = CIMultiDict()
            for line in lines:
                name, sep, value = line.partition(":")
                if not sep:
                    raise LeanError("malformed response header")
                headers.add(name.strip(), value.strip())
            status = int(parts[1])
            if not 100 <= status < 200 or status == 101:
                return LeanResponse(conn, self.read_s, status, headers)

    @contextlib.asynccontextmanager
    async def post_stream(self, path: str, content: bytes, headers: dict) -> AsyncIterator[LeanResponse]:
        """POST `content` (JSON bytes, `headers` with its content type) and stream the response; on exit its
        connection goes back to the pool when the body was read to its end, else it is closed (the server stops)."""
        self.last_used = time.monotonic()
        resp = await self._send(path, content, headers)
        try:
            yield resp
        finally:
            if resp.done and resp.keep and resp.conn.reusable():
                self._pool.put(resp.conn)
            else:
                resp.conn.close()
            self.last_used = time.monotonic()

    async def drain(self, resp: LeanResponse) -> None:
        """Read what is left of the body after `data: [DONE]` (at most `http_client.DRAIN_S`), so that its
        connection goes back to the pool."""
        await drain(resp, (LeanError,))

    async def warm(self, headers: dict) -> None:
        """A connection open in the pool (a TCP connect, no request) unless one is idle; failures are ignored (the
        request itself reports them)."""
        pool = await self.pool()
        if not any(conn.reusable() for conn in pool.idle):
            with contextlib.suppress(LeanError, TimeoutError):
                pool.put(await pool.connect())

    async def aclose(self) -> None:
        if self._pool is not None and self._pool.loop is asyncio.get_running_loop():
            await self._pool.aclose()
        self._pool = None
