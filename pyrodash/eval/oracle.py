"""The oracle methods: `oracle` hands off once, exactly before the first step the SLM was not taught, never otherwise;
`relay_oracle` hands off before every untaught step, the LLM writing that one step (`RelayOracle`, docs/relay.md).

It is the ceiling of any policy that calls the LLM at most once. It needs to know where the untaught steps are
(`Example.meta["hard_steps"]`), so it runs on world benchmarks; it runs through the engine (`CollaborateEngine.batch`),
so it is requested, billed and recorded as PyroDash is. Why it is the ceiling, and how it runs step by step:
docs/internals.md.
"""

from __future__ import annotations

import dataclasses
import json

from pyrodash.backends.base import BatchesStreams, CountsText, GenChunk, GenRequest, GenResult
from pyrodash.engine.conversation import clean_history
from pyrodash.engine.relay import RelayConfig, without_offload
from pyrodash.engine.requests import slm_chat
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
        if not isinstance(slm, CountsText):
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


class GoldPlacement:
    """The relay oracle's SLM: the base SLM, stopped with a handoff (finish_reason "offload", one `<offload>` token
    billed) right before the next untaught step of the request's gold plan (`plan`: the SLM chat as JSON -> the
    untaught step indices). Greedy decoding is causal: the text before the cut is what the SLM writes anyway. The
    engine resumes it on its own context, `<offload>` tokens included; the base SLM has no trained `<offload>`, so
    it reads that context without them (the packed trace)."""

    def __init__(self, slm, plan: dict[str, list[int]], sep: str = STEP_SEP):
        self.slm, self.plan, self.sep = slm, plan, sep
        self.name = slm.name
        if isinstance(slm, BatchesStreams):  # its streams are the base SLM's: decoded together as that model's are
            self.streams = slm.streams

    def token_id(self, token: str) -> int | None:
        return None  # the base SLM has no `<offload>`: the plan hands off

    async def stream(self, req: GenRequest):
        text, fin = "", GenChunk()
        key, req = req.cache_key, dataclasses.replace(req, prefix=without_offload(req.prefix))
        req.cache_key = key  # (not a field: `replace` drops it)
        async for ch in self.slm.stream(req):
            text += ch.text
            if ch.finish_reason is not None:
                fin = ch
        done = req.prefix.count(self.sep)  # the steps written so far
        nxt = [h for h in self.plan.get(plan_key(req.messages), []) if h >= done]
        cut = cut_before_step(text, nxt[0] - done) if nxt else text
        if not nxt or (cut == text and text.count(self.sep) < nxt[0] - done):  # the answer ends first
            yield GenChunk(text=text)
            yield dataclasses.replace(fin, text="")
            return
        if cut:
            yield GenChunk(text=cut)
        n = self.slm.count_tokens(cut) if cut else 0
        yield GenChunk(
            finish_reason="offload",
            prompt_tokens=fin.prompt_tokens,
            completion_tokens=n + 1,
            cached_tokens=fin.cached_tokens,  # what the base SLM's prefix cache served
        )

    async def aclose(self) -> None:
        pass


def plan_key(messages: list[dict]) -> str:
    return json.dumps([[m.get("role"), m.get("content")] for m in messages])


class RelayOracle(Method):
    """Hands off right before every step of `meta["hard_steps"]`, the LLM writing that one step (relay, the engine's
    `max_llm_calls` above the most untaught steps of any item, so no call writes more than its step)."""

    def __init__(self, name: str, slm, llm, env: Env, step_max_tokens: int = 64):
        if not isinstance(slm, CountsText):
            raise ValueError("the relay oracle bills the SLM's prefixes in tokens: the SLM backend needs count_tokens")
        self.name, self.slm, self.llm, self.env, self.cap = name, slm, llm, env, step_max_tokens

    def __call__(self, items: list[Item]) -> list[dict]:
        for ex, _ in items:
            if "hard_steps" not in (ex.meta or {}):
                raise ValueError(f"the relay oracle needs meta.hard_steps on every example; {ex.id} has none")
        prompts = self.env.prompts
        plan = {
            plan_key(slm_chat(prompts, clean_history(self.env.chat(ex)))): sorted(int(h) for h in ex.meta["hard_steps"])
            for ex, _ in items
        }
        calls = 1 + max((len(h) for h in plan.values()), default=1)
        relay = RelayConfig(max_llm_calls=calls, step_sep=STEP_SEP, step_max_tokens=self.cap)
        engine = self.env.engine(GoldPlacement(self.slm, plan), self.llm, require_offload=False, relay=relay)
        return [
            record(d) | {"oracle_steps": sorted(int(h) for h in ex.meta["hard_steps"])}
            for d, (ex, _) in zip(self.env.run(engine, items), items, strict=True)
        ]
