"""The LLM mesh (pyrodash.backends.mesh): several LLM endpoints behind one handoff, LiteLLM price sheets.

The slow end-to-end test runs two real LLM servers in their own processes, both serving the same tiny model dir:
`pyrodash serve-model` (chat API with vLLM's continue_final_message) and `transformers serve` (its
/v1/completions route: our backend renders the chat template locally, `prompt_mode: completion`, because
transformers serve's chat route cannot continue a partial assistant message). `pyrodash serve`'s app (uvicorn on
127.0.0.1) hands off to the mesh; `SigkillAfterChunks`, an injected fault named as such, wraps the first endpoint's
real backend and SIGKILLs the serve-model process after N streamed chunks. The answer must complete through
transformers serve exactly as one uninterrupted greedy answer would (no duplicated or lost text).

The fast tests use `pyrodash serve-model`'s app in threads and `FaultInjectingLLM` (tests/test_server_faults.py)
for endpoints that fail on demand.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from servers import free_port
from test_conversation import RecordingBackend
from test_server import KEY, UvicornThread, llm_server, serve_config, tiny_llm
from test_server_faults import FaultInjectingLLM
from tiny_models import CLEAN_LLM_SEEDS, tiny_model_dir

from pyrodash.backends import load_llm
from pyrodash.backends.base import BackendError, GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.mesh import MeshBackend, spec_from_flags
from pyrodash.cost import Prices, Usage, endpoint_bill
from pyrodash.engine import CollaborateEngine, FailurePolicy
from pyrodash.prompts import get_prompts
from pyrodash.server.app import build_app, build_engine

PROMPTS = get_prompts("world-v1")
PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)
LITELLM = {
    "input_cost_per_token": 2e-6,
    "output_cost_per_token": 8e-6,
    "cache_read_input_token_cost": 5e-7,
    "max_tokens": 8192,
    "litellm_provider": "openai",
    "mode": "chat",
}
MSGS = [{"role": "user", "content": "3+4="}]


# ---------------------------------------------------------------- price sheets


def test_litellm_price_entries_load(tmp_path):
    p = Prices.load(LITELLM)
    assert (p.slm_in, p.slm_out) == (0.0, 0.0)
    assert (p.llm_in, p.llm_out, p.llm_cached_in) == pytest.approx((2.0, 8.0, 0.5))  # USD per million tokens
    table = tmp_path / "model_prices_and_context_window.json"
    table.write_text(
        json.dumps({"gpt-x": LITELLM, "small": {"input_cost_per_token": 1e-7, "output_cost_per_token": 2e-7}})
    )
    assert Prices.load(f"{table}#gpt-x") == p
    both = Prices.load({"slm": f"{table}#small", "llm": f"{table}#gpt-x"})
    assert (both.slm_in, both.slm_out, both.llm_out) == pytest.approx((0.1, 0.2, 8.0))
    assert Prices.load("paper") == Prices.from_yaml("paper") and Prices.load(PRICES.to_dict()) == PRICES
    for bad, msg in (
        ({"input_cost_per_token": 1e-6}, "output_cost_per_token"),
        (f"{table}#nope", "no entry"),
        ({"llm_in": 1, "bogus": 2}, "unknown keys"),
        ({"slm": LITELLM}, "llm side"),
    ):
        with pytest.raises(ValueError, match=msg):
            Prices.load(bad)
    # cached input billed at the cache-read price
    assert Usage(llm_in=1000, llm_cached_in=400, llm_out=10).cost(p) == pytest.approx((600 * 2 + 400 * 0.5 + 80) / 1e6)


def test_endpoint_bill_prices_each_endpoint_at_its_own_sheet():
    calls = [
        {
            "endpoint": "a",
            "calls": 1,
            "llm_in": 100,
            "llm_out": 7,
            "llm_cached_in": 0,
            "text": "abc",
            "prices": Prices.load(LITELLM).to_dict(),
            "error": "boom",
        },
        {
            "endpoint": "b",
            "calls": 1,
            "llm_in": 110,
            "llm_out": 20,
            "llm_cached_in": 0,
            "text": "defg",
            "prices": None,
            "error": None,
        },
    ]
    a, b = endpoint_bill(calls, PRICES)
    assert (a["endpoint"], a["errors"], a["chars"], a["price"]["llm_out"]) == ("a", 1, 3, pytest.approx(8.0))
    assert a["cost_usd"] == pytest.approx((100 * 2.0 + 7 * 8.0) / 1e6)
    assert b["cost_usd"] == pytest.approx((110 * 10.0 + 20 * 40.0) / 1e6) and b["price"]["llm_in"] == 10.0


def test_specs_from_flags_and_yaml_forms():
    assert spec_from_flags(["http://a:1/v1#m"]) == "http://a:1/v1#m"
    spec = spec_from_flags(["http://a:1/v1#m", "http://b:2/v1"], ["paper"], "cheapest", 5.0)
    assert spec == {
        "endpoints": [
            {"url": "http://a:1/v1", "model": "m", "prices": "paper"},
            {"url": "http://b:2/v1", "model": None},
        ],
        "policy": "cheapest",
        "cooldown_s": 5.0,
    }
    with pytest.raises(ValueError, match="one price sheet per --llm"):
        spec_from_flags(["http://a:1/v1"], ["paper", "paper"])
    with pytest.raises(ValueError, match="needs a price sheet on every endpoint"):
        load_llm(spec)
    with pytest.raises(ValueError, match="unknown keys"):
        load_llm({"endpoints": ["http://a:1/v1#m"], "retries": 3})
    mesh = load_llm([{"url": "http://a:1/v1", "model": "m", "name": "a", "prices": LITELLM}, "http://b:2/v1#m"])
    assert isinstance(mesh, MeshBackend) and mesh.policy == "fallback" and [m.name for m in mesh.members][0] == "a"
    assert mesh.members[0].prices == Prices.load(LITELLM) and mesh.members[1].prices is None


# ---------------------------------------------------------------- policies over real tiny servers (in threads)


@pytest.fixture(scope="module")
def llm_up(tmp_path_factory):
    with llm_server(tiny_llm(tmp_path_factory)) as srv:
        yield srv


def _collect(backend, req: GenRequest):
    async def main():
        text, last = "", None
        async for ch in backend.stream(req):
            text += ch.text
            last = ch
        return text, last

    return asyncio.run(main())


def test_cheapest_uses_the_cheap_endpoint_and_cools_down_a_failing_one(llm_up):
    flaky = FaultInjectingLLM(llm_up.url)
    with UvicornThread(flaky.app, log_level="error") as cheap:
        spec = {
            "policy": "cheapest",
            "cooldown_s": 1.0,
            "endpoints": [
                {
                    "url": f"{llm_up.url}/v1",
                    "model": "tiny-llm",
                    "name": "dear",
                    "prices": {"input_cost_per_token": 1e-5, "output_cost_per_token": 4e-5},
                },
                {"url": f"{cheap.url}/v1", "model": "tiny-llm", "name": "cheap", "prices": LITELLM},
            ],
        }
        mesh = load_llm(spec)
        flaky.calls = 0  # loading probed each endpoint's continuation mode (pyrodash.backends.http.endpoint)
        req = GenRequest(messages=MSGS, max_tokens=8, temperature=0.0)
        text, last = _collect(mesh, req)
        assert [e["endpoint"] for e in last.endpoints] == ["cheap"] and flaky.calls == 1
        flaky.mode = "http500"
        text2, last = _collect(mesh, req)
        assert text2 == text and [(e["endpoint"], e["calls"], bool(e["error"])) for e in last.endpoints] == [
            ("cheap", 1, True),
            ("dear", 1, False),
        ]
        assert last.endpoints[1]["prices"]["llm_out"] == pytest.approx(40.0) and flaky.calls == 2
        _, last = _collect(mesh, req)  # cheap is cooling down: not tried at all
        assert [e["endpoint"] for e in last.endpoints] == ["dear"] and flaky.calls == 2
        assert [s["healthy"] for s in mesh.status()] == [True, False]
        flaky.mode = "ok"
        time.sleep(1.05)
        _, last = _collect(mesh, req)  # cooled down: the cheapest again
        assert [e["endpoint"] for e in last.endpoints] == ["cheap"] and flaky.calls == 3


def test_every_endpoint_down_raises_with_the_bill(llm_up):
    flaky = FaultInjectingLLM(llm_up.url)
    with UvicornThread(flaky.app, log_level="error") as bad:
        free = socket.socket()
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
        free.close()  # nothing listens there: connection refused, never reached a server
        mesh = load_llm([f"{bad.url}/v1#tiny-llm", f"http://127.0.0.1:{port}/v1#tiny-llm"])
        flaky.mode = "http500"  # healthy at start-up (its probe passed), failing now
        with pytest.raises(BackendError) as e:
            _collect(mesh, GenRequest(messages=MSGS, max_tokens=4))
        assert e.value.reached_server and [c["calls"] for c in e.value.usage.endpoints] == [1, 0]
        assert "every LLM endpoint failed" in str(e.value)


def test_mid_stream_cut_continues_on_the_next_endpoint_in_process(llm_up, tmp_path_factory):
    """Through the engine: the first endpoint cuts its stream after 3 chunks; the second continues the text."""
    flaky = FaultInjectingLLM(llm_up.url)
    flaky.mode, flaky.cut_after = "cut", 3
    slm = HFBackend(tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=0))
    with UvicornThread(flaky.app, log_level="error") as cut:
        mesh = load_llm(
            {
                "cooldown_s": 0,
                "endpoints": [
                    {"url": f"{cut.url}/v1", "model": "tiny-llm", "name": "cut"},
                    {"url": f"{llm_up.url}/v1", "model": "tiny-llm", "name": "whole", "prices": LITELLM},
                ],
            }
        )
        engine = CollaborateEngine(slm, mesh, PROMPTS, PRICES, max_tokens=24, failure=FailurePolicy(retries=0))
        ref = CollaborateEngine(slm, load_llm(f"{llm_up.url}/v1#tiny-llm"), PROMPTS, PRICES, max_tokens=24)
        done, want = engine.run("3+4=", offload_bias=100.0), ref.run("3+4=", offload_bias=100.0)
        flaky.mode = "cut"  # the playground's "llm alone" mode goes through the same mesh and billing

        async def alone():
            return [ev async for ev in engine.stream(MSGS, mode="llm", max_tokens=24)][-1]

        solo = asyncio.run(alone())
        assert solo.usage.llm_calls == 2 and [s["endpoint"] for s in solo.segments] == ["cut", "whole"]
        assert solo.cost_usd == pytest.approx(sum(e["cost_usd"] for e in solo.llm_endpoints))
    assert done.output == want.output and not done.fallback and done.usage.llm_calls == 2
    by = [(s["by"], s.get("endpoint")) for s in done.segments]
    assert by == [("llm", "cut"), ("llm", "whole")] and len(done.segments[0]["text"]) >= 1
    cut_e, whole_e = done.llm_endpoints
    assert cut_e["errors"] == 1 and cut_e["llm_out"] >= 1
    assert cut_e["estimated"] is True and whole_e["estimated"] is False
    assert cut_e["llm_out"] + whole_e["llm_out"] == want.usage.llm_out
    assert done.cost_usd == pytest.approx(
        sum(e["cost_usd"] for e in done.llm_endpoints)
        + Usage(slm_in=done.usage.slm_in, slm_out=done.usage.slm_out).cost(PRICES)
    )


# ---------------------------------------------------------------- two real servers, the first killed mid-handoff


class SigkillAfterChunks:
    """Injected fault: passes a real backend's stream through and SIGKILLs the process serving it after `n` chunks
    (the chunks already on the wire still arrive; then the connection breaks)."""

    def __init__(self, inner, proc: subprocess.Popen, n: int):
        self.inner, self.proc, self.n, self.name, self.seen = inner, proc, n, inner.name, 0

    async def stream(self, req):
        async for ch in self.inner.stream(req):
            yield ch
            self.seen += bool(ch.text)
            if self.seen == self.n:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _start(cmd: list[str], port: int, log: Path, env: dict | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{cmd[:4]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError(f"{cmd[:4]} did not start: {log.read_text()[-2000:]}")


@pytest.mark.slow
def test_first_llm_killed_mid_handoff_the_second_finishes(tmp_path):
    llm_dir = tiny_model_dir(tmp_path / "llm", seed=CLEAN_LLM_SEEDS[0], offload=False)
    slm_dir = tiny_model_dir(tmp_path / "slm", seed=0)
    transformers_cli = Path(sys.executable).parent / "transformers"
    p1, p2 = free_port(), free_port()
    procs = []
    try:
        procs.append(
            _start(
                [
                    sys.executable,
                    "-m",
                    "pyrodash",
                    "serve-model",
                    str(llm_dir),
                    "--port",
                    str(p1),
                    "--name",
                    "tiny-llm",
                ],
                p1,
                tmp_path / "serve-model.log",
            )
        )
        (tmp_path / "hub").mkdir()
        procs.append(
            _start(
                [
                    str(transformers_cli),
                    "serve",
                    str(llm_dir),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(p2),
                    "--device",
                    "cpu",
                ],
                p2,
                tmp_path / "transformers-serve.log",
                {"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
            )
        )
        config = serve_config(
            slm=str(slm_dir),
            context={"llm": 4096},
            llm={
                "policy": "fallback",
                "endpoints": [
                    {"url": f"http://127.0.0.1:{p1}/v1", "model": "tiny-llm", "name": "serve-model", "prices": "paper"},
                    {
                        "url": f"http://127.0.0.1:{p2}/v1",
                        "model": str(llm_dir),
                        "name": "transformers-serve",
                        "prompt_mode": "completion",
                        "tokenizer": str(llm_dir),
                        "prices": LITELLM,
                    },
                ],
            },
        )
        engine = build_engine(config)
        first, second = engine.llm.members
        first.backend = SigkillAfterChunks(first.backend, procs[0], n=5)
        second.backend = RecordingBackend(second.backend)
        ref = CollaborateEngine(engine.slm, HFBackend(str(llm_dir)), PROMPTS, engine.prices, max_tokens=60)
        want = ref.run(MSGS, offload_bias=100.0, max_tokens=60, max_total_tokens=60)  # the server's max_tokens
        with UvicornThread(build_app(config, engine=engine)) as srv:
            client = openai.OpenAI(base_url=f"{srv.url}/v1", api_key=KEY, max_retries=0, timeout=120)
            chunks = list(
                client.chat.completions.create(
                    model="pyrodash",
                    messages=MSGS,
                    max_tokens=60,
                    temperature=0.0,
                    stream=True,
                    stream_options={"include_usage": True},
                    extra_body={"offload_bias": 100.0},
                )
            )
            auth = {"Authorization": f"Bearer {KEY}"}
            metrics = httpx.get(f"{srv.url}/metrics", headers=auth).text
            health = httpx.get(f"{srv.url}/health", headers=auth).json()
        answer = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        p = chunks[-1].model_extra["pyrodash"]
        assert procs[0].poll() == -signal.SIGKILL, "the first LLM server was killed mid-stream"
        assert answer == want.output, "one uninterrupted answer: what one server alone writes, nothing duplicated"
        assert p["llm_calls"] == 2 and not p["fallback"] and p["handoff"] == 0
        assert [(s["by"], s["endpoint"]) for s in p["segments"]] == [
            ("llm", "serve-model"),
            ("llm", "transformers-serve"),
        ]
        killed, rescuer = p["segments"][0]["text"], p["segments"][1]["text"]
        assert len(killed) >= 5 and killed + rescuer == answer and rescuer
        (req,) = second.backend.requests
        assert req.prefix == killed, "the second endpoint continued from everything the first one streamed"
        a, b = p["llm_endpoints"]
        assert (a["endpoint"], a["errors"], a["calls"], a["estimated"]) == ("serve-model", 1, 1, True)
        assert a["chars"] == len(killed)
        assert a["llm_out"] == len(killed) and a["price"]["llm_out"] == pytest.approx(2.86)  # char tokens, paper
        assert (b["endpoint"], b["errors"], b["calls"]) == ("transformers-serve", 0, 1)
        assert a["llm_out"] + b["llm_out"] == want.usage.llm_out
        assert b["price"]["llm_out"] == pytest.approx(8.0)  # its LiteLLM sheet
        assert b["cost_usd"] == pytest.approx((b["llm_in"] * 2.0 + b["llm_out"] * 8.0) / 1e6)
        slm_cost = (p["slm_in"] * 1 + p["slm_out"] * 2) / 1e6
        assert p["cost_usd"] == pytest.approx(a["cost_usd"] + b["cost_usd"] + slm_cost)
        assert 'pyrodash_llm_endpoint_calls_total{endpoint="serve-model"} 1' in metrics
        assert 'pyrodash_llm_endpoint_errors_total{endpoint="serve-model"} 1' in metrics
        assert 'pyrodash_llm_endpoint_calls_total{endpoint="transformers-serve"} 1' in metrics
        assert health["llm"]["reachable"] and [e["healthy"] for e in health["llm"]["endpoints"]] == [False, True]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_report_prices_mesh_records_per_endpoint():
    from pyrodash.report.metrics import compute_metrics, record_cost
    from pyrodash.report.tables import mesh_table

    a = {
        "endpoint": "a",
        "calls": 1,
        "errors": 1,
        "llm_in": 100,
        "llm_out": 5,
        "llm_cached_in": 0,
        "price": {"llm_in": 2.0, "llm_out": 8.0, "llm_cached_in": None},
    }
    b = {
        "endpoint": "b",
        "calls": 1,
        "errors": 0,
        "llm_in": 105,
        "llm_out": 15,
        "llm_cached_in": 0,
        "price": {"llm_in": 10.0, "llm_out": 40.0, "llm_cached_in": None},
    }
    usage = Usage(slm_in=50, slm_out=3, llm_in=205, llm_out=20, llm_calls=2).to_dict()
    rec = {"benchmark": "w", "id": 1, "correct": True, "usage": usage, "llm_endpoints": [a, b]}
    cheap = Prices(slm_in=1.0, slm_out=2.0, llm_in=0.0, llm_out=0.0)
    want = (50 * 1 + 3 * 2 + 100 * 2 + 5 * 8 + 105 * 10 + 15 * 40) / 1e6
    assert record_cost(rec, cheap) == pytest.approx(want)  # LLM tokens at each endpoint's recorded price
    assert record_cost(rec, cheap, {"b": cheap}) == pytest.approx((56 + 240) / 1e6)  # re-priced: b free
    plain = {**rec, "llm_endpoints": None}
    assert record_cost(plain, cheap) == pytest.approx(56 / 1e6)
    assert compute_metrics("pyrodash@0", [rec, plain], cheap).cost_usd == pytest.approx(want + 56 / 1e6)
    table = "\n".join(mesh_table({"pyrodash@0": [rec, plain]}, cheap))
    assert "| pyrodash@0 | a | 1 | 1 | 100 | 5 | 2.0/8.0 | 0.000240 |" in table


def test_a_hanging_endpoint_times_out_and_the_next_one_answers(llm_up):
    flaky = FaultInjectingLLM(llm_up.url)
    with UvicornThread(flaky.app, log_level="error") as hang:
        mesh = load_llm({"timeout_s": 1.0, "endpoints": [f"{hang.url}/v1#tiny-llm", f"{llm_up.url}/v1#tiny-llm"]})
        flaky.mode = "hang"  # after its start-up probe passed
        t0 = time.monotonic()
        text, last = _collect(mesh, GenRequest(messages=MSGS, max_tokens=6, temperature=0.0))
        assert time.monotonic() - t0 < 10 and text
        first, second = last.endpoints
        assert "no chunk within 1.0s" in first["error"] and first["text"] == "" and second["error"] is None


def test_serve_flags_build_a_mesh_config():
    from pyrodash.cli import build_parser
    from pyrodash.commands.serve import config_from_args

    args = build_parser().parse_args(
        [
            "serve",
            "--slm",
            "s",
            "--llm",
            "http://a:1/v1#m",
            "--llm",
            "http://b:2/v1#m",
            "--llm-prices",
            "paper",
            "--llm-policy",
            "fallback",
            "--context-slm",
            "512",
        ]
    )
    c = config_from_args(args)
    assert c.llm == {
        "endpoints": [
            {"url": "http://a:1/v1", "model": "m", "prices": "paper"},
            {"url": "http://b:2/v1", "model": "m"},
        ],
        "policy": "fallback",
    }
    assert (c.context.slm, c.context.llm) == (512, None)
    one = config_from_args(build_parser().parse_args(["serve", "--slm", "s", "--llm", "http://a:1/v1#m"]))
    assert one.llm == "http://a:1/v1#m"
