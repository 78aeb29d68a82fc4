"""A training batch run as a few forward passes over rows of similar length: the same loss, less padding.

TRL's collator pads a batch to its longest row. In Stage 2's quick recipe a turn-3 conversation row (two earlier
solutions in its prompt) sits beside single questions: over 10 epochs of random batches of 32, the padded batches hold
2.3x the real tokens and 4.6x the real attention work (quick world seed 0). `LengthChunkedSFTTrainer` cuts each
batch into `length_chunks` groups of rows of similar length, each padded only to its own longest row, and adds
their losses before the one backward pass. The batches, their rows and their order stay as TRL makes them.

Why the loss is the same: `SFTTrainer.compute_loss` divides the batch's summed token loss by `num_items_in_batch`,
the label tokens of the whole batch; each group's loss is its own token sum over that same count, so the groups'
losses add up to the batch's loss, and so do the gradients (tests/test_length_chunks.py compares them). Only the
floating-point order of the sums changes. TRL's per-batch metrics (entropy, token accuracy) are logged per group.
"""

from __future__ import annotations

import torch
from trl import SFTTrainer

from pyrodash.train.fingerprint import register_tokenizer_fingerprint


def split_by_length(lengths: list[int], parts: int) -> list[list[int]]:
    """Row indices in at most `parts` groups, each a run of the rows sorted by length, chosen so that the padded
    tokens (a group's rows x its longest row, summed) are fewest."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    ls = [lengths[i] for i in order]
    n, k = len(ls), max(1, min(parts, len(ls)))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(k + 1)]  # best[j][m]: the first m sorted rows in j groups
    cut = [[0] * (n + 1) for _ in range(k + 1)]
    best[0][0] = 0
    for j in range(1, k + 1):
        for m in range(j, n + 1):
            for s in range(j - 1, m):
                cost = best[j - 1][s] + (m - s) * ls[m - 1]
                if cost < best[j][m]:
                    best[j][m], cut[j][m] = cost, s
    groups, m = [], n
    for j in range(k, 0, -1):
        s = cut[j][m]
        groups.append(order[s:m])
        m = s
    return [g for g in reversed(groups) if g]


def right_padded(mask: torch.Tensor) -> bool:
    """True when every row of an attention mask is its real tokens first, then padding."""
    lengths = mask.sum(dim=1, keepdim=True)
    return bool((mask.bool() == (torch.arange(mask.shape[1], device=mask.device) < lengths)).all())


class LengthChunkedSFTTrainer(SFTTrainer):
    """TRL's SFTTrainer with each training batch run in `args.length_chunks` groups of similar length (1: as TRL), and
    its tokenizer fingerprinted cheaply where TRL's dataset preparation hashes it (`pyrodash.train.fingerprint`)."""

    def __init__(self, *args, processing_class=None, **kwargs):
        register_tokenizer_fingerprint(processing_class)
        super().__init__(*args, processing_class=processing_class, **kwargs)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        parts = int(getattr(self.args, "length_chunks", 1) or 1)
        mask = inputs.get("attention_mask")
        plain = (
            parts <= 1
            or return_outputs
            or num_items_in_batch is None
            or not model.training
            or mask is None
            or mask.dim() != 2
            or not right_padded(mask)
            or any(torch.is_tensor(v) and v.shape[:2] != mask.shape for v in inputs.values())
        )
        if plain:  # the batch's loss needs its own token count, and the rows must end in their padding
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
        lengths = mask.sum(dim=1).tolist()
        loss = None
        for group in split_by_length(lengths, parts):
            rows, width = torch.tensor(group, device=mask.device), max(lengths[i] for i in group)
            part = {k: v[rows, :width] if torch.is_tensor(v) else v for k, v in inputs.items()}
            part_loss = super().compute_loss(model, part, num_items_in_batch=num_items_in_batch)
            loss = part_loss if loss is None else loss + part_loss
        return loss
