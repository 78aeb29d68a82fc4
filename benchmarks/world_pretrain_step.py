"""World pretraining step time: float32 (what the build trains in) vs bf16 autocast, on the build's threads.

    .venv/bin/python benchmarks/world_pretrain_step.py [--preset quick] [--which llm] [--steps 60] [--threads N]
    .venv/bin/python benchmarks/world_pretrain_step.py --which slm --steps 1 --warmup 1    # a smoke run

Times the world build's training step (`pyrodash.world.pretrain.train_step`: forward, backward, clipping, fused
AdamW, SDPA attention) on the same batches twice: in float32, and with the forward under bf16 autocast. Each variant
warms up for `--warmup` steps (5), then the mean of `--steps` step times is taken (what a build's time adds up).
The last line is machine-readable: `step_ms_fp32=<a> step_ms_bf16=<b> fp32_speedup=<b/a> threads=<n>`, and
`build_pretrain_s=<steps x a / 1000>` estimates the model's share of a build.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from pyrodash.world.build import build_threads  # noqa: E402
from pyrodash.world.config import WorldConfig  # noqa: E402
from pyrodash.world.pretrain import batch_stream, model_config, train_step  # noqa: E402


def step_times(which: str, cfg: WorldConfig, bf16: bool, batches: list, warmup: int) -> list[float]:
    from transformers import Qwen3ForCausalLM

    spec = cfg.slm if which == "slm" else cfg.llm
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(model_config(spec)).train()
    model.set_attn_implementation("sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, fused=True)
    times = []
    for x, y in batches:
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            train_step(model, opt, x, y)
        times.append(time.perf_counter() - t)
    return times[warmup:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=["quick", "full"], default="quick")
    ap.add_argument("--which", choices=["slm", "llm"], default="llm")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps before the timed ones")
    ap.add_argument("--threads", type=int, default=build_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = WorldConfig.from_preset(args.preset)
    spec = cfg.slm if args.which == "slm" else cfg.llm
    stream = batch_stream(args.which, cfg, 0, spec.batch_size)
    batches = [next(stream) for _ in range(args.steps + args.warmup)]
    ms = {}
    for name, bf16 in (("fp32", False), ("bf16", True)):
        ms[name] = 1000 * statistics.mean(step_times(args.which, cfg, bf16, batches, args.warmup))
        print(f"{args.preset} {args.which} {name}: {ms[name]:.1f} ms/step (mean of {args.steps})")
    print(
        f"step_ms_fp32={ms['fp32']:.1f} step_ms_bf16={ms['bf16']:.1f} fp32_speedup={ms['bf16'] / ms['fp32']:.2f} "
        f"threads={args.threads} build_pretrain_s={spec.train_steps * ms['fp32'] / 1000:.0f}"
    )


if __name__ == "__main__":
    main()
