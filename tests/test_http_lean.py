"""The lean HTTP/1.1 client of plain-http upstreams (`backends/http/lean_client.py`) on its own, against the raw TCP
TEST DOUBLE of `test_openai_compat_http.py` (what the backend sees through it, with every framing, is tested there
for both clients): which URLs it takes, interim and malformed responses, a large body under back-pressure, warming,
the keep-alive limit, and its connections closed as the event loop ends."""

from __future__ import annotations

import asyncio
import threading

import pytest
from test_openai_compat_http import RawServer, response

from pyrodash.backends.http import lean_client
from pyrodash.backends.http.lean_client import LeanClient, LeanError, lean_ok

BODY = b'{"model":"m"}'
HEADERS = {"content-type": "application/json"}


async def _post(client: LeanClient) -> tuple[int, bytes]:
    async with client.post_stream("/chat/completions", BODY, HEADERS) as resp:
        return resp.status, await resp.read()


def test_it_takes_plain_http_without_a_proxy_or_credentials(monkeypatch):
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    assert lean_ok("http://127.0.0.1:8000/v1") and lean_ok("http://[::1]:8000/v1")
    assert not lean_ok("https://api.openai.com/v1")
    assert not lean_ok("http://user:secret@10.0.0.5/v1")
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert not lean_ok("http://10.0.0.5:8000/v1")
    monkeypatch.setenv("NO_PROXY", "10.0.0.5")
    assert lean_ok("http://10.0.0.5:8000/v1")


def test_an_interim_response_is_skipped_and_a_large_body_reads_whole():
    big = bytes(range(256)) * (3 * 4096 + 7)  # ~3 MiB: more than the buffer read before the socket pauses

    async def main():
        answers = {1: b"HTTP/1.1 100 Continue\r\n\r\n" + response(b"ok", "length"), 2: response(big, "length")}
        async with RawServer(answers.get) as srv:
            client = LeanClient(srv.url, timeout_s=5)
            first = await _post(client)
            second = await _post(client)
            await client.aclose()
            return first, second, srv.connections

    first, second, connections = asyncio.run(main())
    assert first == (200, b"ok") and second == (200, big) and connections == 1


@pytest.mark.parametrize(
    "answer",
    [
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: 2\r\n\r\nxx",
        b"HTTP/1.1 200 OK\r\ncontent-length: 2x\r\n\r\nxx",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nxx\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"x-long: " + b"a" * (70 * 1024) + b"\r\n\r\n",
    ],
)
def test_a_malformed_response_is_a_lean_error(answer):
    async def main():
        async with RawServer(lambda n: answer) as srv:
            client = LeanClient(srv.url, timeout_s=5)
            try:
                with pytest.raises(LeanError):
                    await _post(client)
            finally:
                await client.aclose()

    asyncio.run(main())


def test_warm_opens_one_connection_that_the_next_request_uses():
    async def main():
        async with RawServer(lambda n: response(b"ok", "length")) as srv:
            client = LeanClient(srv.url, timeout_s=5)
            await client.warm(HEADERS)
            await client.warm(HEADERS)  # one is idle already: nothing more
            await asyncio.sleep(0.05)
            opened = srv.connections
            assert await _post(client) == (200, b"ok")
            await client.aclose()
            return opened, srv.connections, srv.requests

    assert asyncio.run(main()) == (1, 1, 1)


def test_a_connection_idle_past_the_keep_alive_limit_is_not_reused(monkeypatch):
    monkeypatch.setattr(lean_client, "KEEPALIVE_S", 0.0)

    async def main():
        async with RawServer(lambda n: response(b"ok", "length")) as srv:
            client = LeanClient(srv.url, timeout_s=5)
            for _ in range(2):
                assert await _post(client) == (200, b"ok")
            await client.aclose()
            return srv.connections

    assert asyncio.run(main()) == 2


def test_its_connections_close_as_the_event_loop_ends():
    """`engine.run()` makes an event loop per call: the pool's idle connection closes as that loop ends, without an
    `aclose()`, and the next loop gets a pool of its own."""
    server_loop = asyncio.new_event_loop()
    threading.Thread(target=server_loop.run_forever, daemon=True).start()
    srv = RawServer(lambda n: response(b"ok", "length"))
    on_server = lambda coro: asyncio.run_coroutine_threadsafe(coro, server_loop).result(10)  # noqa: E731
    on_server(srv.__aenter__())
    try:
        client = LeanClient(srv.url, timeout_s=5)
        first = asyncio.run(_post(client))
        on_server(asyncio.wait_for(srv.closed.wait(), 5))  # the first loop's end closed its connection
        second = asyncio.run(_post(client))
    finally:
        on_server(srv.__aexit__(None, None, None))
        server_loop.call_soon_threadsafe(server_loop.stop)
    assert first == second == (200, b"ok") and srv.connections == 2
