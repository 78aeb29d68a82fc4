"""The KV cache of our decode loop (`hf/backend.py`): transformers' `DynamicCache` whose layers write each
step's keys and values into a buffer that grows by doubling, instead of concatenating the whole cache every step.

transformers' `DynamicLayer.update` does `torch.cat([keys, new])`, which copies every cached position once per
generated token: O(L^2) copies over a decode of L tokens, and the largest single cost of a batched decode of the
world's small models on a CPU (measured: 30 s of a 181 s profiled evaluation, `torch.cat`). Here a step writes its one
position into spare room and hands the attention a view of the filled part; the buffer is copied only when it doubles.
The values the attention sees are the same as with concatenation.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_MIN_ROOM = 64  # positions allocated at least, and added at least when the buffer grows


class GrowingLayer(DynamicLayer):
    """A `DynamicLayer` backed by a preallocated [batch, heads, capacity, head_dim] buffer."""

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0  # filled positions

    def _grow(self, need: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        cap = max(need, 2 * (0 if self._k is None else self._k.shape[-2]), _MIN_ROOM)
        k = key_states.new_empty((*key_states.shape[:-2], cap, key_states.shape[-1]))
        v = value_states.new_empty((*value_states.shape[:-2], cap, value_states.shape[-1]))
        if self._k is not None and self._n:
            k[..., : self._n, :] = self._k[..., : self._n, :]
            v[..., : self._n, :] = self._v[..., : self._n, :]
        self._k, self._v = k, v

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self._n + key_states.shape[-2]
        if self._k is None or end > self._k.shape[-2]:
            self._grow(end, key_states, value_states)
        self._k[..., self._n : end, :] = key_states
        self._v[..., self._n : end, :] = value_states
        self._n = end
        self.keys, self.values = self._k[..., :end, :], self._v[..., :end, :]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the rows `indices` (sequences that are still decoding): their filled positions and `_MIN_ROOM`
        more are copied into the new buffer, not its whole room (after a doubling up to half of it is spare; the next
        `update` that needs more grows it as always). Measured, the SLM alone on the quick world's six-turn
        conversations, one thread: 4.2 s of its 44 s went here when whole buffers were copied."""
        if self._k is None:
            return
        keep = min(self._k.shape[-2], self._n + _MIN_ROOM)
        self._k, self._v = self._k[indices, :, :keep], self._v[indices, :, :keep]
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `abs(tokens_to_remove)` positions (`DynamicLayer.crop`'s convention: a negative count or 0);
        the buffer keeps its room, the next `update` writes over them."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop({tokens_to_remove}): give the positions to drop as a negative count")
        if tokens_to_remove == 0 or not self.is_initialized or self._k is None:
            return
        self._n = max(0, self._n - abs(tokens_to_remove))
        self.keys, self.values = self._k[..., : self._n, :], self._v[..., : self._n, :]

    def nbytes(self) -> int:
        """Bytes of the buffer (what keeping this layer costs)."""
        return 0 if self._k is None else self._k.nbytes + self._v.nbytes


def growing_cache(config) -> DynamicCache:
    """A `DynamicCache` for `config`'s model whose layers are `GrowingLayer`s (full attention only: a model with
    sliding-window layers keeps transformers' own layers)."""
    cache = DynamicCache(config=config)
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [GrowingLayer() for _ in cache.layers]
    return cache


def growing(cache: DynamicCache) -> bool:
    """Whether every layer of `cache` is a `GrowingLayer` (full attention: a cropped cache is a valid prefix)."""
    return bool(cache.layers) and all(isinstance(layer, GrowingLayer) for layer in cache.layers)


def row_cache(cache: DynamicCache, row: int, start: int, config) -> DynamicCache:
    """A one-row copy of `cache`'s row `row` from position `start` on (a left-padded row without its padding)."""
    out = growing_cache(config)
    for src, dst in zip(cache.layers, out.layers, strict=True):
        dst.update(src.keys[row : row + 1, :, start:], src.values[row : row + 1, :, start:])  # (copied in)
    return out


def stack_rows(caches: list[DynamicCache], config) -> DynamicCache:
    """One left-padded batch cache from one-row caches: row i holds cache i's positions at the right end, zeros before
    them (masked out by the batch's attention mask, as left padding is)."""
    out = growing_cache(config)
    width = max(c.layers[0].keys.shape[-2] for c in caches)
    for n, dst in enumerate(out.layers):
        first = caches[0].layers[n].keys
        shape = (len(caches), first.shape[1], width, first.shape[-1])
        keys, values = first.new_zeros(shape), first.new_zeros(shape)
        for i, c in enumerate(caches):
            k, v = c.layers[n].keys, c.layers[n].values
            keys[i, :, width - k.shape[-2] :] = k[0]
            values[i, :, width - v.shape[-2] :] = v[0]
        dst.update(keys, values)
    return out
