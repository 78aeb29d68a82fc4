"""The Stage 3 reward: complete collaborative rollouts with the frozen LLM in the loop.

The G completions of each prompt (cut at `<offload>`) go to the Collaborate Engine, which hands each one that ended in
`<offload>` to the LLM (all handoffs of a batch together); the LLM tokens never enter the loss. The reward is
R_total = R_acc - λ R_eff (`eq:grpo-total`), with R_eff = Cost_act / Cost_base; it also accumulates per-step
statistics for the Stage 3 trainer's logs. Each term and statistic: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from pyrodash.backends.base import GenRequest, GenResult
from pyrodash.cost import MILLION, Prices, grpo_cost_actual, grpo_cost_base, grpo_efficiency, grpo_total_reward
from pyrodash.engine import CollaborateEngine
from pyrodash.grading import grade_batch
from pyrodash.prompts import Prompts


class BaselineCache:
    """Cost_base per training prompt (`eq:grpo-baseline`): the LLM alone on the plain question, cached in a JSON file
    keyed by (LLM, prompt set, max tokens, question) so sweeps and resumed runs never recompute it."""

    def __init__(self, path: str | Path, llm_key: str, prompts: Prompts, prices: Prices, max_tokens: int):
        self.path = Path(path)
        self.llm_key, self.prompts, self.prices, self.max_tokens = llm_key, prompts, prices, max_tokens
        self.entries: dict[str, dict] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def key(self, question: str | list[dict]) -> str:
        blob = json.dumps([self.llm_key, self.prompts.name, self.max_tokens, question])
        return hashlib.sha256(blob.encode()).hexdigest()[:20]

    def messages(self, question: str | list[dict]) -> list[dict]:
        """The LLM-alone request's chat: a question under the template, or a conversation turn as given."""
        return self.prompts.plain_messages(question) if isinstance(question, str) else list(question)

    def fill(self, llm, questions: list[str | list[dict]], golds: list[str]) -> int:
        """Run the LLM alone on every question (a string, or a conversation turn's chat: Cost_base per turn, the LLM
        answering that turn after the same history) not cached yet (all at once); return how many were computed."""
        todo = {}
        for q, g in zip(questions, golds, strict=True):
            if self.key(q) not in self.entries:
                todo[self.key(q)] = (q, g)
        if not todo:
            return 0
        items = list(todo.values())
        reqs = [GenRequest(messages=self.messages(q), max_tokens=self.max_tokens) for q, _ in items]
        # journaled as the calls return: a killed run resumes without paying for them again
        gens = llm.generate(reqs, desc="LLM-only baseline (Cost_base)", cache=self.path.with_suffix(".calls.jsonl"))
        failed = [g.error for g in gens if g.finish_reason == "error"]
        if failed:
            raise ValueError(
                f"{len(failed)} of {len(gens)} LLM-only baseline calls (Cost_base) failed after retries "
                f"(first: {failed[0]}); the {len(gens) - len(failed)} that succeeded are saved: fix the "
                "LLM endpoint and run the same command again to resume"
            )
        ok = grade_batch([g.text for g in gens], [g for _, g in items])
        for (q, _), gen, c in zip(items, gens, ok, strict=True):
            self.entries[self.key(q)] = {
                "t_in": gen.prompt_tokens,
                "t_llm_dec": gen.completion_tokens,
                "cost_base": grpo_cost_base(gen.prompt_tokens, gen.completion_tokens, self.prices),
                "llm_correct": bool(c),
            }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries))
        tmp.replace(self.path)
        return len(items)

    def cost_base(self, question: str | list[dict]) -> float:
        entry = self.entries.get(self.key(question))
        if entry is None:
            raise ValueError("no Cost_base for a training prompt: call BaselineCache.fill() on the training set first")
        return float(entry["cost_base"])


