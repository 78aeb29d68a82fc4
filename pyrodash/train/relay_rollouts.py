"""Stage 3's relay rollouts (`stage3.max_llm_calls` > 1): each rollout runs the relay through the Collaborate Engine,
and its completion is what the SLM's context holds at the end (docs/relay.md): SLM tokens, `<offload>`, the LLM's step
and separator, SLM tokens, ... The LLM's tokens are in the completion as context and out of the loss (`env_mask` 0,
TRL's `rollout_func` mechanism); the reward's cost sums every LLM call (`pyrodash.train.reward.relay_cost_actual`).

    trainer = CostAwareGRPOTrainer(..., rollout_func=stage3.relay_rollouts(cfg, llm, prompts, prices, dataset))

The SLM's first segment is sampled by the decode loop of single-handoff rollouts (`decode_rollouts`, with
`ExploreBranches`); every resume after an LLM step is sampled at the same temperature and top-p by the engine's relay
(`SampledSLM`); the LLM decodes as the engine asks it (greedy), one call per step, the last call writing the rest.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import threading

import torch

from pyrodash.backends.base import GenResult
from pyrodash.engine.relay import RelayConfig


class SampledSLM:
    """The policy's backend for relay resumes: every request sampled at the rollout's temperature and top-p, its seed
    made from the rollout's own seed (`req.seed`, drawn per rollout from torch's global RNG: a seeded run repeats
    itself) and the number of resumes that rollout has had. A resume's draw depends on neither the order nor the
    timing of the requests, so the in-process backends may decode the rollouts' streams together
    (`pyrodash.backends.hf.stream_batch`): each row samples with its own seeded generator. Everything else is the
    wrapped backend's."""

    def __init__(self, inner, temperature: float, top_p: float):
        self.inner, self.temperature, self.top_p = inner, temperature, top_p
        self._resumes: dict[int, int] = {}  # rollout seed -> resumes asked so far
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def stream(self, req):
        if req.seed is None:
            raise ValueError("relay rollouts: a resume without its rollout's seed (options['seed'])")
        with self._lock:
            k = self._resumes[req.seed] = self._resumes.get(req.seed, -1) + 1
        seed = resume_seed(req.seed, k)
        return self.inner.stream(dataclasses.replace(req, temperature=self.temperature, top_p=self.top_p, seed=seed))


