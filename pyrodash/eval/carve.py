"""A validation share carved from a user's own evaluation data, for picking an operating point (`pyrodash select`)
on questions the report's figures do not come from.

    val, rest = carve_val(examples, share=0.2, seed=0)      # whole conversations, the same ones for any order

The built-in world has its own `world:val` split; a user's benchmark (a JSONL file, a chat log) has one set of
examples, so `pyrodash eval --val-share X` carves a seeded share of its conversations (an example without
`meta.conversation` is a conversation of one) into RUN/val, evaluated with the candidates `val_methods` keeps, and
the rest into RUN. `pyrodash curate` carves the same way from the data it is given (`curate.val_share`), into
DIR/curated/val.jsonl, kept out of training.
"""

from __future__ import annotations

import hashlib

from pyrodash.data.example import Example
from pyrodash.eval.build import SWEEPS, method_specs

# what a validation evaluation needs: every PyroDash point (the candidates) and the LLM alone (the cost base)
VAL_METHODS = frozenset({"llm", "pyrodash", *SWEEPS})


def val_methods(methods: list) -> list:
    """The entries of an eval config's `methods` a validation evaluation runs (`VAL_METHODS`)."""
    return [m for m, (kind, _) in zip(methods, method_specs(methods)) if kind in VAL_METHODS]


def conversation_key(ex: Example) -> str:
    """The unit that goes to one side whole: the example's benchmark and conversation (or its id)."""
    conv = (ex.meta or {}).get("conversation")
    return f"{ex.benchmark}\x00{'c:' + str(conv) if conv is not None else 'q:' + str(ex.id)}"


def carve_val(
    examples: list[Example], share: float, seed: int = 0, knob: str = "--val-share"
) -> tuple[list[Example], list[Example]]:
    """(val, rest): round(share x conversations) of the conversations, the ones whose seeded hash ranks lowest, each
    with every turn; both lists keep the examples' order. Neither side is empty when share is in (0, 1) and there are
    two conversations or more. `knob`: what the user set, named in the errors (`--val-share`, `curate.val_share`)."""
    if not 0.0 < share < 1.0:
        raise ValueError(f"{knob} {share:g}: give a fraction between 0 and 1, e.g. 0.2")
    keys = list(dict.fromkeys(conversation_key(ex) for ex in examples))
    if len(keys) < 2:
        raise ValueError(f"{knob} needs two conversations or more to carve from; the data holds {len(keys)}")
    n = min(max(round(share * len(keys)), 1), len(keys) - 1)
    rank = sorted(keys, key=lambda k: hashlib.sha256(f"{seed}\x00{k}".encode()).hexdigest())
    chosen = set(rank[:n])
    val = [ex for ex in examples if conversation_key(ex) in chosen]
    return val, [ex for ex in examples if conversation_key(ex) not in chosen]
