"""World pretraining step time: PyTorch SDPA (what the build trains with) vs eager attention in float32,
single-threaded.

    .venv/bin/python benchmarks/world_pretrain_step.py [--preset quick] [--which llm] [--steps 100]

Times the world build's training step (`pyrodash.world.pretrain.train_step`: forward under bf16 autocast,
backward, clipping, fused AdamW) on the same batches twice: with transformers' SDPA (its CPU flash-attention kernel,
what the build uses) and with `fp32_eager_attention` below (what builds of the earlier, shorter world used: faster
there, slower on this world's ~220-token examples). Each variant warms up for 10 steps, then the median of
`--steps` step times is taken. The last line is machine-readable:
`step_ms_sdpa=<a> step_ms_fp32_eager=<b> sdpa_speedup=<b/a>`.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from pyrodash.world.config import WorldConfig  # noqa: E402
from pyrodash.world.pretrain import batch_stream, model_config, train_step  # noqa: E402


def fp32_eager_attention(module, query, key, value, attention_mask, **kwargs):
    """Transformers' eager attention computed in float32 inside a bf16 autocast region: the projections and MLPs run
    in bf16, the attention scores and softmax do not. Measured on the quick world (same steps, same data): with the
    scores rounded to bf16 (plain eager attention under autocast) the LLM solved 0% of the 4- and 5-lookup tiers;
    with them in float32, 100%."""
    from transformers.models.qwen3.modeling_qwen3 import eager_attention_forward

    with torch.autocast("cpu", enabled=False):
        out, weights = eager_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                               **kwargs)
    return out.to(query.dtype), weights


def use_fp32_eager_attention(model) -> None:
    """Switch `model` to `fp32_eager_attention`, with the causal mask transformers builds for eager attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    AttentionInterface.register("fp32_eager", fp32_eager_attention)
    AttentionMaskInterface.register("fp32_eager", eager_mask)  # without it, no mask: every token sees the future
    model.set_attn_implementation("fp32_eager")


def step_times(which: str, cfg: WorldConfig, attention: str, batches: list) -> list[float]:
    from transformers import Qwen3ForCausalLM

    spec = cfg.slm if which == "slm" else cfg.llm
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(model_config(spec)).train()
    if attention == "fp32_eager":
        use_fp32_eager_attention(model)
    else:
        model.set_attn_implementation("sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, fused=True)
    times = []
    for x, y in batches:
        t = time.perf_counter()
        train_step(model, opt, x, y)
        times.append(time.perf_counter() - t)
    return times[10:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=["quick", "full"], default="quick")
    ap.add_argument("--which", choices=["slm", "llm"], default="llm")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = WorldConfig.from_preset(args.preset)
    spec = cfg.slm if args.which == "slm" else cfg.llm
    stream = batch_stream(args.which, cfg, 0, spec.batch_size)
    batches = [next(stream) for _ in range(args.steps + 10)]
    ms = {}
    for attention in ("sdpa", "fp32_eager"):
        ms[attention] = 1000 * statistics.median(step_times(args.which, cfg, attention, batches))
        print(f"{args.preset} {args.which} {attention}: {ms[attention]:.1f} ms/step (median of {args.steps})")
    print(f"step_ms_sdpa={ms['sdpa']:.1f} step_ms_fp32_eager={ms['fp32_eager']:.1f} "
          f"sdpa_speedup={ms['fp32_eager'] / ms['sdpa']:.2f}")


if __name__ == "__main__":
    main()
