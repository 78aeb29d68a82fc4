"""The Collaborate Engine (Algorithm 1) over real tiny transformers, in process (HFBackend on both sides).

The HTTP side (behind `pyrodash serve-model` on 127.0.0.1, fault injection) is in tests/test_backends.py.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from tiny_models import tiny_model_dir

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.cost import Prices
from pyrodash.engine import CollaborateEngine, EngineRequest, FailurePolicy
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts

PROMPTS = get_prompts("world-v1")
PRICES = Prices(slm_in=1.0, slm_out=2.0, llm_in=10.0, llm_out=40.0)


@pytest.fixture(scope="module")
def slm(tmp_path_factory):
    return HFBackend(tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=0))


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    return HFBackend(tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=1, offload=False))


@pytest.fixture(scope="module")
def engine(slm, llm):
    return CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=24)


def mid_handoff_bias(engine, question: str, lo: int = 2) -> tuple[float, Done]:
    """A bias at which the (random) SLM decodes at least `lo` tokens before emitting <offload>."""
    for i in range(60):
        bias = i * 0.1
        done = engine.run(question, offload_bias=bias)
        if done.handoff is not None and lo <= done.handoff <= engine.max_tokens - 2:
            return bias, done
    raise AssertionError("no bias in [0, 6) gives a mid-trace handoff for this tiny model")


def slm_request(engine, question: str, **kw) -> GenRequest:
    msgs = [
        {"role": "system", "content": PROMPTS.offload_system},
        {"role": "user", "content": PROMPTS.question(question)},
    ]
    return GenRequest(messages=msgs, max_tokens=engine.max_tokens, stop_token_ids=[engine.offload_id], **kw)


def test_no_offload_means_no_llm_call_and_the_slm_answer(engine, slm):
    done = engine.run("x", offload_bias=float("-inf"))
    assert done.handoff is None and done.llm_text == "" and not done.fallback
    assert (done.usage.llm_in, done.usage.llm_out, done.usage.llm_calls) == (0, 0, 0)
    alone = slm.generate(slm_request(engine, "x"))  # the same SLM decoding, with <offload> never chosen
    direct = slm.generate(slm_request(engine, "x", logit_bias={engine.offload_id: float("-inf")}))
    assert done.output == direct.text == done.slm_text
    assert done.usage.slm_in == len(direct.prompt_ids) and done.usage.slm_out == direct.completion_tokens
    assert done.cost_usd == pytest.approx(done.usage.cost(PRICES))
    assert alone.prompt_ids == direct.prompt_ids


def test_handoff_calls_the_llm_once_and_joins_outputs(engine, slm, llm):
    bias, done = mid_handoff_bias(engine, "x")
    assert done.usage.llm_calls == 1 and done.handoff >= 2
    assert done.output == done.slm_text + done.llm_text and OFFLOAD_TOKEN not in done.output
    # the SLM part is exactly the SLM's own decoding up to (not including) <offload>
    direct = slm.generate(slm_request(engine, "x", logit_bias={engine.offload_id: bias}))
    assert direct.stop_token_id == engine.offload_id and direct.token_ids[-1] == engine.offload_id
    assert done.slm_text == direct.text and done.handoff == len(direct.token_ids) - 1
    # the LLM part is the LLM continuing [P_l, query] + assistant prefix Pack(O_s)
    lreq = engine.llm_request(PROMPTS.plain_messages("x"), done.slm_text, engine.max_tokens, {})
    assert lreq.messages[0] == {"role": "system", "content": PROMPTS.completion_system}
    assert lreq.prefix == done.slm_text
    cont = llm.generate(lreq)
    assert done.llm_text == cont.text
    # exact usage, recounted with the tokenizers
    assert done.usage.slm_in == len(slm.prompt_ids(slm_request(engine, "x")))
    assert done.usage.slm_out == done.handoff + 1  # the <offload> token itself was decoded (and billed)
    assert done.usage.llm_in == len(llm.tokenizer.encode(llm.render(lreq), add_special_tokens=False))
    assert done.usage.llm_out == cont.completion_tokens
    if cont.finish_reason == "length":
        assert done.usage.llm_out == llm.count_tokens(done.llm_text)
    assert done.cost_usd == pytest.approx(done.usage.cost(PRICES))


def test_event_stream_order_and_text(engine):
    bias, ref = mid_handoff_bias(engine, "x")

    async def collect():
        return [ev async for ev in engine.stream("x", offload_bias=bias)]

    evs = asyncio.run(collect())
    kinds = [type(e).__name__ for e in evs]
    h = kinds.index("Handoff")
    assert set(kinds[:h]) <= {"SLMDelta"} and set(kinds[h + 1 : -1]) <= {"LLMDelta"} and kinds[-1] == "Done"
    assert kinds.count("Handoff") == 1
    assert "".join(e.text for e in evs if isinstance(e, SLMDelta)) == evs[-1].slm_text == evs[h].packed
    assert "".join(e.text for e in evs if isinstance(e, LLMDelta)) == evs[-1].llm_text
    assert evs[h].slm_tokens == evs[-1].handoff == ref.handoff
    assert evs[-1].output == ref.output


def test_instruct_style_puts_question_and_partial_in_the_user_message(slm, llm):
    eng = CollaborateEngine(slm, llm, PROMPTS, PRICES, handoff_style="instruct", max_tokens=24)
    bias, done = mid_handoff_bias(eng, "x")
    lreq = eng.llm_request(PROMPTS.plain_messages("x"), done.slm_text, 24, {})
    assert lreq.prefix == "" and lreq.messages[-1]["content"] == PROMPTS.handoff_template.format(
        question="x", partial=done.slm_text
    )
    assert done.usage.llm_calls == 1 and done.llm_text == llm.generate(lreq).text
    assert done.usage.llm_in == len(llm.prompt_ids(lreq))


def test_large_bias_hands_off_at_once_and_override_per_request(slm, llm):
    eng = CollaborateEngine(slm, llm, PROMPTS, PRICES, offload_bias=-1e4, max_tokens=8)
    assert eng.run("abc").handoff is None
    done = eng.run("abc", offload_bias=1e4)
    assert done.handoff == 0 and done.slm_text == "" and done.usage.slm_out == 1 and done.usage.llm_calls == 1
    assert done.offload_bias == 1e4


def test_model_without_offload_token_is_a_clear_error(llm, slm):
    with pytest.raises(ValueError, match="add_offload_token"):
        CollaborateEngine(llm, slm, PROMPTS, PRICES)


def test_bad_arguments_are_value_errors(slm, llm, engine):
    with pytest.raises(ValueError, match="handoff_style"):
        CollaborateEngine(slm, llm, PROMPTS, PRICES, handoff_style="relay")
    with pytest.raises(ValueError, match="on_error"):
        FailurePolicy(on_error="ignore")
    with pytest.raises(ValueError, match="list of chat messages"):
        engine.run(42)

    async def inside():
        engine.run("x")

    with pytest.raises(ValueError, match="arun"):
        asyncio.run(inside())


def test_arun_many_keeps_order_and_matches_single_runs(engine):
    qs = ["x", "abc", "2+3=?"]
    many = asyncio.run(engine.arun_many(qs, concurrency=2, offload_bias=2.0))
    for q, d in zip(qs, many):
        one = engine.run(q, offload_bias=2.0)
        assert (d.output, d.handoff, d.usage) == (one.output, one.handoff, one.usage)


def test_seeded_sampling_is_reproducible(engine):
    a = engine.run("abc", temperature=1.0, seed=7, offload_bias=-1e4)
    b = engine.run("abc", temperature=1.0, seed=7, offload_bias=-1e4)
    assert a.output == b.output


def test_closing_the_stream_stops_generation(slm, llm):
    eng = CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=2000)
    calls = []
    hook = slm.model.register_forward_hook(lambda *a: calls.append(time.perf_counter()))
    try:

        async def consume_three():
            n = 0
            async for ev in eng.stream("abc", offload_bias=-1e4):
                n += isinstance(ev, SLMDelta)
                if n == 3:
                    break
            await asyncio.sleep(0.3)

        asyncio.run(consume_three())
        seen = len(calls)
        time.sleep(0.3)
        assert len(calls) == seen, "the decode loop kept running after the consumer left"
        assert seen < 200
        assert slm._lock.acquire(timeout=2.0)
        slm._lock.release()
    finally:
        hook.remove()


def test_done_and_handoff_are_the_contract_types(engine):
    async def kinds():
        return {type(e) async for e in engine.stream("x", offload_bias=1e4)}

    assert kinds_ok(asyncio.run(kinds()))


def kinds_ok(kinds: set) -> bool:
    return Handoff in kinds and Done in kinds and kinds <= {SLMDelta, Handoff, LLMDelta, Done}


class FaultAfter:
    """TEST DOUBLE (fault injection): forwards the real LLM backend's stream; on the first call, `fault()` runs
    before the chunk after the first `n`; later calls pass through."""

    name = "fault-after"

    def __init__(self, inner: HFBackend, n: int):
        self.inner, self.n, self.calls = inner, n, 0

    def token_id(self, token: str):
        return self.inner.token_id(token)

    def prompt_ids(self, req: GenRequest) -> list[int]:
        return self.inner.prompt_ids(req)

    async def fault(self) -> None:
        raise NotImplementedError

    async def stream(self, req: GenRequest):
        self.calls += 1
        k = 0
        async for ch in self.inner.stream(req):
            if self.calls == 1 and k == self.n:
                await self.fault()
            k += 1
            yield ch

    async def aclose(self) -> None:
        pass


class CutAfter(FaultAfter):
    """The first call breaks after `n` chunks without reporting usage, like a dropped connection."""

    name = "cut-after"

    async def fault(self) -> None:
        raise ConnectionResetError("injected: stream cut")


def test_tokens_streamed_before_a_cut_are_billed(slm, llm):
    cut = CutAfter(llm, n=3)
    eng = CollaborateEngine(slm, cut, PROMPTS, PRICES, max_tokens=24, failure=FailurePolicy(backoff_s=0.0))
    done = eng.run("7+8", offload_bias=1e4)  # hand off at once
    assert cut.calls == 2 and done.usage.llm_calls == 2 and len(done.errors) == 1 and not done.fallback
    ref = CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=24).run("7+8", offload_bias=1e4)
    # the cut attempt sent the same prompt as `ref` and streamed 3 tokens: both are billed on top of the retry
    # (whose prompt is longer by those 3 tokens)
    assert done.usage.llm_in >= 2 * ref.usage.llm_in + 3
    assert done.usage.llm_out >= 3 + 1
    assert done.output.startswith(done.slm_text) and OFFLOAD_TOKEN not in done.output


def test_handoff_admitted_is_a_fixed_hash_admitting_about_the_share():
    from pyrodash.engine import handoff_admitted

    reqs = [[{"role": "user", "content": f"{i}: +3x8 f2"}] for i in range(4000)]
    for share in (0.1, 0.5, 0.9):
        rate = sum(handoff_admitted(m, share) for m in reqs) / len(reqs)
        assert abs(rate - share) < 0.03, (share, rate)
    assert not any(handoff_admitted(m, 0.0) for m in reqs) and all(handoff_admitted(m, 1.0) for m in reqs)
    # the same request always gets the same answer; a system prompt does not change it; a smaller share admits a subset
    sys_ = [{"role": "system", "content": "P_s"}]
    assert all(handoff_admitted(m, 0.5) == handoff_admitted(sys_ + m, 0.5) for m in reqs[:200])
    assert all(handoff_admitted(m, 0.5) for m in reqs if handoff_admitted(m, 0.25))


def test_handoff_share_bans_offload_outside_the_share_and_says_so(slm, llm):
    from pyrodash.engine import handoff_admitted

    with pytest.raises(ValueError, match="handoff_share"):
        CollaborateEngine(slm, llm, PROMPTS, PRICES, handoff_share=1.5)
    eng = CollaborateEngine(slm, llm, PROMPTS, PRICES, offload_bias=1e4, max_tokens=8, handoff_share=0.5)
    qs = [f"q{i}" for i in range(12)]
    admitted = [handoff_admitted(eng.messages(q), 0.5) for q in qs]
    assert any(admitted) and not all(admitted)  # both kinds among these questions
    for q, ok in zip(qs, admitted):
        done = eng.run(q)
        assert done.handoff_admitted is ok and done.offload_bias == 1e4
        if ok:  # +1e4 hands off at once
            assert done.handoff == 0 and done.usage.llm_calls == 1
        else:  # <offload> banned from the first token: the SLM answers alone, no LLM call
            assert done.handoff is None and done.usage.llm_calls == 0 and done.slm_text
            assert done.output == eng.run(q, offload_bias=float("-inf")).output


class CutLLM:
    """TEST DOUBLE for a provider that drops the connection mid-answer: streams the first `after` chunks of the real
    (in-process) LLM's answer, then fails, on every attempt. No `generate_batch`: it is driven like an endpoint."""

    def __init__(self, inner: HFBackend, after: int = 3):
        self.inner, self.after, self.name = inner, after, "cut-llm"

    def token_id(self, token: str):
        return self.inner.token_id(token)

    async def stream(self, req: GenRequest):
        from pyrodash.backends.base import BackendError

        n = 0
        async for ch in self.inner.stream(req):
            if ch.text and n == self.after:
                raise BackendError("injected: connection dropped mid-stream")
            n += bool(ch.text)
            yield ch

    async def aclose(self) -> None:
        pass


