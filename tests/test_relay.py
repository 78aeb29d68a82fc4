"""Relay (pyrodash.engine.relay) over scripted backends: an SLM that writes the gold steps it was taught and hands off
before each untaught one, an LLM that continues the trace (honouring `stop` or not). Each model's tokens are its
characters, so every count and dollar below is computed from the text."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.cost import Prices, Usage
from pyrodash.engine import CollaborateEngine, EngineError, FailurePolicy
from pyrodash.engine.relay import STEP_CAP, STOP_IGNORED, RelayConfig
from pyrodash.events import Done, Handoff, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.record import Record, usage_of
from pyrodash.report.metrics import record_cost

PROMPTS = get_prompts("world-v1")
PAPER = Prices.from_yaml("paper")
CACHED = Prices.from_yaml("cached")
STEPS = ["a=1", "H(a)=7", "b=7+1", "H(b)=99", "c=99-1", "\\boxed{98}"]
GOLD = "\n\n".join(STEPS)
HARD = {1, 3}  # the steps the SLM was not taught
OFFLOAD_ID = 5


def prompt_len(req: GenRequest) -> int:
    """A prompt's tokens: its characters, and 4 per message (a closed turn costs more than a prefix continued)."""
    return sum(len(str(m.get("content") or "")) + 4 for m in req.messages) + len(req.prefix)


class ScriptSLM:
    """Writes GOLD from where the prefix is, stopping with `<offload>` right before a hard step."""

    name = "slm"

    def __init__(self):
        self.requests: list[GenRequest] = []

    def token_id(self, token: str) -> int | None:
        return OFFLOAD_ID if token == OFFLOAD_TOKEN else None

    async def stream(self, req: GenRequest):
        self.requests.append(req)
        trace = req.prefix.replace(OFFLOAD_TOKEN, "")  # its context keeps the `<offload>` tokens it emitted
        assert GOLD.startswith(trace)
        done = trace.count("\n\n")
        rest = GOLD[len(trace) :]
        hard = [h for h in sorted(HARD) if h >= done]
        text, stop = rest, None
        if hard and OFFLOAD_ID in req.stop_token_ids and req.logit_bias.get(OFFLOAD_ID, 0) != float("-inf"):
            parts = rest.split("\n\n")
            text, stop = "".join(p + "\n\n" for p in parts[: hard[0] - done]), OFFLOAD_ID
        if text:
            yield GenChunk(text=text)
        yield GenChunk(
            finish_reason="stop",
            stop_token_id=stop,
            prompt_tokens=prompt_len(req),
            completion_tokens=len(text) + (stop is not None),
        )

    async def aclose(self):
        pass


def trace_of(req: GenRequest) -> str:
    """The trace a handoff request continues: its assistant prefix, or in the instruct form the partial answer
    quoted in its last user message (world-v1's handoff_template)."""
    if req.prefix or not req.messages:
        return req.prefix
    content = str(req.messages[-1].get("content") or "")
    if "\nPartial:\n" not in content:
        return ""
    return content.split("\nPartial:\n", 1)[1].rsplit("\nContinue.", 1)[0]


class ScriptLLM:
    """Continues GOLD from the prefix; stops before "\\n\\n" when asked to (`honours_stop`), within max_tokens.
    `cached`: reports the previous call's prompt as cached tokens (a provider's prompt cache)."""

    name = "llm"

    def __init__(self, honours_stop: bool = True, cached: bool = False, fail: bool = False):
        self.honours_stop, self.cached, self.fail = honours_stop, cached, fail
        self.requests: list[GenRequest] = []
        self.last_prompt = 0

    def token_id(self, token: str) -> int | None:
        return None

    async def stream(self, req: GenRequest):
        self.requests.append(req)
        if self.fail:
            raise RuntimeError("down")
        trace = trace_of(req)
        if not GOLD.startswith(trace):  # a server's start-up probe ("Count on: 1, 2, 3"): counts on
            yield GenChunk(text=", 5, 6")
            yield GenChunk(finish_reason="stop", prompt_tokens=prompt_len(req), completion_tokens=6)
            return
        rest = GOLD[len(trace) :]
        if self.honours_stop:
            for s in req.stop:
                rest = rest.split(s)[0]
        text = rest[: req.max_tokens]
        reason = "length" if len(text) < len(rest) else "stop"
        n = prompt_len(req)
        cached, self.last_prompt = (min(self.last_prompt, n) if self.cached else None), n
        yield GenChunk(text=text)
        yield GenChunk(finish_reason=reason, prompt_tokens=n, completion_tokens=len(text), cached_tokens=cached)

    async def aclose(self):
        pass


