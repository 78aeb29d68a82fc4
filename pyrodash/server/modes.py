"""Who answers a server request, and what its answer cost against the LLM alone.

A request's `pyrodash.mode` picks the answerer: "collab" is the Collaborate Engine; "slm" and "llm" are one of the
engine's two models answering alone (the engine's modes of the same name, `CollaborateEngine.stream(..., mode=)`),
exactly as the `slm` / `llm` baselines of `pyrodash eval` do (the conversation as given, no system prompt added,
`<offload>` banned where the SLM has it). The playground's compare view sends the same question in all three modes.

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

import contextlib

from pyrodash.backends.base import GenRequest
from pyrodash.cost import MILLION, Prices, Usage
from pyrodash.engine import MODES  # noqa: F401 - the request modes, re-exported for the playground
from pyrodash.events import Done
from pyrodash.server.protocol import LLMOnlyEstimate

BAN = float("-inf")


def cost_by_component(usage: Usage, prices: Prices) -> dict[str, float]:
    """`usage.cost(prices)` split into its four components (cached LLM input is part of llm_in)."""
    cached = prices.llm_in if prices.llm_cached_in is None else prices.llm_cached_in
    llm_in = (usage.llm_in - usage.llm_cached_in) * prices.llm_in + usage.llm_cached_in * cached
    return {
        "slm_in": usage.slm_in * prices.slm_in / MILLION,
        "slm_out": usage.slm_out * prices.slm_out / MILLION,
        "llm_in": llm_in / MILLION,
        "llm_out": usage.llm_out * prices.llm_out / MILLION,
    }


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
    u = done.usage
    if mode == "llm":
        return LLMOnlyEstimate(
            prompt_tokens=u.llm_in,
            completion_tokens=u.llm_out,
            cost_usd=done.cost_usd,
            estimated=False,
            method="measured: the LLM answered alone",
        )
    completion = u.slm_out + u.llm_out - (done.handoff is not None)
    if prompt is not None:
        n_in, how = prompt[0], f"the LLM-only request counted with the {prompt[1].upper()}'s tokenizer"
    else:
        n_in, how = u.slm_in, "the SLM's billed input (P_s included)"
    cost = (n_in * prices.llm_in + completion * prices.llm_out) / MILLION
    method = f"estimate: prompt = {how}; completion = this answer's SLM + LLM output tokens"
    return LLMOnlyEstimate(
        prompt_tokens=n_in, completion_tokens=completion, cost_usd=cost, estimated=True, method=method
    )
