"""The in-process backend's prefix cache (pyrodash.backends.prefix_cache): a request that continues a decoded sequence
prefills only what is new, decodes the same greedy tokens as a fresh prefill (on the world's shipped SLM, in the shape
of a relay's resumes, after a streamed or a batched first segment), reports the tokens it served, and the engine bills
the SLM only for the rest."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from tiny_models import tiny_model

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.backends.hf import HFBackend
from pyrodash.backends.prefix_cache import PrefixCache
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


def test_a_continuation_prefills_only_what_is_new_and_other_requests_prefill_in_full(tiny):
    tiny.prefix_cache = PrefixCache()
    first, ids, fin = collect(tiny, GenRequest(messages=MSGS, max_tokens=12))
    assert fin.cached_tokens == 0 and len(tiny.prefix_cache) == 1
    prompt = fin.prompt_tokens
    # the same question again: not a continuation (its prompt does not go past the sequence's), prefilled in full
    assert collect(tiny, GenRequest(messages=MSGS, max_tokens=4))[2].cached_tokens == 0
    # another question (sharing the template's head): prefilled in full
    other = [{"role": "user", "content": "What is 2+4?"}]
    assert collect(tiny, GenRequest(messages=other, max_tokens=4))[2].cached_tokens == 0
    # a continuation: the prompt, 5 of its generated tokens, then new text -> those prompt + 5 tokens are served
    cont = GenRequest(messages=MSGS, prefix=first[:5] + "zz", max_tokens=6)
    got = collect(tiny, cont)[2]
    assert got.cached_tokens == prompt + 5 and got.prompt_tokens == prompt + 7
    assert tiny.prefix_cache.hits == 1 and tiny.prefix_cache.served == prompt + 5
    # off: no cached figure at all (None), the same tokens
    tiny.prefix_cache = None
    off = collect(tiny, cont)
    tiny.prefix_cache = PrefixCache()
    assert off[2].cached_tokens is None


def test_the_cache_is_bounded_and_tied_to_the_weights(tiny):
    import torch

    tiny.prefix_cache = PrefixCache(max_entries=2)
    questions = [[{"role": "user", "content": f"What is 2+{k}?"}] for k in range(4)]
    for q in questions:
        collect(tiny, GenRequest(messages=q, max_tokens=6))
    assert len(tiny.prefix_cache) == 2 and tiny.prefix_cache.evicted == 2
    size = tiny.prefix_cache.nbytes()
    tiny.prefix_cache = PrefixCache(max_bytes=size // 2 + 1)  # room for about one entry
    for q in questions:
        collect(tiny, GenRequest(messages=q, max_tokens=6))
    assert len(tiny.prefix_cache) == 1 and tiny.prefix_cache.nbytes() <= size // 2 + 1
    # a training step changes the weights: every kept KV is stale, the continuation prefills in full
    first, _, _ = collect(tiny, GenRequest(messages=MSGS, max_tokens=8))
    w = tiny.model.get_input_embeddings().weight
    with torch.no_grad():
        w.add_(0.0)  # an in-place write (an optimizer step's kind)
    got = collect(tiny, GenRequest(messages=MSGS, prefix=first[:3] + "z", max_tokens=2))[2]
    assert got.cached_tokens == 0 and len(tiny.prefix_cache) == 1
    with pytest.raises(ValueError, match="max_entries"):
        PrefixCache(max_entries=0)


def _world_slm():
    from pyrodash.tokens import add_offload_token
    from pyrodash.world.shipped import SHIPPED
    from pyrodash.world.tokenizer import build_tokenizer

    from transformers import AutoModelForCausalLM

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
    firsts = {
        "stream": [collect(slm, GenRequest(messages=m, max_tokens=160))[0] for m in base],
        "batch": [r.text for r in slm.generate_batch([GenRequest(messages=m, max_tokens=160) for m in base])],
    }
    assert firsts["stream"] == firsts["batch"]
    served = differ = 0
    for how in ("stream", "batch"):
        slm.prefix_cache = PrefixCache(max_entries=64)
        if how == "stream":
            [collect(slm, GenRequest(messages=m, max_tokens=160)) for m in base]
        else:
            slm.generate_batch([GenRequest(messages=m, max_tokens=160) for m in base])
        for ex, m, first in zip(exs, base, firsts[how], strict=True):
            h = ex.meta["hard_steps"][0]
            cut = "".join(p + "\n\n" for p in first.split("\n\n")[:h])
            ctx = cut + OFFLOAD_TOKEN + ex.meta["steps"][h] + "\n\n"
            req = GenRequest(messages=m, prefix=ctx, max_tokens=120)
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
