"""`pyrodash.tokens.add_offload_token`: `eq:offload-embed-init` on real tiny transformers (tied and untied)."""

from __future__ import annotations

import torch
from tiny_models import tiny_model

from pyrodash.prompts import OFFLOAD_TOKEN
from pyrodash.tokens import add_offload_token, anchor_token_ids, offload_token_id


def anchors_of(tok) -> list[int]:
    ids = [
        tok.encode(".", add_special_tokens=False)[0],
        tok.encode("\n", add_special_tokens=False)[0],
        tok.eos_token_id,
    ]
    assert anchor_token_ids(tok) == sorted(set(ids))
    return sorted(set(ids))


def test_untied_rows_are_anchor_means_plus_independent_noise():
    model, tok = tiny_model(seed=3, offload=False, tied=False, hidden=256)
    assert offload_token_id(tok) is None
    old_in = model.get_input_embeddings().weight.detach().clone()
    old_out = model.get_output_embeddings().weight.detach().clone()
    anchors = anchors_of(tok)
    tid = add_offload_token(model, tok, sigma=0.1, seed=0)
    assert tid == offload_token_id(tok) == len(tok) - 1 == old_in.shape[0]
    assert tok.encode(f"a{OFFLOAD_TOKEN}b", add_special_tokens=False)[1] == tid
    w_in, w_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert w_in.shape[0] == w_out.shape[0] == tid + 1 and model.config.vocab_size == tid + 1
    assert torch.equal(w_in[:tid], old_in) and torch.equal(w_out[:tid], old_out)  # nothing else moved
    noise_in = w_in[tid] - old_in[anchors].mean(0)
    noise_out = w_out[tid] - old_out[anchors].mean(0)
    for noise in (noise_in, noise_out):
        assert abs(noise.std().item() - 0.1) < 0.02 and abs(noise.mean().item()) < 0.03
    assert torch.corrcoef(torch.stack([noise_in, noise_out]))[0, 1].abs() < 0.25  # drawn separately


def test_tied_embeddings_get_one_row_and_stay_tied():
    model, tok = tiny_model(seed=4, offload=False, tied=True, hidden=256)
    old = model.get_input_embeddings().weight.detach().clone()
    tid = add_offload_token(model, tok, sigma=0.05, seed=1)
    w_in, w_out = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    assert w_in.data_ptr() == w_out.data_ptr()
    noise = w_in[tid] - old[anchors_of(tok)].mean(0)
    assert abs(noise.std().item() - 0.05) < 0.01


def test_idempotent_seeded_and_sigma_zero_is_the_mean():
    model, tok = tiny_model(seed=5, offload=False)
    old = model.get_input_embeddings().weight.detach().clone()
    tid = add_offload_token(model, tok, sigma=0.0, seed=0)
    assert torch.allclose(model.get_input_embeddings().weight[tid], old[anchors_of(tok)].mean(0))
    snapshot = model.get_input_embeddings().weight.detach().clone()
    assert add_offload_token(model, tok, sigma=0.1, seed=9) == tid  # second call: nothing changes
    assert torch.equal(model.get_input_embeddings().weight, snapshot) and len(tok) == tid + 1
    a, ta = tiny_model(seed=6, offload=False)
    b, tb = tiny_model(seed=6, offload=False)
    ia, ib = add_offload_token(a, ta, seed=2), add_offload_token(b, tb, seed=2)
    assert ia == ib and torch.equal(a.get_input_embeddings().weight[ia], b.get_input_embeddings().weight[ib])


def test_save_and_reload_keeps_the_token(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tok = tiny_model(seed=7, offload=True)
    tid = offload_token_id(tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    tok2 = AutoTokenizer.from_pretrained(tmp_path)
    model2 = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert offload_token_id(tok2) == tid
    assert torch.equal(model2.get_input_embeddings().weight[tid], model.get_input_embeddings().weight[tid])
    assert tok2.decode([tid]) == OFFLOAD_TOKEN
