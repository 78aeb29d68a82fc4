"""Stage 3's in-process rollouts: the SLM's G completions per prompt, decoded by the same loop that serves and
evaluates it (`HFBackend.generate_ids`), not by transformers' `generate`.

Why: the loop writes its KV cache in place and drops finished rollouts from the batch, where `generate` concatenates
the whole cache every token and carries every finished rollout to the longest one's end. Measured, quick world seed 0,
λ 0.6 on 1 thread (profiled): `generate` took 26.6 of Stage 3's 49 s of training. Sampling is the same distribution
(temperature, then top-p; Gumbel-max with a generator per rollout, seeded from torch's global RNG, so a seeded run
repeats itself), not the same draws as `generate`.

`ExploreBranches` bans `<offload>` in the last `k` rollouts of every group of G (a logit bias of -inf on those rows)
and can push it (a positive bias) in the first ones. Those rows are not the policy's samples: `sampling_logprobs`
gives each of their tokens its log-probability under the distribution it was drawn from, so that TRL's off-policy
sequence masking (`off_policy_mask_threshold`, DeepSeek-V3.2) can leave out a rollout whose bias changed a choice
the policy would have made and which scored below its group (docs/training.md, "Stage 3's KL").
"""

from __future__ import annotations

import math

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


@torch.no_grad()
def sampling_logprobs(
    model, prompt_ids: list[list[int]], completions: list[list[int]], explore: ExploreBranches, temperature: float
) -> list[list[float]]:
    """Per token of each completion, its log-probability under the distribution the decode loop drew it from when
    `explore` biased its row: log_softmax((logits + the row's `<offload>` bias) / temperature), as TRL computes the
    policy's own (top-p left out, as TRL leaves it out); NaN on the rows sampled from the policy as it is (TRL reads NaN
    as "no evidence": the token counts as on-policy). `prompt_ids` and `completions` as the decode loop had them; one
    forward pass of `model` (the policy) over the biased rows, right-padded."""
    out = [[math.nan] * len(c) for c in completions]
    rows = [i for i in range(len(completions)) if explore.logit_bias(i) and completions[i]]
    if not rows:
        return out
    seqs = [list(prompt_ids[i]) + list(completions[i]) for i in rows]
    width = max(len(x) for x in seqs)
    dev = next(model.parameters()).device
    ids = torch.zeros((len(rows), width), dtype=torch.long, device=dev)
    mask = torch.zeros_like(ids)
    for j, x in enumerate(seqs):
        ids[j, : len(x)] = torch.tensor(x, device=dev)
        mask[j, : len(x)] = 1
    logits = model(input_ids=ids, attention_mask=mask).logits.float()
    for j, i in enumerate(rows):
        n_prompt, n = len(prompt_ids[i]), len(completions[i])
        z = logits[j, n_prompt - 1 : n_prompt - 1 + n].clone()  # the logits each completion token was drawn from
        for t, v in explore.logit_bias(i).items():
            z[:, t] += v
        lp = torch.log_softmax(z / temperature, -1)
        tokens = torch.tensor(completions[i], device=dev)
        out[i] = lp.gather(1, tokens[:, None])[:, 0].tolist()
    return out
