"""The oracle single-handoff method: hand off exactly before the first step the SLM was not taught, never otherwise.

It is the ceiling of any policy that calls the LLM at most once: a handoff earlier makes the LLM write more (it costs
more and gains nothing, the SLM does the earlier steps right), a handoff later lets the SLM write an untaught step it
gets wrong, and a problem without an untaught step needs no LLM at all. It needs to know where the untaught steps
are (`Example.meta["hard_steps"]`, step indices; the built-in world records them), so it runs on world benchmarks.

How it runs, through the same request builders and billing as PyroDash's engine:
- the base SLM answers under P_s (the engine's SLM request, `<offload>` absent from its vocabulary);
- no untaught step: that answer is the output (SLM tokens only);
- else its answer is cut at the step boundary before the first untaught step (step separator `\\n\\n`): the SLM's
  own prefix. Greedy decoding is causal, so this is exactly the text the SLM writes before that boundary whether or
  not it would go on; it is billed as the engine bills a handoff there: SLM prompt + prefix tokens + one `<offload>`
  token, then the LLM's handoff request (P_l + question, the packed prefix as its assistant prefix, `continue`
  style) billed as it comes back.
The SLM's own prefix, not the gold one: the oracle knows where to hand off, not what to write. (On the world the
SLM's first wrong step is the first untaught lookup in 99% of its failures, so the two rarely differ.)
"""

from __future__ import annotations

from pyrodash.backends.base import GenRequest
from pyrodash.cost import Usage
from pyrodash.engine import _with_system, handoff_request
from pyrodash.methods import Env, Item, Method, _ban_offload, generate
from pyrodash.prompts import pack

STEP_SEP = "\n\n"


def cut_before_step(text: str, step: int, sep: str = STEP_SEP) -> str:
    """`text` up to and including the separator after its first `step` steps (all of it when it has fewer)."""
    parts = text.split(sep)
    if step >= len(parts):
        return text
    return "".join(p + sep for p in parts[:step])


class Oracle(Method):
    """Hands off right before `meta["hard_steps"][0]` (no handoff when the list is empty)."""

    def __init__(self, name: str, slm, llm, env: Env):
        if not hasattr(slm, "count_tokens"):
            raise ValueError("the oracle bills the SLM's prefix in tokens: the SLM backend needs count_tokens (use "
                             "an in-process model path for models.slm)")
        self.name, self.slm, self.llm, self.env = name, slm, llm, env

    def __call__(self, items: list[Item]) -> list[dict]:
        env = self.env
        for ex, _ in items:
            if "hard_steps" not in (ex.meta or {}):
                raise ValueError(f"the oracle needs meta.hard_steps (where the SLM's untaught steps are) on every "
                                 f"example; {ex.id} ({ex.benchmark}) has none: run it on world:<tier> benchmarks")
        msgs = [env.chat(ex) for ex, _ in items]  # conversation turns: their earlier turns first
        ban = _ban_offload(self.slm)
        reqs = [GenRequest(messages=_with_system(env.prompts.offload_system, m), max_tokens=env.max_tokens,
                           logit_bias=dict(ban), **s) for m, (_, s) in zip(msgs, items)]
        slm = generate(self.slm, reqs, env.batch_size, env.concurrency)
        cuts: dict[int, str] = {}
        for i, ((ex, _), g) in enumerate(zip(items, slm)):
            hard = ex.meta.get("hard_steps") or []
            if hard:
                cuts[i] = cut_before_step(g.text, int(hard[0]))
        order = sorted(cuts)
        lreqs = [handoff_request(env.prompts, "continue", msgs[i], pack(cuts[i]), env.max_tokens,
                                 {"stop": [], **items[i][1]}) for i in order]
        llm = dict(zip(order, generate(self.llm, lreqs, env.batch_size, env.concurrency)))
        out = []
        for i, g in enumerate(slm):
            if i not in llm:
                u = Usage(slm_in=g.prompt_tokens, slm_out=g.completion_tokens)
                out.append({"output": g.text, "usage": u.to_dict(), "llm_calls": 0, "handoff": None,
                            "finish_reason": g.finish_reason, "segments": [{"model": "slm", "text": g.text}],
                            "oracle_step": None})
                continue
            prefix, lg = cuts[i], llm[i]
            n_prefix = self.slm.count_tokens(prefix) if prefix else 0
            u = Usage(slm_in=g.prompt_tokens, slm_out=n_prefix + 1, llm_in=lg.prompt_tokens,
                      llm_out=lg.completion_tokens, llm_cached_in=lg.cached_tokens, llm_calls=1)
            out.append({"output": prefix + lg.text, "usage": u.to_dict(), "llm_calls": 1, "handoff": n_prefix,
                        "finish_reason": lg.finish_reason,
                        "segments": [{"model": "slm", "text": prefix}, {"model": "llm", "text": lg.text}],
                        "oracle_step": int(items[i][0].meta["hard_steps"][0])})
        return out
