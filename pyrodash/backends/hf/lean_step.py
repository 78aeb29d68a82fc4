"""One decode step of a Qwen3 decoder without transformers' module machinery: the same torch ops, in the same order,
on the same weights (less the ones that cannot change a value: docs/internals.md), so the logits are bit for bit those
of `model(...)` (`tests/test_lean_step.py` checks it, on a plain model and with PEFT LoRA layers). Used by the decode
loop (`hf/backend.py`) for every token after the prompt; the prompt itself (prefill) still goes through
`model(...)`. A model it does not cover gets `None` from `lean_step` and keeps its own forward.

Why (per-call overhead on tiny models, with measurements) and exactly what it covers: docs/internals.md.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional
from transformers.integrations.sdpa_attention import use_gqa_in_sdpa


def _linear(module: nn.Module):
    if type(module) is nn.Linear and module.bias is None:
        weight = module.weight
        return lambda x: functional.linear(x, weight)
    return module


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`Qwen3RMSNorm.forward`, op for op (its two casts are no-ops on a float32 model and are skipped there)."""
    dtype = x.dtype
    if dtype is not torch.float32:
        x = x.to(torch.float32)
    variance = x.pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + eps)
    return weight * (x if dtype is torch.float32 else x.to(dtype))


def _rotate_half(x: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """transformers' `rotate_half`, cat((-x2, x1)), as a roll by half the head and a sign: the same values in two
    ops instead of four (a product by -1 or 1 is exact)."""
    return torch.roll(x, x.shape[-1] // 2, -1) * sign


class LeanStep:
    """`step(ids [B, 1], mask [B, L] of 0/1 over the cache + this token, pos [B, 1], cache)` -> float32 logits of the
    token, [B, vocab]. The cache is the one the prefill filled (`kv_cache.growing_cache`); the step appends to it."""

    def __init__(self, model):
        inner = model.model
        cfg = model.config
        self.eps = cfg.rms_norm_eps
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.groups = cfg.num_attention_heads // cfg.num_key_value_heads
        half = self.head_dim // 2
        w = inner.norm.weight  # (the model's dtype and device)
        self.sign = torch.cat((-torch.ones(half), torch.ones(half))).to(dtype=w.dtype, device=w.device)
        rotary = inner.rotary_emb
        self.inv_freq, self.rope_scaling = rotary.inv_freq, rotary.attention_scaling
        embed = inner.embed_tokens
        self.embed = (
            (lambda ids, w=embed.weight: functional.embedding(ids, w, embed.padding_idx))
            if type(embed) is nn.Embedding
            else embed
        )
        self.layers = []
        for layer in inner.layers:
            a, mlp = layer.self_attn, layer.mlp
            self.layers.append(
                (
                    layer.input_layernorm.weight,
                    _linear(a.q_proj),
                    _linear(a.k_proj),
                    _linear(a.v_proj),
                    a.q_norm.weight,
                    a.k_norm.weight,
                    a.scaling,
                    _linear(a.o_proj),
                    layer.post_attention_layernorm.weight,
                    _linear(mlp.gate_proj),
                    _linear(mlp.up_proj),
                    _linear(mlp.down_proj),
                    mlp.act_fn,
                )
            )
        self.norm = inner.norm.weight
        self.head = _linear(model.lm_head)

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache) -> torch.Tensor:
        eps, hd = self.eps, self.head_dim
        x = self.embed(ids)
        b, q = ids.shape
        # the rotary module's forward (default RoPE), then apply_rotary_pos_emb's unsqueeze on the head dim
        freqs = pos[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.rope_scaling != 1.0:  # (x 1.0 is exact: skipped, as the casts to the dtype it already has)
            cos, sin = cos * self.rope_scaling, sin * self.rope_scaling
        if x.dtype is not torch.float32:
            cos, sin = cos.to(dtype=x.dtype), sin.to(dtype=x.dtype)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        # transformers' SDPA mask for one query token: none when nothing is padded, else the padding mask as bool
        attn_mask = None if bool(mask.all()) else mask.bool()[:, None, None, :]
        for i, (ln1, qp, kp, vp, qn, kn, scale, op, ln2, gate, up, down, act) in enumerate(self.layers):
            residual = x
            h = _rms(x, ln1, eps)
            qs = _rms(qp(h).view(b, q, -1, hd), qn, eps).transpose(1, 2)
            ks = _rms(kp(h).view(b, q, -1, hd), kn, eps).transpose(1, 2)
            vs = vp(h).view(b, q, -1, hd).transpose(1, 2)
            qs = (qs * cos) + (_rotate_half(qs, self.sign) * sin)
            ks = (ks * cos) + (_rotate_half(ks, self.sign) * sin)
            keys, values = cache.layers[i].update(ks, vs)
            if self.groups == 1:
                out = functional.scaled_dot_product_attention(
                    qs, keys, values, attn_mask=attn_mask, dropout_p=0.0, scale=scale
                )
            elif use_gqa_in_sdpa(attn_mask, keys, values):  # (no padding)
                out = functional.scaled_dot_product_attention(
                    qs, keys, values, attn_mask=attn_mask, dropout_p=0.0, scale=scale, enable_gqa=True
                )
            else:  # transformers' pack_gqa: the query heads of a key/value head side by side, one query token
                packed = qs.reshape(b, qs.shape[1] // self.groups, self.groups, hd)
                out = functional.scaled_dot_product_attention(
                    packed, keys, values, attn_mask=attn_mask, dropout_p=0.0, scale=scale
                )
            out = out.reshape(out.shape[0], -1, q, hd).transpose(1, 2).contiguous().reshape(b, q, -1)
            x = residual + op(out)
            residual = x
            h = _rms(x, ln2, eps)
            x = residual + down(act(gate(h)) * up(h))
        x = _rms(x, self.norm, eps)
        logits = self.head(x[:, -1, :])
        return logits if logits.dtype is torch.float32 else logits.float()


def lean_step(model) -> LeanStep | None:
    """A `LeanStep` for `model` when it is a Qwen3 decoder this file reproduces exactly (see the module docstring),
    else None."""
    cfg = getattr(model, "config", None)
    if type(model).__name__ != "Qwen3ForCausalLM" or cfg is None:
        return None
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return None
    if cfg.num_attention_heads % cfg.num_key_value_heads:
        return None
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or []):
        return None
    if getattr(model.model.rotary_emb, "rope_type", "default") != "default":  # (the config's, as the module uses it)
        return None
    if any(_foreign_hooks(m) for m in model.modules()):  # accelerate's offload hooks, ...
        return None
    return LeanStep(model)


# transformers' own output-capture hooks: installed for good on a model's first forward that asks for hidden states
# or attentions (RouteLLM-MF's encoder does, on the SLM the evaluation also decodes with), they record only while such
# a forward runs, and the lean step never runs one. Measured, quick world seed 0, the routers' evaluation on one
# thread: every decode after the encoder had run fell back to `model(...)` (135 of 231 loops); with them ignored
# 30.2 -> 28.1 s, the same records (its time is mostly prefills: GlimpRouter sends each step as a new request).
_CAPTURE_MODULE = "transformers.utils.output_capturing"


def _foreign_hooks(module: nn.Module) -> bool:
    hooks = [*module._forward_hooks.values(), *module._forward_pre_hooks.values()]
    return any(getattr(h, "__module__", None) != _CAPTURE_MODULE for h in hooks)
