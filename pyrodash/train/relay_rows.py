"""Relay training rows (`curate.relay: true`): a hard example written as SLM text, `<offload>`, the LLM's step, SLM
text, ... and the loss masked on the LLM's steps.

    text, spans = relay_target(steps, "\\n\\n", chosen=[1, 3])     # curation: spans are the LLM's, in the content
    dataset, cfg = relay_dataset(rows, tok, cfg)                    # Stage 2: input_ids + assistant_masks (0 on spans)

A row is what the SLM's context holds at a relay resume (docs/relay.md): one token sequence, the LLM's step and its
separator after each `<offload>`. The loss is on the SLM's tokens (its text, each `<offload>`, its end of turn) and
not on the LLM's (`llm_spans`: character spans of the completion's content). All of it is the LLM's reconstruction:
after an untaught step the base SLM's own answer is wrong, so only the reconstruction has the SLM text that follows
the LLM's step (docs/training.md, "Relay").
"""

from __future__ import annotations

import copy

from pyrodash.chat import render_chat
from pyrodash.prompts import OFFLOAD_TOKEN
from pyrodash.train.common import prompt_completion


def relay_target(steps: list[str], step_sep: str, chosen: list[int]) -> tuple[str, list[list[int]]]:
    """The completion's content with `<offload>` before each chosen step, and each chosen step with its separator
    (none after the last step) as an LLM span [start, end) of that content."""
    text, spans, last = "", [], len(steps) - 1
    for j, step in enumerate(steps):
        tail = step_sep if j < last else ""
        if j in chosen:
            text += OFFLOAD_TOKEN
            spans.append([len(text), len(text) + len(step) + len(tail)])
        text += step + tail
    return text, spans


def has_llm_spans(rows: list[dict]) -> bool:
    return any(r.get("llm_spans") for r in rows)


def relay_dataset(rows: list[dict], tok, cfg):
    """(a pre-tokenized `datasets.Dataset` of `rows`, the config to train it with). Each row: `input_ids` (the chat
    template rendered as SFTTrainer renders it) and `assistant_masks`, 1 where the loss is: the assistant's tokens
    (`assistant_only_loss`, the template's generation markers), else the completion's (completion-only loss), else
    every token; 0 on every token that overlaps an LLM span. TRL builds the labels from `assistant_masks` (it always
    applies it); the returned config has its own masking off, since a pre-tokenized row is no longer a chat."""
    import datasets

    out = [relay_tokens(r, tok, cfg) for r in rows]
    cfg = copy.copy(cfg)
    cfg.assistant_only_loss, cfg.completion_only_loss = False, False
    return datasets.Dataset.from_list(out), cfg


def relay_tokens(row: dict, tok, cfg) -> dict:
    """One row's `input_ids` and `assistant_masks` (`relay_dataset`)."""
    pc = prompt_completion(row)
    prompt_text = render_chat(tok, pc["prompt"])
    full = render_chat(tok, pc["prompt"] + pc["completion"], generation=False)
    spans = row.get("llm_spans") or []
    if not full.startswith(prompt_text):
        raise ValueError(f"row {row.get('id')}: the chat template renders the prompt differently before a completion")
    content = pc["completion"][0]["content"] if pc["completion"] else ""
    if spans and not full[len(prompt_text) :].startswith(content):
        raise ValueError(f"row {row.get('id')}: the chat template does not render the completion as it is")
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    if getattr(cfg, "assistant_only_loss", False):
        marked = tok.apply_chat_template(
            pc["prompt"] + pc["completion"], tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        if list(marked["input_ids"]) != list(ids):
            raise ValueError(f"row {row.get('id')}: the template's tokens differ from its rendered text's")
        mask = list(marked["assistant_masks"])
    elif getattr(cfg, "completion_only_loss", None) is not False:
        mask = [int(s >= len(prompt_text)) for s, _ in offsets]
    else:
        mask = [1] * len(ids)
    at = len(prompt_text)
    for i, (s, e) in enumerate(offsets):
        if any(s < at + b and at + a < e for a, b in spans):
            mask[i] = 0
    return {"input_ids": list(ids), "assistant_masks": mask}
