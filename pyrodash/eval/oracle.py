"""The oracle single-handoff method: hand off exactly before the first step the SLM was not taught, never otherwise.

It is the ceiling of any policy that calls the LLM at most once: a handoff earlier makes the LLM write more (it costs
more and gains nothing, the SLM does the earlier steps right), a handoff later lets the SLM write an untaught step it
gets wrong, and a problem without an untaught step needs no LLM at all. It needs to know where the untaught steps
are (`Example.meta["hard_steps"]`, step indices; the built-in world records them), so it runs on world benchmarks.

How it runs, through the engine (`CollaborateEngine.batch`), so it is requested, billed and recorded as PyroDash is:
- the base SLM answers under P_s (the engine's SLM request; `<offload>` is absent from its vocabulary, so it never
  hands off by itself);
- no untaught step: that answer is the output (SLM tokens only);
- else its answer is cut at the step boundary before the first untaught step (step separator `\\n\\n`): the SLM's
  own prefix. Greedy decoding is causal, so this is exactly the text the SLM writes before that boundary whether or
  not it would go on. The engine is handed that prefix as an SLM generation that ended in a handoff (prompt +
  prefix tokens + one `<offload>` token, as the engine bills one) and makes the handoff: the LLM's request (P_l +
  question, the packed prefix as its assistant prefix) billed as it comes back.
The SLM's own prefix, not the gold one: the oracle knows where to hand off, not what to write. (On the world the
SLM's first wrong step is the first untaught lookup in 99% of its failures, so the two rarely differ.)
"""

from __future__ import annotations

from pyrodash.backends.base import GenResult
from pyrodash.eval.methods import Env, Item, Method, record

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
            raise ValueError(
                "the oracle bills the SLM's prefix in tokens: the SLM backend needs count_tokens (use "
                "an in-process model path for models.slm)"
            )
        self.name, self.slm, self.llm, self.env = name, slm, llm, env
        self.engine = env.engine(slm, llm, require_offload=False)

    def __call__(self, items: list[Item]) -> list[dict]:
        for ex, _ in items:
            if "hard_steps" not in (ex.meta or {}):
                raise ValueError(
                    f"the oracle needs meta.hard_steps (where the SLM's untaught steps are) on every "
                    f"example; {ex.id} ({ex.benchmark}) has none: run it on world:<tier> benchmarks"
                )
        alone = self.env.run(self.engine, items)  # the SLM's own answers under P_s (it cannot hand off)
        order = [i for i, (ex, _) in enumerate(items) if ex.meta.get("hard_steps")]
        cut = {}
        for i in order:
            prefix = cut_before_step(alone[i].output, int(items[i][0].meta["hard_steps"][0]))
            n = self.slm.count_tokens(prefix) if prefix else 0
            cut[i] = GenResult(
                text=prefix,
                token_ids=[],
                prompt_ids=[],
                finish_reason="offload",
                prompt_tokens=alone[i].usage.slm_in,
                completion_tokens=n + 1,
            )
        handed = (
            dict(zip(order, self.env.run(self.engine, [items[i] for i in order], slm_results=[cut[i] for i in order])))
            if order
            else {}
        )
        return [
            record(handed.get(i, d)) | {"oracle_step": int(items[i][0].meta["hard_steps"][0]) if i in handed else None}
            for i, d in enumerate(alone)
        ]
