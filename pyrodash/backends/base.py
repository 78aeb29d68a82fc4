"""The one small protocol every model backend speaks (in-process transformers, OpenAI-compatible HTTP).

A backend turns a `GenRequest` (chat messages, optionally an assistant prefix to continue) into a stream of
`GenChunk`s. The last chunk carries `finish_reason`, `stop_token_id` (which stop token ended the generation, if
one did; that token is never part of `text`) and the exact token usage of the request.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, fields
from typing import Protocol, runtime_checkable

CHARS_PER_TOKEN_ESTIMATE = 3  # a conservative estimate for backends that cannot count tokens locally


@dataclass
class GenRequest:
    messages: list[dict]
    # Text the model continues as its own (final) assistant message; "" = start a fresh assistant turn.
    # With messages=[] the prefix is the whole raw prompt (no chat template), as in /v1/completions.
    prefix: str = ""
    max_tokens: int = 512
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # stop strings (GlimpRouter's step boundary)
    stop_token_ids: list[int] = field(default_factory=list)  # e.g. the SLM's <offload> id
    logit_bias: dict[int, float] = field(default_factory=dict)  # added to these token logits while decoding
    top_logprobs: int = 0  # >0: report the top-k log-probabilities at every generated position
    # the functions the model may call (OpenAI function schemas, `pyrodash.chat.Tools.schemas`): rendered into the
    # prompt by the chat template, or sent as `tools` to a chat endpoint; None: no tools
    tools: list[dict] | None = None
    # Not a field (no annotation): the answer this request belongs to (any object; set by the engine on the SLM
    # requests of a relay answer, `Turn.cache_key`). An in-process backend with a prefix cache keeps the KV of keyed
    # sequences and reuses it for the next request with the same key (pyrodash.backends.hf.prefix_cache); None: no
    # cache is used. `asdict` and `==` never see it.
    cache_key = None


@dataclass
class GenChunk:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    # one dict {token_text: logprob} per generated token in this chunk, when top_logprobs > 0
    top_logprobs: list[dict[str, float]] | None = None
    # set on the last chunk only
    finish_reason: str | None = None  # "stop" (EOS, stop string or stop token) | "length"
    stop_token_id: int | None = None
    prompt_tokens: int | None = None  # input tokens billed for this request (prefix included)
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    usage_estimated: bool = False  # the server reported no usage: counted locally or estimated
    # the client closed the stream at a stop string the server wrote past (it ignores `stop`, or was not sent it):
    # the usage is what arrived before the close (counted locally, `usage_estimated`)
    client_stop: bool = False
    # set by a composite backend (backends/mesh.py) on the last chunk: one dict per upstream call, in order
    # ({endpoint, calls, llm_in, llm_out, llm_cached_in, text, prices, error}); None = this backend is one endpoint
    endpoints: list[dict] | None = None
    # set on the last chunk by a backend whose server returns structured calls (a chat endpoint's `tool_calls`)
    tool_calls: list | None = None  # `pyrodash.chat.ToolCall`s


@dataclass
class GenResult:
    """One finished generation, whatever the backend or the caller: `HFBackend.generate_batch`, a stream collected
    by `pyrodash.backends.retry` (evaluation, curation, Stage 3), the engine's batch driver. A call that failed after
    its retries is one too: finish_reason "error" and its `error`, never an exception."""

    text: str  # decoded output; never contains the stop token or a matched stop string
    token_ids: list[int] = field(default_factory=list)  # every generated id, the final stop token / EOS included
    prompt_ids: list[int] = field(default_factory=list)  # the prompt's ids where the backend tokenized it locally
    finish_reason: str = "stop"  # "stop" | "length" | "error" (the call failed: see `error`)
    stop_token_id: int | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    top_logprobs: list[dict[str, float]] | None = None
    cached_tokens: int = 0
    usage_estimated: bool = False  # the server reported no usage: counted locally or estimated
    eos: bool | None = None  # True: ended by EOS; False: by a stop string/id or length; None: unknown
    error: str | None = None  # why the call failed after its retries (finish_reason "error")

    def to_json(self) -> dict:
        """A JSON object of the result (a call journal's entry), without the prompt's ids (the request has them): a
        copy of every other field, as `asdict` makes it. The prompt's ids are never copied: `asdict` copied them one
        element at a time before they were dropped, most of storing a long prompt's answer (measured, the SLM alone on
        the quick world's six-turn conversations: 3.3 of 44 s)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self) if f.name != "prompt_ids"}

    @classmethod
    def from_json(cls, d: dict) -> GenResult:
        """`to_json`'s object back; keys this version does not know (an older journal's) are left out."""
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


class BackendError(RuntimeError):
    """A generation failed. `reached_server` is False when the request never got to the model (connection
    refused), so the engine does not count it as an LLM call; `usage` holds any counts the server reported;
    `status` is the HTTP status of a refused request (None: a network error, a timeout, a broken stream)."""

    def __init__(
        self,
        message: str,
        reached_server: bool = True,
        usage: GenChunk | None = None,
        status: int | None = None,
        param: str | None = None,
        kind: str | None = None,
    ):
        super().__init__(message)
        self.reached_server = reached_server
        self.usage = usage
        self.status = status
        self.param = param  # the request field an OpenAI-style error names, if any
        # what went wrong (`pyrodash.events.FAILURE_KINDS`); unset: from the status and whether it reached the server
        self.kind = kind or ("http" if status is not None else "error" if reached_server else "unreachable")

    @property
    def retryable(self) -> bool:
        """A client error (4xx other than 408 timeout / 429 rate limit) fails the same way again: not retried."""
        return self.status is None or self.status in (408, 429) or self.status >= 500


def public_name(text: object, default: str) -> str:
    """A backend's default display name, safe to show clients: never a URL, a host:port or a local directory.
    `http://host:8001/v1#Qwen/Qwen3-32B` -> "Qwen3-32B", `/data/runs/q/stage1` -> "stage1", a hub id
    `Qwen/Qwen3-32B` -> "Qwen3-32B"; `default` when nothing is left (an endpoint URL without a model)."""
    s = str(text or "").strip()
    if "://" in s:
        s = s.partition("#")[2]
    s = s.rstrip("/\\").replace("\\", "/").rsplit("/", 1)[-1]
    if re.fullmatch(r"[\w.-]+:\d+", s):  # a bare host:port is no public name
        s = ""
    return s or default


def message_chars(m: dict) -> int:
    """The characters of one message a prompt holds: its content, and its tool calls or tool-call id as sent."""
    n = len(str(m.get("content") or "")) + 8
    if m.get("tool_calls"):
        n += len(json.dumps(m["tool_calls"]))
    return n + len(str(m.get("tool_call_id") or ""))


def estimate_tokens(messages: list[dict], prefix: str = "", tools: list[dict] | None = None) -> int:
    """A conservative token estimate (characters / 3, plus a few per message) for backends that cannot count: the
    messages with their tool calls, the prefix and the tools' schemas."""
    chars = sum(message_chars(m) for m in messages) + len(prefix) + (len(json.dumps(tools)) if tools else 0)
    return -(-chars // CHARS_PER_TOKEN_ESTIMATE)


@runtime_checkable
class Backend(Protocol):
    """What every backend offers. What only some offer is an optional capability below, which a caller checks with
    `isinstance(backend, Capability)` before using it (an in-process model has most; an HTTP endpoint a few)."""

    name: str  # a public name (never a URL or a local path: `public_name`)

    def stream(self, req: GenRequest) -> AsyncIterator[GenChunk]:
        """Generate for `req`, yielding text deltas; cancelling the iterator stops generation upstream."""
        ...

    def token_id(self, token: str) -> int | None:
        """Id of a (special) token in this model's vocabulary, or None (used to find `<offload>`)."""
        ...

    async def aclose(self) -> None: ...


# ---- optional capabilities (each checked with isinstance where a caller uses it) --------------------------------


@runtime_checkable
class Tokenizes(Protocol):
    """The model's own tokenizer is here (an in-process model): a request's prompt token ids, as the model sees them."""

    def prompt_ids(self, req: GenRequest) -> list[int]: ...


@runtime_checkable
class CountsText(Protocol):
    """Tokens of a plain text in the model's own tokenizer (the oracle bills an SLM prefix with it)."""

    def count_tokens(self, text: str) -> int: ...


@runtime_checkable
class Renders(Protocol):
    """The chat template is rendered here: `render(req)` is the raw prompt text, which as `GenRequest(messages=[],
    prefix=text)` is the same prompt."""

    def render(self, req: GenRequest) -> str: ...


@runtime_checkable
class KnowsWindow(Protocol):
    """The model's context window in tokens (None: not known)."""

    def context_window(self) -> int | None: ...


@runtime_checkable
class KnowsSpecials(Protocol):
    """The special-token strings of the model's vocabulary (what client text may not produce as tokens)."""

    def special_tokens(self) -> list[str]: ...


@runtime_checkable
class ContinuesPrefix(Protocol):
    """Whether the model continues an assistant prefix (False: the engine hands off in the instruct style). A
    backend without it continues one."""

    continues_prefix: bool


@runtime_checkable
class Warms(Protocol):
    """Opens its connections ahead of a call (best effort)."""

    async def warm(self) -> None: ...


@runtime_checkable
class ChecksHealth(Protocol):
    """Raises unless the model answers (the server's /health, a mesh's reachability)."""

    async def health(self) -> None: ...


@runtime_checkable
class Batches(Protocol):
    """Decodes many requests as one batch (an in-process model); `eos_ids` tells an EOS from a stop id."""

    eos_ids: set[int]

    def generate_batch(self, reqs: list[GenRequest], batch_size: int | None = None) -> list[GenResult]: ...


@runtime_checkable
class BatchesStreams(Protocol):
    """Decodes the streamed requests that wait for it together, as one batch (an in-process model:
    `pyrodash.backends.hf.stream_batch`); `streams` is its queue and decode thread."""

    streams: object


@runtime_checkable
class Meshed(Protocol):
    """Several endpoints behind one backend (`pyrodash.backends.mesh`): its members (each with `.backend`, `.name`
    and its own `.prices` or None) and their status."""

    members: list

    def status(self) -> list[dict]: ...
