"""GlimpRouter (Zeng et al., 2026): training-free, step-level SLM→LLM collaboration by first-token entropy.

At each step boundary the SLM "glimpses" the first token of the next step; if its entropy H is below τ the SLM writes
the step, else the LLM writes it. `run_glimprouter` is batched: it advances every unfinished query by one step per
round, with one SLM batch and one LLM batch per round, through a `gen(role, requests)` callable (so in-process and
HTTP backends both work). The entropy, the steps and how each call is billed: docs/internals.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from pyrodash.backends.base import GenRequest, GenResult
from pyrodash.cost import Usage
from pyrodash.grading import extract_answer

BOUNDARY = "\n\n"


def first_token_entropy(top_logprobs: dict[str, float]) -> float:
    """Entropy (nats) of the renormalised top-k distribution of one position."""
    if not top_logprobs:
        raise ValueError("GlimpRouter needs the SLM's top-k log-probabilities; request top_logprobs > 0")
    m = max(top_logprobs.values())
    ps = [math.exp(v - m) for v in top_logprobs.values()]
    z = sum(ps)
    return -sum(p / z * math.log(p / z) for p in ps if p > 0)


@dataclass
class _State:
    messages: list[dict]
    sampling: dict
    text: str = ""
    segments: list[dict] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    kept: int = 0  # answer tokens kept so far (both models)
    slm_seen: int = 0  # tokens in the SLM's (notional) KV cache
    entropies: list[float] = field(default_factory=list)
    handoff: int | None = None  # SLM tokens kept before the first LLM step
    done: bool = False
    finish: str = "stop"


def _step_end(g: GenResult, st: _State, text: str, boundary: str) -> bool:
    """Append a finished step; True when the answer is complete."""
    if g.finish_reason == "length":
        st.text += text
        st.finish = "length"
        return True
    eos = g.eos if g.eos is not None else extract_answer(text) is not None
    st.text += text if eos else text + boundary
    return bool(eos)


def run_glimprouter(
    items: list[tuple[list[dict], dict]],
    tau: float,
    gen: Callable[[str, list[GenRequest]], list[GenResult]],
    max_tokens: int,
    boundary: str = BOUNDARY,
    top_k: int = 20,
    max_steps: int = 64,
    slm_logit_bias: dict[int, float] | None = None,
) -> list[dict]:
    """Answer each (messages, sampling) item; returns one partial record per item (output, usage, segments...).
    `gen(role, reqs)` ("slm" | "llm") returns one `GenResult` per request (`pyrodash.backends.retry.run_requests`;
    its `eos`: True ended by EOS, False by a stop string, None unknown).
    `slm_logit_bias` is added to the SLM's logits (e.g. to ban `<offload>` in a base SLM)."""
    if tau < 0:
        raise ValueError(f"GlimpRouter threshold tau={tau} must be >= 0")
    states = [_State(m, s) for m, s in items]
    for _ in range(max_steps):
        live = [st for st in states if not st.done]
        if not live:
            break
        to_llm = _slm_round(live, tau, gen, max_tokens, boundary, top_k, slm_logit_bias)
        if to_llm:
            _llm_round(to_llm, gen, max_tokens, boundary)
    return [_result(st) for st in states]


def _slm_round(live: list[_State], tau: float, gen, max_tokens: int, boundary: str, top_k: int, bias) -> list[_State]:
    """One SLM step for every live query: kept when its glimpse is sure (H < τ); the others, returned, go to the
    LLM (billed the glimpse: the prompt and one token)."""
    reqs = [
        GenRequest(
            messages=st.messages,
            prefix=st.text,
            max_tokens=max_tokens - st.kept,
            stop=[boundary],
            top_logprobs=top_k,
            logit_bias=dict(bias or {}),
            **st.sampling,
        )
        for st in live
    ]
    to_llm = []
    for st, g in zip(live, gen("slm", reqs)):
        h = first_token_entropy(g.top_logprobs[0]) if g.top_logprobs else 0.0
        st.entropies.append(h)
        new_in = max(g.prompt_tokens - st.slm_seen, 0)
        if h >= tau:  # glimpse only: the prompt and one token; the LLM writes this step
            st.usage += Usage(slm_in=new_in, slm_out=1)
            st.slm_seen = g.prompt_tokens
            to_llm.append(st)
            continue
        st.usage += Usage(slm_in=new_in, slm_out=g.completion_tokens)
        st.slm_seen = g.prompt_tokens + g.completion_tokens
        st.kept += g.completion_tokens
        before = len(st.text)
        st.done = _step_end(g, st, g.text, boundary) or st.kept >= max_tokens
        st.segments.append({"by": "slm", "text": st.text[before:]})
    return to_llm


def _llm_round(to_llm: list[_State], gen, max_tokens: int, boundary: str) -> None:
    """The LLM writes this step of each query handed to it, billed with its whole growing prompt."""
    reqs = [
        GenRequest(
            messages=st.messages, prefix=st.text, max_tokens=max_tokens - st.kept, stop=[boundary], **st.sampling
        )
        for st in to_llm
    ]
    for st, g in zip(to_llm, gen("llm", reqs)):
        if st.handoff is None:
            st.handoff = st.kept  # only SLM tokens were kept before the first LLM step
        st.usage += Usage(
            llm_in=g.prompt_tokens, llm_out=g.completion_tokens, llm_cached_in=g.cached_tokens or 0, llm_calls=1
        )
        st.kept += g.completion_tokens
        before = len(st.text)
        st.done = _step_end(g, st, g.text, boundary) or st.kept >= max_tokens
        st.segments.append({"by": "llm", "text": st.text[before:]})


def _result(st: _State) -> dict:
    """A query's partial record; one still unfinished after `max_steps` ends as "length"."""
    if not st.done:
        st.finish = "length"
    return {
        "output": st.text,
        "segments": _merge(st.segments),
        "usage": st.usage.to_dict(),
        "llm_calls": st.usage.llm_calls,
        "handoff": st.handoff,
        "finish_reason": st.finish,
        "entropies": list(st.entropies),
    }


def _merge(segments: list[dict]) -> list[dict]:
    """Consecutive steps of the same model as one segment."""
    out: list[dict] = []
    for s in segments:
        if out and out[-1]["by"] == s["by"]:
            out[-1] = {"by": s["by"], "text": out[-1]["text"] + s["text"]}
        elif s["text"] or not out:
            out.append(dict(s))
    return out
