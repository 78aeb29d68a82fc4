"""The `<offload>` control token: add it to a tokenizer/model and initialise its rows (`eq:offload-embed-init`).

    e_off = mean(e_a for a in anchors) + eps,   eps ~ N(0, sigma^2 I)

Anchors are natural breakpoints: the period, the newline and the end-of-sequence token. Input and output rows are
initialised separately when the embeddings are untied (each from its own matrix, with independent noise).
"""

from __future__ import annotations

import torch

from pyrodash.prompts import OFFLOAD_TOKEN

ANCHOR_TEXTS = (".", "\n")


def offload_token_id(tokenizer) -> int | None:
    """The id of `<offload>` in `tokenizer`, or None when the vocabulary does not have it."""
    tid = tokenizer.convert_tokens_to_ids(OFFLOAD_TOKEN)
    if tid is None or tid == tokenizer.unk_token_id:
        return None
    return int(tid)


def anchor_token_ids(tokenizer) -> list[int]:
    """Ids of the anchor tokens (period, newline, EOS) that exist as single tokens in this vocabulary."""
    ids: list[int] = []
    for text in ANCHOR_TEXTS:
        enc = tokenizer.encode(text, add_special_tokens=False)
        if len(enc) == 1:
            ids.append(int(enc[0]))
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    ids = sorted(set(ids))
    if not ids:
        raise ValueError("no anchor token (period, newline, EOS) is a single token of this tokenizer")
    return ids


@torch.no_grad()
def add_offload_token(model, tokenizer, sigma: float = 0.1, seed: int = 0) -> int:
    """Add `<offload>` to `tokenizer` and `model` and initialise its input/output rows; return its id.

    Idempotent: a tokenizer that already has the token is left as it is and its id returned.
    """
    existing = offload_token_id(tokenizer)
    if existing is not None and existing < model.get_input_embeddings().weight.shape[0]:
        return existing
    anchors = anchor_token_ids(tokenizer)
    tokenizer.add_special_tokens({"additional_special_tokens": [OFFLOAD_TOKEN]}, replace_extra_special_tokens=False)
    tid = offload_token_id(tokenizer)
    assert tid is not None
    if tid >= model.get_input_embeddings().weight.shape[0]:
        model.resize_token_embeddings(tid + 1, mean_resizing=False)
    gen = torch.Generator().manual_seed(seed)
    emb_in = model.get_input_embeddings().weight
    noise = torch.randn(emb_in.shape[1], generator=gen) * sigma
    emb_in[tid] = emb_in[anchors].float().mean(0).to(emb_in.dtype) + noise.to(emb_in.dtype)
    out = model.get_output_embeddings()
    if out is not None and out.weight.data_ptr() != emb_in.data_ptr():
        w = out.weight
        noise = torch.randn(w.shape[1], generator=gen) * sigma
        w[tid] = w[anchors].float().mean(0).to(w.dtype) + noise.to(w.dtype)
        if getattr(out, "bias", None) is not None:
            out.bias[tid] = out.bias[anchors].mean()
    return tid
