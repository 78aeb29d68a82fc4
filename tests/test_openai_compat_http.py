"""The upstream HTTP clients of `OpenAICompatBackend` (the lean client of plain-http upstreams,
`backends/http/lean_client.py`, and aiohttp, `backends/http/aiohttp_client.py`: every test runs with each), against a
raw TCP TEST DOUBLE that answers each request with scripted bytes: connections are reused once a stream ended with
`data: [DONE]` (the body is read to its end), a stream closed early closes its connection, every framing (chunked with
odd chunk boundaries, extensions and trailers; Content-Length; read to close; gzip) reads the same, and failures are
BackendErrors (refused connection, timeout, HTTP error status, a server gone mid-stream). A kept-alive connection the
server closed meanwhile is not used again; one it closed as the request went out is retried once."""

from __future__ import annotations

import asyncio
import dataclasses
import gzip
import json

import pytest

from pyrodash.backends.base import BackendError, GenRequest
from pyrodash.backends.http import openai_compat
from pyrodash.backends.http.aiohttp_client import UpstreamClient
from pyrodash.backends.http.continuation import StreamState
from pyrodash.backends.http.endpoint import LLMEndpoint
from pyrodash.backends.http.lean_client import LeanClient
from pyrodash.backends.http.openai_compat import TEMPLATE_TOKENS, OpenAICompatBackend

REQ = GenRequest(messages=[{"role": "user", "content": "q"}], max_tokens=8)


@pytest.fixture(autouse=True, params=["lean", "aiohttp"])
def client_kind(request, monkeypatch):
    """Each test with each client: "aiohttp" takes plain-http upstreams too (as it does https ones)."""
    if request.param == "aiohttp":
        monkeypatch.setattr(openai_compat, "lean_ok", lambda url: False)
    return request.param


def test_plain_http_goes_through_the_lean_client_and_https_or_a_proxy_through_aiohttp(client_kind, monkeypatch):
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.delenv(var, raising=False)
    lean = LeanClient if client_kind == "lean" else UpstreamClient
    assert type(OpenAICompatBackend("http://127.0.0.1:8000/v1", model="m").http) is lean
    assert type(OpenAICompatBackend("https://api.example.com/v1", model="m").http) is UpstreamClient
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    assert type(OpenAICompatBackend("http://10.0.0.5:8000/v1", model="m").http) is UpstreamClient