def test_fallback_after_partial_llm_text_keeps_streamed_order_everywhere(slm, llm):
    """Drift bug: under an LLM failure the fallback text was painted twice in `Done.segments` and the eval record
    ordered SLM, fallback and LLM text differently from the stream. Now the stream, the batch driver and the eval
    record agree: text in streamed order, each piece once."""
    from pyrodash.data.example import Example
    from pyrodash.eval.methods import Env, PyroDash

    eng = CollaborateEngine(
        slm,
        CutLLM(llm),
        PROMPTS,
        PRICES,
        max_tokens=24,
        failure=FailurePolicy(retries=1, backoff_s=0.0, on_error="fallback"),
    )
    bias = mid_handoff_bias(CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=24), "x")[0]

    async def events():
        return [ev async for ev in eng.stream("x", offload_bias=bias)]

    evs = asyncio.run(events())
    done = evs[-1]
    streamed = "".join(ev.text for ev in evs if isinstance(ev, (SLMDelta, LLMDelta)))
    assert done.fallback and done.llm_text and len(done.errors) == 2
    assert done.output == streamed == "".join(s["text"] for s in done.segments)
    assert [(s["by"], bool(s.get("fallback"))) for s in done.segments] == [
        ("slm", False),
        ("llm", False),
        ("slm", True),
    ]
    batch = eng.batch(["x"], options=[{"offload_bias": bias}])[0]
    assert (batch.output, batch.segments, batch.usage, batch.handoff) == (
        done.output,
        done.segments,
        done.usage,
        done.handoff,
    )
    env = Env(PROMPTS, PRICES, max_tokens=24)
    method = PyroDash("pyrodash", slm, CutLLM(llm), env, offload_bias=bias)
    method.engine.failure = eng.failure
    (rec,) = method([(Example(id="0", benchmark="t", question="x", gold="0"), {"temperature": 0.0})])
    assert rec["output"] == done.output and rec["segments"] == done.segments and rec["fallback"]


