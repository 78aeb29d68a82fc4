"""SLM decode throughput of one device: a Qwen3-4B-shaped model with transformers `generate`, tokens/s by batch size.

    python benchmarks/slm_decode.py [--batches 1,16,64,256] [--prompt-tokens 256] [--new-tokens 256] [--tiny]

The weights are random (no download; the shape, not the values, sets the speed) and every sequence decodes exactly
`--new-tokens` tokens (min_new_tokens), greedy, bf16 on a GPU (float32 on CPU), after one warm-up call per batch
size. transformers' static batches are a lower bound for vLLM, which batches continuously with paged attention; the
figure sizes the SLM GPUs in docs/scaling.md. `--tiny` runs a 2-layer, 64-wide model (a smoke test on a CPU).
One line per batch size; the last line is exactly:
`device=<name> batch=<b> decode_tokens_per_s=<t> ms_per_step=<m> prefill_ms=<p>` (the largest batch).
"""

from __future__ import annotations

import argparse
import time

import torch


def qwen3_4b_config(tiny: bool = False):
    """The Qwen3-4B shape (36 layers, 2560 wide, GQA 32/8 heads of 128, SwiGLU 9728, 151,936 tokens)."""
    from transformers import Qwen3Config

    if tiny:
        return Qwen3Config(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=128,
            max_position_embeddings=4096,
        )
    return Qwen3Config(
        vocab_size=151_936,
        hidden_size=2560,
        num_hidden_layers=36,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=9728,
        max_position_embeddings=40_960,
        tie_word_embeddings=True,
        rope_theta=1_000_000,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_generate(model, batch: int, prompt_tokens: int, new_tokens: int, device: torch.device) -> float:
    """Seconds for one `generate` of `batch` random prompts, each decoding exactly `new_tokens` tokens."""
    ids = torch.randint(10, model.config.vocab_size, (batch, prompt_tokens), device=device)
    mask = torch.ones_like(ids)
    _sync(device)
    t0 = time.perf_counter()
    out = model.generate(
        input_ids=ids,
        attention_mask=mask,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    _sync(device)
    assert out.shape == (batch, prompt_tokens + new_tokens)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,16,64,256", help="comma-separated batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--tiny", action="store_true", help="a 2-layer toy model (CPU smoke test)")
    a = p.parse_args(argv)
    batches = [int(x) for x in a.batches.split(",") if x.strip()]
    from transformers import Qwen3ForCausalLM

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen3ForCausalLM(qwen3_4b_config(a.tiny)).to(dtype).eval()
    model.generation_config.eos_token_id = None  # never stop early: every sequence decodes --new-tokens
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    params = sum(t.numel() for t in model.parameters()) / 1e9
    print(
        f"{name}: Qwen3{'-tiny' if a.tiny else '-4B shape'} ({params:.2f}B params, {dtype}), prompt "
        f"{a.prompt_tokens} + {a.new_tokens} new tokens per sequence",
        flush=True,
    )
    line = ""
    with torch.inference_mode():
        for b in batches:
            timed_generate(model, b, a.prompt_tokens, 4, device)  # warm-up (kernels, allocator)
            prefill = timed_generate(model, b, a.prompt_tokens, 1, device)
            total = timed_generate(model, b, a.prompt_tokens, a.new_tokens, device)
            step = (total - prefill) / max(1, a.new_tokens - 1)
            line = (
                f"device={name.replace(' ', '_')} batch={b} decode_tokens_per_s={b / step:.0f} "
                f"ms_per_step={step * 1e3:.2f} prefill_ms={prefill * 1e3:.1f}"
            )
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