class CollaborativeReward:
    """TRL reward function (`reward_funcs=[CollaborativeReward(...)]`); needs dataset columns `question`, `gold`
    (and `chat` for conversation turns). `lam` is a Stage 3 config's (`Stage3Config.validate` checks it)."""

    __name__ = "collab"  # TRL names the reward's metrics after this

    def __init__(
        self,
        engine: CollaborateEngine,
        baselines: BaselineCache,
        lam: float,
        cost_penalty: str = "normalized",
        slm_price: float | None = None,
        batch_size: int = 64,
        concurrency: int = 16,
    ):
        if cost_penalty not in ("normalized", "direct"):
            raise ValueError(f"cost_penalty={cost_penalty!r}: choose 'normalized' or 'direct'")
        self.engine, self.prices, self.baselines = engine, engine.prices, baselines
        self.offload_id, self.lam, self.cost_penalty = engine.offload_id, lam, cost_penalty
        self.slm_price, self.batch_size, self.concurrency = slm_price, batch_size, concurrency
        self.totals = {"llm_calls": 0, "rollouts": 0, "llm_failures": 0}
        self._acc: dict[str, list[float]] = {}
        self.last: list[dict] = []  # per-rollout details of the last call (for tests and case studies)

    def __call__(
        self, prompts, completions, completion_ids, question, gold, chat=None, relay=None, **kwargs
    ) -> list[float]:
        # a conversation turn's chat (history + question, JSON in the `chat` column; "" for a single question) is
        # what the engine is asked, as `pyrodash serve` is asked it: its handoff carries the same history
        queries = [json.loads(c) if c else q for q, c in zip(question, chat or [""] * len(question), strict=True)]
        if relay is not None:  # relay rollouts (pyrodash.train.relay_rollouts): the engine already ran them
            return self._score(queries, gold, [_relay_outcome(r, self.prices, self.slm_price) for r in relay])
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        rollouts = [
            GenResult(
                text=t,
                token_ids=list(ids),
                prompt_ids=[],
                finish_reason="stop",
                stop_token_id=ids[-1] if ids and ids[-1] == self.offload_id else None,
                completion_tokens=len(ids),
            )
            for t, ids in zip(texts, completion_ids, strict=True)
        ]
        dones = self.engine.batch(
            queries, slm_results=rollouts, batch_size=self.batch_size, concurrency=self.concurrency
        )
        outcomes = []
        for d in dones:
            off = d.handoff is not None
            t_slm = d.handoff if off else d.usage.slm_out  # the <offload> token itself is not handed over
            cost_act = grpo_cost_actual(t_slm, d.usage.llm_out, self.prices, handoff=off, slm_price=self.slm_price)
            outcomes.append(_outcome(d.output, off, t_slm, d.usage.llm_out, cost_act, d.finish_reason == "error"))
            outcomes[-1]["llm_calls"] = d.usage.llm_calls
        return self._score(queries, gold, outcomes)

    def _score(self, queries: list, gold, outcomes: list[dict]) -> list[float]:
        """R_total of each rollout from its outcome (`_outcome`), failed LLM calls skipped, statistics recorded."""
        acc = grade_batch([o["joint"] for o in outcomes], list(gold))
        rewards, self.last = [], []
        for i, o in enumerate(outcomes):
            if self.cost_penalty == "normalized":
                r_eff = grpo_efficiency(o["cost_act"], self.baselines.cost_base(queries[i]))
            else:
                r_eff = o["cost_act"]
            r_acc = 1.0 if acc[i] else 0.0
            rewards.append(grpo_total_reward(r_acc, r_eff, self.lam))
            self.last.append({**o, "r_acc": r_acc, "r_eff": r_eff, "reward": rewards[-1]})
        self._skip_failed(rewards, [json.dumps(q) for q in queries])
        self._record(
            [d["offload"] for d in self.last],
            acc,
            [d["r_eff"] for d in self.last],
            [d.get("handoff_pos", d["t_slm"]) for d in self.last if d["offload"]],
            sum(o.pop("llm_calls") for o in self.last),
        )
        return rewards

    def _skip_failed(self, rewards: list[float], questions: list[str]) -> None:
        """A rollout whose LLM call failed (after retries) is skipped, not fatal: it gets the mean reward of the
        other rollouts of its prompt (zero advantage in GRPO's group normalisation, so it teaches nothing), or 0
        when none succeeded; it is counted in `totals["llm_failures"]` and the step's stats."""
        failed = [i for i, d in enumerate(self.last) if d["llm_failed"]]
        for i in failed:
            peers = [
                rewards[j] for j, q in enumerate(questions) if q == questions[i] and not self.last[j]["llm_failed"]
            ]
            rewards[i] = sum(peers) / len(peers) if peers else 0.0
            self.last[i]["reward"] = rewards[i]
        self.totals["llm_failures"] += len(failed)
        self._acc.setdefault("llm_failures", []).append(float(len(failed)))

    def _record(self, off, acc, r_eff, positions, calls) -> None:
        a = self._acc
        a.setdefault("offload", []).extend(float(o) for o in off)
        a.setdefault("acc", []).extend(float(x) for x in acc)
        a.setdefault("r_eff", []).extend(r_eff)
        a.setdefault("handoff_pos", []).extend(float(p) for p in positions)
        a.setdefault("llm_calls", []).append(float(calls))
        self.totals["llm_calls"] += calls
        self.totals["rollouts"] += len(off)

    def pop_stats(self) -> dict[str, float]:
        """Since the last pop: mean accuracy, offload rate, R_eff, handoff position; LLM calls (sum, per rollout)."""
        a, self._acc = self._acc, {}
        if not a:
            return {}

        def mean(xs):
            return sum(xs) / len(xs) if xs else 0.0

        n = len(a.get("offload", []))
        out = {
            "pyrodash/accuracy": mean(a.get("acc", [])),
            "pyrodash/offload_rate": mean(a.get("offload", [])),
            "pyrodash/r_eff": mean(a.get("r_eff", [])),
            "pyrodash/handoff_position": mean(a.get("handoff_pos", [])),
            "pyrodash/llm_calls": sum(a.get("llm_calls", [])),
            "pyrodash/llm_calls_per_rollout": sum(a.get("llm_calls", [])) / n if n else 0.0,
            "pyrodash/llm_calls_total": float(self.totals["llm_calls"]),
            "pyrodash/llm_failures": sum(a.get("llm_failures", [])),
            "pyrodash/llm_failures_total": float(self.totals["llm_failures"]),
        }
        if not a.get("handoff_pos"):
            del out["pyrodash/handoff_position"]  # no handoff since the last log: no position to average
        return out


def _outcome(joint: str, off: bool, t_slm: int, t_llm_dec: int, cost_act: float, failed: bool) -> dict:
    return {
        "offload": off,
        "t_slm": t_slm,
        "t_llm_dec": t_llm_dec,
        "cost_act": cost_act,
        "joint": joint,
        "llm_failed": failed,
    }


def relay_cost_actual(
    t_slm: int, reads: list[int], t_llm_dec: int, prices: Prices, slm_price: float | None = None
) -> float:
    """The compact collaborative cost of a relay rollout, summed over its LLM calls: C_s * T_s + sum over calls of
    C_pre * (the trace tokens that call reads) + C_dec * T_l,dec (all calls' output). T_s: every SLM token of the
    answer (`<offload>` not counted). With one call (reads == [T_s]) it is `grpo_cost_actual` with a handoff; with
    none, without one."""
    c_s = prices.slm_out if slm_price is None else slm_price
    if not reads and t_llm_dec:
        raise ValueError("a rollout without an LLM call cannot have LLM decode tokens")
    return (c_s * t_slm + prices.llm_in * sum(reads) + prices.llm_out * t_llm_dec) / MILLION


def _relay_outcome(r: dict, prices: Prices, slm_price: float | None) -> dict:
    """A relay rollout's outcome, from `RelayRollouts`' `relay` column (the engine's record and token counts)."""
    cost = relay_cost_actual(r["t_slm"], r["reads"], r["t_llm_dec"], prices, slm_price)
    out = _outcome(r["output"], bool(r["handoffs"]), r["t_slm"], r["t_llm_dec"], cost, r["llm_failed"])
    # the stats' handoff position: the first handoff (a single-handoff rollout's is its t_slm)
    pos = r["handoffs"][0] if r["handoffs"] else None
    return {**out, "handoff_pos": pos, "handoffs": len(r["handoffs"]), "llm_calls": r["llm_calls"]}
