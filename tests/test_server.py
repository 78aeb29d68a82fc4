"""`pyrodash serve` for real: uvicorn on 127.0.0.1 over tiny real transformers, driven with the official `openai` SDK.

The SLM runs in process (HFBackend); the LLM runs behind its own OpenAI-compatible server (`pyrodash serve-model`'s
app, also uvicorn on 127.0.0.1) and is reached through the OpenAI-compatible backend. Shared helpers
(`UvicornThread`, `tiny_stack`) are imported by the other tests/test_server_*.py files.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
import openai
import pytest
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_models import tiny_model_dir

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cost import Prices, Usage
from pyrodash.engine import CollaborateEngine, FailurePolicy
from pyrodash.prompts import get_prompts
from pyrodash.server.app import build_app
from pyrodash.server.config import Limits, OperatingPoint, ServeConfig

PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)
# model name -> operating point (an offload_bias, or {offload_bias, handoff_share})
OPS = {
    "pyrodash": 0.0,
    "slm-only": -100.0,
    "always-offload": 100.0,
    "half-share": {"offload_bias": 100.0, "handoff_share": 0.5},
}
BIAS = {k: v if isinstance(v, float) else v["offload_bias"] for k, v in OPS.items()}
KEY = "test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
Q = [{"role": "user", "content": "3+4="}]


class UvicornThread:
    """A real uvicorn server for `app` on 127.0.0.1 (a pre-bound free port), in a daemon thread."""

    def __init__(self, app, log_level: str = "warning"):
        self.app = app
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.server = uvicorn.Server(
            uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=5)
        )
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> UvicornThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()


def tiny_slm(tmp_path_factory, seed: int = 0) -> HFBackend:
    return HFBackend(tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=seed), name="tiny-slm")


def tiny_llm(tmp_path_factory) -> HFBackend:
    return HFBackend(tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=1, offload=False), name="tiny-llm")


@contextmanager
def llm_server(llm_backend: HFBackend, model: str = "tiny-llm"):
    """The LLM behind `pyrodash serve-model`'s OpenAI-compatible app on 127.0.0.1."""
    from pyrodash.server.model_server import build_model_app

    with UvicornThread(build_model_app(llm_backend, model_name=model)) as srv:
        yield srv


def remote(url: str, model: str = "tiny-llm", timeout_s: float = 30.0):
    from pyrodash.backends import load_backend

    return load_backend({"url": f"{url}/v1", "model": model, "timeout_s": timeout_s})


def serve_config(**kw) -> ServeConfig:
    base = dict(
        prompts="world-v1",
        prices=PRICES.to_dict(),
        operating_points=dict(OPS),
        api_key=KEY,
        limits=Limits(max_body_bytes=64 * 1024, max_tokens=4000, default_max_tokens=16),
    )
    base.update(kw)
    return ServeConfig(**base)


def make_engine(slm, llm, config: ServeConfig, **failure) -> CollaborateEngine:
    policy = FailurePolicy(**{"retries": 1, "backoff_s": 0.01, "timeout_s": 10.0, **failure})
    return CollaborateEngine(
        slm,
        llm,
        get_prompts(config.prompts),
        config.load_prices(),
        max_tokens=config.limits.default_max_tokens,
        failure=policy,
    )


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    """(pyrodash server, LLM server, SLM backend, LLM backend): the full stack over real tiny models."""
    slm, llm = tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
    config = serve_config()
    with llm_server(llm) as lsrv:
        engine = make_engine(slm, remote(lsrv.url), config)
        with UvicornThread(build_app(config, engine=engine)) as srv:
            yield srv, lsrv, slm, llm