def engine(llm=None, calls=8, cap=64, **kw) -> CollaborateEngine:
    cfg = RelayConfig(max_llm_calls=calls, step_max_tokens=cap)
    return CollaborateEngine(ScriptSLM(), llm or ScriptLLM(), PROMPTS, PAPER, max_tokens=200, relay=cfg, **kw)


def events(e: CollaborateEngine, **kw) -> list:
    async def go():
        return [ev async for ev in e.stream("q", **kw)]

    return asyncio.run(go())


def test_relay_hands_off_before_each_hard_step_and_the_llm_writes_only_that_step():
    e = engine()
    done = e.run("q")
    assert done.output == GOLD and done.finish_reason == "stop" and done.relay_fallback is None
    assert [s["by"] for s in done.segments] == ["slm", "llm", "slm", "llm", "slm"]
    assert [s["text"] for s in done.segments if s["by"] == "llm"] == ["H(a)=7\n\n", "H(b)=99\n\n"]
    assert done.usage.llm_calls == 2 and len(e.llm.requests) == 2
    assert all(r.stop == ["\n\n"] and r.max_tokens == 64 for r in e.llm.requests)
    # handoff positions: SLM tokens (characters) before each <offload>, the earlier <offload> tokens not counted
    assert done.handoffs == [len("a=1\n\n"), len("a=1\n\nb=7+1\n\n")]
    assert Record.from_done(done).handoffs == done.handoffs
    # every call billed on its own: the second call's input = what the first one read, plus fresh tokens
    first, second = (prompt_len(r) for r in e.llm.requests)
    assert done.usage.llm_in == first + second and done.usage.llm_prior_in == first
    assert done.usage.llm_out == len("H(a)=7") + len("H(b)=99")
    assert done.cost_usd == pytest.approx(done.usage.cost(PAPER))
    # the SLM wrote three times: its first segment, then on its own context after each LLM step (the `<offload>` it
    # emitted kept, one token sequence), while each LLM call read the packed trace (no `<offload>`)
    o = OFFLOAD_TOKEN
    first = f"a=1\n\n{o}H(a)=7\n\n"
    assert [r.prefix for r in e.slm.requests] == ["", first, f"{first}b=7+1\n\n{o}H(b)=99\n\n"]
    assert [r.prefix for r in e.llm.requests] == ["a=1\n\n", "a=1\n\nH(a)=7\n\nb=7+1\n\n"]


def test_the_stream_yields_segments_as_they_come_and_equals_the_batch_driver():
    e = engine()
    evs = events(e)
    kinds = [type(ev).__name__ for ev in evs]
    # the step's separator streams (an LLMDelta) once the SLM resumes: the LLM's stop sequence ended its step
    step = ["LLMDelta", "LLMDelta", "SLMDelta"]
    assert kinds == ["SLMDelta", "Handoff", *step, "Handoff", *step, "Done"]
    text = "".join(ev.text for ev in evs if isinstance(ev, (SLMDelta, LLMDelta)))
    done = evs[-1]
    assert isinstance(done, Done) and text == done.output == GOLD
    assert [ev.slm_tokens for ev in evs if isinstance(ev, Handoff)] == done.handoffs
    (batch,) = e.batch(["q"])
    for f in ("output", "segments", "handoffs", "usage", "cost_usd", "finish_reason", "relay_fallback"):
        assert getattr(batch, f) == getattr(done, f), f


