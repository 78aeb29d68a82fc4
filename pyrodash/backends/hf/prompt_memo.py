"""The in-process backend's memo of its prompts (`pyrodash.backends.hf.backend`): each chat template rendered and each
prompt text tokenized once, however many times a request's prompt is asked for (the server's context check, fitting
it to the window, the LLM-only estimate, the decode itself), keyed by what decides the result.

    memo = PromptMemo(max_size=1 << 20)   # characters and token ids held, keys included
    text = memo.get(("template", messages_json, template), lambda: render(messages))   # rendered once
    ids = memo.get(("ids", text, vocab_size), lambda: tokenize(text), lambda ids: len(text) + len(ids))

Bounded by the characters and token ids it holds (least recently used out first); thread-safe (the server measures
prompts off the event loop while decode threads run). A key holds everything its value depends on (the messages, the
chat template and the tokenizer's vocabulary size), so a changed template or an added token is never served stale.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")


class PromptMemo:
    """Values by key, least recently used out first once `max_size` (the sum of each value's size) is passed."""

    def __init__(self, max_size: int = 1 << 20) -> None:
        self.max_size, self.size = max_size, 0
        self._items: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, make: Callable[[], T], size: Callable[[T], int] = len) -> T:
        """The value kept for `key`, else `make()` kept (a value larger than the whole memo is returned, not kept)."""
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]  # type: ignore[return-value]
        value = make()  # (outside the lock: two threads may make the same value, with the same result)
        n = size(value)
        if n <= self.max_size:
            with self._lock:
                if key not in self._items:
                    self._items[key] = (value, n)
                    self.size += n
                while self.size > self.max_size:
                    self.size -= self._items.popitem(last=False)[1][1]
        return value

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.size = 0

    def __len__(self) -> int:
        return len(self._items)
