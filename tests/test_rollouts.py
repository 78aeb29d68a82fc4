"""Stage 3's in-process rollouts decode with PyroDash's own loop (`pyrodash.train.rollouts`): completions end at their
first stop id, explored rows never hand off, a seeded run repeats itself, sampling knobs the loop lacks are refused."""

from __future__ import annotations

import math

import pytest
import torch
from tiny_models import tiny_model

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.prompts import OFFLOAD_TOKEN
from pyrodash.train.rollouts import ExploreBranches, decode_rollouts, sampling_logprobs, unsupported_sampling


def _slm_leaning_to_offload():
    model, tok = tiny_model(seed=3)
    tid = tok.convert_tokens_to_ids(OFFLOAD_TOKEN)
    with torch.no_grad():  # <offload> a likely pick at temperature 1 from any position
        model.lm_head.weight[tid] = model.lm_head.weight.mean(0) + 0.5 * model.model.norm.weight.sign()
    return model, tok, tid


def _prompts(tok, n):
    return [tok.encode(f"Q{i}: 12+{i}=", add_special_tokens=False) for i in range(n)]


def test_rollouts_stop_at_offload_and_explored_rows_never_hand_off():
    model, tok, tid = _slm_leaning_to_offload()
    backend = HFBackend(model, tok)
    explore = ExploreBranches(tid, group=4, k=2)
    stops = [tok.eos_token_id, tid]
    torch.manual_seed(0)
    outs = decode_rollouts(
        backend, _prompts(tok, 16), temperature=1.0, top_p=1.0, max_tokens=40, stop_ids=stops, explore=explore
    )
    assert len(outs) == 16
    for i, ids in enumerate(outs):
        assert 1 <= len(ids) <= 40
        assert not any(t in stops for t in ids[:-1])  # nothing after the first stop id
        if i in explore.banned_rows(16):
            assert tid not in ids
    handed_off = [i for i, ids in enumerate(outs) if ids[-1] == tid]
    assert handed_off and set(handed_off).isdisjoint(explore.banned_rows(16))


def test_rollouts_repeat_under_the_same_torch_seed_and_differ_under_another():
    model, tok, tid = _slm_leaning_to_offload()
    backend = HFBackend(model, tok)

    def run(seed):
        torch.manual_seed(seed)
        return decode_rollouts(backend, _prompts(tok, 8), 1.0, 1.0, 30, [tok.eos_token_id, tid])

    assert run(0) == run(0)
    assert run(0) != run(1)


def test_sampling_settings_the_loop_lacks_are_named():
    class Cfg:
        top_k, min_p, repetition_penalty, generation_kwargs = 0, None, 1.0, None

    assert unsupported_sampling(Cfg()) == []
    Cfg.top_k, Cfg.repetition_penalty = 50, 1.1
    assert unsupported_sampling(Cfg()) == ["top_k=50", "repetition_penalty=1.1"]


@pytest.mark.parametrize("n", [0])
def test_no_prompts_no_rollouts(n):
    model, tok = tiny_model(seed=0)
    assert decode_rollouts(HFBackend(model, tok), [], 1.0, 1.0, 10, [tok.eos_token_id]) == []


def _policy_logits(model, prompt, ids):
    """The policy's logits each of `ids` was drawn from (one row, no padding: the reference computation)."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : len(prompt) - 1 + len(ids)]


def test_sampling_logprobs_are_of_the_biased_distribution_on_explored_rows_only():
    """A banned row's tokens were drawn with `<offload>` at -inf: each one's sampling log-probability is the policy's
    plus -log(1 - p(<offload>)) at that position; a pushed row's has the bias in the softmax; a row sampled as it is
    gets NaN (for TRL: no evidence, the policy's own sample)."""
    model, tok, tid = _slm_leaning_to_offload()
    explore = ExploreBranches(tid, group=4, k=1, push=1, push_bias=2.0)
    prompts, temp = _prompts(tok, 8), 0.7
    torch.manual_seed(0)
    outs = decode_rollouts(HFBackend(model, tok), prompts, temp, 1.0, 20, [tok.eos_token_id, tid], explore=explore)
    got = sampling_logprobs(model, prompts, outs, explore, temp)
    assert [len(g) for g in got] == [len(o) for o in outs]
    gaps = []
    for i, (prompt, ids, lps) in enumerate(zip(prompts, outs, got)):
        if not explore.logit_bias(i):
            assert all(math.isnan(x) for x in lps)
            continue
        logits, drawn = _policy_logits(model, prompt, ids), torch.tensor(ids)[:, None]
        own = torch.log_softmax(logits / temp, -1)
        if i in explore.banned_rows(8):
            want = own.gather(1, drawn)[:, 0] - torch.log1p(-own[:, tid].exp())
            gaps += (torch.tensor(lps) - own.gather(1, drawn)[:, 0]).tolist()
        else:
            logits[:, tid] += 2.0
            want = torch.log_softmax(logits / temp, -1).gather(1, drawn)[:, 0]
        assert torch.allclose(torch.tensor(lps), want, atol=1e-4), (i, lps, want.tolist())
    assert min(gaps) >= -1e-4 and max(gaps) > 0.1  # the ban moved some draws away from where the policy leaned