def test_single_handoff_is_the_default_and_unchanged():
    e = engine(calls=1)
    done = e.run("q")
    assert done.usage.llm_calls == 1 and e.llm.requests[0].stop == []
    assert done.output == GOLD and [s["by"] for s in done.segments] == ["slm", "llm"]
    assert done.handoffs == [] and Record.from_done(done).handoffs == [done.handoff]
    # a request may ask for relay on an engine whose default is the single handoff
    assert e.run("q", max_llm_calls=3).usage.llm_calls == 2


def test_max_llm_calls_bounds_the_calls_and_the_last_one_writes_the_rest():
    e = engine(calls=2)
    done = e.run("q")
    assert done.usage.llm_calls == 2 and done.output == GOLD
    assert e.llm.requests[0].stop == ["\n\n"] and e.llm.requests[1].stop == []
    assert done.segments[-1] == {"by": "llm", "endpoint": "llm", "text": "H(b)=99\n\nc=99-1\n\n\\boxed{98}"}


def test_a_server_that_ignores_stop_falls_back_visibly():
    e = engine(llm=ScriptLLM(honours_stop=False), cap=200)
    done = e.run("q")
    assert done.relay_fallback == STOP_IGNORED and done.usage.llm_calls == 1 and done.output == GOLD
    assert Record.from_done(done).relay_fallback == STOP_IGNORED


def test_the_step_cap_falls_back_to_one_call_for_the_rest():
    e = engine(cap=3)
    done = e.run("q")
    assert done.relay_fallback == STEP_CAP and done.output == GOLD
    assert done.usage.llm_calls == 2 and e.llm.requests[1].stop == [] and e.llm.requests[1].prefix == "a=1\n\nH(a"


def test_cached_input_reported_wins_else_the_sheet_estimates_it_from_the_split():
    done = engine().run("q")
    u = done.usage
    estimated = Usage(**{**u.to_dict(), "llm_cached_in": u.llm_prior_in})
    assert u.cost(CACHED) == pytest.approx(estimated.cost(CACHED)) and u.cost(CACHED) < u.cost(PAPER)
    rec = Record.from_done(done).to_json()
    assert record_cost(rec, CACHED) == pytest.approx(u.cost(CACHED)) and usage_of(rec) == u
    assert rec["llm_endpoints"][0]["llm_prior_in"] == u.llm_prior_in
    # a provider that reports cached tokens: its figure is billed, the estimate is not used
    rep = engine(llm=ScriptLLM(cached=True)).run("q").usage
    assert rep.llm_cached_in == rep.llm_prior_in > 0
    assert rep.cost(CACHED) == pytest.approx(Usage(**{**rep.to_dict(), "llm_prior_in": 0}).cost(CACHED))
    assert not rep.cache_estimated(CACHED) and u.cache_estimated(CACHED) and not u.cache_estimated(PAPER)


def test_an_llm_that_fails_leaves_the_slm_to_finish_or_raises():
    fast = FailurePolicy(retries=0, backoff_s=0.0)
    e = engine(llm=ScriptLLM(fail=True), failure=fast)
    done = e.run("q")
    assert done.fallback and done.segments[-1]["fallback"] and done.output.startswith("a=1\n\n")
    assert e.slm.requests[-1].stop == []  # the SLM finishes the answer: the step's stop is not on its request
    with pytest.raises(EngineError) as err:
        engine(llm=ScriptLLM(fail=True), failure=FailurePolicy(retries=0, on_error="raise")).run("q")
    assert err.value.done.finish_reason == "error"
    (batch,) = engine(llm=ScriptLLM(fail=True), failure=FailurePolicy(retries=0, on_error="raise")).batch(["q"])
    assert batch.finish_reason == "error"


