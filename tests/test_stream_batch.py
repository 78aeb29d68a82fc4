"""Streams that wait for an in-process model together are decoded as one batch (`pyrodash.backends.hf.stream_batch`):
each stream gets the tokens, usage and prefix-cache figures it gets alone, on the world's SLM in the shape of a relay's
resumes (keyed requests resuming from the prefix cache beside plain and sampled ones); a stream whose consumer leaves
mid-batch stops there and the others finish as they would; `max_batch` 1 decodes them one by one, first come first
served. A sampled request with a seed draws the same tokens in a batch as alone (Stage 3's relay resumes, each with
its own seed: tests/test_relay_train.py). Reverting the batch (each stream alone again) fails the batch count; a
batch that hands a row's tokens to another stream fails the per-stream comparison."""

from __future__ import annotations

import asyncio
import contextlib

from test_prefix_cache import _world_questions, _world_slm, keyed

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.prefix_cache import PrefixCache
from pyrodash.prompts import OFFLOAD_TOKEN, get_prompts

PROMPTS = get_prompts("world-v1")


async def _drain(backend, req: GenRequest, leave_after: int | None = None) -> tuple:
    """(text, ids, finish reason, prompt tokens, cached tokens) of one stream; `leave_after`: close it after that many
    chunks (a client that went away)."""
    text, ids, fin = "", [], None
    async with contextlib.aclosing(backend.stream(req)) as it:
        async for n, ch in aiter_enumerate(it):
            text, ids = text + ch.text, ids + list(ch.token_ids)
            fin = ch if ch.finish_reason else fin
            if leave_after is not None and n + 1 >= leave_after:
                return text, ids, None, None, None
    return text, ids, fin.finish_reason, fin.prompt_tokens, fin.cached_tokens


async def aiter_enumerate(it):
    n = 0
    async for x in it:
        yield n, x
        n += 1


def _relay_shaped(slm, n: int) -> list[GenRequest]:
    """Each question's first segment streamed alone (its KV kept under its key), then the requests that go together:
    its resume after `<offload>` and the gold step (a prefix-cache hit), plus a plain greedy and a sampled request."""
    base = [[{"role": "system", "content": PROMPTS.offload_system}, *PROMPTS.plain_messages(ex.question)] for ex in
            _world_questions(n)]  # fmt: skip
    out = []
    for i, (ex, m) in enumerate(zip(_world_questions(n), base, strict=True)):
        key = object()
        first = asyncio.run(_drain(slm, keyed(key, messages=m, max_tokens=160)))[0]
        h = ex.meta["hard_steps"][0]
        cut = "".join(p + "\n\n" for p in first.split("\n\n")[:h])
        out.append(keyed(key, messages=m, prefix=cut + OFFLOAD_TOKEN + ex.meta["steps"][h] + "\n\n", max_tokens=120))
        out.append(GenRequest(messages=m, max_tokens=40 + 7 * i))
        out.append(GenRequest(messages=m, max_tokens=30, temperature=0.7, top_p=0.9, seed=i))
    return out


def _together(slm, max_batch: int | None, n: int = 6, leave: dict[int, int] | None = None) -> tuple[list, int, int]:
    """The relay-shaped requests streamed at once: (each stream's figures, batches, requests decoded)."""
    slm.prefix_cache, slm.streams.max_batch = PrefixCache(), max_batch
    reqs = _relay_shaped(slm, n)
    b0, j0 = slm.streams.batches, slm.streams.jobs

    async def go():
        return await asyncio.gather(*(_drain(slm, r, (leave or {}).get(i)) for i, r in enumerate(reqs)))

    got = asyncio.run(go())
    return got, slm.streams.batches - b0, slm.streams.jobs - j0


def test_streams_waiting_together_decode_as_one_batch_with_what_each_gets_alone():
    slm = _world_slm()
    alone, batches_alone, jobs_alone = _together(slm, max_batch=1)
    together, batches, jobs = _together(slm, max_batch=None)
    assert batches_alone == jobs_alone == len(alone)  # one by one: a batch per request
    assert batches < jobs / 2  # together: most requests shared a batch
    assert together == alone  # the same text, ids, finish, prompt tokens and prefix-cache tokens, stream by stream
    assert sum(c for *_, c in together if c) > 0  # the resumes were served from the prefix cache in the batch


def test_a_stream_that_leaves_mid_batch_stops_and_the_others_finish_as_alone():
    slm = _world_slm()
    alone, *_ = _together(slm, max_batch=1)
    leave = {1: 3, 4: 1}  # two plain requests' clients go away after 3 and 1 chunks
    together, *_ = _together(slm, max_batch=None, leave=leave)
    for i, (a, t) in enumerate(zip(alone, together, strict=True)):
        if i in leave:
            assert t[2] is None and t[1] == a[1][: len(t[1])]  # what it got before it left: a prefix of its answer
        else:
            assert t == a
