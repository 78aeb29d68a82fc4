"""Conversations as training turns: the world's conversation splits and a user's own chat logs, one `Example` per
assistant turn, so curation judges and rewrites each turn exactly as it judges a single question.

A chat log is a JSONL file of OpenAI `messages`, one conversation per line (what `pyrodash serve` receives); every
assistant message that answers a user message is a turn. `turn_messages(prompts, ex)` is the chat a model is asked
for a turn. The format, with an example, and what a turn's history, question and gold are: docs/internals.md.
"""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.data.example import Example
from pyrodash.engine.conversation import example_messages
from pyrodash.grading import extract_answer
from pyrodash.prompts import Prompts


def is_chat_log(path: str | Path) -> bool:
    """Whether a .jsonl file holds chat logs (its first row is a message list or has `messages`)."""
    with Path(path).open() as f:
        for line in f:
            if line.strip():
                row = json.loads(line)
                return isinstance(row, list) or (isinstance(row, dict) and "messages" in row)
    return False


def load_chat_turns(path: str | Path, limit: int | None = None) -> tuple[list[Example], dict]:
    """(one Example per answered turn of the first `limit` conversations, counts). Bad lines are a ValueError naming
    the line and the fix."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"chat log {path} not found")
    out: list[Example] = []
    counts = {"conversations": 0, "turns": 0, "turns_without_answer": 0}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if limit is not None and counts["conversations"] >= limit:
            break
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(
                f"{path}:{n} is not JSON ({e.msg}); one conversation per line: "
                '{"messages": [{"role": "user", "content": ...}, ...]}'
            ) from None
        msgs = row.get("messages") if isinstance(row, dict) else row
        if not isinstance(msgs, list) or not all(
            isinstance(m, dict)
            and isinstance(m.get("content"), str)
            and m.get("role") in ("system", "developer", "user", "assistant")
            for m in msgs
        ):
            raise ValueError(
                f"{path}:{n}: `messages` must be a list of {{role: system|user|assistant, content: <text>}}}} objects"
            )
        cid = str(row.get("id", f"{path.stem}-{n}")) if isinstance(row, dict) else f"{path.stem}-{n}"
        counts["conversations"] += 1
        turn = 0
        for i, m in enumerate(msgs):
            if m["role"] != "assistant" or i == 0 or msgs[i - 1]["role"] != "user":
                continue
            turn += 1
            gold = m.get("gold") or extract_answer(m["content"])
            if gold is None:
                counts["turns_without_answer"] += 1
                continue
            history = [{"role": x["role"], "content": x["content"]} for x in msgs[: i - 1]]
            out.append(
                Example(
                    id=f"{cid}-t{turn}",
                    benchmark=f"chat:{path.stem}",
                    question=msgs[i - 1]["content"],
                    gold=str(gold),
                    meta={"turn": turn, "conversation": cid, "history": history, "verbatim": True},
                )
            )
            counts["turns"] += 1
    return out, counts


def turn_messages(prompts: Prompts, ex: Example) -> list[dict]:
    """The chat a model is asked for `ex`: a logged turn verbatim (`meta.verbatim`), else the example's history and
    its question under the prompt set's template."""
    if ex.meta.get("verbatim"):
        return [dict(m) for m in ex.meta.get("history") or []] + [{"role": "user", "content": ex.question}]
    return example_messages(prompts, ex.question, ex.meta.get("history"))


def row_messages(prompts: Prompts, row: dict) -> list[dict]:
    """`turn_messages` of a curated or held-out row (an `Example.to_dict`, single question or conversation turn)."""
    return turn_messages(prompts, Example.from_dict(row))
