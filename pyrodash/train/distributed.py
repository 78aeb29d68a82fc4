"""Training on several processes (`accelerate launch`): who computes the shared files, who writes, stats of all ranks.

    accelerate launch --num_processes 4 -m pyrodash train stage3 --config C --output-dir D          # 4 GPUs (DDP)
    accelerate launch --config_file configs/accelerate/zero2.yaml -m pyrodash train stage3 ...     # DeepSpeed ZeRO-2
    accelerate launch --multi_gpu --num_processes 2 -m pyrodash train stage2 ...   # a CPU-only machine: gloo

The stages run unchanged on every rank; the main process computes the shared files and writes checkpoints and stats
(`main_first()`, `is_main()`, `barrier()`), and the reward's statistics are gathered from every rank. Each part, and
why a CPU-only machine needs `--multi_gpu` (`setup()`): docs/internals.md.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from pyrodash.train.models import load_local

# How long a rank waits at a barrier for the main process (a Cost_base pass over thousands of prompts through an
# API, or curation, can take hours; the default process-group timeout is 30 min).
WAIT_TIMEOUT = timedelta(hours=6)


def _flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def launched_world_size() -> int:
    """The number of processes the launcher started (torchrun / accelerate / MPI environment), 1 when none."""
    for key in ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "MV2_COMM_WORLD_SIZE"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 1


def setup():
    """The process's `accelerate.PartialState` (initialising the process group under a launcher). Call it before any
    TRL config is built: on a CPU-only machine it selects gloo (ACCELERATE_USE_CPU) so the ranks form one group."""
    import torch
    from accelerate import PartialState

    n = launched_world_size()
    if n > 1 and not torch.cuda.is_available():
        os.environ.setdefault("ACCELERATE_USE_CPU", "true")  # transformers' TrainingArguments read it too
    if n == 1 and _flag("ACCELERATE_USE_CPU") and os.environ.get("MASTER_ADDR") and "RANK" not in os.environ:
        raise ValueError(
            "`accelerate launch --cpu --num_processes N` started a single process (accelerate needs MPI "
            "for that: --mpirun_hostfile). On a CPU machine use `accelerate launch --multi_gpu "
            "--num_processes N -m pyrodash ...` (PyroDash picks gloo when there is no GPU), or "
            "--num_processes 1"
        )
    state = PartialState(cpu=_flag("ACCELERATE_USE_CPU"), timeout=WAIT_TIMEOUT)
    if n > 1 and state.num_processes != n and not _group_ready():
        # a TRL config built before this call set up a non-distributed state (CPU machine): start it again
        from accelerate.state import AcceleratorState

        AcceleratorState._reset_state(reset_partial_state=True)
        state = PartialState(cpu=_flag("ACCELERATE_USE_CPU"), timeout=WAIT_TIMEOUT)
    if n > 1 and state.num_processes != n:
        raise ValueError(
            f"the launcher started {n} processes but they did not form one group "
            f"({state.distributed_type}); launch with `accelerate launch --num_processes {n} -m pyrodash "
            "...` (CPU: add --multi_gpu)"
        )
    return state


def _group_ready() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def _state():
    from accelerate import PartialState

    return PartialState()


def world_size() -> int:
    return _state().num_processes


def rank() -> int:
    return _state().process_index


def is_main() -> bool:
    return _state().is_main_process


def barrier() -> None:
    _state().wait_for_everyone()


@contextmanager
def main_first():
    """Run the block on the main process first, then (after it finished) on the other ranks."""
    with _state().main_process_first():
        yield


def gather_objects(obj: Any) -> list[Any]:
    """`obj` of every rank, in rank order (a collective: every rank must call it)."""
    if world_size() == 1:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def pop_reward_stats(reward) -> dict[str, float]:
    """`CollaborativeReward.pop_stats()` over the rollouts of every rank since the last log (a collective, called
    from the trainer's `log`, which every rank runs at the same steps)."""
    if world_size() == 1:
        return reward.pop_stats()
    parts = gather_objects({"acc": reward._acc, "totals": dict(reward.totals)})
    merged: dict[str, list[float]] = {}
    for part in parts:
        for key, values in part["acc"].items():
            merged.setdefault(key, []).extend(values)
    own_totals = reward.totals
    reward._acc = merged
    reward.totals = {k: sum(p["totals"].get(k, 0) for p in parts) for k in own_totals}  # running totals, all ranks
    try:
        return reward.pop_stats()  # the same means, over all ranks' rollouts; clears the accumulator
    finally:
        reward.totals = own_totals


def reward_totals_by_rank(reward) -> list[dict[str, int]]:
    """Each rank's Stage 3 totals (LLM handoff calls, rollouts), in rank order (a collective)."""
    return gather_objects(dict(reward.totals))


def uses_zero3(trainer) -> bool:
    """True when the trainer runs DeepSpeed ZeRO-3 (parameters sharded: merge adapters from a gathered save)."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return False
    plugin = getattr(trainer.accelerator.state, "deepspeed_plugin", None)
    return bool(plugin is not None and plugin.zero_stage == 3)


def merged_model(trainer, base_path, scratch_dir):
    """The trained LoRA adapters merged into the base model. Under ZeRO-3 each rank holds a shard of every weight,
    so the adapters are saved through the trainer (which gathers them) and merged into the base loaded afresh on
    the main process (other ranks get None); otherwise the in-memory model is merged."""
    if not uses_zero3(trainer):
        return trainer.model.merge_and_unload()
    trainer.save_model(str(scratch_dir))  # collective; gathers the sharded adapter weights
    if not is_main():
        return None
    from peft import PeftModel

    base, _ = load_local(base_path)
    return PeftModel.from_pretrained(base, str(scratch_dir)).merge_and_unload()
