"""Two torch processes side by side on a machine with fewer cores than their threads (what the test suite is: its
tests, their servers and the background demo and world builds share 2 cores), under OpenMP's default wait policy
and under `OMP_WAIT_POLICY=PASSIVE`.

    .venv/bin/python benchmarks/omp_wait.py [--steps 30] [--threads 2]
    .venv/bin/python benchmarks/omp_wait.py --steps 2              # a smoke run

Each process trains the quick world's LLM shape (fresh weights, seeded) for `--steps` steps on `--threads` torch
threads. By default an OpenMP thread that reaches the end of a parallel region spins, waiting for the others; a
tiny model's step is hundreds of such regions, and when a process's threads outnumber the cores left to it, the
spinning thread holds a core the other process needs. PASSIVE threads sleep instead. The wait policy decides only who
waits how, not what is computed: both runs print the same final loss. Also timed: one process alone, both ways (PASSIVE
costs a process that has the cores to itself).
The last line is machine-readable: `side_by_side_s_default=<a> side_by_side_s_passive=<b> cpu_s_default=<c>
cpu_s_passive=<d> passive_speedup=<a/b> alone_s_default=<e> alone_s_passive=<f> same_loss=<0|1>`.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WORKER = """
import sys, time, torch
from transformers import Qwen3ForCausalLM
from pyrodash.world.config import WorldConfig
from pyrodash.world.pretrain import model_config
torch.set_num_threads(int(sys.argv[1]))
torch.manual_seed(0)
model = Qwen3ForCausalLM(model_config(WorldConfig.from_preset("quick").llm)).train()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randint(0, 100, (32, 128))
cpu = time.process_time()
for _ in range(int(sys.argv[2])):
    loss = model(input_ids=x, labels=x).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print(f"{time.process_time() - cpu:.3f} {loss.item():.8f}")
"""


def run(n: int, threads: int, steps: int, passive: bool) -> tuple[float, float, set[str]]:
    """`n` workers started together; (wall seconds until the last ends, their CPU seconds, their final losses)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("OMP_WAIT_POLICY", None)
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, str(threads), str(steps)], env=env, stdout=subprocess.PIPE)
        for _ in range(n)
    ]
    outs = [p.communicate()[0].decode().split() for p in procs]
    if any(p.returncode for p in procs):
        raise SystemExit("a worker failed")
    # (the wall time includes each interpreter's start-up, the same for both policies)
    return time.perf_counter() - t0, sum(float(o[0]) for o in outs), {o[1] for o in outs}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    wall_d, cpu_d, loss_d = run(2, a.threads, a.steps, passive=False)
    wall_p, cpu_p, loss_p = run(2, a.threads, a.steps, passive=True)
    alone_d, _, _ = run(1, a.threads, a.steps, passive=False)
    alone_p, _, _ = run(1, a.threads, a.steps, passive=True)
    print(f"two processes of {a.threads} threads side by side, {a.steps} steps each, on {os.cpu_count()} cores:")
    print(f"  default wait: {wall_d:.1f} s, {cpu_d:.1f} CPU-s;  PASSIVE: {wall_p:.1f} s, {cpu_p:.1f} CPU-s")
    print(f"one process alone: default {alone_d:.1f} s, PASSIVE {alone_p:.1f} s")
    print(
        f"side_by_side_s_default={wall_d:.2f} side_by_side_s_passive={wall_p:.2f} cpu_s_default={cpu_d:.2f} "
        f"cpu_s_passive={cpu_p:.2f} passive_speedup={wall_d / wall_p:.2f} alone_s_default={alone_d:.2f} "
        f"alone_s_passive={alone_p:.2f} same_loss={int(len(loss_d | loss_p) == 1)}"
    )


if __name__ == "__main__":
    main()
