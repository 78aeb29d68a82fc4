"""The evaluated methods. Each is a callable over a batch of (Example, sampling) items that returns one record per item
(`pyrodash.record`: the engine's `Done` as a JSON object, plus method extras); `pyrodash.eval.harness` grades and stores
them. `pyrodash.eval.build.build_methods` makes the methods of an eval config.

Methods: `slm`, `slm+sft`, `llm` (one model alone), `pyrodash@<λ>` (with `+bias<b>` or `+relay<n>`), `oracle`,
`routellm@<α>`, `glimprouter@<τ>`. Every one but GlimpRouter runs on the engine's batch driver
(`CollaborateEngine.batch`), so a record is what `pyrodash serve` answers for the same question. Each method, and how
they are driven: docs/internals.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from pyrodash.backends.base import GenRequest, GenResult
from pyrodash.backends.retry import run_requests
from pyrodash.cost import Prices
from pyrodash.data.example import Example
from pyrodash.engine import CollaborateEngine
from pyrodash.engine.conversation import example_messages
from pyrodash.engine.range_rule import RangeRule
from pyrodash.engine.relay import RelayConfig
from pyrodash.eval.routing.glimprouter import run_glimprouter
from pyrodash.events import Done
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts
from pyrodash.record import Record, read_record

Item = tuple[Example, dict]  # (example, sampling: temperature / top_p / seed)


def _ban_offload(backend) -> dict[int, float]:
    tid = backend.token_id(OFFLOAD_TOKEN)
    return {} if tid is None else {tid: float("-inf")}


class Method:
    name: str

    def __call__(self, items: list[Item]) -> list[dict]:
        raise NotImplementedError


@dataclass
class Env:
    """What every method shares: prompts, prices, the answer budget and the batching knobs."""

    prompts: Prompts
    prices: Prices
    max_tokens: int = 256
    batch_size: int = 16
    concurrency: int = 8
    # Solo answers by backend and request, shared by every method that needs the same one: RouteLLM's chosen model
    # answers exactly as `slm`/`llm` do (same model, same prompt, same decoding), as RouteLLM's own evaluation reuses
    # stored model answers. Each entry keeps the per-item latency of the batch that produced it.
    solo_memo: dict = field(default_factory=dict)

    def chat(self, ex: Example) -> list[dict]:
        """The messages every method puts to a model for `ex` (earlier turns of a conversation first)."""
        return example_messages(self.prompts, ex.question, ex.meta.get("history"))

    def engine(self, slm, llm, **kw) -> CollaborateEngine:
        """The Collaborate Engine every method runs on (the eval's prompts, prices and budget)."""
        return CollaborateEngine(slm, llm, self.prompts, self.prices, max_tokens=self.max_tokens, **kw)

    def run(self, engine: CollaborateEngine, items: list[Item], mode: str = "collab", **kw) -> list[Done]:
        """`engine.batch` over the items' questions with their sampling."""
        return engine.batch(
            [self.chat(ex) for ex, _ in items],
            mode=mode,
            options=[dict(s) for _, s in items],
            batch_size=self.batch_size,
            concurrency=self.concurrency,
            **kw,
        )


def record(done: Done) -> dict:
    """The eval record of one answer (`pyrodash.record`), without the engine's latency: a batch's wall time per
    item is stamped by `timed`."""
    rec = Record.from_done(done).to_json()
    del rec["latency_s"]
    return rec


class Solo(Method):
    """One model answers the whole query alone: the engine in mode "slm" or "llm"."""

    def __init__(self, name: str, backend, role: str, env: Env):
        if role not in ("slm", "llm"):
            raise ValueError(f"role={role!r}: use 'slm' or 'llm'")
        self.name, self.backend, self.role, self.env = name, backend, role, env
        self.engine = env.engine(backend, backend, require_offload=False)

    def __call__(self, items: list[Item]) -> list[dict]:
        keys = [(id(self.backend), self.role, repr(self.env.chat(ex)), repr(sorted(s.items()))) for ex, s in items]
        memo = self.env.solo_memo
        todo = [i for i, k in enumerate(keys) if k not in memo]
        if todo:
            t0 = time.perf_counter()
            dones = self.env.run(self.engine, [items[i] for i in todo], mode=self.role)
            dt = (time.perf_counter() - t0) / len(todo)
            for i, d in zip(todo, dones, strict=True):
                memo[keys[i]] = (d, dt)
        fresh, out = set(todo), []
        for i, k in enumerate(keys):
            rec = record(memo[k][0])
            if i not in fresh:  # an answer generated earlier for another method
                rec.update(latency_s=memo[k][1], reused_answer=True)
            out.append(rec)
        return out


class PyroDash(Method):
    """The Collaborate Engine with a trained SLM at a fixed offload_bias and handoff_share."""

    def __init__(
        self,
        name: str,
        slm,
        llm,
        env: Env,
        offload_bias: float = 0.0,
        handoff_share: float = 1.0,
        rule: RangeRule | None = None,
        max_llm_calls: float = 1,
    ):
        self.name, self.env, self.bias, self.share = name, env, float(offload_bias), float(handoff_share)
        relay = RelayConfig(max_llm_calls=int(max_llm_calls))  # above 1: relay (a `pyrodash_relay` sweep point)
        self.engine = env.engine(
            slm, llm, offload_bias=self.bias, handoff_share=self.share, range_rule=rule, relay=relay
        )

    def __call__(self, items: list[Item]) -> list[dict]:
        return [record(d) for d in self.env.run(self.engine, items)]


class RouteLLM(Method):
    """RouteLLM-MF at threshold α: the query goes to the LLM when P(LLM wins) >= α; that model answers it all."""

    def __init__(self, name: str, router, alpha: float, embed, slm: Solo, llm: Solo):
        self.name, self.router, self.alpha, self.embed, self.slm, self.llm = name, router, alpha, embed, slm, llm

    def __call__(self, items: list[Item]) -> list[dict]:
        wins = self.router.win_rate(self.embed([ex.question for ex, _ in items]))
        to_llm = [w >= self.alpha for w in wins]
        parts = {True: [it for it, b in zip(items, to_llm) if b], False: [it for it, b in zip(items, to_llm) if not b]}
        res = {
            True: iter(self.llm(parts[True]) if parts[True] else []),
            False: iter(self.slm(parts[False]) if parts[False] else []),
        }
        out = []
        for b, w in zip(to_llm, wins):
            r = next(res[b])
            r.update(route="llm" if b else "slm", win_rate=round(w, 6), alpha=self.alpha)
            out.append(r)
        return out


class GlimpRouter(Method):
    def __init__(self, name: str, slm, llm, env: Env, tau: float, top_k: int = 20):
        self.name, self.slm, self.llm, self.env, self.tau, self.top_k = name, slm, llm, env, tau, top_k

    def __call__(self, items: list[Item]) -> list[dict]:
        def gen(role: str, reqs: list[GenRequest]) -> list[GenResult]:
            backend = self.slm if role == "slm" else self.llm
            return run_requests(backend, reqs, self.env.batch_size, self.env.concurrency)

        its = [(self.env.chat(ex), s) for ex, s in items]
        out = run_glimprouter(
            its, self.tau, gen, self.env.max_tokens, top_k=self.top_k, slm_logit_bias=_ban_offload(self.slm)
        )
        return [read_record(r) | {"tau": self.tau, "mode": "router"} for r in out]


def timed(method: Method, items: list[Item]) -> list[dict]:
    """Run a batch and stamp each record with its share of the batch's wall time."""
    t0 = time.perf_counter()
    out = method(items)
    if len(out) != len(items):
        raise RuntimeError(f"method {method.name} returned {len(out)} records for {len(items)} items")
    dt = (time.perf_counter() - t0) / max(len(items), 1)
    for r in out:
        r.setdefault("latency_s", dt)
        r["batch"] = len(items)
    return out
