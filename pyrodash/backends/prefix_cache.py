"""The in-process backend's prefix cache (`pyrodash.backends.hf`): the KV caches of recently decoded sequences, keyed
by their token ids, so that a request continuing one of them prefills only what is new (a relay's SLM resuming after
the LLM's step; the next turn of a conversation), as vLLM's automatic prefix caching does.

    cache = PrefixCache(max_entries=32, max_bytes=256 << 20)     # HFBackend(...).prefix_cache; None: off
    kv, n = cache.take(prompt_ids, weights)    # n positions of `kv` are `prompt_ids[:n]`: prefill prompt_ids[n:]
    cache.put(ids, kv, prompt_len, weights)    # after the decode: its ids (prompt + generated) and their KV

Bounded (entries and bytes, least recently used out first) and tied to the weights it was computed with (`weights`:
a fingerprint the backend takes per request; a training step changes it and empties the cache). Reuse rule, why
only continuations, and the counts it keeps: docs/relay.md (The SLM's prefix cache).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pyrodash.backends.kv_cache import growing


@dataclass
class _Entry:
    ids: list[int]  # the sequence: its prompt, then what was generated (the KV covers `n` of them)
    kv: object  # a one-row DynamicCache of `GrowingLayer`s
    n: int  # positions of `kv`
    prompt_len: int  # the sequence's own prompt (a request continues it when it goes past this)
    nbytes: int


@dataclass
class PrefixCache:
    """Least recently used KV caches of decoded sequences, at most `max_entries` and `max_bytes`."""

    max_entries: int = 32
    max_bytes: int = 256 << 20
    hits: int = 0  # requests that reused a sequence's KV
    misses: int = 0  # requests looked up that found none
    served: int = 0  # prompt tokens served from the cache (not prefilled)
    evicted: int = 0  # entries dropped for room or for new weights
    _entries: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _weights: object = field(default=None, repr=False)
    _key: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError(f"PrefixCache needs max_entries >= 1 and max_bytes >= 1 (None turns it off), got {self}")

    def __len__(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        return sum(e.nbytes for e in self._entries.values())

    def take(self, prompt: list[int], weights: object) -> tuple[object | None, int]:
        """The KV of the sequence `prompt` continues furthest, cropped to the positions `prompt` shares with it (never
        all of `prompt`: its last token is prefilled for the logits); the entry leaves the cache (the decode extends
        that KV in place and puts it back). (None, 0): none. A request continues a sequence when its prompt covers that
        sequence's prompt and goes past it: a new question that shares only a system prompt, or the same prompt
        again, is not a continuation and prefills in full."""
        self._check(weights)
        best, reuse = None, 0
        for key, e in self._entries.items():
            if len(prompt) <= e.prompt_len:
                continue
            common = _common(e.ids, prompt)
            usable = min(common, e.n, len(prompt) - 1)
            if common >= e.prompt_len and usable > reuse:
                best, reuse = key, usable
        if best is None:
            self.misses += 1
            return None, 0
        e = self._entries.pop(best)
        if e.n > reuse:
            e.kv.crop(reuse - e.n)
        self.hits, self.served = self.hits + 1, self.served + reuse
        return e.kv, reuse

    def put(self, ids: list[int], kv, prompt_len: int, weights: object) -> None:
        """Keep `kv` (one row, its positions `ids[:n]`) as the sequence `ids`, whose own prompt is `ids[:prompt_len]`;
        the least recently used entries leave while over the bounds (a sequence over `max_bytes` is not kept)."""
        self._check(weights)
        if not growing(kv):
            return
        n = kv.get_seq_length()
        size = sum(layer.nbytes() for layer in kv.layers)
        if n == 0 or size > self.max_bytes:
            return
        self._key += 1
        self._entries[self._key] = _Entry(list(ids), kv, n, prompt_len, size)
        while len(self._entries) > self.max_entries or self.nbytes() > self.max_bytes:
            self._entries.popitem(last=False)
            self.evicted += 1

    def clear(self) -> None:
        self.evicted += len(self._entries)
        self._entries.clear()

    def _check(self, weights: object) -> None:
        if weights != self._weights:  # other weights: every KV kept is stale
            self.clear()
            self._weights = weights


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
