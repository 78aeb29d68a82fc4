"""Stage 3's in-process rollouts: the SLM's G completions per prompt, decoded by the same loop that serves and
evaluates it (`HFBackend.generate_ids`), not by transformers' `generate`.

Why: the loop writes its KV cache in place and drops finished rollouts from the batch, where `generate` concatenates
the whole cache every token and carries every finished rollout to the longest one's end. Measured, quick world seed 0,
λ 0.6 on 1 thread (profiled): `generate` took 26.6 of Stage 3's 49 s of training. Sampling is the same distribution
(temperature, then top-p; Gumbel-max with a generator per rollout, seeded from torch's global RNG, so a seeded run
repeats itself), not the same draws as `generate`.

`ExploreBranches` bans `<offload>` in the last `k` rollouts of every group of G (a logit bias of -inf on those rows)
and can push it (a positive bias) in the first ones.
"""

from __future__ import annotations

import torch

from pyrodash.backends.base import GenRequest


class ExploreBranches:
    """Bans `<offload>` in the last `k` rollouts of every group of `group` consecutive rows (TRL's RepeatSampler puts
    a prompt's G rollouts side by side), and adds `push_bias` to its logit in the first `push`. The banned rollouts
    answer alone, so every group holds both branches of the handoff decision, whatever the policy's confidence; their
    tokens still enter the loss with their group advantage (at a large λ the SLM-alone branch wins and its tokens are
    pushed up). The pushed ones hand off where the policy would not: on a problem the SLM gets right alone, their
    handoff scores below the group and its `<offload>` is pushed down, the signal banned rollouts cannot give.
    Also a transformers logits processor."""

    def __init__(self, token_id: int, group: int, k: int, push: int = 0, push_bias: float = 0.0):
        self.token_id, self.group, self.k = token_id, group, k
        self.push, self.push_bias = push, push_bias

    def _banned(self, i: int) -> bool:
        return i % self.group >= self.group - self.k

    def _pushed(self, i: int) -> bool:
        return i % self.group < self.push

    def banned_rows(self, n: int) -> list[int]:
        return [i for i in range(n) if self._banned(i)]

    def pushed_rows(self, n: int) -> list[int]:
        return [i for i in range(n) if self._pushed(i)]

    def logit_bias(self, i: int) -> dict[int, float]:
        """Row `i`'s logit bias on `<offload>` (none for a row the policy samples as it is)."""
        if self._banned(i):
            return {self.token_id: float("-inf")}
        return {self.token_id: self.push_bias} if self._pushed(i) else {}

    def __call__(self, input_ids, scores):
        rows = self.banned_rows(scores.shape[0])
        if rows:
            scores[rows, self.token_id] = float("-inf")
        pushed = self.pushed_rows(scores.shape[0])
        if pushed:
            scores[pushed, self.token_id] += self.push_bias
        return scores


def unsupported_sampling(cfg) -> list[str]:
    """The GRPO sampling settings the decode loop does not implement (it samples with temperature and top-p)."""
    bad = []
    if cfg.top_k not in (None, 0):
        bad.append(f"top_k={cfg.top_k}")
    if cfg.min_p is not None:
        bad.append(f"min_p={cfg.min_p}")
    if cfg.repetition_penalty not in (None, 1.0):
        bad.append(f"repetition_penalty={cfg.repetition_penalty}")
    if cfg.generation_kwargs:
        bad.append(f"generation_kwargs={cfg.generation_kwargs}")
    return bad


def decode_rollouts(
    backend,
    prompt_ids: list[list[int]],
    temperature: float,
    top_p: float,
    max_tokens: int,
    stop_ids: list[int],
    explore: ExploreBranches | None = None,
) -> list[list[int]]:
    """The completion ids of every prompt (sampled; each ends at its first stop id, included, or at `max_tokens`),
    one batch through `backend.generate_ids`. Rows `explore` bans get `<offload>` at -inf, rows it pushes its bias."""
    reqs = [
        GenRequest(
            messages=[],
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=int(torch.randint(0, 2**62, (1,))),
            stop_token_ids=list(stop_ids),
            logit_bias=explore.logit_bias(i) if explore is not None else {},
        )
        for i in range(len(prompt_ids))
    ]
    return [r.token_ids for r in backend.generate_ids([list(p) for p in prompt_ids], reqs)]
