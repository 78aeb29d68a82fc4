"""Who answers a server request, and what its answer cost against the LLM alone.

A request's `pyrodash.mode` picks the answerer: "collab" is the Collaborate Engine; "slm" and "llm" are one of the
engine's two models answering alone (`SoloEngine`), exactly as the `slm` / `llm` baselines of `pyrodash eval` do
(the conversation as given, no system prompt added, `<offload>` banned where the vocabulary has it, one call, no
retries). The playground's compare view sends the same question in all three modes.

`llm_only_estimate` is the server's estimate of what the LLM alone would have billed for an answer (the `pyrodash`
object's `llm_only_cost_usd`), at the LLM's prices from the server's price sheet:

- prompt tokens: the LLM-only request (the conversation without P_s) counted with the LLM backend's tokenizer when
  it runs in process, else with the SLM's (same conversation, the SLM's chat template), else the SLM's billed input
  (which includes P_s: an over-estimate);
- completion tokens: the answer's own length, SLM + LLM output tokens without the `<offload>` stop token, i.e. the
  LLM is assumed to write an answer as long as the joint one.

In mode "llm" it is not an estimate: the LLM did answer alone and `llm_only_cost_usd == cost_usd`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.conversation import turn_number
from pyrodash.cost import MILLION, Prices, Usage
from pyrodash.engine import sampling_fields
from pyrodash.events import Done, Event, LLMDelta, SLMDelta
from pyrodash.prompts import OFFLOAD_TOKEN

MODES = ("collab", "slm", "llm")
BAN = float("-inf")


class SoloEngine:
    """One of `engine`'s models answering alone, with the engine's `stream(...)` signature and event types."""

    def __init__(self, engine, role: str):
        if role not in ("slm", "llm"):
            raise ValueError(f"role={role!r}: use 'slm' or 'llm'")
        self.engine, self.role = engine, role
        self.backend = engine.slm if role == "slm" else engine.llm
        self._ban: dict[int, float] | None = None

    async def ban(self) -> dict[int, float]:
        """`{<offload> id: -inf}` when this model's vocabulary has the token (an HTTP backend may ask its server)."""
        if self._ban is None:
            if self.role == "slm":
                tid = self.engine.offload_id
            else:
                try:
                    tid = await asyncio.to_thread(self.backend.token_id, OFFLOAD_TOKEN)
                except ValueError:  # the server cannot tokenize: an LLM has no <offload> of its own anyway
                    tid = None
            self._ban = {} if tid is None else {tid: BAN}
        return self._ban

    async def stream(
        self,
        question: str | list[dict],
        offload_bias: float | None = None,
        max_tokens: int | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        stop: list[str] | None = None,
        max_total_tokens: int | None = None,
        handoff_share: float | None = None,  # a model answering alone never hands off: nothing to admit
    ) -> AsyncIterator[Event]:
        t0 = time.perf_counter()
        eng = self.engine
        sampling = sampling_fields(temperature, top_p, seed, stop)
        budget = eng.max_tokens if max_tokens is None else int(max_tokens)
        if max_total_tokens is not None:  # one model answers: the joint budget is its budget
            budget = min(budget, int(max_total_tokens))
        req = GenRequest(messages=eng.messages(question), max_tokens=budget, logit_bias=dict(await self.ban()),
                         **sampling)  # fmt: skip
        delta = SLMDelta if self.role == "slm" else LLMDelta
        text, final = "", GenChunk()
        async with contextlib.aclosing(self.backend.stream(req)) as it:
            async for ch in it:
                if ch.text:
                    text += ch.text
                    yield delta(ch.text)
                if ch.finish_reason is not None:
                    final = ch
        n_in, n_out = final.prompt_tokens or 0, final.completion_tokens or 0
        bias = eng.offload_bias if offload_bias is None else float(offload_bias)
        turn = {"turn": turn_number(req.messages), "trimmed": {"slm": 0, "llm": 0}}
        if self.role == "slm":
            usage = Usage(slm_in=n_in, slm_out=n_out)
            yield eng._done(text, "", usage, final.finish_reason or "length", None, bias, t0, turn, [])
            return
        calls = eng._calls(final, text, 1, None)  # one entry per endpoint an LLM mesh called, each at its price
        usage = Usage(llm_in=n_in, llm_out=n_out, llm_cached_in=final.cached_tokens or 0,
                      llm_calls=sum(c["calls"] for c in calls))
        yield eng._done("", text, usage, final.finish_reason or "length", None, bias, t0, turn, calls)


def answerer(engine, mode: str, cache: dict):
    """The engine for a request's mode: the Collaborate Engine itself, or its SLM / LLM alone (kept in `cache`)."""
    if mode == "collab":
        return engine
    if mode not in cache:
        cache[mode] = SoloEngine(engine, mode)
    return cache[mode]


def cost_by_component(usage: Usage, prices: Prices) -> dict[str, float]:
    """`usage.cost(prices)` split into its four components (cached LLM input is part of llm_in)."""
    cached = prices.llm_in if prices.llm_cached_in is None else prices.llm_cached_in
    llm_in = (usage.llm_in - usage.llm_cached_in) * prices.llm_in + usage.llm_cached_in * cached
    return {
        "slm_in": usage.slm_in * prices.slm_in / MILLION, "slm_out": usage.slm_out * prices.slm_out / MILLION,
        "llm_in": llm_in / MILLION, "llm_out": usage.llm_out * prices.llm_out / MILLION,
    }  # fmt: skip


def llm_only_prompt(engine, question: str | list[dict]) -> tuple[int, str] | None:
    """(input tokens of the LLM-only request, whose tokenizer counted them), or None when no backend can count."""
    messages = engine.messages(question)
    for side in ("llm", "slm"):
        count = getattr(getattr(engine, side, None), "prompt_ids", None)
        if callable(count):
            with contextlib.suppress(Exception):  # a tokenizer that cannot render this conversation
                return len(count(GenRequest(messages=messages))), side
    return None


def llm_only_estimate(done: Done, prices: Prices, prompt: tuple[int, str] | None, mode: str = "collab"):
    """What the LLM alone would have billed for `done`'s answer (see the module docstring)."""
    from pyrodash.server.protocol import LLMOnlyEstimate

    u = done.usage
    if mode == "llm":
        return LLMOnlyEstimate(prompt_tokens=u.llm_in, completion_tokens=u.llm_out, cost_usd=done.cost_usd,
                               estimated=False, method="measured: the LLM answered alone")  # fmt: skip
    completion = u.slm_out + u.llm_out - (done.handoff is not None)
    if prompt is not None:
        n_in, how = prompt[0], f"the LLM-only request counted with the {prompt[1].upper()}'s tokenizer"
    else:
        n_in, how = u.slm_in, "the SLM's billed input (P_s included)"
    cost = (n_in * prices.llm_in + completion * prices.llm_out) / MILLION
    method = f"estimate: prompt = {how}; completion = this answer's SLM + LLM output tokens"
    return LLMOnlyEstimate(prompt_tokens=n_in, completion_tokens=completion, cost_usd=cost, estimated=True,
                           method=method)  # fmt: skip
