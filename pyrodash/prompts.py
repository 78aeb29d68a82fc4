"""The fixed prompts of the paper and the evaluation prompt templates, versioned.

- P_s (`offload_system`): the offloading prompt given to the SLM as its system message; it enables `<offload>`.
- P_l (`completion_system`): the completion prompt given to the LLM after a handoff.
- `question_template`: how a benchmark question is put to any model (Qwen-math style for real benchmarks).
- `handoff_template`: for the "instruct" handoff style, the user message that carries query + partial solution.

A prompt set is chosen by name (`get_prompts("qwen-math-v1")`); changing a text means adding a new version, so
stored evaluation records stay comparable. The built-in world uses short texts because its models read characters.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

OFFLOAD_TOKEN = "<offload>"


@dataclass(frozen=True)
class Prompts:
    name: str
    question_template: str
    offload_system: str
    completion_system: str
    handoff_template: str

    def question(self, q: str) -> str:
        return self.question_template.format(question=q)

    def slm_messages(self, question: str, offload: bool = True) -> list[dict]:
        """Messages for the SLM: with P_s as system message when offloading is enabled (Corpus B), else none."""
        msgs = [{"role": "system", "content": self.offload_system}] if offload and self.offload_system else []
        return msgs + [{"role": "user", "content": self.question(question)}]

    def plain_messages(self, question: str) -> list[dict]:
        """Messages for a model answering alone (SLM-only, LLM-only, routers): no system prompt."""
        return [{"role": "user", "content": self.question(question)}]

    def to_dict(self) -> dict:
        return asdict(self)


def pack(slm_text: str) -> str:
    """Pack(O_s): the partial trace handed to the LLM. The engine never puts `<offload>` into `slm_text` (it is a
    stop token id), so this only guards against a model that spells the token out as text."""
    return slm_text.replace(OFFLOAD_TOKEN, "")


PROMPT_SETS: dict[str, Prompts] = {
    "qwen-math-v1": Prompts(
        name="qwen-math-v1",
        question_template="{question}\nPlease reason step by step, and put your final answer within \\boxed{{}}.",
        offload_system=(
            "You are the small model in a collaboration with a stronger model. Reason step by step and try to solve "
            "the problem yourself. If you reach a step you cannot do reliably, emit <offload> and stop: the stronger "
            "model will continue from your partial solution."
        ),
        completion_system=(
            "You are continuing a partial solution written by a smaller model. Continue the reasoning from exactly "
            "where it stops, fix nothing that is already correct, and put the final answer within \\boxed{}."
        ),
        handoff_template=(
            "Problem:\n{question}\n\nPartial solution (by a smaller model):\n{partial}\n\n"
            "Continue the solution from where it stops and put the final answer within \\boxed{{}}."
        ),
    ),
    "world-v1": Prompts(
        name="world-v1",
        question_template="{question}",
        offload_system="Solve; emit <offload> if stuck.",
        completion_system="Continue the solution.",
        handoff_template="{question}\nPartial:\n{partial}\nContinue.",
    ),
}


def get_prompts(name: str = "qwen-math-v1") -> Prompts:
    if name not in PROMPT_SETS:
        raise ValueError(f"unknown prompt set {name!r}; choose one of {sorted(PROMPT_SETS)}")
    return PROMPT_SETS[name]
