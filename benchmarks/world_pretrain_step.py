"""World pretraining step time: the attention the build trains with vs PyTorch SDPA, single-threaded.

    .venv/bin/python benchmarks/world_pretrain_step.py [--preset quick] [--which llm] [--steps 100]

Times the world build's training step (`pyrodash.world.pretrain.train_step`: forward under bf16 autocast,
backward, clipping, fused AdamW) on the same batches twice: with `fp32_eager_attention` (what the build uses) and
with transformers' SDPA (its CPU flash-attention kernel). Each variant warms up for 10 steps, then the median of
`--steps` step times is taken. The last line is machine-readable:
`step_ms_sdpa=<a> step_ms_fp32_eager=<b> speedup=<a/b>`.
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
from pyrodash.world.pretrain import (  # noqa: E402
    batch_stream,
    model_config,
    train_step,
    use_fp32_eager_attention,
)


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
          f"speedup={ms['sdpa'] / ms['fp32_eager']:.2f}")


if __name__ == "__main__":
    main()
