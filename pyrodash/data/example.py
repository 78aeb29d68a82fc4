"""The uniform record every benchmark loader and the built-in world produce."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Example:
    id: str  # unique within the benchmark
    benchmark: str  # where it comes from (math500, world:tier3, chat:<file>, ...)
    question: str  # the user's message (a conversation's history is in meta.history)
    gold: str  # the reference answer, as a string (graded with pyrodash.grading.is_correct)
    meta: dict = field(default_factory=dict)  # loader-specific extras (solution, subject, world step info, ...)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Example:
        return cls(
            id=str(d["id"]),
            benchmark=d["benchmark"],
            question=d["question"],
            gold=str(d["gold"]),
            meta=d.get("meta") or {},
        )
