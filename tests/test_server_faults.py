"""`pyrodash serve` when things go wrong: clients that vanish mid-request, and an LLM that fails, hangs or is down.

Disconnects are checked on the models themselves: a forward hook counts the real SLM's and LLM's forward passes,
which must stop soon after the client goes away (no orphan generation). LLM faults come from
`FaultInjectingLLM`, a test double named as such: an OpenAI-compatible proxy in front of the real LLM server
(`pyrodash serve-model`'s app) that answers 500, hangs, or cuts the stream, on demand.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httpx
import openai
import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from test_server import KEY, Q, UvicornThread, llm_server, make_engine, remote, serve_config

from pyrodash.server.app import build_app

AUTH = {"Authorization": f"Bearer {KEY}"}


class ForwardCounter:
    """Counts a real model's forward passes (one per decoded token after the prefill)."""

    def __init__(self, model):
        self.n = 0
        self.handle = model.register_forward_hook(self._hook)

    def _hook(self, *_args) -> None:
        self.n += 1

    def settled(self, quiet_s: float = 1.0, limit_s: float = 20.0) -> int:
        """Wait until no forward pass happened for `quiet_s`; return the count (fails if it never goes quiet)."""
        deadline = time.monotonic() + limit_s
        last = -1
        while time.monotonic() < deadline:
            if self.n == last:
                return last
            last = self.n
            time.sleep(quiet_s)
        raise AssertionError(f"the model kept generating for {limit_s}s after the client left ({self.n} passes)")

    def close(self) -> None:
        self.handle.remove()


