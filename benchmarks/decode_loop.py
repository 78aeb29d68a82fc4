"""Our batched decode loop (`HFBackend.generate_batch`) against transformers' own `generate` on the world's models,
and with its lean step (`pyrodash/backends/hf/lean_step.py`) against the same loop calling the model's forward.

    .venv/bin/python benchmarks/decode_loop.py [--model slm|llm] [--batch 64] [--runs 3] [--seed 0]

The prompts mix single questions of every tier and conversation turns 2 and 3 (~60 to ~600 tokens), greedy, up to
`--max-tokens` new tokens, left-padded. Our loop writes its KV cache in place and drops finished rows
(`pyrodash/backends/hf/kv_cache.py`); "forward" is the loop with `HFBackend.lean = False`. All three must write the
same tokens (checked; exit 1 otherwise). Builds or reuses the quick world of `--seed`. The last line is exactly:
`ours_s=<a> forward_s=<f> generate_s=<b> speedup=<b/a> lean_speedup=<f/a> same_tokens=<True|False>`.
"""

from __future__ import annotations

import argparse
import statistics
import time


def prompts_of(world, n: int):
    """`n` chats: tier questions and conversation turns in turn, as the evaluation builds them."""
    from pyrodash.data.benchmarks import load_benchmark
    from pyrodash.engine import slm_chat
    from pyrodash.prompts import get_prompts
    from pyrodash.train.chat_logs import turn_messages

    prompts = get_prompts("world-v1")
    singles = [ex for t in range(1, 6) for ex in load_benchmark(f"world:tier{t}", path=str(world))]
    turns = [ex for ex in load_benchmark("world:multiturn", path=str(world)) if ex.meta.get("turn", 1) > 1]
    mix = [x for pair in zip(singles, turns) for x in pair][:n]
    return [slm_chat(prompts, turn_messages(prompts, ex)) for ex in mix]


def generate_reference(be, reqs, max_tokens: int):
    """A function running transformers' `generate` on the left-padded batch of `reqs`, cut as our loop records."""
    import torch

    ids = [be.prompt_ids(r) for r in reqs]
    width = max(map(len, ids))
    x = torch.full((len(ids), width), be.pad_id)
    mask = torch.zeros_like(x)
    for i, row in enumerate(ids):
        x[i, width - len(row) :], mask[i, width - len(row) :] = torch.tensor(row), 1

    def reference():
        with torch.inference_mode():
            out = be.model.generate(
                input_ids=x,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                eos_token_id=sorted(be.eos_ids),
                pad_token_id=be.pad_id,
            )
        rows = []
        for row in out[:, width:].tolist():  # up to and including the first EOS, as our loop records them
            cut = next((i + 1 for i, t in enumerate(row) if t in be.eos_ids), len(row))
            rows.append(row[:cut])
        return rows

    return reference


def timed_runs(be, reqs, max_tokens: int, runs: int) -> tuple[dict[str, list[float]], dict[str, list]]:
    """({variant: wall seconds per run}, {variant: the tokens of its last run}) for ours, forward and generate."""

    def loop(lean: bool):
        be.lean = lean
        return [r.token_ids for r in be.generate_batch(reqs)]

    variants = (
        ("ours", lambda: loop(True)),
        ("forward", lambda: loop(False)),
        ("generate", generate_reference(be, reqs, max_tokens)),
    )
    times: dict[str, list[float]] = {name: [] for name, _ in variants}
    got = {}
    for _ in range(runs):
        for name, fn in variants:
            t = time.perf_counter()
            got[name] = fn()
            times[name].append(time.perf_counter() - t)
    return times, got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=("slm", "llm"), default="slm")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=int, default=300)
    a = p.parse_args(argv)
    import torch

    from pyrodash.backends.base import GenRequest
    from pyrodash.backends.hf.backend import HFBackend
    from pyrodash.world.build import build_world

    world = build_world(None, quick=True, seed=a.seed)
    be = HFBackend(str(world / a.model))
    reqs = [GenRequest(messages=c, max_tokens=a.max_tokens) for c in prompts_of(world, a.batch)]
    times, got = timed_runs(be, reqs, a.max_tokens, a.runs)
    same = got["ours"] == got["forward"] == got["generate"]
    lengths = [len(be.prompt_ids(r)) for r in reqs]
    new = [len(t) for t in got["ours"]]
    print(
        f"world seed {a.seed}, {a.model}, {len(reqs)} prompts of {min(lengths)}-{max(lengths)} tokens, "
        f"{min(new)}-{max(new)} new tokens ({sum(new)} in all), {torch.get_num_threads()} threads"
    )
    for name, ts in times.items():
        runs = ", ".join(f"{t:.2f}" for t in ts)
        print(f"{name:>9}: median {statistics.median(ts):.2f} s over {a.runs} runs ({runs})")
    o, f, g = (statistics.median(times[k]) for k in ("ours", "forward", "generate"))
    print(
        f"ours_s={o:.3f} forward_s={f:.3f} generate_s={g:.3f} speedup={g / o:.2f} lean_speedup={f / o:.2f} "
        f"same_tokens={same}"
    )
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