def sse(texts: list[str], finish: str = "stop", stop_reason=None, usage: bool = True) -> bytes:
    def ev(obj: dict) -> str:
        return "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", **obj}) + "\n\n"

    out = [ev({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": None}]}) for t in texts]
    out.append(ev({"choices": [{"index": 0, "delta": {}, "finish_reason": finish, "stop_reason": stop_reason}]}))
    if usage:
        out.append(ev({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": len(texts)}}))
    return ("".join(out) + "data: [DONE]\n\n").encode()


def chunked(body: bytes, sizes=(7, 1, 30), ext: bool = False, trailer: bool = False) -> bytes:
    out, i, k = [], 0, 0
    while i < len(body):
        n = sizes[k % len(sizes)]
        part = body[i : i + n]
        out.append(b"%x%s\r\n%s\r\n" % (len(part), b";x=1" if ext else b"", part))
        i, k = i + n, k + 1
    return b"".join(out) + b"0\r\n" + (b"x-trailer: 1\r\n" if trailer else b"") + b"\r\n"


class RawServer:
    """TEST DOUBLE: reads one HTTP/1.1 request at a time per connection and writes `answer(n)` (n: the request's
    number) or, when it returns None, closes the connection. Counts connections and requests."""

    def __init__(self, answer):
        self.answer, self.connections, self.requests, self.bodies, self.heads = answer, 0, 0, [], []
        self.closed = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.heads.append(head)
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                self.bodies.append(json.loads(await reader.readexactly(length)))
                self.requests += 1
                out = self.answer(self.requests)
                if out is None:
                    break
                if callable(out):
                    await out(reader, writer)
                    continue
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()

    async def __aenter__(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1"
        return self

    async def __aexit__(self, *exc):
        self.server.close()


def response(body: bytes, framing: str = "chunked", status: int = 200, extra: bytes = b"", **kw) -> bytes:
    head = b"HTTP/1.1 %d X\r\ncontent-type: text/event-stream\r\n%s" % (status, extra)
    if framing == "chunked":
        return head + b"transfer-encoding: chunked\r\n\r\n" + chunked(body, **kw)
    if framing == "length":
        return head + b"content-length: %d\r\n\r\n" % len(body) + body
    return head + b"connection: close\r\n\r\n" + body


async def collect(backend: OpenAICompatBackend, req: GenRequest = REQ) -> tuple[str, list]:
    text, chunks = "", []
    async for ch in backend.stream(req):
        text += ch.text
        chunks.append(ch)
    return text, chunks


@pytest.mark.parametrize(
    "framing,kw",
    [
        ("chunked", {}),
        ("chunked", {"sizes": (1,), "ext": True, "trailer": True}),
        ("chunked", {"sizes": (4096,)}),
        ("length", {}),
        ("close", {}),
    ],
)
def test_every_framing_streams_the_same_and_a_finished_stream_keeps_its_connection(framing, kw):
    body = sse(["Hello", ", wor", "ld ünï"], stop_reason=7)

    async def main():
        async with RawServer(lambda n: response(body, framing, **kw)) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            for _ in range(3):
                text, chunks = await collect(b)
                assert text == "Hello, world ünï"
                assert [c.stop_token_id for c in chunks if c.finish_reason] == [7, 7]
                assert chunks[-1].prompt_tokens == 3 and chunks[-1].completion_tokens == 3
            await b.aclose()
            return srv.connections, srv.requests

    conns, reqs = asyncio.run(main())
    assert reqs == 3
    assert conns == (3 if framing == "close" else 1)  # read to its end ([DONE] and the body's end): reused


@pytest.mark.parametrize(
    "texts,finish,want",
    [
        (["step one", "\n", "\n"], "stop", "step one"),  # returned stop string (transformers serve): dropped
        (["step one\n\n"], "stop", "step one"),
        (["step one"], "stop", "step one"),  # stripped by the server (vLLM, OpenAI): nothing held
        (["cut at\n"], "length", "cut at\n"),  # a held prefix of a stop string is released at the end
        (["x\n\n"], "length", "x\n\n"),  # ended by the cap, not the stop string: kept
    ],
)
def test_a_stop_string_the_server_returns_never_reaches_the_caller(texts, finish, want):
    """`GenChunk.text` never holds a matched stop string, also from a server that returns it: the tail that could
    begin one is held back until the next text or the stop, and dropped where the answer stopped on it; the usage
    still counts what the server sent."""
    body = sse(texts, finish=finish)

    async def main():
        async with RawServer(lambda n: response(body)) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            out = await collect(b, dataclasses.replace(REQ, stop=["\n\n"]))
            await b.aclose()
            return out

    text, chunks = asyncio.run(main())
    assert text == want
    assert chunks[-1].finish_reason == finish and chunks[-1].completion_tokens == len(texts)
    assert all(c.text for c in chunks if c.finish_reason is None)  # no empty text chunk while holding back


def test_a_server_that_writes_past_a_stop_string_is_cut_there_and_its_stream_closed():
    """A server that ignores `stop`: the text up to the stop string, a "stop" marked `client_stop`, the stream closed
    (its connection not reused), billed for what arrived (counted locally: marked estimated)."""
    body = sse(["a\n", "b\n\nc", *[" d e f" * 200] * 2000], finish="stop")  # (a long tail: still on the wire)

    async def main():
        async with RawServer(lambda n: response(body)) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            outs = [await collect(b, dataclasses.replace(REQ, stop=["\n\n"])) for _ in range(2)]
            await b.aclose()
            return outs, srv.connections

    outs, conns = asyncio.run(main())
    for text, chunks in outs:
        assert text == "a\nb" and [c.finish_reason for c in chunks if c.finish_reason] == ["stop", "stop"]
        last = chunks[-1]
        assert last.client_stop and last.usage_estimated and last.completion_tokens >= 2  # "a\n", "b\n\nc" arrived
        assert not any(c.client_stop for c in chunks[:-2])
    assert conns == 2  # the cut stream's connection was closed, not put back in the pool


def test_a_body_that_ends_after_done_is_read_to_its_end_and_keeps_its_connection():
    """The body's end (the last chunk) may come a while after `data: [DONE]`: it is waited for (up to DRAIN_S), so
    the connection is reused instead of closed."""
    whole = response(sse(["a"]))

    async def late_end(reader, writer):
        writer.write(whole[: -len(b"0\r\n\r\n")])
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def main():
        async with RawServer(lambda n: late_end) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            texts = [(await collect(b))[0] for _ in range(2)]
            await b.aclose()
            return texts, srv.connections

    assert asyncio.run(main()) == (["a", "a"], 1)


def test_crlf_lines_and_gzip_bodies():
    body = sse(["a", "b"]).replace(b"\n", b"\r\n")
    gz = gzip.compress(body)

    async def main():
        async with RawServer(
            lambda n: response(body) if n == 1 else response(gz, extra=b"content-encoding: gzip\r\n")
        ) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            out = [(await collect(b))[0] for _ in range(2)]
            await b.aclose()
            return out

    assert asyncio.run(main()) == ["ab", "ab"]


def test_closing_a_stream_early_closes_its_connection():
    async def slow(reader, writer):  # streams forever until the client goes away
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        event = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\n'
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.005)

    async def main():
        async with RawServer(lambda n: slow) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            it = b.stream(REQ)
            assert (await anext(it)).text == "x"
            await it.aclose()
            await asyncio.wait_for(srv.closed.wait(), 5)  # the server saw the client go: it stops generating
            await b.aclose()

    asyncio.run(main())


def test_a_kept_alive_connection_the_server_closed_is_not_reused():
    body = sse(["ok"])

    async def answer_then_close(reader, writer):  # as uvicorn does after its keep-alive timeout
        writer.write(response(body, "length"))
        await writer.drain()
        writer.close()
        raise ConnectionError("closed")

    async def idle_close():
        async with RawServer(lambda n: answer_then_close) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            for _ in range(3):
                assert (await collect(b))[0] == "ok"
                await asyncio.sleep(0.05)  # the close reaches the client while the connection is idle
            await b.aclose()
            return srv.connections, srv.requests

    async def race(first_closes: bool):
        # the server closes a connection on a request without answering it (a keep-alive race seen from the client)
        async with RawServer(lambda n: None if n == (1 if first_closes else 2) else response(body)) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            out = [(await collect(b))[0] for _ in range(2)]
            await b.aclose()
            return out, srv.connections, srv.requests

    assert asyncio.run(idle_close()) == (3, 3)
    # on a kept-alive connection, sent once more on a new one
    assert asyncio.run(race(False)) == (["ok", "ok"], 2, 3)
    # on a new connection it is an error (no retry here: the engine's failure policy decides)
    with pytest.raises(BackendError):
        asyncio.run(race(True))


def test_failures_are_backend_errors_as_before():
    async def never(reader, writer):
        await asyncio.sleep(10)

    async def main():
        # refused: never reached the server
        b = OpenAICompatBackend("http://127.0.0.1:9/v1", model="m", timeout_s=2)
        with pytest.raises(BackendError) as e:
            await collect(b)
        assert e.value.reached_server is False and "cannot connect" in str(e.value)
        # an HTTP error status: its message and status, the connection kept (the body was read)
        err = json.dumps({"error": {"message": "bad field", "param": "top_p"}}).encode()
        async with RawServer(lambda n: response(err, "length", status=400) if n == 1 else response(sse(["y"]))) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            with pytest.raises(BackendError) as e:
                await collect(b)
            assert e.value.status == 400 and e.value.param == "top_p" and "bad field" in str(e.value)
            assert not e.value.retryable
            assert (await collect(b))[0] == "y"
            await b.aclose()
        # a timeout
        async with RawServer(lambda n: never) as srv:
            b = OpenAICompatBackend(srv.url, model="m", timeout_s=0.2)
            with pytest.raises(BackendError) as e:
                await collect(b)
            assert "timeout" in str(e.value)
            await b.aclose()
        # the server gone in the middle of the stream
        cut = response(sse(["a", "b"]))[:-40]
        async with RawServer(lambda n: lambda r, w: _write_and_close(w, cut)) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            with pytest.raises(BackendError):
                await collect(b)
            await b.aclose()

    asyncio.run(main())


async def _write_and_close(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()
    writer.close()
    raise ConnectionError("closed")


def test_the_request_bytes_are_one_json_body_with_the_key():
    async def main():
        async with RawServer(lambda n: response(sse(["z"]))) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            b.api_key = "sk-test"  # headers are read at each request
            await collect(b)
            b.api_key = "sk-other"
            await collect(b)
            await b.aclose()
            return srv.bodies, srv.heads

    bodies, heads = asyncio.run(main())
    assert b"authorization: bearer sk-other\r\n" in heads[1].lower()
    assert b"authorization: bearer sk-test\r\n" in heads[0].lower() and heads[0].startswith(
        b"POST /v1/chat/completions "
    )
    assert bodies[0]["model"] == "m" and bodies[0]["stream"] is True
    assert bodies[0]["messages"][-1]["content"] == "q"


def test_the_read_timeout_bounds_each_wait_not_the_stream():
    """`timeout_s` is the longest wait for the next bytes: a stream that sends a chunk every 0.1 s for longer than
    the timeout (0.25 s) in all reads to its end; one that stops sending mid-stream fails with a timeout."""
    texts = [f"t{i} " for i in range(6)]
    head = response(b"").partition(b"\r\n\r\n")[0] + b"\r\n\r\n"  # chunked

    def trickle(stall_after: int | None):  # one event per chunk, 0.1 s apart; none after `stall_after` of them
        async def send(reader, writer):
            writer.write(head)
            for i, ev in enumerate(sse(texts).split(b"\n\n")[:-1]):
                if i == stall_after:
                    await asyncio.sleep(10)
                await asyncio.sleep(0.1)
                part = ev + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
            await writer.drain()

        return send

    async def main(stall_after):
        async with RawServer(lambda n: trickle(stall_after)) as srv:
            b = OpenAICompatBackend(srv.url, model="m", timeout_s=0.25)
            try:
                return await collect(b)
            finally:
                await b.aclose()

    text, chunks = asyncio.run(main(None))
    assert text == "".join(texts) and chunks[-1].completion_tokens == 6
    with pytest.raises(BackendError, match="timeout"):
        asyncio.run(main(3))


def test_a_request_is_one_socket_write(monkeypatch):
    """A request's head and JSON body go out in one socket write (the server wakes up once for it)."""
    from asyncio import selector_events

    writes: list[bytes] = []
    write = selector_events._SelectorSocketTransport.write

    def spy(self, data) -> None:
        writes.append(bytes(data))
        write(self, data)

    monkeypatch.setattr(selector_events._SelectorSocketTransport, "write", spy)

    async def main():
        async with RawServer(lambda n: response(sse(["z"]))) as srv:
            b = OpenAICompatBackend(srv.url, model="m")
            for _ in range(3):
                await collect(b)
            await b.aclose()
            return srv.connections

    assert asyncio.run(main()) == 1
    sent = [w for w in writes if not w.startswith(b"HTTP/1.1")]  # (the test server's answers use the same class)
    assert len(sent) == 3 and all(w.startswith(b"POST /v1/chat/completions ") and w.endswith(b"}") for w in sent)


def test_a_proxy_named_by_the_environment_is_used(monkeypatch):
    for var in ("NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.delenv(var, raising=False)

    async def main():
        async with RawServer(lambda n: response(sse(["via proxy"]))) as proxy:
            monkeypatch.setenv("HTTP_PROXY", proxy.url.removesuffix("/v1"))
            b = OpenAICompatBackend("http://upstream.invalid:8000/v1", model="m")
            text = (await collect(b))[0]
            await b.aclose()
            return text, proxy.heads

    text, heads = asyncio.run(main())
    assert text == "via proxy" and heads[0].startswith(b"POST http://upstream.invalid:8000/v1/chat/completions ")


@pytest.mark.parametrize("odd", [-5, float("nan"), float("inf"), 3.5, "12", True])
def test_an_odd_reported_count_is_left_out_and_the_usage_marked_estimated(odd):
    """A server reporting a negative, fractional, non-finite or non-numeric token count is not believed: the count is
    left out (counted or bounded locally instead) and the usage marked estimated, never a negative or NaN bill."""
    st = StreamState()
    st.feed({"choices": [], "usage": {"prompt_tokens": odd, "completion_tokens": 7}})
    assert st.prompt_tokens is None and st.completion_tokens == 7 and st.odd_usage
    st = StreamState()
    st.feed({"type": "message_start", "message": {"usage": {"input_tokens": odd, "output_tokens": 1}}})
    assert st.prompt_tokens is None and st.odd_usage
    ok = StreamState()
    ok.feed({"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 7.0}})
    assert (ok.prompt_tokens, ok.completion_tokens, ok.odd_usage) == (40, 7, False)


def test_an_unreported_prompt_is_bounded_never_under_counted():
    """A server that reports no usage: the prompt is charged at a bound of what it read (every message's text, the
    tools, the template's tokens around each message), above a tokenizer's count of the text alone (a chat of many
    short messages is mostly template tokens); a revert to characters / 4 of the content bills a fraction of it."""
    b = OpenAICompatBackend.from_endpoint(
        LLMEndpoint.parse({"url": "http://127.0.0.1:9/v1", "model": "m", "mode": "instruct"})
    )
    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": "ok"} for i in range(40)]
    body = {"messages": msgs, "tools": [{"type": "function", "function": {"name": "f"}}]}
    bound = b.prompt_bound(body)
    assert (
        bound
        >= 40 * TEMPLATE_TOKENS + sum(len(m["content"]) for m in msgs)
        > 10 * sum(len(m["content"]) for m in msgs) // 4
    )
    assert b.prompt_bound({"prompt": "héllo"}) == len("héllo".encode())  # a raw prompt, no tokenizer: its bytes