class FaultInjectingLLM:
    """Test double: proxies an OpenAI-compatible LLM server and injects the fault named by `mode`.

    ok: pass through · http500: answer 500 with an OpenAI error body · hang: never answer · cut: forward
    `cut_after` chunks, then drop the connection · cut_once: cut the first request, pass the rest through."""

    def __init__(self, upstream: str):
        self.upstream, self.mode, self.cut_after, self.calls = upstream, "ok", 3, 0
        self.app = FastAPI()
        self.app.add_api_route("/v1/models", self.models, methods=["GET"])
        self.app.add_api_route("/v1/chat/completions", self.chat, methods=["POST"])

    async def models(self):
        async with httpx.AsyncClient() as c:
            return (await c.get(f"{self.upstream}/v1/models")).json()

    async def chat(self, request: Request):
        self.calls += 1
        mode = self.mode
        if mode == "cut_once":
            mode, self.mode = "cut", "ok"
        if mode == "http500":
            return JSONResponse(
                {"error": {"message": "injected failure", "type": "server_error", "param": None, "code": None}},
                status_code=500,
            )
        if mode == "hang":
            while not await request.is_disconnected():
                await asyncio.sleep(0.05)
            return JSONResponse({}, status_code=499)
        body = await request.body()

        async def relay():
            sent = 0
            async with httpx.AsyncClient(timeout=60) as c:
                async with c.stream(
                    "POST",
                    f"{self.upstream}/v1/chat/completions",
                    content=body,
                    headers={"content-type": "application/json"},
                ) as r:
                    async for line in r.aiter_lines():
                        if mode == "cut" and line.startswith("data:") and '"content"' in line:
                            sent += 1
                            if sent > self.cut_after:
                                raise ConnectionResetError("injected: connection cut mid-stream")
                        yield line + "\n"

        return StreamingResponse(relay(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def llm_up(models):
    with llm_server(models[1]) as lsrv:
        yield lsrv


def _server(models, llm_url: str, **failure):
    config = serve_config()
    return UvicornThread(
        build_app(config, engine=make_engine(models[0], remote(llm_url), config, **failure)), log_level="error"
    )


# ---------------------------------------------------------------- client disconnects


@pytest.mark.parametrize("side", ["slm", "llm"])
def test_disconnect_mid_stream_stops_the_generating_model(models, llm_up, side):
    model_name = "slm-only" if side == "slm" else "always-offload"
    backend = models[0] if side == "slm" else models[1]
    with _server(models, llm_up.url) as srv:
        # the model keeps generating when nobody stops it: 120 tokens asked, 120 produced
        full = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=120,
            json={"model": model_name, "messages": Q, "max_tokens": 120},
        ).json()
        # (max_tokens is the joint budget: the SLM's <offload> token counts, so the LLM decodes 119 of 120)
        assert full["pyrodash"]["slm_out"] + full["pyrodash"]["llm_out"] == 120
        assert full["pyrodash"][f"{side}_out"] >= 119 and full["choices"][0]["finish_reason"] == "length"

        counter = ForwardCounter(backend.model)
        try:
            body = {"model": model_name, "messages": Q, "max_tokens": 1900, "stream": True}  # < 2048 positions
            seen = 0
            with httpx.stream("POST", f"{srv.url}/v1/chat/completions", json=body, headers=AUTH, timeout=60) as r:
                for line in r.iter_lines():
                    if '"content":"' in line and '"role"' not in line:
                        seen += 1
                    if seen >= 3:
                        break  # leaving the block closes the connection mid-stream
            stopped_at = counter.settled()
            assert 3 <= stopped_at < 300, f"{side} made {stopped_at} forward passes of 1900 asked"
            deadline = time.monotonic() + 5
            while srv.app.state.runs and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not srv.app.state.runs, "an engine run outlived its client"
            metrics = httpx.get(f"{srv.url}/metrics", headers=AUTH).text
            assert 'pyrodash_errors_total{kind="disconnect"} 1' in metrics
            assert 'status="499"' in metrics and "pyrodash_requests_in_flight 0" in metrics
        finally:
            counter.close()


def test_disconnect_of_a_non_streaming_request_stops_generation(models, llm_up):
    with _server(models, llm_up.url) as srv:
        counter = ForwardCounter(models[1].model)
        try:
            body = {"model": "always-offload", "messages": Q, "max_tokens": 1900}
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(
                    f"{srv.url}/v1/chat/completions", json=body, headers=AUTH, timeout=httpx.Timeout(10, read=1.0)
                )
            stopped_at = counter.settled()
            assert stopped_at < 2000, f"the LLM made {stopped_at} forward passes after the client left"
            assert not srv.app.state.runs
        finally:
            counter.close()


# ---------------------------------------------------------------- LLM faults and the failure policy


@pytest.fixture(scope="module")
def faulty(llm_up):
    fault = FaultInjectingLLM(llm_up.url)
    with UvicornThread(fault.app, log_level="critical") as fsrv:
        fault.url = fsrv.url
        yield fault
    fault.mode = "ok"


@pytest.mark.parametrize("mode,calls", [("http500", 2), ("hang", 2), ("cut", 2)])
@pytest.mark.parametrize("stream", [False, True])
def test_llm_failures_fall_back_to_the_slm(models, faulty, mode, calls, stream):
    faulty.mode, faulty.calls = mode, 0
    with _server(models, faulty.url, retries=1, timeout_s=1.0, on_error="fallback") as srv:
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60)
        t0 = time.monotonic()
        kw = dict(model="always-offload", messages=Q, max_tokens=8)
        if stream:
            chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
            p, text = (
                chunks[-1].model_extra["pyrodash"],
                "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
            )
        else:
            r = client.chat.completions.create(**kw)
            p, text = r.model_extra["pyrodash"], r.choices[0].message.content
        assert time.monotonic() - t0 < 30
        assert p["fallback"] is True and p["handoff"] == 0 and p["llm_calls"] == calls == faulty.calls
        assert p["slm_out"] >= 1 and text
        metrics = httpx.get(f"{srv.url}/metrics", headers=AUTH).text
        assert 'pyrodash_fallbacks_total{model="always-offload"} 1' in metrics


