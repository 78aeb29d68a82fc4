"""The in-process backend's prefix cache (backends/hf/prefix_cache.py): a request that continues a decoded sequence
prefills only what is new, decodes the same greedy tokens as a fresh prefill (on the world's shipped SLM, in the shape
of a relay's resumes, after a streamed or a batched first segment), reports the tokens it served, and the engine bills
the SLM only for the rest."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from tiny_models import tiny_model

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.hf.prefix_cache import PrefixCache
from pyrodash.cost import Prices, Usage
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.relay import RelayConfig
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts
from pyrodash.record import Record, usage_of
from pyrodash.report.metrics import record_cost

PROMPTS = get_prompts("world-v1")
PAPER = Prices.from_yaml("paper")
MSGS = [{"role": "user", "content": "What is 2+3?"}]


def collect(backend, req: GenRequest) -> tuple[str, list[int], GenChunk]:
    async def go():
        text, ids, fin = "", [], None
        async for ch in backend.stream(req):
            text, ids = text + ch.text, ids + list(ch.token_ids)
            fin = ch if ch.finish_reason else fin
        return text, ids, fin

    return asyncio.run(go())


@pytest.fixture(scope="module")
def tiny():
    return HFBackend(*tiny_model(seed=0), name="tiny")


def keyed(key: object, **kw) -> GenRequest:
    req = GenRequest(**kw)
    req.cache_key = key
    return req


def test_an_answers_next_request_prefills_only_what_is_new_and_nothing_else_shares_its_kv(tiny):
    tiny.prefix_cache = PrefixCache()
    answer = object()
    first, ids, fin = collect(tiny, keyed(answer, messages=MSGS, max_tokens=12))
    assert fin.cached_tokens == 0 and len(tiny.prefix_cache) == 1 and len(ids) == 12
    prompt = fin.prompt_tokens
    # requests of other answers (or of none) never read it: the same prompt again prefills in full
    assert collect(tiny, keyed(object(), messages=MSGS, prefix=first[:5], max_tokens=4))[2].cached_tokens == 0
    assert collect(tiny, GenRequest(messages=MSGS, prefix=first[:5], max_tokens=4))[2].cached_tokens is None
    assert len(tiny.prefix_cache) == 2  # (the other answer's sequence; the unkeyed request keeps nothing)
    # the answer's next request: the prompt and 5 of its generated tokens, then new text -> prompt + 5 served
    cont = keyed(answer, messages=MSGS, prefix=first[:5] + "zz", max_tokens=6)
    got = collect(tiny, cont)
    assert got[2].cached_tokens == prompt + 5 and got[2].prompt_tokens == prompt + 7
    assert tiny.prefix_cache.hits == 1 and tiny.prefix_cache.served == prompt + 5
    # and it decodes what a fresh prefill decodes; off, nothing is looked up (no cached figure)
    tiny.prefix_cache = None
    off = collect(tiny, cont)
    tiny.prefix_cache = PrefixCache()
    assert off[2].cached_tokens is None and off[1] == got[1]


def test_the_cache_is_bounded_and_tied_to_the_weights(tiny):
    import torch

    tiny.prefix_cache = PrefixCache(max_entries=2)
    questions = [[{"role": "user", "content": f"What is 2+{k}?"}] for k in range(4)]
    for q in questions:
        collect(tiny, keyed(object(), messages=q, max_tokens=6))
    assert len(tiny.prefix_cache) == 2 and tiny.prefix_cache.evicted == 2
    size = tiny.prefix_cache.nbytes()
    tiny.prefix_cache = PrefixCache(max_bytes=size // 2 + 1)  # room for about one entry
    for q in questions:
        collect(tiny, keyed(object(), messages=q, max_tokens=6))
    assert len(tiny.prefix_cache) == 1 and tiny.prefix_cache.nbytes() <= size // 2 + 1
    # a training step changes the weights: every kept KV is stale, the answer's next request prefills in full
    answer = object()
    first, _, _ = collect(tiny, keyed(answer, messages=MSGS, max_tokens=8))
    w = tiny.model.get_input_embeddings().weight
    with torch.no_grad():
        w.add_(0.0)  # an in-place write (an optimizer step's kind)
    got = collect(tiny, keyed(answer, messages=MSGS, prefix=first[:3] + "z", max_tokens=2))[2]
    assert got.cached_tokens == 0 and len(tiny.prefix_cache) == 1
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(max_entries=0)


def _world_slm():
    from transformers import AutoModelForCausalLM

    from pyrodash.tokens import add_offload_token
    from pyrodash.world.shipped import SHIPPED
    from pyrodash.world.tokenizer import build_tokenizer

    model = AutoModelForCausalLM.from_pretrained(SHIPPED / "seed0" / "slm")
    tok = build_tokenizer()
    add_offload_token(model, tok)  # the relay context's `<offload>` (a Stage-1 SLM has it; the shipped base does not)
    return HFBackend(model, tok, name="world-slm")


def _world_questions(n: int):
    from pyrodash.world.task import make_known, make_split, make_table

    exs = make_split(0, "test", n, [1, 2, 3, 4, 5], make_table(0), make_known(0.65))
    return [ex for ex in exs if ex.meta["hard_steps"]]


def test_resumes_from_the_cache_decode_the_tokens_of_a_fresh_prefill_on_the_world_slm():
    """A relay's resume on the world's SLM: its first segment (streamed, or decoded in a batch whose rows' KV are
    kept), cut before the first untaught step, `<offload>`, the gold step, then the SLM goes on. With the cache it
    prefills only the new part; without, all of it: the same greedy tokens, every question."""
    slm = _world_slm()
    exs = _world_questions(24)
    base = [[{"role": "system", "content": PROMPTS.offload_system}, *PROMPTS.plain_messages(ex.question)] for ex in exs]
    served = differ = 0
    for how in ("stream", "batch"):
        slm.prefix_cache = PrefixCache()
        keys = [object() for _ in base]
        if how == "stream":
            firsts = [collect(slm, keyed(k, messages=m, max_tokens=160))[0] for k, m in zip(keys, base)]
        else:
            firsts = [
                r.text for r in slm.generate_batch([keyed(k, messages=m, max_tokens=160) for k, m in zip(keys, base)])
            ]
        assert len(slm.prefix_cache) == len(base)
        for ex, m, first, k in zip(exs, base, firsts, keys, strict=True):
            h = ex.meta["hard_steps"][0]
            cut = "".join(p + "\n\n" for p in first.split("\n\n")[:h])
            ctx = cut + OFFLOAD_TOKEN + ex.meta["steps"][h] + "\n\n"
            req = keyed(k, messages=m, prefix=ctx, max_tokens=120)
            hit = collect(slm, req)
            cache, slm.prefix_cache = slm.prefix_cache, None
            fresh = collect(slm, req)
            slm.prefix_cache = cache
            assert hit[2].cached_tokens > 0 and hit[2].prompt_tokens == fresh[2].prompt_tokens
            served += hit[2].cached_tokens
            differ += hit[1] != fresh[1]
    assert differ == 0 and served > 0


def test_the_engine_bills_the_slm_only_for_what_it_prefills():
    """A relay through the engine with an SLM that reports cached tokens: slm_cached_in is recorded, never billed,
    in the record, its re-pricing and the usage's cost."""
    import test_relay as tr

    class CachingSLM(tr.ScriptSLM):
        async def stream(self, req: GenRequest):
            async for ch in super().stream(req):
                if ch.finish_reason is not None:  # a resume: everything before the LLM's last step was cached
                    ch = dataclasses.replace(ch, cached_tokens=max(0, tr.prompt_len(req) - 12) if req.prefix else 0)
                yield ch

    e = CollaborateEngine(CachingSLM(), tr.ScriptLLM(), PROMPTS, PAPER, max_tokens=200, relay=RelayConfig(4))
    done = e.run("q")
    u = done.usage
    assert u.slm_cached_in > 0 and u.slm_cached_in < u.slm_in
    fresh = Usage(**{**u.to_dict(), "slm_in": u.slm_in - u.slm_cached_in, "slm_cached_in": 0})
    assert done.cost_usd == pytest.approx(fresh.cost(PAPER)) and u.cost(PAPER) < dataclasses.replace(
        u, slm_cached_in=0
    ).cost(PAPER)
    rec = Record.from_done(done).to_json()
    assert rec["slm_cached_in"] == u.slm_cached_in and usage_of(rec) == u
    assert record_cost(rec, PAPER) == pytest.approx(done.cost_usd)
    (batch,) = e.batch(["q"])
    assert batch.usage == u and batch.cost_usd == pytest.approx(done.cost_usd)