@pytest.fixture()
def client(stack):
    srv = stack[0]
    with openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def _tokens(p: dict) -> Usage:
    return Usage(**{k: p[k] for k in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_cached_in", "llm_calls")})


# ---------------------------------------------------------------- the happy paths


def test_non_stream_handoff_reports_usage_cost_and_pyrodash(client):
    r = client.chat.completions.create(model="always-offload", messages=Q, max_tokens=12)
    p = r.model_extra["pyrodash"]
    assert r.object == "chat.completion" and r.model == "always-offload"
    assert r.choices[0].message.role == "assistant" and r.choices[0].finish_reason in ("stop", "length")
    assert p["handoff"] == 0 and p["llm_calls"] == 1 and p["llm_out"] >= 1 and not p["fallback"]
    assert p["offload_bias"] == OPS["always-offload"]
    u = _tokens(p)
    assert r.usage.prompt_tokens == u.slm_in + u.llm_in and r.usage.completion_tokens == u.slm_out + u.llm_out
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert p["cost_usd"] == pytest.approx(u.cost(PRICES))


def test_slm_alone_never_calls_the_llm(client):
    r = client.chat.completions.create(model="slm-only", messages=Q, max_tokens=12)
    p = r.model_extra["pyrodash"]
    assert p["handoff"] is None and (p["llm_in"], p["llm_out"], p["llm_calls"]) == (0, 0, 0)
    assert p["slm_out"] >= 1 and r.usage.completion_tokens == p["slm_out"]


def test_request_offload_bias_overrides_the_operating_point(client):
    r = client.chat.completions.create(model="slm-only", messages=Q, max_tokens=8, extra_body={"offload_bias": 100.0})
    assert r.model_extra["pyrodash"]["offload_bias"] == 100.0 and r.model_extra["pyrodash"]["handoff"] == 0


def test_stream_chunk_order_and_usage_chunk(client):
    kw = dict(model="always-offload", messages=Q, max_tokens=10, temperature=0.0)
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    finish = [i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason]
    assert finish == [len(chunks) - 2], "one finish_reason chunk, right before the usage chunk"
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and "pyrodash" in last.model_extra
    assert all("pyrodash" not in (c.model_extra or {}) for c in chunks[:-1])
    text = "".join(c.choices[0].delta.content or "" for c in chunks[:-1])
    assert text == whole.choices[0].message.content  # greedy: the stream carries the same SLM + LLM text
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    for key in ("slm_in", "slm_out", "llm_in", "llm_out", "llm_calls", "handoff"):
        assert last.model_extra["pyrodash"][key] == whole.model_extra["pyrodash"][key]


def test_stream_without_include_usage_has_no_usage_chunk(stack):
    srv = stack[0]
    body = {"model": "slm-only", "messages": Q, "max_tokens": 6, "stream": True}
    r = httpx.post(f"{srv.url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["choices"] for c in chunks) and all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_sampling_fields_reach_the_models(client):
    kw = dict(model="always-offload", messages=Q, max_tokens=12, temperature=1.0, top_p=0.9)
    a = client.chat.completions.create(**kw, seed=7).choices[0].message.content
    b = client.chat.completions.create(**kw, seed=7).choices[0].message.content
    c = [client.chat.completions.create(**kw, seed=s).choices[0].message.content for s in (8, 9, 10)]
    assert a == b and any(x != a for x in c)
    r = client.chat.completions.create(model="slm-only", messages=Q, max_tokens=3)
    assert r.choices[0].finish_reason == "length" and r.model_extra["pyrodash"]["slm_out"] == 3
    text = client.chat.completions.create(model="slm-only", messages=Q, max_tokens=40).choices[0].message.content
    stop = text[5:7]
    cut = client.chat.completions.create(model="slm-only", messages=Q, max_tokens=40, stop=[stop])
    assert cut.choices[0].message.content == text[: text.index(stop)]


def test_legacy_completions(client):
    r = client.completions.create(model="always-offload", prompt="3+4=", max_tokens=6)
    assert r.object == "text_completion" and r.choices[0].text and r.model_extra["pyrodash"]["handoff"] == 0
    parts = list(client.completions.create(model="slm-only", prompt="3+4=", max_tokens=6, stream=True))
    assert parts[-1].choices[0].finish_reason == "length"


def test_models_lists_the_operating_points(client):
    models = client.models.list()
    assert [m.id for m in models.data] == list(OPS)
    assert {m.id: m.model_extra["offload_bias"] for m in models.data} == BIAS
    assert {m.id: m.model_extra["handoff_share"] for m in models.data} == {
        "pyrodash": 1.0,
        "slm-only": 1.0,
        "always-offload": 1.0,
        "half-share": 0.5,
    }
    assert client.models.retrieve("slm-only").model_extra["offload_bias"] == OPS["slm-only"]
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-9")


def test_health_and_metrics(client, stack):
    srv = stack[0]
    assert httpx.get(f"{srv.url}/health").json() == {"status": "ok", "live": True, "ready": True}  # no key: no more
    h = httpx.get(f"{srv.url}/health", headers=AUTH).json()
    assert h["status"] == "ok" and h["slm"]["reachable"] and h["llm"]["reachable"]
    assert h["slm"]["name"] == "tiny-slm" and h["llm"]["name"] == "tiny-llm"  # public names, no URL
    assert httpx.get(f"{srv.url}/metrics").status_code == 401  # auth on: metrics need the key
    before = httpx.get(f"{srv.url}/metrics", headers=AUTH).text
    r = client.chat.completions.create(model="always-offload", messages=Q, max_tokens=5)
    after = httpx.get(f"{srv.url}/metrics", headers=AUTH).text

    def value(text: str, series: str) -> float:
        return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(series))

    series = 'pyrodash_requests_total{model="always-offload",route="/v1/chat/completions",status="200"}'
    assert value(after, series) == value(before, series) + 1
    assert value(after, 'pyrodash_handoffs_total{model="always-offload"}') >= 1
    for comp in ("slm_in", "slm_out", "llm_in", "llm_out"):
        series = f'pyrodash_tokens_total{{component="{comp}"}}'
        assert value(after, series) == value(before, series) + r.model_extra["pyrodash"][comp]
    cost = 'pyrodash_cost_usd_total{model="always-offload"}'
    assert value(after, cost) == pytest.approx(value(before, cost) + r.model_extra["pyrodash"]["cost_usd"])
    assert (
        value(after, "pyrodash_request_duration_seconds_count")
        == value(before, "pyrodash_request_duration_seconds_count") + 1
    )
    assert "# TYPE pyrodash_cost_usd_total counter" in after and "pyrodash_requests_in_flight 0" in after


def test_a_handoff_share_operating_point_lets_only_its_share_hand_off(client, stack):
    """`half-share` hands off at once when admitted (bias +100); a fixed hash of the messages admits about half of
    the requests, and the others are answered by the SLM alone, which the response and /metrics say."""
    from pyrodash.engine import handoff_admitted

    def outside(text: str) -> float:
        return sum(
            float(x.rsplit(" ", 1)[1])
            for x in text.splitlines()
            if x.startswith('pyrodash_outside_handoff_share_total{model="half-share"}')
        )

    url = stack[0].url
    before = outside(httpx.get(f"{url}/metrics", headers=AUTH).text)
    questions = [f"{a}+{a + 1}=" for a in range(10)]
    admitted = []
    for q in questions:
        messages = [{"role": "user", "content": q}]
        p = client.chat.completions.create(model="half-share", messages=messages, max_tokens=6).model_extra["pyrodash"]
        admitted.append(p["handoff_admitted"])
        assert p["handoff_admitted"] == handoff_admitted(messages, 0.5)  # the engine's own rule, nothing else
        if p["handoff_admitted"]:
            assert p["handoff"] == 0 and p["llm_calls"] == 1
        else:
            assert p["handoff"] is None and p["llm_calls"] == 0 and p["llm_in"] == p["llm_out"] == 0
    assert 0 < sum(admitted) < len(questions)  # both kinds among these ten (fixed by the hash)
    assert outside(httpx.get(f"{url}/metrics", headers=AUTH).text) == before + admitted.count(False)


def test_without_a_base_slm_slm_only_is_the_served_slm_and_says_so(stack):
    url = stack[0].url
    cfg = httpx.get(f"{url}/playground/config", headers=AUTH).json()
    assert (cfg["slm_only"], cfg["base_slm"], cfg["slm"]) == ("slm", None, "tiny-slm")
    r = httpx.post(
        f"{url}/v1/chat/completions",
        headers=AUTH,
        timeout=60,
        json={"messages": Q, "max_tokens": 4, "pyrodash": {"mode": "slm"}},
    ).json()
    assert r["pyrodash"]["answered_by"] == "slm" and r["pyrodash"]["mode"] == "slm"


# ---------------------------------------------------------------- client mistakes: 4xx with OpenAI's error body


def test_auth(stack):
    srv = stack[0]
    with pytest.raises(openai.AuthenticationError) as e:
        openai.OpenAI(base_url=f"{srv.url}/v1", api_key="wrong", max_retries=0).models.list()
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    r = httpx.post(f"{srv.url}/v1/chat/completions", json={"messages": Q})
    assert r.status_code == 401 and r.json()["error"]["code"] == "missing_api_key"
    assert r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(f"{srv.url}/v1/chat/completions", content=b"{not json", headers={"Authorization": "Basic x"})
    assert r.status_code == 401, "auth is checked before the body is read"


BAD = [  # (body, status, param, code)
    (b"{not json", 400, None, "invalid_json"),
    (b"", 400, None, "invalid_json"),
    (b"[1, 2]", 400, None, "invalid_value"),
    (b'{"model": "pyrodash"}', 400, "messages", "invalid_value"),
    (b'{"messages": []}', 400, "messages", "invalid_value"),
    (b'{"messages": "hi"}', 400, "messages", "invalid_value"),
    (b'{"messages": [{"role": "robot", "content": "x"}]}', 400, "messages.0.role", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": 5}]}', 400, "messages.0.content", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": "5"}', 400, "max_tokens", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}', 400, "max_tokens", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stream": "yes"}', 400, "stream", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}', 400, "temperature", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "stop": [""]}', 400, "stop", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "offload_bias": "high"}', 400, "offload_bias", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "n": 2}', 400, "n", "unsupported_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 4001}', 400, "max_tokens", "invalid_value"),
    (b'{"messages": [{"role": "user", "content": "x"}], "model": "gpt-9"}', 404, "model", "model_not_found"),
    (b"[" * 100_000, 413, None, "request_too_large"),
]


@pytest.mark.parametrize("body,status,param,code", BAD, ids=[f"{b[:30]!r}" for b, *_ in BAD])
def test_client_mistakes_get_openai_error_bodies(stack, body, status, param, code):
    r = httpx.post(f"{stack[0].url}/v1/chat/completions", content=body, headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert list(err) == ["message", "type", "param", "code"] and err["message"]
    assert (err["type"], err["param"], err["code"]) == ("invalid_request_error", param, code)


def test_deep_nesting_and_chunked_oversize_bodies(stack):
    url, auth = f"{stack[0].url}/v1/chat/completions", {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(url, content=b"[" * 50_000, headers=auth)  # under the size limit, too deep for the parser
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"

    def chunks():  # no Content-Length: the limit is enforced while reading
        for _ in range(100):
            yield b" " * 1024

    r = httpx.post(url, content=chunks(), headers=auth)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_sdk_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="nope", messages=Q)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="pyrodash", messages=Q, max_tokens=10**6)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.NotFoundError):
        client.post("/nowhere", cast_to=object)


