"""What a server answer would have cost the LLM alone (the `pyrodash` object's `llm_only_cost_usd`; its cost split by
component is the record's own, `Done.cost_usd_by_component`).

A request's `pyrodash.mode` picks the answerer: "collab" is the Collaborate Engine; "slm" and "llm" are one of the
engine's two models answering alone (`EngineRequest.mode`), as the `slm` / `llm` baselines of `pyrodash eval` do.
`llm_only_estimate` is what the LLM alone would have billed, at the LLM's prices from the server's price sheet:
- prompt tokens: the LLM-only request (the conversation without P_s) as the engine counted it
  (`CollaborateEngine.llm_only_prompt`: the LLM's tokenizer in process, else the SLM's), else the SLM's billed
  input (which includes P_s: an over-estimate);
- completion tokens: the answer's own length, SLM + LLM output tokens without the `<offload>` stop token.
In mode "llm" it is not an estimate: the LLM did answer alone and `llm_only_cost_usd == cost_usd`.
"""

from __future__ import annotations

from pyrodash.cost import MILLION, Prices
from pyrodash.events import Done
from pyrodash.server.protocol import LLMOnlyEstimate


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