def test_a_retry_recovers_from_one_cut_stream(models, faulty):
    faulty.mode, faulty.calls = "cut_once", 0
    with _server(models, faulty.url, retries=1, timeout_s=5.0) as srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "always-offload", "messages": Q, "max_tokens": 12},
        ).json()
        assert r["pyrodash"]["fallback"] is False and r["pyrodash"]["llm_calls"] == 2 == faulty.calls
        assert r["pyrodash"]["llm_out"] >= 1 and r["choices"][0]["message"]["content"]


def test_llm_down_fallback_and_health(models):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with _server(models, dead, retries=1, timeout_s=2.0) as srv:
        h = httpx.get(f"{srv.url}/health", headers=AUTH)
        assert h.status_code == 503 and h.json()["status"] == "degraded"
        assert h.json()["slm"]["reachable"] is True and h.json()["llm"]["reachable"] is False
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "always-offload", "messages": Q, "max_tokens": 6},
        ).json()
        assert r["pyrodash"]["fallback"] is True and r["pyrodash"]["llm_calls"] == 0  # never reached a server
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "slm-only", "messages": Q, "max_tokens": 6},
        ).json()
        assert r["pyrodash"]["fallback"] is False and r["pyrodash"]["llm_calls"] == 0


def test_on_error_raise_gives_an_upstream_error(models, faulty):
    faulty.mode = "http500"
    with _server(models, faulty.url, retries=0, timeout_s=2.0, on_error="raise") as srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "always-offload", "messages": Q, "max_tokens": 6},
        )
        assert r.status_code == 502
        err = r.json()["error"]
        # the upstream's own text and address stay in the server log; the client gets a request id
        assert err["type"] == "upstream_error" and "request id" in err["message"]
        assert "injected failure" not in r.text and "127.0.0.1" not in r.text and faulty.url not in r.text
        client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60)
        with pytest.raises(openai.APIError, match="model backend failed"):
            list(client.chat.completions.create(model="always-offload", messages=Q, max_tokens=6, stream=True))
        # the SLM alone still works: the LLM is only needed after a handoff
        ok = client.chat.completions.create(model="slm-only", messages=Q, max_tokens=4)
        assert ok.choices[0].message.content
        text = httpx.get(f"{srv.url}/metrics", headers=AUTH).text
        assert 'pyrodash_errors_total{kind="upstream"} 2' in text
    faulty.mode = "ok"


def test_the_stream_error_event_is_openai_shaped(models, faulty):
    faulty.mode = "http500"
    with _server(models, faulty.url, retries=0, timeout_s=2.0, on_error="raise") as srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "always-offload", "messages": Q, "max_tokens": 6, "stream": True},
        )
        events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]" and list(json.loads(events[-2])["error"]) == ["message", "type", "param", "code"]
        assert "injected failure" not in r.text and faulty.url not in r.text  # nothing internal in the stream
    faulty.mode = "ok"


@pytest.mark.parametrize("stream", [False, True])
def test_slm_server_down_is_a_502_before_any_output(models, llm_up, stream):
    """An SLM behind HTTP that goes away: the request fails before the first event, so even a stream gets a real
    502 status line with OpenAI's error body (not a 200 with an error inside)."""
    config = serve_config()
    with llm_server(models[0], model="tiny-slm") as ssrv:
        slm = remote(ssrv.url, model="tiny-slm", timeout_s=5)
        engine = make_engine(slm, remote(llm_up.url), config)  # looks up <offload> while the SLM server is up
    with UvicornThread(build_app(config, engine=engine), log_level="error") as srv:
        r = httpx.post(
            f"{srv.url}/v1/chat/completions",
            headers=AUTH,
            timeout=60,
            json={"model": "pyrodash", "messages": Q, "max_tokens": 4, "stream": stream},
        )
        assert r.status_code == 502 and r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["type"] == "upstream_error" and "BackendError" in r.json()["error"]["message"]
        assert "127.0.0.1" not in r.text and "connect" not in r.text  # no internal address, no upstream text
        h = httpx.get(f"{srv.url}/health", headers=AUTH).json()
        assert h["slm"]["reachable"] is False and h["llm"]["reachable"] is True
