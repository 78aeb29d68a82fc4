"""Backends behind real servers on 127.0.0.1: the model server (official `openai` client), the OpenAI-compatible
backend, the engine over HTTP, and LLM faults (a fault-injecting server, a TEST DOUBLE wrapping the real one)."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import socket
import time
from pathlib import Path

import openai
import pytest
from tiny_models import tiny_model_dir

from pyrodash.backends import load_backend
from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, EngineError, FailurePolicy
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.server.model_server import build_model_app, serve_in_thread

PROMPTS = get_prompts("world-v1")
PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0, llm_cached_in=1.0)
MSGS = [{"role": "user", "content": "x"}]


class FaultInjectingApp:
    """TEST DOUBLE: an ASGI wrapper that makes the first `n` chat requests fail ("500": HTTP 500 in OpenAI's error
    shape; "hang": no answer at all) and passes everything else to the real model server."""

    def __init__(self, inner, n: int, mode: str = "500"):
        self.inner, self.n, self.mode, self.seen = inner, n, mode, 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"].endswith("/chat/completions"):
            self.seen += 1
            if self.seen <= self.n:
                if self.mode == "hang":
                    await asyncio.sleep(30)
                body = b'{"error": {"message": "injected fault", "type": "server_error", "param": null, "code": 500}}'
                await send(
                    {"type": "http.response.start", "status": 500, "headers": [(b"content-type", b"application/json")]}
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.inner(scope, receive, send)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    slm = HFBackend(tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=0), name="slm")
    llm = HFBackend(tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=1, offload=False), name="llm")
    return slm, llm


@pytest.fixture(scope="module")
def servers(models):
    slm, llm = models
    with serve_in_thread(build_model_app(slm, "slm")) as su, serve_in_thread(build_model_app(llm, "llm")) as lu:
        yield su, lu


def test_model_server_speaks_openai_with_vllm_extras(models, servers):
    slm, _ = models
    client = openai.OpenAI(base_url=servers[0], api_key="none")
    assert [m.id for m in client.models.list().data] == ["slm"]
    oid = slm.token_id(OFFLOAD_TOKEN)
    stream = client.chat.completions.create(
        model="slm",
        messages=MSGS,
        max_tokens=12,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"stop_token_ids": [oid]},
        logit_bias={str(oid): 100},
    )
    chunks = list(stream)
    fin = [c.choices[0] for c in chunks if c.choices and c.choices[0].finish_reason]
    assert fin[0].finish_reason == "stop" and fin[0].model_extra["stop_reason"] == oid
    usage = chunks[-1].usage
    ref = slm.generate(GenRequest(messages=MSGS, max_tokens=12, stop_token_ids=[oid], logit_bias={oid: 100.0}))
    assert usage.prompt_tokens == len(ref.prompt_ids) == len(slm.prompt_ids(GenRequest(messages=MSGS)))
    assert usage.completion_tokens == ref.completion_tokens == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "" == ref.text


def test_continue_final_message_and_logprobs(models, servers):
    _, llm = models
    client = openai.OpenAI(base_url=servers[1], api_key="none")
    r = client.chat.completions.create(
        model="llm",
        messages=MSGS + [{"role": "assistant", "content": "ab"}],
        max_tokens=6,
        temperature=0.0,
        logprobs=True,
        top_logprobs=5,
        extra_body={"continue_final_message": True, "add_generation_prompt": False},
    )
    ref = llm.generate(GenRequest(messages=MSGS, prefix="ab", max_tokens=6, top_logprobs=5))
    assert r.choices[0].message.content == ref.text
    assert r.usage.prompt_tokens == len(ref.prompt_ids) and r.usage.completion_tokens == 6
    assert len(r.choices[0].logprobs.content) == 6
    assert all(len(t.top_logprobs) == 5 for t in r.choices[0].logprobs.content)
    with pytest.raises(openai.BadRequestError, match="n=1"):
        client.chat.completions.create(model="llm", messages=MSGS, n=2)
    with pytest.raises(openai.BadRequestError, match="final assistant message"):
        client.chat.completions.create(
            model="llm", messages=MSGS, extra_body={"continue_final_message": True, "add_generation_prompt": False}
        )


def test_http_backend_matches_in_process(models, servers):
    slm, llm = models
    http_slm, http_llm = load_backend(servers[0]), load_backend({"url": servers[1], "model": "llm"})
    assert http_slm.model == "slm" and http_slm.token_id(OFFLOAD_TOKEN) == slm.token_id(OFFLOAD_TOKEN)
    assert http_llm.token_id(OFFLOAD_TOKEN) is None
    local = CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=16)
    remote = CollaborateEngine(http_slm, http_llm, PROMPTS, PRICES, max_tokens=16)
    handoffs = set()
    for bias in (-1e4, 1.0, 1.5, 2.0, 1e4):
        a, b = local.run("x", offload_bias=bias), remote.run("x", offload_bias=bias)
        assert (a.output, a.slm_text, a.handoff, a.usage) == (b.output, b.slm_text, b.handoff, b.usage)
        assert b.usage.llm_calls == (b.handoff is not None) and OFFLOAD_TOKEN not in b.output
        handoffs.add(b.handoff)
    assert None in handoffs and 0 in handoffs and len(handoffs) >= 3  # no handoff, at once, and mid-trace


def test_retry_after_http_500_succeeds_and_counts_both_calls(models, servers):
    slm, llm = models
    fault = FaultInjectingApp(build_model_app(llm, "llm"), n=1)
    with serve_in_thread(fault) as url:
        eng = CollaborateEngine(
            slm,
            OpenAICompatBackend(url, "llm"),
            PROMPTS,
            PRICES,
            max_tokens=16,
            failure=FailurePolicy(retries=2, backoff_s=0.01),
        )
        done = eng.run("x", offload_bias=1.5)
    ref = CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=16).run("x", offload_bias=1.5)
    assert done.output == ref.output and not done.fallback and done.finish_reason == ref.finish_reason
    assert done.usage.llm_calls == 2 and len(done.errors) == 1 and "500" in done.errors[0]
    assert done.usage.llm_in == ref.usage.llm_in and done.usage.llm_out == ref.usage.llm_out


def test_failing_llm_falls_back_to_the_slm(models, servers):
    slm, llm = models
    fault = FaultInjectingApp(build_model_app(llm, "llm"), n=10**6)
    with serve_in_thread(fault) as url:
        eng = CollaborateEngine(
            slm,
            OpenAICompatBackend(url, "llm"),
            PROMPTS,
            PRICES,
            max_tokens=16,
            failure=FailurePolicy(retries=2, backoff_s=0.01, on_error="fallback"),
        )
        done = eng.run("x", offload_bias=1.5)
    assert done.fallback and done.llm_text == "" and len(done.errors) == 3 and fault.seen == 3
    assert done.usage.llm_calls == 3 and done.usage.llm_in == done.usage.llm_out == 0
    oid = eng.offload_id
    first = slm.generate(
        GenRequest(
            messages=[{"role": "system", "content": PROMPTS.offload_system}] + MSGS,
            max_tokens=16,
            stop_token_ids=[oid],
            logit_bias={oid: 1.5},
        )
    )
    resume = GenRequest(
        messages=[{"role": "system", "content": PROMPTS.offload_system}] + MSGS,
        prefix=first.text,
        max_tokens=16 - first.completion_tokens,
        logit_bias={oid: float("-inf")},
    )
    rest = slm.generate(resume)
    assert oid not in rest.token_ids and done.handoff == first.completion_tokens - 1
    assert done.output == first.text + rest.text and OFFLOAD_TOKEN not in done.output
    assert done.usage.slm_in == len(first.prompt_ids) + len(rest.prompt_ids)
    assert done.usage.slm_out == first.completion_tokens + rest.completion_tokens


def test_failing_llm_raises_when_configured(models):
    slm, llm = models
    with serve_in_thread(FaultInjectingApp(build_model_app(llm, "llm"), n=10**6)) as url:
        eng = CollaborateEngine(
            slm,
            OpenAICompatBackend(url, "llm"),
            PROMPTS,
            PRICES,
            max_tokens=8,
            failure=FailurePolicy(retries=1, backoff_s=0.01, on_error="raise"),
        )
        with pytest.raises(EngineError, match="injected fault") as ei:
            eng.run("x", offload_bias=1e4)
    d = ei.value.done
    assert d.finish_reason == "error" and d.usage.llm_calls == 2 and len(d.errors) == 2 and d.handoff == 0
    assert d.usage.slm_out == 1 and d.cost_usd == pytest.approx(d.usage.cost(PRICES))


def test_llm_timeout_and_unreachable_server(models):
    slm, llm = models
    with serve_in_thread(FaultInjectingApp(build_model_app(llm, "llm"), n=1, mode="hang")) as url:
        eng = CollaborateEngine(
            slm,
            OpenAICompatBackend(url, "llm"),
            PROMPTS,
            PRICES,
            max_tokens=8,
            failure=FailurePolicy(retries=1, backoff_s=0.0, timeout_s=0.5),
        )
        t0 = time.perf_counter()
        done = eng.run("x", offload_bias=1e4)
        assert time.perf_counter() - t0 < 10
    assert not done.fallback and done.usage.llm_calls == 2 and "Timeout" in done.errors[0]
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
    eng = CollaborateEngine(
        slm,
        OpenAICompatBackend(dead, "llm"),
        PROMPTS,
        PRICES,
        max_tokens=8,
        failure=FailurePolicy(retries=1, backoff_s=0.0),
    )
    done = eng.run("x", offload_bias=1e4)
    assert done.fallback and done.usage.llm_calls == 0 and "connect" in done.errors[0]


def test_closing_an_http_stream_stops_the_server_model(models, servers):
    slm, _ = models
    calls = []
    hook = slm.model.register_forward_hook(lambda *a: calls.append(1))
    try:

        async def three_chunks():
            b = OpenAICompatBackend(servers[0], "slm")
            async with contextlib.aclosing(b.stream(GenRequest(messages=MSGS, max_tokens=3000))) as it:
                n = 0
                async for ch in it:
                    n += bool(ch.text)
                    if n == 3:
                        break
            await b.aclose()

        asyncio.run(three_chunks())
        time.sleep(1.0)
        seen = len(calls)
        time.sleep(0.5)
        assert len(calls) == seen and seen < 1000, "the server kept generating after the client left"
    finally:
        hook.remove()


def test_cached_tokens_and_offload_stop_from_a_scripted_server():
    spec = importlib.util.spec_from_file_location(
        "engine_overhead", Path(__file__).resolve().parent.parent / "benchmarks" / "engine_overhead.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    script = [f" t{i}" for i in range(10)]
    with serve_in_thread(bench.scripted_app(script, 4, prompt_tokens=50, cached_tokens=20)) as url:
        eng = CollaborateEngine(load_backend(url + "#slm"), load_backend(url + "#llm"), PROMPTS, PRICES)
        done = eng.run("q")
    assert done.handoff == 4 and done.output == "".join(script) and done.slm_text == "".join(script[:4])
    assert (done.usage.llm_in, done.usage.llm_cached_in, done.usage.llm_out, done.usage.slm_out) == (50, 20, 6, 5)
    assert done.cost_usd == pytest.approx(done.usage.cost(PRICES))


def test_load_backend_specs(tmp_path, monkeypatch):
    path = tiny_model_dir(tmp_path / "m", seed=0)
    assert isinstance(load_backend(str(path)), HFBackend)
    b = load_backend("http://127.0.0.1:9/v1#big")
    assert isinstance(b, OpenAICompatBackend) and b.model == "big" and b.base == "http://127.0.0.1:9/v1"
    monkeypatch.delenv("PD_TEST_KEY", raising=False)
    with pytest.raises(ValueError, match="PD_TEST_KEY"):
        load_backend({"url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "PD_TEST_KEY"})
    monkeypatch.setenv("PD_TEST_KEY", "sk-test")
    b = load_backend({"url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "PD_TEST_KEY", "timeout_s": 5})
    assert b.headers == {"Authorization": "Bearer sk-test"} and b.timeout_s == 5
    with pytest.raises(ValueError, match="unknown keys"):
        load_backend({"url": "http://x/v1", "modle": "m"})
    with pytest.raises(ValueError, match="'path'"):
        load_backend({"model": "m"})
    with pytest.raises(ValueError, match="does not exist"):
        load_backend(str(tmp_path / "missing"))


def test_hf_batch_equals_single_and_stream(models):
    slm, _ = models
    reqs = [
        GenRequest(messages=[{"role": "user", "content": "a much longer question " * 3}], max_tokens=10),
        GenRequest(messages=MSGS, max_tokens=10, temperature=0.9, top_p=0.8, seed=11),
        GenRequest(messages=[{"role": "user", "content": "hi"}], max_tokens=7, top_logprobs=4, seed=3, temperature=1.2),
    ]
    batch = slm.generate_batch(reqs)
    for req, res in zip(reqs, batch):
        one = slm.generate(req)
        assert (one.text, one.token_ids, one.prompt_ids) == (res.text, res.token_ids, res.prompt_ids)
        assert res.completion_tokens == len(res.token_ids) <= req.max_tokens
        assert res.prompt_tokens == len(slm.prompt_ids(req))

        async def streamed(r=req):
            return [c async for c in slm.stream(r)]

        chunks = asyncio.run(streamed())
        assert "".join(c.text for c in chunks) == res.text
        assert [t for c in chunks for t in c.token_ids] == res.token_ids
        if req.top_logprobs:
            got = [d for c in chunks for d in (c.top_logprobs or [])]
            assert len(got) == len(res.top_logprobs) == res.completion_tokens
            assert all(len(d) <= 4 and max(d.values()) <= 0 for d in got)
            flat = [v for d in got for v in sorted(d.values())]
            assert flat == pytest.approx([v for d in res.top_logprobs for v in sorted(d.values())], abs=1e-4)


def test_hf_batch_decodes_identical_deterministic_requests_once(models, monkeypatch):
    """Stage 3's handoffs repeat (rollouts that agree up to `<offload>`): a batch decodes each distinct request once
    and gives every request its own copy; a request sampled without a seed is never merged."""
    slm, _ = models
    q = [{"role": "user", "content": "the same question"}]
    greedy = GenRequest(messages=q, max_tokens=8)
    seeded = GenRequest(messages=q, max_tokens=8, temperature=0.9, seed=5)
    unseeded = GenRequest(messages=q, max_tokens=8, temperature=0.9)
    reqs = [
        greedy,
        seeded,
        GenRequest(messages=q, max_tokens=8),
        GenRequest(messages=q, max_tokens=8, seed=99),
        GenRequest(messages=q, max_tokens=8, temperature=0.9, seed=5),
        unseeded,
        unseeded,
        GenRequest(messages=q, max_tokens=7),
        GenRequest(messages=q, max_tokens=8, logit_bias={3: -5.0}),
    ]
    rows = []
    decode = slm._decode
    monkeypatch.setattr(slm, "_decode", lambda prompts, rs, *a, **k: rows.append(len(rs)) or decode(prompts, rs))
    got = slm.generate_batch(reqs, batch_size=3)
    # distinct: greedy (its seed ignored), seeded, both unseeded draws, max_tokens 7, the biased one
    assert sum(rows) == 6 and rows == [3, 3]
    assert got[0].token_ids == got[2].token_ids == got[3].token_ids == slm.generate(greedy).token_ids
    assert got[1].token_ids == got[4].token_ids == slm.generate(seeded).token_ids
    assert got[0] is not got[2] and got[0].token_ids is not got[2].token_ids  # copies, not one shared object
    assert len(got) == len(reqs) and got[7].completion_tokens <= 7


def test_hf_decode_uses_the_cache_keyword_of_the_installed_transformers(models):
    """No deprecation noise on every prompt: the KV cache goes in under the keyword the model's forward takes (`cache`
    in transformers 5, `past_key_values` before)."""
    import inspect
    import warnings

    slm, _ = models
    expected = "cache" if "cache" in inspect.signature(slm.model.forward).parameters else "past_key_values"
    assert slm._cache_arg == expected
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        slm.generate(GenRequest(messages=MSGS, max_tokens=3))
    assert not [w for w in caught if "past_key_values" in str(w.message)]


def test_hf_stop_strings_and_banned_tokens(models):
    slm, _ = models
    free = slm.generate(GenRequest(messages=MSGS, max_tokens=20, logit_bias={slm.token_id(OFFLOAD_TOKEN): -1e9}))
    assert len(free.text) >= 6
    stop = free.text[3:5]
    cut = slm.generate(
        GenRequest(messages=MSGS, max_tokens=20, stop=[stop], logit_bias={slm.token_id(OFFLOAD_TOKEN): -1e9})
    )
    assert cut.finish_reason == "stop" and cut.text == free.text[: free.text.index(stop)] and stop not in cut.text
    banned = free.token_ids[0]
    other = slm.generate(GenRequest(messages=MSGS, max_tokens=5, logit_bias={banned: float("-inf")}))
    assert banned not in other.token_ids


def test_raw_completion_prompt_mode_matches_chat_continuation(models, servers, tmp_path):
    slm, llm = models
    llm.tokenizer.save_pretrained(tmp_path)
    raw = load_backend({"url": servers[1], "model": "llm", "tokenizer": str(tmp_path), "prompt_mode": "completion"})
    local = CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=16)
    remote = CollaborateEngine(slm, raw, PROMPTS, PRICES, max_tokens=16)
    for bias in (1.5, 1e4):  # a handoff mid-trace (as in the tests above), then at once
        a, b = local.run("x", offload_bias=bias), remote.run("x", offload_bias=bias)
        assert (a.output, a.handoff, a.usage) == (b.output, b.handoff, b.usage) and b.usage.llm_calls == 1
    client = openai.OpenAI(base_url=servers[1], api_key="none")
    prompt = llm.render(GenRequest(messages=MSGS, prefix="ab"))
    r = client.completions.create(model="llm", prompt=prompt, max_tokens=5, temperature=0.0, logprobs=3)
    ref = llm.generate(GenRequest(messages=MSGS, prefix="ab", max_tokens=5))
    assert r.choices[0].text == ref.text and r.usage.prompt_tokens == len(ref.prompt_ids)
    assert len(r.choices[0].logprobs.top_logprobs) == 5
    with pytest.raises(ValueError, match="tokenizer: DIR"):
        OpenAICompatBackend(servers[1], "llm", prompt_mode="completion")


def test_a_consumer_leaving_during_the_llm_part_stops_the_llm_server(models, servers):
    slm, llm = models
    calls = []
    hook = llm.model.register_forward_hook(lambda *a: calls.append(1))
    try:

        async def leave_early():
            eng = CollaborateEngine(slm, OpenAICompatBackend(servers[1], "llm"), PROMPTS, PRICES, max_tokens=3000)
            n = 0
            async with contextlib.aclosing(eng.stream("x", offload_bias=1e4)) as it:
                async for ev in it:
                    n += type(ev).__name__ == "LLMDelta"
                    if n == 3:
                        break
            await eng.aclose()

        asyncio.run(leave_early())
        time.sleep(1.0)
        seen = len(calls)
        time.sleep(0.5)
        assert len(calls) == seen and seen < 1000, "the LLM server kept generating after the consumer left"
    finally:
        hook.remove()


def test_the_batch_collector_retries_with_jitter_times_out_and_matches_in_process(models):
    """`pyrodash.backends.retry`, the one collector of eval and training: a 500 is retried, a call with no answer
    is cut at the policy's timeout and retried, and the collected result (text, usage, top-k log-probabilities) is
    what the in-process model generates."""
    from pyrodash.backends.retry import FailurePolicy, backoff_delay, run_requests

    _, llm = models
    req = GenRequest(messages=MSGS, max_tokens=6, top_logprobs=3)
    ref = run_requests(llm, [req])[0]
    for mode, policy in (("500", FailurePolicy(retries=1, backoff_s=0)), ("hang", FailurePolicy(1, 0, timeout_s=2))):
        app = FaultInjectingApp(build_model_app(llm, "llm"), 1, mode)
        with serve_in_thread(app) as url:
            t0 = time.perf_counter()
            got = run_requests(load_backend(url + "#llm"), [req], policy=policy)[0]
            took = time.perf_counter() - t0
        assert app.seen == 2 and got.error is None, (mode, got.error)
        assert (got.text, got.prompt_tokens, got.completion_tokens) == (
            ref.text,
            ref.prompt_tokens,
            ref.completion_tokens,
        )
        assert len(got.top_logprobs) == len(ref.top_logprobs) == ref.completion_tokens
        assert mode != "hang" or 2 <= took < 30  # cut at the timeout, not after the server's 30 s
    failed = run_requests(load_backend("http://127.0.0.1:9/v1#llm"), [req], policy=FailurePolicy(1, 0, timeout_s=5))[0]
    assert failed.finish_reason == "error" and failed.error.startswith("attempt 2:")
    waits = [backoff_delay(1.0, 3) for _ in range(50)]
    assert all(3.0 <= w <= 5.0 for w in waits) and len(set(waits)) > 1  # 4 s +-25%, jittered