class StepLLM:
    """Writes one short step and stops at the separator, whatever the trace (an endpoint honouring `stop`)."""

    name = "llm"

    def token_id(self, token: str) -> int | None:
        return None

    async def stream(self, req: GenRequest):
        yield GenChunk(text="x=1")
        yield GenChunk(finish_reason="stop", prompt_tokens=len(req.prefix) + 20, completion_tokens=3)

    async def aclose(self):
        pass


def test_a_relay_through_the_engine_reuses_the_slms_kv_the_same_way_in_both_drivers():
    """The world-tokenizer SLM in relay: its first segment's KV is kept (streamed, or a batch row) and each resume
    prefills only what is new; the stream and the batch driver record the same answer and the same cached count, and
    the answer is the one decoded without the cache, billed less by exactly the cached tokens."""
    from tiny_models import HANDOFF_SLM_SEED, mid_trace_bias

    tiny = HFBackend(*tiny_model(seed=HANDOFF_SLM_SEED), name="tiny")
    q = "What is 2+3?"
    bias = mid_trace_bias(tiny, PROMPTS, q)

    def run(cache: PrefixCache | None, driver: str):
        tiny.prefix_cache = cache
        e = CollaborateEngine(tiny, StepLLM(), PROMPTS, PAPER, max_tokens=40, relay=RelayConfig(max_llm_calls=3))
        return e.run(q, offload_bias=bias) if driver == "stream" else e.batch([q], options=[{"offload_bias": bias}])[0]

    served, batch, off = run(PrefixCache(), "stream"), run(PrefixCache(), "batch"), run(None, "stream")
    assert served.usage.llm_calls >= 2 and served.usage.slm_cached_in > 0
    for f in ("output", "segments", "handoffs", "usage", "cost_usd"):
        assert getattr(served, f) == getattr(batch, f), f
    assert (off.output, off.segments, off.usage.slm_in) == (served.output, served.segments, served.usage.slm_in)
    assert off.usage.slm_cached_in == 0
    saved = served.usage.slm_cached_in * PAPER.slm_in / 1e6
    assert off.cost_usd - served.cost_usd == pytest.approx(saved)
