"""The range rule: past the SLM's range (a turn count, or tokens of its prompt) a turn is the LLM's alone.

    rule = RangeRule(max_turns=3)                 # turns 4, 5, ... of a conversation: the LLM alone
    engine = CollaborateEngine(slm, llm, prompts, prices, range_rule=rule)   # or per request: range_rule=...

A routed turn runs as mode "llm" and its record says `routed: "range"` (`range_reason`: "turns" or "tokens").
`pyrodash calibrate --range` picks `max_turns` on validation conversations; why the LLM alone and not a handoff
at token 0, and why turns before tokens: docs/conversations.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

ROUTED = "range"  # the `routed` value of a turn the rule gave to the LLM


@dataclass(frozen=True)
class RangeRule:
    """The SLM's range; a field left None does not limit. Both None: the rule is off."""

    max_turns: int | None = None  # the last user turn the SLM may take (turn max_turns + 1 on: the LLM; 0: all)
    max_context_tokens: int | None = None  # the most tokens the SLM's prompt (P_s + conversation) may hold

    def __post_init__(self) -> None:
        for name, least in (("max_turns", 0), ("max_context_tokens", 1)):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < least):
                raise ValueError(f"range rule {name}={v!r} must be an integer >= {least} (or null: no limit)")

    @property
    def active(self) -> bool:
        return self.max_turns is not None or self.max_context_tokens is not None

    @classmethod
    def of(cls, value: RangeRule | dict | None) -> RangeRule:
        """A rule from a config / wire value: a mapping with max_turns and/or max_context_tokens, None = off."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise ValueError(f"range rule {value!r}: use a mapping {{max_turns, max_context_tokens}} or null")
        unknown = sorted(set(value) - {"max_turns", "max_context_tokens"})
        if unknown:
            raise ValueError(f"range rule: unknown keys {unknown}; use max_turns and/or max_context_tokens")
        return cls(value.get("max_turns"), value.get("max_context_tokens"))

    def to_dict(self) -> dict:
        return {"max_turns": self.max_turns, "max_context_tokens": self.max_context_tokens}

    def reason(self, turn: int, prompt_tokens: Callable[[], int | None]) -> str | None:
        """Why a turn is past the range ("turns" or "tokens"), or None when the SLM may take it. `prompt_tokens`
        counts the SLM's prompt (called only when a token limit is set); None from it is an error: a token limit
        on an SLM that cannot count its prompt is refused rather than silently skipped."""
        if self.max_turns is not None and turn > self.max_turns:
            return "turns"
        if self.max_context_tokens is not None:
            n = prompt_tokens()
            if n is None:
                raise ValueError("range rule max_context_tokens needs an SLM that counts its prompt (in process)")
            if n > self.max_context_tokens:
                return "tokens"
        return None
