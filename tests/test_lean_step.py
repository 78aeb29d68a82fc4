"""The decode loop's lean step (`pyrodash.backends.hf.lean_step`) gives the model's own logits bit for bit: with and
without padding, with grouped-query attention, in float32 and bfloat16, with PEFT LoRA layers; the loop writes the
same tokens with it as without it; models it does not reproduce keep their own forward."""

from __future__ import annotations

import pytest
import torch
from tiny_models import tiny_model
from transformers import Qwen3Config, Qwen3ForCausalLM

from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.hf.kv_cache import growing_cache
from pyrodash.backends.hf.lean_step import lean_step


def _model(kv_heads: int, attn: str = "sdpa", seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        head_dim=8,
        max_position_embeddings=256,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    model.set_attn_implementation(attn)
    return model


def _same_logits_every_step(model, padded: bool, steps: int = 12) -> None:
    """Prefill one cache per path with the model, then decode greedily: the model's forward on one cache, the lean
    step on the other; the logits must be equal, not close."""
    torch.manual_seed(1)
    lengths = [9, 5, 7] if padded else [7, 7, 7]
    width = max(lengths)
    ids = torch.zeros((3, width), dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(1, 40, (n,))
        mask[i, width - n :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    step = lean_step(model)
    assert step is not None
    with torch.inference_mode():
        ref_cache, lean_cache = growing_cache(model.config), growing_cache(model.config)
        logits = (
            model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=ref_cache, use_cache=True)
            .logits[:, -1]
            .float()
        )
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=lean_cache, use_cache=True)
        for _ in range(steps):
            nxt = logits.argmax(-1)[:, None]
            mask = torch.cat([mask, mask.new_ones((3, 1))], dim=1)
            pos = pos[:, -1:] + 1
            logits = (
                model(
                    input_ids=nxt,
                    attention_mask=mask,
                    position_ids=pos,
                    past_key_values=ref_cache,
                    use_cache=True,
                    logits_to_keep=1,
                )
                .logits[:, -1]
                .float()
            )
            lean = step(nxt, mask, pos, lean_cache)
            assert torch.equal(lean, logits)


@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("padded", [True, False])
def test_lean_step_logits_are_the_models(kv_heads, padded):
    _same_logits_every_step(_model(kv_heads), padded)


def test_lean_step_logits_are_the_models_in_bfloat16():
    """A model that is not float32: the casts the lean step skips on float32 (RMSNorm's, RoPE's, the logits') run here,
    and the logits are still the model's."""
    _same_logits_every_step(_model(2).to(torch.bfloat16), padded=True)


def test_lean_step_with_lora_layers_is_the_peft_models():
    """Stage 3 decodes its rollouts with LoRA layers in the model: they are called as the modules they are."""
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(
        _model(2),
        LoraConfig(
            r=4,
            lora_alpha=8,
            lora_dropout=0.0,
            target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        ),
    )
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)  # (initialised to zero: the adapter would add nothing)
    base = peft_model.get_base_model().eval()
    _same_logits_every_step(base, padded=True)
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.inference_mode(), peft_model.disable_adapter():
        plain = base(input_ids=ids).logits
    with torch.inference_mode():
        assert not torch.equal(base(input_ids=ids).logits, plain)  # the adapter did change the model


def test_decode_loop_writes_the_same_tokens_with_and_without_it():
    model, tok = tiny_model(seed=3)
    backend = HFBackend(model, tok)
    assert lean_step(backend.model) is not None
    reqs = [
        GenRequest(
            messages=[{"role": "user", "content": "question " * (1 + i % 3)}],
            max_tokens=6 + 4 * i,
            temperature=0.8 if i % 2 else 0.0,
            seed=i,
            top_logprobs=2 if i == 1 else 0,
            logit_bias={5: 3.0} if i == 2 else {},
        )
        for i in range(5)
    ]
    lean = backend.generate_batch(reqs)
    backend.lean = False
    ref = backend.generate_batch(reqs)
    assert [r.token_ids for r in lean] == [r.token_ids for r in ref]
    assert [r.top_logprobs for r in lean] == [r.top_logprobs for r in ref]
    assert len({len(r.token_ids) for r in lean}) > 1  # rows left the batch at different steps


def test_models_it_does_not_reproduce_keep_their_forward():
    assert lean_step(_model(2, attn="eager")) is None
    hooked = _model(2)
    hooked.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert lean_step(hooked) is None
    assert lean_step(torch.nn.Linear(2, 2)) is None


def test_transformers_output_capture_hooks_do_not_turn_it_off():
    """A forward asking for hidden states (RouteLLM-MF's encoder) installs transformers' capture hooks on the model for
    good; they record only inside such a forward, so the lean step still applies and still gives the model's logits."""
    model = _model(2)
    model(input_ids=torch.tensor([[1, 2, 3]]), output_hidden_states=True)
    assert any(m._forward_hooks for m in model.modules())  # the hooks are there
    assert lean_step(model) is not None
    _same_logits_every_step(model, padded=True)
