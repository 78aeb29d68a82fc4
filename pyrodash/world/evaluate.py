"""Batched greedy decoding and grading for the world's models: base accuracies, the LLM's continuation of a gold
prefix, and where the SLM's first wrong step falls (the hidden-difficulty check).

These run in-process on the models being built (no backend, no server); `pyrodash eval` is the general path.
"""

from __future__ import annotations

import random
from collections import Counter

from pyrodash.backends.base import GenRequest
from pyrodash.data.example import Example
from pyrodash.grading import grade_batch
from pyrodash.world.task import STEP_SEP
from pyrodash.world.tokenizer import IM_END_ID, VOCAB, build_tokenizer, encode_chat, encode_text

ID_TO_TOKEN = {i: t for t, i in VOCAB.items()}


def decode_ids(ids: list[int]) -> str:
    """Text of generated ids up to (not including) `<|im_end|>`; other special tokens are dropped."""
    out = []
    for i in ids:
        if i == IM_END_ID:
            break
        tok = ID_TO_TOKEN.get(int(i), "")
        out.append(tok if len(tok) == 1 else "")
    return "".join(out)


def prompt_ids(question: str, prefix: str = "", system: str | None = None) -> list[int]:
    """Ids of a question put to a world model (generation prompt added), continuing `prefix` as its own answer."""
    msgs = [{"role": "system", "content": system}] if system else []
    ids, _ = encode_chat(msgs + [{"role": "user", "content": question}], add_generation_prompt=True)
    return ids + encode_text(prefix)


def max_new_tokens_for(ex: Example) -> int:
    """A generous cap: the gold solution's length plus slack."""
    return len(ex.meta.get("solution", "")) + 24 if ex.meta.get("solution") else 160


def greedy_generate(
    model, prompts: list[list[int]], max_new_tokens: int, batch_size: int = 200, progress=None, label: str = "generate"
) -> list[str]:
    """Greedy completions (text up to `<|im_end|>`) of `prompts`, longest first, in batches through the decode loop
    that serves and evaluates every model (`HFBackend.generate_ids`: finished rows leave the batch, tokens after the
    prompt go through `lean_step`). Before, transformers' `generate`: the same texts on the quick world of seed 0
    (every split the build evaluates), the build's evaluation 16 -> 6 s (`world.json` timings); the two decoders
    side by side on evaluation prompts: `benchmarks/decode_loop.py`."""
    from pyrodash.backends.hf.backend import HFBackend

    backend = HFBackend(model, build_tokenizer())
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[str] = [""] * len(prompts)
    task = progress.add_task(label, total=len(prompts)) if progress is not None else None
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        reqs = [GenRequest(messages=[], max_tokens=max_new_tokens, stop_token_ids=[IM_END_ID]) for _ in idx]
        for i, res in zip(idx, backend.generate_ids([prompts[i] for i in idx], reqs)):
            out[i] = decode_ids(res.token_ids)
        if task is not None:
            progress.update(task, advance=len(idx))
    return out


def grade(outputs: list[str], golds: list[str]) -> list[bool]:
    """`pyrodash.grading.grade_batch` (inline: this runs on the main thread)."""
    return grade_batch(outputs, golds, workers=0)


def evaluate_split(
    model, examples: list[Example], batch_size: int = 200, progress=None, label: str = "eval"
) -> tuple[list[str], list[bool]]:
    """(greedy outputs, correctness) of `model` answering `examples` alone (no system prompt)."""
    if not examples:
        return [], []
    cap = max(max_new_tokens_for(ex) for ex in examples)
    outs = greedy_generate(model, [prompt_ids(ex.question) for ex in examples], cap, batch_size, progress, label)
    return outs, grade(outs, [ex.gold for ex in examples])


def cut_at_random_boundary(ex: Example, rng: random.Random) -> str:
    """The gold solution cut after a random number of complete steps (0 .. all), boundary included."""
    steps = ex.meta["steps"]
    k = rng.randrange(0, len(steps) + 1)
    return "".join(s + STEP_SEP for s in steps[:k])


def evaluate_continue(
    model, examples: list[Example], system: str | None, seed: int, batch_size: int = 200, progress=None
) -> float:
    """Accuracy of `model` continuing the gold solution cut at a random step boundary, as its own assistant
    prefix, with `system` as system message (the engine's handoff: P_l + question + partial solution)."""
    if not examples:
        return float("nan")
    rng = random.Random(f"world-continue-{seed}")
    prefixes = [cut_at_random_boundary(ex, rng) for ex in examples]
    cap = max(max_new_tokens_for(ex) for ex in examples)
    prompts = [prompt_ids(ex.question, pre, system) for ex, pre in zip(examples, prefixes)]
    outs = greedy_generate(model, prompts, cap, batch_size, progress, "llm continue")
    ok = grade([pre + out for pre, out in zip(prefixes, outs)], [ex.gold for ex in examples])
    return sum(ok) / len(ok)


def first_wrong_step(output: str, gold_steps: list[str]) -> int | None:
    """Index of the first step of `output` that differs from the gold steps (None if all gold steps match)."""
    got = output.split(STEP_SEP)
    for i, step in enumerate(gold_steps):
        if i >= len(got) or got[i].strip() != step:
            return i
    return None


def first_wrong_distribution(examples: list[Example], outputs: list[str], correct: list[bool]) -> dict:
    """Where the SLM's first wrong step falls on the problems it gets wrong that contain an untaught lookup:
    a histogram of the step index, and how it sits relative to the first hard step."""
    hist: Counter[int] = Counter()
    rel: Counter[str] = Counter()
    for ex, out, ok in zip(examples, outputs, correct):
        hard = ex.meta.get("hard_steps") or []
        if ok or not hard:
            continue
        i = first_wrong_step(out, ex.meta["steps"])
        if i is None:  # every step right but the boxed answer wrong
            rel["only_final_answer"] += 1
            continue
        hist[i] += 1
        rel["before_first_hard" if i < hard[0] else "at_first_hard" if i == hard[0] else "after_first_hard"] += 1
    n = sum(hist.values())
    return {
        "n": n,
        "step_index": {str(k): hist[k] for k in sorted(hist)},
        "relative_to_first_hard": dict(sorted(rel.items())),
        "frac_first_step": (hist[0] / n) if n else float("nan"),
        "frac_at_first_hard": (rel["at_first_hard"] / n) if n else float("nan"),
    }
