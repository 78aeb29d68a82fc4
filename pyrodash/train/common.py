"""Small pieces the three stages share: the training log callback, datasets of chat rows, saving a checkpoint."""

from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback


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


def callbacks(args, log_path: str | Path) -> list:
    """A rich progress bar (TRL's) in place of tqdm, plus the JSONL log."""
    from trl.trainer.callbacks import RichProgressCallback

    args.disable_tqdm = True
    return [RichProgressCallback(), JsonlLogCallback(log_path)]


def quiet(trainer) -> None:
    """Drop transformers' PrinterCallback (added whenever tqdm is off): it prints every log dict to stdout, which the
    JSONL log and the rich bar already show."""
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)


def messages_dataset(rows: list[dict]):
    """A `datasets.Dataset` with only the `messages` column (what SFTTrainer's conversational path reads)."""
    import datasets

    if not rows:
        raise ValueError("no training rows: the curated corpus is empty (check DIR/curated/stats.json)")
    return datasets.Dataset.from_list([{"messages": r["messages"]} for r in rows])


def save_checkpoint(model, tokenizer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def read_log(path: str | Path) -> list[dict]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []
