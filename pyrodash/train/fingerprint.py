"""How `datasets` fingerprints a tokenizer, made cheap: from its serialized form, not by pickling every attribute.

TRL's SFTTrainer prepares its dataset with a few `Dataset.map` calls whose `fn_kwargs` hold the tokenizer, and
`datasets` fingerprints each call by pickling those arguments with dill, in Python, one object at a time. A real
model's tokenizer is large (Gemma 3's: 262,144 tokens and their merges as a list of tuples), so each trainer spent
most of its set-up hashing it: measured, Gemma 3 270M's Stage 1 and Stage 2 on two cores, 62 of the 234 seconds
they took (five `map` calls each). Here a fast tokenizer is fingerprinted by its class, its backend's JSON (vocabulary,
merges, normalizer, added tokens: `tokenizers.Tokenizer.to_str`), its chat template, special tokens, padding and
truncation sides and maximum length: one string, hashed at C speed. The fingerprint changes when any of them does,
as `datasets` needs for its cache files (and stays the same for the same tokenizer loaded again).

    register_tokenizer_fingerprint(tokenizer)   # before building an SFTTrainer with it
"""

from __future__ import annotations

import json


def tokenizer_state(tokenizer) -> str:
    """The string a fast tokenizer is fingerprinted by (see the module docstring)."""
    return json.dumps(
        {
            "class": f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}",
            "backend": tokenizer.backend_tokenizer.to_str(),
            "chat_template": tokenizer.chat_template,
            "special_tokens": tokenizer.special_tokens_map,
            "sides": [tokenizer.padding_side, tokenizer.truncation_side],
            "model_max_length": tokenizer.model_max_length,
        },
        sort_keys=True,
        default=str,
    )


def _not_a_tokenizer(state: str):
    raise TypeError("a tokenizer's dataset fingerprint is not a tokenizer: it cannot be unpickled")


def _save_tokenizer(pickler, obj) -> None:
    pickler.save_reduce(_not_a_tokenizer, (tokenizer_state(obj),), obj=obj)


def register_tokenizer_fingerprint(tokenizer) -> bool:
    """Fingerprint `tokenizer`'s type from its serialized form in `datasets` (its hashing pickler only: nothing else
    pickles differently); False, and nothing changed, for a tokenizer without a fast backend."""
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        return False
    from datasets.utils._dill import Pickler, pklregister

    if Pickler.dispatch.get(type(tokenizer)) is not _save_tokenizer:
        pklregister(type(tokenizer))(_save_tokenizer)
    return True