def test_bad_relay_settings_are_value_errors():
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="max_llm_calls"):
            RelayConfig(max_llm_calls=bad)
    with pytest.raises(ValueError, match="step_sep"):
        RelayConfig(step_sep="")
    with pytest.raises(ValueError, match="max_llm_calls"):
        engine().run("q", max_llm_calls=0)


class BaseSLM(ScriptSLM):
    """A base SLM without `<offload>`: writes the rest of GOLD (the relay oracle places the handoffs)."""

    def token_id(self, token: str) -> int | None:
        return None

    def count_tokens(self, text: str) -> int:
        return len(text)

    async def stream(self, req: GenRequest):
        assert OFFLOAD_TOKEN not in req.prefix  # the relay oracle strips the engine's `<offload>` for it
        async for ch in super().stream(req):
            yield ch


def test_relay_oracle_hands_off_before_every_untaught_step_through_the_engine():
    from pyrodash.data.example import Example
    from pyrodash.eval.methods import Env
    from pyrodash.eval.oracle import RelayOracle

    env = Env(PROMPTS, PAPER, max_tokens=200, batch_size=4)
    items = [
        (Example("r0", "world:tier1", "q", "98", {"hard_steps": sorted(HARD)}), {}),
        (Example("r1", "world:tier1", "q2", "98", {"hard_steps": []}), {}),
    ]
    llm = ScriptLLM()
    hard, easy = RelayOracle("relay_oracle", BaseSLM(), llm, env)(items)
    assert hard["output"] == GOLD and hard["llm_calls"] == len(HARD) and hard["oracle_steps"] == sorted(HARD)
    assert [s["text"] for s in hard["segments"] if s["by"] == "llm"] == ["H(a)=7\n\n", "H(b)=99\n\n"]
    assert hard["handoffs"] == [len("a=1\n\n"), len("a=1\n\nb=7+1\n\n")] and hard["relay_fallback"] is None
    # each SLM stretch billed as written plus one <offload> token per handoff
    assert hard["slm_out"] == len("a=1\n\n") + len("b=7+1\n\n") + len("c=99-1\n\n\\boxed{98}") + len(HARD)
    assert easy["llm_calls"] == 0 and easy["output"] == GOLD and easy["handoffs"] == []
    assert all(r.stop == ["\n\n"] for r in llm.requests)


def test_admission_reserves_a_relays_first_call_and_the_gate_each_further_one():
    """Admission reserves one call's bound whatever `max_llm_calls` is; every further relay call is reserved by the
    budget's gate before it is made (tests/test_budget_gate.py drives that through a capped server)."""
    from pyrodash.engine import EngineRequest
    from pyrodash.server.budget.reserve import call_bound, worst_case

    call = EngineRequest("q", max_tokens=200, max_total_tokens=200)
    one, four = (worst_case(engine(calls=n), call, "llm") for n in (1, 4))
    assert one.llm == pytest.approx(four.llm) and one.collab == pytest.approx(four.collab)
    assert four.llm >= call_bound(engine(calls=4), 0, 200).usd  # at least the call's whole output budget


def test_a_relay_sweep_point_is_the_policy_in_relay_mode():
    from pyrodash.data.example import Example
    from pyrodash.eval.methods import Env, PyroDash
    from pyrodash.eval.names import method_name, parse_method, sort_key, sweep_kind

    name = method_name("pyrodash", 2, "relay", 4)
    assert name == "pyrodash@2+relay4" and parse_method(name) == ("pyrodash", 2.0, 4.0) and sweep_kind(name) == "relay"
    assert sort_key("pyrodash@2+share0.5") < sort_key(name) < sort_key("relay_oracle") < sort_key("oracle")
    env = Env(PROMPTS, PAPER, max_tokens=200)
    point = PyroDash(name, ScriptSLM(), ScriptLLM(), env, max_llm_calls=4.0)
    (rec,) = point([(Example("x", "b", "q", "98"), {})])
    assert point.engine.max_llm_calls == 4 and rec["llm_calls"] == 2 and rec["output"] == GOLD


