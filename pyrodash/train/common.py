"""Small pieces the three stages share: the training log callback, datasets of chat rows, saving a checkpoint."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from transformers import TrainerCallback

from pyrodash.jobs.scheduler import take_grant


class JsonlLogCallback(TrainerCallback):
    """Appends every Trainer log (loss, lr, TRL's reward metrics, our Stage 3 stats) as one JSON line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            row = {"step": state.global_step, "time": round(time.time(), 3), **logs}
            with self.path.open("a") as f:
                f.write(json.dumps(row, default=float) + "\n")


class ProgressBarCallback(TrainerCallback):
    """One rich progress bar per training run, its description showing the last logged loss (and reward, for
    GRPO). Unlike TRL's RichProgressCallback it draws no table of every logged metric: those are in the JSONL log."""

    def __init__(self):
        self.progress = None
        self.task = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=state.max_steps)

    def on_step_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.update(self.task, completed=state.global_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.progress is None or not logs:
            return
        shown = [f"{k} {logs[k]:.3f}" for k in ("loss", "reward") if isinstance(logs.get(k), (int, float))]
        self.progress.update(self.task, description="train " + " ".join(shown))

    def on_train_end(self, args, state, control, **kwargs):
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class GrantedThreads(TrainerCallback):
    """At each training step, takes the torch threads `grant()` says the step may use now. The demo's scheduler
    hands an elastic step its grant (`pyrodash.jobs.scheduler`: idle cores go to that step); None: nothing changes."""

    def __init__(self, grant: Callable[[], int | None]):
        self.grant = grant

    def on_step_begin(self, args, state, control, **kwargs):
        take_grant(self.grant)


def callbacks(args, log_path: str | Path, thread_grant: Callable[[], int | None] | None = None) -> list:
    """A rich progress bar in place of tqdm, plus the JSONL log (every metric of every logging step), plus the
    thread grant when one is given (`GrantedThreads`)."""
    args.disable_tqdm = True
    return [ProgressBarCallback(), JsonlLogCallback(log_path)] + (
        [GrantedThreads(thread_grant)] if thread_grant else []
    )


def quiet(trainer) -> None:
    """Drop transformers' PrinterCallback (added whenever tqdm is off): it prints every log dict to stdout, which the
    JSONL log and the rich bar already show."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def messages_dataset(rows: list[dict]):
    """A `datasets.Dataset` of conversational prompt-completion pairs (`prompt`: the chat up to the current turn,
    `completion`: the assistant turn trained), what SFTTrainer trains with the loss on the completion only. Rows
    curated before conversations (a `messages` column) are split at their last assistant message."""
    import datasets

    if not rows:
        raise ValueError("no training rows: the curated corpus is empty (check DIR/curated/stats.json)")
    return datasets.Dataset.from_list([prompt_completion(r) for r in rows])


def prompt_completion(row: dict) -> dict:
    """{prompt, completion} of a curated row (either form)."""
    if "prompt" in row:
        return {"prompt": row["prompt"], "completion": row["completion"]}
    msgs = row["messages"]
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    return {"prompt": msgs[:last], "completion": msgs[last:]}


def save_checkpoint(model, tokenizer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def read_log(path: str | Path) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
