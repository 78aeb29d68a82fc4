"""Tiny real transformers in Hugging Face format, built by the tests themselves (no downloads), reusable by any test.

    from tiny_models import tiny_model_dir, tiny_tokenizer
    path = tiny_model_dir(tmp_path / "slm", seed=0)            # random Qwen3ForCausalLM + char tokenizer + <offload>
    backend = HFBackend(path)

The tokenizer is the built-in world's character-level one (pyrodash.world.tokenizer: Qwen-style chat template,
`<|im_end|>` as EOS and `<|endoftext|>` as padding). The model is a randomly initialised two-layer
`Qwen3ForCausalLM` (hidden size 32) with `<offload>` added by `pyrodash.tokens.add_offload_token`. Building and
saving one takes well under a second on a CPU; `tiny_model_dir` caches by (seed, offload, tied) per process.
Importing this module sets torch to one intra-op thread: tiny matrices decode ~10x faster that way on a shared CPU.
"""

from __future__ import annotations

import shutil
from pathlib import Path

_CACHE: dict[tuple, Path] = {}

# Seeds whose random models behave as a test needs (probed over seeds 0-9 under the world-v2 vocabulary):
# HANDOFF_SLM_SEED's greedy trace hands off after a few tokens at a moderate offload_bias (seed 0's loops on one
# character and never does); CLEAN_LLM_SEEDS write no special-token text in 60 greedy tokens, so servers that drop
# special tokens from text (`transformers serve`) return what the in-process backend does.
HANDOFF_SLM_SEED = 9
CLEAN_LLM_SEEDS = (3, 5)

try:  # tiny models: thread start-up costs more than the math, and the test box is shared
    import torch

    torch.set_num_threads(1)
except ImportError:  # pragma: no cover
    pass


def tiny_tokenizer():
    """The built-in world's character-level tokenizer (`pyrodash.world.tokenizer`), without `<offload>`."""
    from pyrodash.world.tokenizer import build_tokenizer

    return build_tokenizer()


def tiny_model(seed: int = 0, offload: bool = True, tied: bool = False, hidden: int = 32, layers: int = 2):
    """(model, tokenizer): a random tiny Qwen3ForCausalLM over the char tokenizer, `<offload>` added if asked."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from pyrodash.tokens import add_offload_token

    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=hidden // 2,
        max_position_embeddings=2048,
        tie_word_embeddings=tied,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(cfg).eval()
    # random init gives near-uniform logits; scale the head so greedy decoding has clear preferences
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    if offload:
        add_offload_token(model, tok, sigma=0.1, seed=seed)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok


def tiny_model_dir(out_dir: str | Path, seed: int = 0, offload: bool = True, tied: bool = False) -> Path:
    """Save a tiny model + tokenizer into `out_dir` (HF format) and return the path; cached per process."""
    out = Path(out_dir)
    key = (seed, offload, tied)
    if key in _CACHE and _CACHE[key].exists():
        if _CACHE[key] != out:
            shutil.copytree(_CACHE[key], out, dirs_exist_ok=True)
        return out
    model, tok = tiny_model(seed=seed, offload=offload, tied=tied)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    _CACHE[key] = out
    return out


def mid_trace_bias(slm, prompts, question: str, max_tokens: int = 24) -> float:
    """An offload_bias at which the SLM backend `slm` hands off after a few tokens on `question` (a mid-trace
    handoff): of a small grid, the bias with the latest handoff (cached per backend and question)."""
    from pyrodash.backends.base import GenRequest
    from pyrodash.prompts import OFFLOAD_TOKEN

    key = (id(slm), prompts.name, question, max_tokens)
    if key in _BIAS:
        return _BIAS[key]
    oid = slm.token_id(OFFLOAD_TOKEN)
    msgs = [{"role": "system", "content": prompts.offload_system}] + prompts.plain_messages(question)
    found = []
    for i in range(21):
        b = 1.0 + 0.05 * i
        r = slm.generate(GenRequest(messages=msgs, max_tokens=max_tokens, stop_token_ids=[oid], logit_bias={oid: b}))
        if r.stop_token_id == oid and r.completion_tokens >= 3:
            found.append((r.completion_tokens, b))
    if not found:
        raise AssertionError("no bias gives a mid-trace handoff on this SLM")
    _BIAS[key] = max(found)[1]
    return _BIAS[key]


_BIAS: dict[tuple, float] = {}
