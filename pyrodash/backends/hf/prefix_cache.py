"""The in-process backend's prefix cache (`hf/backend.py`): the KV of the sequences decoded for one answer,
keyed by token ids, so that the answer's next request (a relay's SLM resuming after the LLM's step) prefills only
the tokens that are new to it, as vLLM's automatic prefix caching does within one sequence's requests.

    cache = PrefixCache(max_entries=1024, max_bytes=512 << 20)   # HFBackend(...).prefix_cache; None: off
    kv, n = cache.take(prompt_ids, key, weights)   # n positions of `kv` are `prompt_ids[:n]`: prefill the rest
    cache.put(ids, kv, key, weights)               # after the decode: its ids (prompt + generated) and their KV

Only requests with the same `key` (`GenRequest.cache_key`: one answer) share KV, so a request's bill never depends
on what else the backend served before (serve = eval). Bounded (entries and bytes, least recently used out first)
and tied to the weights it was computed with (`weights`: a fingerprint the backend takes per request; a training
step changes it and empties the cache). Why and what it measured: docs/relay.md (The SLM's prefix cache).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from pyrodash.backends.hf.kv_cache import growing


@dataclass
class _Entry:
    ids: list[int]  # the sequence: its prompt, then what was generated (the KV covers `n` of them)
    kv: object  # a one-row DynamicCache of `GrowingLayer`s
    n: int  # positions of `kv`
    key: object  # the answer it belongs to
    nbytes: int


@dataclass
class PrefixCache:
    """Least recently used KV caches of decoded sequences, at most `max_entries` and `max_bytes`."""

    max_entries: int = 1024
    max_bytes: int = 512 << 20
    hits: int = 0  # keyed requests that reused a sequence's KV
    misses: int = 0  # keyed requests that found none (their answer's first request, or evicted)
    served: int = 0  # prompt tokens served from the cache (not prefilled)
    evicted: int = 0  # entries dropped for room or for new weights
    _entries: OrderedDict = field(default_factory=OrderedDict, repr=False)
    _weights: object = field(default=None, repr=False)
    _next: int = field(default=0, repr=False)
    _bytes: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        if self.max_entries < 1 or self.max_bytes < 1:
            raise ValueError(f"PrefixCache needs max_entries >= 1 and max_bytes >= 1 (None turns it off), got {self}")

    def __len__(self) -> int:
        return len(self._entries)

    def nbytes(self) -> int:
        return self._bytes

    def take(self, prompt: list[int], key: object, weights: object) -> tuple[object | None, int]:
        """The KV of `key`'s sequence that shares the longest prefix with `prompt`, cropped to it (never all of
        `prompt`: its last token is prefilled for the logits); the entry leaves the cache (the decode extends that KV
        in place and puts it back). (None, 0): none."""
        self._check(weights)
        best, reuse = None, 0
        for k, e in self._entries.items():
            if e.key == key:
                usable = min(_common(e.ids, prompt), e.n, len(prompt) - 1)
                if usable > reuse:
                    best, reuse = k, usable
        if best is None:
            self.misses += 1
            return None, 0
        e = self._entries.pop(best)
        self._bytes -= e.nbytes
        if e.n > reuse:
            e.kv.crop(reuse - e.n)
        self.hits, self.served = self.hits + 1, self.served + reuse
        return e.kv, reuse

    def put(self, ids: list[int], kv, key: object, weights: object) -> None:
        """Keep `kv` (one row, its positions `ids[:n]`) as `key`'s sequence `ids`. The last id's position is never
        kept (a decode that ends does not feed its last token; one whose row left a batch early did: both keep the
        same). The least recently used entries leave while over the bounds (a sequence over `max_bytes`: not kept)."""
        self._check(weights)
        if not growing(kv):
            return
        n = kv.get_seq_length()
        if n > len(ids) - 1:
            kv.crop(len(ids) - 1 - n)
            n = len(ids) - 1
        size = sum(layer.nbytes() for layer in kv.layers)
        if n <= 0 or size > self.max_bytes:
            return
        self._next += 1
        self._entries[self._next] = _Entry(list(ids), kv, n, key, size)
        self._bytes += size
        while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
            self._bytes -= self._entries.popitem(last=False)[1].nbytes
            self.evicted += 1

    def clear(self) -> None:
        self.evicted += len(self._entries)
        self._entries.clear()
        self._bytes = 0

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