def test_an_slm_out_of_budget_after_the_llm_step_ends_the_answer_there_as_streamed():
    e = CollaborateEngine(ScriptSLM(), ScriptLLM(), PROMPTS, PAPER, max_tokens=6, relay=RelayConfig(max_llm_calls=4))
    evs = events(e)
    done = evs[-1]
    streamed = "".join(ev.text for ev in evs if isinstance(ev, (SLMDelta, LLMDelta)))
    assert done.finish_reason == "length" and done.output == streamed == "a=1\n\nH(a)=7"


def test_the_hf_backend_reads_the_engines_offload_as_the_token_and_a_clients_as_text():
    """The SLM's context through the world's tokenizer: each `<offload>` the engine put in the resume prefix is the
    `<offload>` id; a client's `<offload>` (literal-marked by the server) and one the LLM spelled out are characters."""
    from tiny_models import tiny_model

    from pyrodash.backends import literal
    from pyrodash.backends.hf.backend import HFBackend

    slm = HFBackend(*tiny_model(seed=0), name="tiny-slm")
    oid = slm.token_id(OFFLOAD_TOKEN)
    e = engine()
    client = literal.mark(f"q {OFFLOAD_TOKEN}", slm.special_tokens())
    e.run(client)
    resume = e.slm.requests[-1]
    ids = slm.prompt_ids(resume)
    asked = slm.prompt_ids(dataclasses.replace(resume, prefix=""))  # P_s names the token: its own count
    assert ids.count(oid) - asked.count(oid) == 2 == resume.prefix.count(OFFLOAD_TOKEN)
    chars = slm.tokenizer.encode(OFFLOAD_TOKEN, add_special_tokens=False, split_special_tokens=True)
    assert len(chars) == len(OFFLOAD_TOKEN) and _count(ids, chars) == 1  # the client's, as characters
    # the prefix's own text around each token tokenizes as it does alone (one contiguous sequence)
    tail = slm.prompt_ids(dataclasses.replace(resume, messages=[]))
    assert ids[-len(tail) :] == tail and tail.count(oid) == 2
    # an `<offload>` the LLM wrote stays characters in the SLM's context
    from pyrodash.engine.relay import _as_text, without_offload

    ctx = "a=1\n\n" + OFFLOAD_TOKEN + _as_text(f"say {OFFLOAD_TOKEN}\n\n")
    got = slm.prompt_ids(GenRequest(messages=[], prefix=ctx))
    assert got.count(oid) == 1 and _count(got, chars) == 1
    assert literal.strip_markers(without_offload(ctx)) == f"a=1\n\nsay {OFFLOAD_TOKEN}\n\n"


def _count(ids: list[int], sub: list[int]) -> int:
    return sum(ids[i : i + len(sub)] == sub for i in range(len(ids) - len(sub) + 1))


def test_engine_retries_wait_the_backends_jittered_backoff(monkeypatch):
    """One backoff in the tree (backends.retry.backoff_delay): retry k waits backoff_s * 2**(k-1), +-25%."""
    import random

    import pyrodash.engine.core as core

    waits: list[float] = []
    real = core.asyncio.sleep

    async def sleep(s: float, *a):
        if s > 0:
            waits.append(s)
        await real(0)

    monkeypatch.setattr(core.asyncio, "sleep", sleep)
    random.seed(0)
    for _ in range(4):
        engine(llm=ScriptLLM(fail=True), calls=1, failure=FailurePolicy(retries=2, backoff_s=1.0)).run("q")
    first, second = waits[0::2], waits[1::2]
    assert len(waits) == 8 and all(0.75 <= w <= 1.25 for w in first) and all(1.5 <= w <= 2.5 for w in second)
    assert len(set(waits)) == 8  # jittered: calls that failed together do not come back together
