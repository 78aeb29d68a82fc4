"""Stages 1-2 run a training batch as groups of similar-length rows (`pyrodash.train.length_chunks`): the groups are
the least-padding split, and the loss and gradients are the whole batch's (a real TRL SFTTrainer on a tiny Qwen3)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from test_train import gold_corpora, stage1_cfg
from tiny_models import tiny_model

from pyrodash.train.length_chunks import LengthChunkedSFTTrainer, right_padded, split_by_length


def _padded(groups, lengths):
    return sum(len(g) * max(lengths[i] for i in g) for g in groups)


def test_split_by_length_covers_every_row_once_with_the_least_padding():
    rng = random.Random(0)
    for _ in range(30):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 9))]
        parts = rng.randint(1, 4)
        groups = split_by_length(lengths, parts)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        assert 1 <= len(groups) <= parts
        # the best split of the length-sorted rows into at most `parts` runs, by brute force
        order = sorted(range(len(lengths)), key=lambda i: lengths[i])
        best = min(
            _padded([order[a:b] for a, b in zip((0, *cuts), (*cuts, len(order)))], lengths)
            for k in range(min(parts, len(order)))
            for cuts in itertools.combinations(range(1, len(order)), k)
        )
        assert _padded(groups, lengths) == best


def test_right_padded_tells_trailing_from_leading_padding():
    assert right_padded(torch.tensor([[1, 1, 0], [1, 1, 1]]))
    assert not right_padded(torch.tensor([[0, 1, 1], [1, 1, 1]]))


def _trainer(tmp_path, chunks: int):
    from pyrodash.train.common import messages_dataset

    model, tok = tiny_model(seed=1)
    rows = gold_corpora(24)[1]  # Corpus B
    cfg = stage1_cfg(tmp_path, per_device_train_batch_size=12, length_chunks=chunks)
    trainer = LengthChunkedSFTTrainer(model=model, args=cfg, train_dataset=messages_dataset(rows), processing_class=tok)
    return trainer, model


@pytest.mark.parametrize("chunks", [2, 4])
def test_a_chunked_batch_has_the_whole_batchs_loss_and_gradients(tmp_path, chunks):
    whole, model = _trainer(tmp_path / "whole", 1)
    batch = next(iter(whole.get_train_dataloader()))
    lengths = batch["attention_mask"].sum(1)
    assert right_padded(batch["attention_mask"]) and int(lengths.min()) < int(lengths.max())  # padding to save
    n_items = int((batch["labels"][:, 1:] != -100).sum())
    model.train()

    def loss_and_grads(trainer):
        model.zero_grad()
        loss = trainer.compute_loss(model, dict(batch), num_items_in_batch=n_items)
        loss.backward()
        return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    ref_loss, ref = loss_and_grads(whole)
    chunked, _ = _trainer(tmp_path / "chunked", chunks)
    calls = []
    forward = model.forward
    model.forward = lambda *a, **kw: calls.append(kw["input_ids"].shape) or forward(*a, **kw)
    try:
        loss, grads = loss_and_grads(chunked)
    finally:
        del model.forward
    assert len(calls) == chunks  # one forward pass per group
    assert sum(s[0] * s[1] for s in calls) < batch["input_ids"].numel()  # fewer padded positions computed
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert grads.keys() == ref.keys() and grads
    for n, g in ref.items():
        torch.testing.assert_close(grads[n], g, rtol=1e-4, atol=1e-6, msg=n)