# ---------------------------------------------------------------- config


def test_config_yaml_flags_and_key_from_env(tmp_path, monkeypatch):
    cfg = tmp_path / "s.yaml"
    (tmp_path / "slm").mkdir()
    cfg.write_text(
        "slm: slm\nllm: http://h:1/v1#m\nport: 9000\n"
        "operating_points: {a: 1, b: -1, c: {handoff_share: 0.25}}\n"
        "limits: {max_tokens: 64, default_max_tokens: 32}\nfailure: {on_error: raise}\n"
    )
    c = ServeConfig.from_yaml(cfg, port=9001, host=None)
    assert c.slm == str((tmp_path / "slm").resolve()) and c.llm == "http://h:1/v1#m"
    assert (
        c.port == 9001
        and c.default_model == "a"
        and c.operating_points == {"a": OperatingPoint(1.0), "b": OperatingPoint(-1.0), "c": OperatingPoint(0.0, 0.25)}
    )
    assert c.limits.max_tokens == 64 and c.failure.on_error == "raise"
    monkeypatch.setenv("PYRODASH_API_KEY", "from-env")
    assert c.resolved_api_key() == "from-env" and ServeConfig(api_key="flag").resolved_api_key() == "flag"
    monkeypatch.delenv("PYRODASH_API_KEY")
    assert c.resolved_api_key() is None and c.to_dict()["api_key"] is None
    for bad in (
        "bogus: 1\n",
        "operating_points: {}\n",
        "limits: {max_tokens: 0}\n",
        "failure: {on_error: x}\n",
        "operating_points: {a: {handoff_share: 1.5}}\n",
        "operating_points: {a: {share: 0.5}}\n",
        "operating_points: {a: x}\n",
    ):
        cfg.write_text(bad)
        with pytest.raises(ValueError):
            ServeConfig.from_yaml(cfg)


