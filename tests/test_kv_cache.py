"""The decode loop's in-place KV cache and its batch compaction give what transformers' concatenating cache and a
full batch give: the same keys and values, the same tokens."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model_dir
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf import backend as hf
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.hf.kv_cache import GrowingLayer, growing_cache


def test_growing_layer_holds_what_concatenation_holds():
    torch.manual_seed(0)
    grow, cat = GrowingLayer(), DynamicLayer()
    steps = [torch.randn(3, 2, 5, 4)] + [torch.randn(3, 2, 1, 4) for _ in range(70)]  # past the first doubling
    for i, k in enumerate(steps):
        v = k * 2 + 1
        gk, gv = grow.update(k, v)
        ck, cv = cat.update(k, v)
        assert torch.equal(gk, ck) and torch.equal(gv, cv)
        assert grow.get_seq_length() == cat.get_seq_length() == 5 + i
        if i == 40:  # a finished row leaves the batch
            rows = torch.tensor([0, 2])
            grow.batch_select_indices(rows)
            cat.batch_select_indices(rows)
            steps[i + 1 :] = [s[:2] for s in steps[i + 1 :]]
    assert grow.keys.shape == (2, 2, 75, 4)


def test_growing_cache_replaces_full_attention_layers_only():
    from transformers import Qwen3Config

    cfg = Qwen3Config(
        vocab_size=16,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=4,
    )
    cache = growing_cache(cfg)
    assert len(cache.layers) == 3 and all(isinstance(layer, GrowingLayer) for layer in cache.layers)


@pytest.fixture(scope="module")
def slm(tmp_path_factory):
    return HFBackend(tiny_model_dir(tmp_path_factory.mktemp("kv") / "slm", seed=3))


def test_decode_equals_transformers_cache_and_full_batch(slm, monkeypatch):
    """Requests of different lengths, budgets, samplers and biases: the loop with the growing cache and rows leaving
    the batch writes the same tokens and logprobs as each request decoded alone (nothing leaves a batch of one), and
    as the loop on transformers' own concatenating DynamicCache."""
    msgs = [{"role": "user", "content": "a much longer question " * (1 + i % 3)} for i in range(6)]
    reqs = [
        GenRequest(
            messages=[m],
            max_tokens=4 + 5 * i,
            temperature=0.8 if i % 2 else 0.0,
            seed=i,
            top_logprobs=3 if i == 1 else 0,
            logit_bias={5: 2.0} if i == 4 else {},
        )
        for i, m in enumerate(msgs)
    ]
    ours = slm.generate_batch(reqs)

    ref = [slm.generate_batch([r])[0] for r in reqs]  # alone: nothing to compact
    monkeypatch.setattr(hf, "growing_cache", lambda config: DynamicCache(config=config))
    ref_cat = slm.generate_batch(reqs)
    for a, b, c in zip(ours, ref, ref_cat):
        assert a.token_ids == b.token_ids == c.token_ids
        assert a.text == b.text == c.text
        assert a.top_logprobs == c.top_logprobs  # same batch, same arithmetic
        if a.top_logprobs:  # alone the padding differs: the same tokens, logprobs equal to float rounding
            assert [sorted(d) for d in a.top_logprobs] == [sorted(d) for d in b.top_logprobs]
            assert [v for d in a.top_logprobs for v in sorted(d.values())] == pytest.approx(
                [v for d in b.top_logprobs for v in sorted(d.values())], abs=1e-4
            )
    assert len({len(r.token_ids) for r in ours}) > 1  # rows did finish at different steps