@pytest.mark.parametrize("mode", ["collab", "slm", "llm"])
def test_batch_driver_equals_the_stream_driver(engine, mode):
    """The engine's two entry points are one Algorithm 1: a batch (left-padded in-process generation) gives each
    question the Done its stream gives (text, segments, handoff, tokens, dollars), in every mode."""
    qs = ["x", "3+4=", "Start 5: +1, f."]
    bias = 2.0 if mode == "collab" else 0.0
    streamed = [engine.run(q, mode=mode, offload_bias=bias) for q in qs]
    batched = engine.batch(qs, mode=mode, options=[{"offload_bias": bias}] * len(qs), batch_size=2)
    for s, b in zip(streamed, batched, strict=True):
        assert (b.output, b.segments, b.handoff, b.usage, b.mode) == (s.output, s.segments, s.handoff, s.usage, mode)
        assert b.cost_usd == pytest.approx(s.cost_usd)
    if mode == "collab":
        assert any(d.handoff is not None for d in batched)
        only_slm = engine.batch(qs, options=[{"offload_bias": bias}] * len(qs), stop_at_handoff=True)
        assert [d.handoff for d in only_slm] == [d.handoff for d in streamed]
        assert all(d.usage.llm_calls == 0 for d in only_slm)
    else:
        assert all(d.handoff is None and (d.usage.llm_calls == (mode == "llm")) for d in batched)