@pytest.mark.parametrize("name", ["world", "paper"])
def test_shipped_configs_load(name):
    from pathlib import Path

    c = ServeConfig.from_yaml(Path(__file__).resolve().parent.parent / "configs" / "serve" / f"{name}.yaml")
    assert c.slm and c.llm and len(c.operating_points) >= 2 and c.load_prices().llm_out > 0


def test_cors_is_opt_in():
    import asyncio

    async def preflight(config: ServeConfig) -> httpx.Response:
        transport = httpx.ASGITransport(app=build_app(config, engine=None))  # no lifespan: the engine is not needed
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.options(
                "/v1/chat/completions",
                headers={"Origin": "https://app.example", "Access-Control-Request-Method": "POST"},
            )

    on = asyncio.run(preflight(serve_config(cors_origins=["https://app.example"])))
    assert on.status_code == 200 and on.headers["access-control-allow-origin"] == "https://app.example"
    off = asyncio.run(preflight(serve_config()))
    assert "access-control-allow-origin" not in off.headers


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(
    bias=st.floats(-3.0, 6.0),
    seed=st.integers(0, 2**32),
    temperature=st.sampled_from([0.0, 0.7, 1.3]),
    max_tokens=st.integers(1, 12),
)
def test_stream_and_non_stream_agree(client, bias, seed, temperature, max_tokens):
    """Same request, same seed: the stream's deltas, finish_reason, usage and pyrodash equal the whole response."""
    kw = dict(
        model="pyrodash",
        messages=Q,
        max_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        extra_body={"offload_bias": bias},
    )
    whole = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert chunks[-2].choices[0].finish_reason == whole.choices[0].finish_reason
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()
    p, q = chunks[-1].model_extra["pyrodash"], whole.model_extra["pyrodash"]
    timings = ("cost_usd", "latency_s", "overhead_ms")
    assert {k: v for k, v in p.items() if k not in timings} == {k: v for k, v in q.items() if k not in timings}
    assert p["cost_usd"] == pytest.approx(q["cost_usd"])
    assert p["slm_out"] <= max_tokens and p["llm_out"] <= max_tokens


def test_each_prompt_is_tokenized_once_per_request(stack, client):
    """Drift bug: the server tokenized each prompt 3-4 times per request (validation built both models' requests to
    count their tokens, then the LLM-only estimate counted again). Now each distinct text reaches the SLM's
    tokenizer at most once per request (the SLM's prompt, and the LLM-only request for the estimate). Each request
    starts with the model's prompt memo empty (`HFBackend.prompts`), so the counts are its own."""
    from collections import Counter

    tok = stack[2].tokenizer
    seen: Counter = Counter()
    encode = tok.encode

    def counting(text, *a, **kw):
        seen[text] += 1
        return encode(text, *a, **kw)

    tok.encode = counting
    try:
        for model in ("pyrodash", "always-offload"):
            seen.clear()
            stack[2].prompts.clear()
            r = client.chat.completions.create(model=model, messages=Q, max_tokens=12)
            assert r.choices[0].message.content is not None and seen
            assert max(seen.values()) == 1, {t[-60:]: n for t, n in seen.items() if n > 1}
    finally:
        del tok.encode
