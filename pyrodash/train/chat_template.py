"""Chat templates for training: which one a model trains with, and which loss mask its rows get (docs/real-models.md).

    tok.chat_template = resolve_template(tok, cfg.chat_template, path)   # given > the tokenizer's own > the default
    cfg = loss_mask_config(cfg, rows, tok)                                 # completion-only loss where it suffices

Curated rows are prompt-completion pairs. A template with `{% generation %}` markers (the built-in world's) keeps
TRL's assistant-only loss as recipes ask (labels unchanged). A template without them (most published ones, Gemma's)
trains on the completion (TRL's `completion_only_loss`) when each completion is one assistant turn; a completion
with several assistant turns needs the markers, and stops with one error naming the fix.
"""

from __future__ import annotations

import copy
import logging

from pyrodash.train.common import prompt_completion

log = logging.getLogger("pyrodash.train")


def has_generation_markers(template: str | None) -> bool:
    return bool(template) and "generation" in template and "endgeneration" in template


def assistant_turns(row: dict) -> int:
    """Assistant messages in the trained part of a curated row (its completion, or after its last prompt message)."""
    return sum(m.get("role") == "assistant" for m in prompt_completion(row)["completion"])


def loss_mask_config(cfg, rows: list[dict], tok):
    """`cfg`, or a copy with completion-only loss in place of the assistant-only loss its template cannot give
    (module docstring). A row with several assistant turns and no markers: one ValueError naming the fix."""
    if not getattr(cfg, "assistant_only_loss", False) or has_generation_markers(tok.chat_template):
        return cfg
    several = sum(assistant_turns(r) > 1 for r in rows)
    if several:
        raise ValueError(
            f"{several} training row(s) hold several assistant turns in their completion: the loss on assistant "
            "tokens only needs `{% generation %}` markers, which this model's chat template lacks. Give a template "
            "with them (`chat_template:` in the recipe, `--chat-template FILE`), or set assistant_only_loss: false "
            "to train on the whole completion"
        )
    out = copy.copy(cfg)
    out.assistant_only_loss, out.completion_only_loss = False, True
    return out