def resume_seed(rollout_seed: int, k: int) -> int:
    """The sampling seed of a rollout's k-th resume (k from 0): a hash of the two, below 2**62."""
    digest = hashlib.sha256(f"{rollout_seed}:{k}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 2


def relay_completion(done, first_ids: list[int], tok, offload_id: int, eos_id: int, step_sep: str, calls: int) -> dict:
    """One relay rollout as the SLM's token sequence: `ids`, `env_mask` (0 on the LLM's tokens), `t_slm` (the SLM's
    tokens, `<offload>` not counted) and `reads` (for each LLM call, the trace tokens before it: what it prefills in
    the compact cost, `<offload>` not counted). `first_ids`: the sampled first segment, its `<offload>` included;
    `calls`: the request's max_llm_calls. Later segments are the engine's text, tokenized as the engine's resume
    tokenizes it (docs/relay.md)."""

    def enc(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"] if text else []

    segs = list(done.segments)
    if segs and segs[0]["by"] == "slm" and not segs[0].get("fallback"):
        segs = segs[1:]  # the first segment is `first_ids`
    ids, mask = list(first_ids), [1] * len(first_ids)
    trace = len(ids) - (1 if ids and ids[-1] in (offload_id, eos_id) else 0)
    reads, prev = [], None
    for seg in segs:
        piece = enc(seg["text"])
        if seg["by"] == "llm":
            # an `<offload>` before every LLM call but the first (in first_ids) and a step-cap call's second half
            if prev is not None and (prev["by"] == "slm" or prev["text"].endswith(step_sep)):
                ids.append(offload_id)
                mask.append(1)
            reads.append(trace)
        mask += [int(seg["by"] == "slm")] * len(piece)
        ids += piece
        trace += len(piece)
        prev = seg
    if done.finish_reason == "stop" and prev is not None:
        if prev["by"] == "llm" and len(reads) < calls and done.relay_fallback is None:
            sep = enc(step_sep)  # the last call was a step: the SLM read it and its separator, then ended
            ids, mask = ids + sep + [eos_id], mask + [0] * len(sep) + [1]
        elif prev["by"] == "slm":
            ids, mask = ids + [eos_id], mask + [1]
    while ids.count(offload_id) < len(done.handoffs):  # the SLM handed off, and no LLM call came (the budget)
        ids, mask = ids + [offload_id], mask + [1]
    if ids.count(offload_id) != len(done.handoffs):
        raise ValueError(f"relay rollout: {ids.count(offload_id)} <offload> tokens for {len(done.handoffs)} handoffs")
    t_slm = sum(m for m, t in zip(mask, ids) if t != offload_id)
    return {"ids": ids, "env_mask": mask, "t_slm": t_slm, "reads": reads}


class RelayRollouts:
    """TRL's `rollout_func(prompts, trainer)` for relay rollouts. `queries`: each training prompt (JSON) -> what the
    engine is asked (the question, or a conversation turn's chat); `engine_factory(slm, relay)`: the engine over the
    policy's backend and the frozen LLM (`stage3.collaboration_engine`)."""

    def __init__(self, engine_factory, queries: dict[str, object], max_llm_calls: int, step_max_tokens: int):
        self.engine_factory, self.queries = engine_factory, queries
        self.relay = RelayConfig(max_llm_calls=max_llm_calls, step_max_tokens=step_max_tokens)

    def __call__(self, prompts: list, trainer) -> dict:
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        tok = trainer.processing_class
        queries = [self.queries[json.dumps(p)] for p in prompts]
        with trainer.rollout_backend() as backend:
            first = trainer.sample_first_segments(backend, prompt_ids)
            first_lps = trainer.first_segment_logprobs(backend, prompt_ids, first)  # (None: masking off)
            engine = self.engine_factory(SampledSLM(backend, trainer.temperature, trainer.top_p), self.relay)
            results = [_first_result(tok, ids, engine.offload_id) for ids in first]
            seeds = torch.randint(0, 2**62, (len(queries),)).tolist()  # each rollout's own, in rollout order
            dones = engine.batch(
                queries,
                slm_results=results,
                options=[{"max_llm_calls": self.relay.max_llm_calls, "seed": s} for s in seeds],
                batch_size=trainer.collab.batch_size,
                concurrency=trainer.collab.concurrency,
            )
        eos = tok.eos_token_id
        n, sep = self.relay.max_llm_calls, self.relay.step_sep
        rows = [relay_completion(d, f, tok, engine.offload_id, eos, sep, n) for d, f in zip(dones, first)]
        return {
            "prompt_ids": [list(p) for p in prompt_ids],
            "completion_ids": [r["ids"] for r in rows],
            # the first segments' sampling log-probabilities (biased rows), NaN after them: sampled by the policy
            "logprobs": None
            if first_lps is None
            else [lp + [math.nan] * (len(r["ids"]) - len(lp)) for lp, r in zip(first_lps, rows)],
            "env_mask": [r["env_mask"] for r in rows],
            "relay": [_relay_fields(d, r) for d, r in zip(dones, rows)],
        }


def _first_result(tok, ids: list[int], offload_id: int | None) -> GenResult:
    return GenResult(
        text=tok.decode(ids, skip_special_tokens=True),
        token_ids=list(ids),
        prompt_ids=[],
        finish_reason="stop",
        stop_token_id=ids[-1] if ids and ids[-1] == offload_id else None,
        completion_tokens=len(ids),
    )


def _relay_fields(done, row: dict) -> dict:
    """What the reward reads of a relay rollout (passed to it by TRL as the `relay` column)."""
    return {
        "output": done.output,
        "handoffs": list(done.handoffs),
        "t_slm": row["t_slm"],
        "reads": row["reads"],
        "t_llm_dec": done.usage.llm_out,
        "llm_calls": done.usage.llm_calls,
        "llm_failed": done.finish_reason == "error",
        "fallback": done.relay_fallback,
    }