class StallAfter(FaultAfter):
    """The first call stops sending for `stall_s` after `n` chunks, like a provider that hangs mid-answer."""

    name = "stall-after"

    def __init__(self, inner: HFBackend, n: int, stall_s: float):
        super().__init__(inner, n)
        self.stall_s = stall_s
        self.stalled = asyncio.Event()

    async def fault(self) -> None:
        self.stalled.set()
        await asyncio.sleep(self.stall_s)


def test_llm_chunk_timeout_counts_only_the_wait_for_a_chunk(slm, llm):
    """`FailurePolicy.timeout_s` bounds each wait for the LLM's next chunk: a stall mid-answer fails the attempt
    (and the retry continues); a consumer slower than the timeout between chunks is no timeout; a cancel from
    outside during a wait stays a cancel."""
    stall = StallAfter(llm, n=3, stall_s=30.0)
    eng = CollaborateEngine(
        slm, stall, PROMPTS, PRICES, max_tokens=24, failure=FailurePolicy(backoff_s=0.0, timeout_s=0.3)
    )
    t0 = time.perf_counter()
    done = eng.run("7+8", offload_bias=1e4)  # hand off at once
    assert time.perf_counter() - t0 < 10
    assert stall.calls == 2 and done.errors == ["attempt 1: TimeoutError (no chunk within 0.3s)"]
    assert not done.fallback and done.usage.llm_calls == 2 and done.llm_text

    patient = CollaborateEngine(slm, llm, PROMPTS, PRICES, max_tokens=24, failure=FailurePolicy(timeout_s=0.2))

    async def slow_reader() -> Done:
        n = 0
        async for ev in patient.stream("7+8", offload_bias=1e4):
            if isinstance(ev, LLMDelta) and n < 2:
                n += 1
                await asyncio.sleep(0.4)  # the engine waits at its yield: not the LLM's time
        return ev

    done = asyncio.run(slow_reader())
    assert not done.errors and done.usage.llm_calls == 1 and done.llm_text

    async def cancel_in_a_wait() -> None:
        stall = StallAfter(llm, n=1, stall_s=30.0)
        eng = CollaborateEngine(slm, stall, PROMPTS, PRICES, max_tokens=24, failure=FailurePolicy(timeout_s=20.0))
        task = asyncio.create_task(_drain_stream(eng.stream("7+8", offload_bias=1e4)))
        await stall.stalled.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert stall.calls == 1

    asyncio.run(cancel_in_a_wait())


async def _drain_stream(stream) -> None:
    async for _ in stream:
        pass


def test_a_typed_request_runs_as_its_keyword_form(engine):
    """`engine.stream(EngineRequest(...))` (the server's form) gives the same record as `engine.stream(q, **options)`
    (eval's and training's); an unknown option is a TypeError naming it, an unknown mode a ValueError."""
    options = {"offload_bias": 100.0, "max_tokens": 6, "max_total_tokens": 9, "temperature": 0.0, "seed": 1}
    typed = engine.run(EngineRequest("x", **options))
    plain = engine.run("x", **options)
    assert typed.handoff is not None and typed.usage.llm_calls == 1
    assert (typed.output, typed.usage, typed.segments) == (plain.output, plain.usage, plain.segments)
    with pytest.raises(TypeError, match="bogus"):
        engine.run("x", bogus=1)
    with pytest.raises(ValueError, match="mode="):
        EngineRequest("x", mode="both")
