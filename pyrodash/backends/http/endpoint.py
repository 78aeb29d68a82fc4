"""One description of an LLM endpoint, used by every command: `LLMEndpoint` (opened and checked by the one LLM
loader, `pyrodash.backends.load_llm`).

    ep = LLMEndpoint.parse("https://api.openai.com/v1#gpt-5-mini")          # URL#model
    ep = LLMEndpoint.parse({"url": "http://127.0.0.1:8001/v1", "model": "llm", "mode": "completion",
                            "tokenizer": "worlds/w/llm", "api_key_env": "VLLM_KEY"})   # a YAML dict
    llm = pyrodash.backends.load_llm("http://127.0.0.1:8001/v1#llm", mode="auto")   # + the start-up probe

A key never appears in a log line, an error message or a record (`redact()`). A spec's forms and keys, its `mode`,
and which environment variable a key is read from: docs/internals.md.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from urllib.parse import urlparse

from pyrodash.backends.http.continuation import MODES

log = logging.getLogger("pyrodash.llm")
LLM_MODES = ("auto",) + MODES
SPEC_KEYS = {"url", "model", "api_key_env", "mode", "timeout_s", "tokenizer", "extra_body", "name", "prompt_mode"}
_LEGACY_PROMPT_MODE = {"chat": "continue", "completion": "completion"}


def default_key_env(url: str, mode: str) -> str:
    host = (urlparse(url).hostname or "").lower()
    if mode == "anthropic" or host.endswith("anthropic.com"):
        return "ANTHROPIC_API_KEY"
    if host.endswith("deepseek.com"):
        return "DEEPSEEK_API_KEY"
    return "OPENAI_API_KEY"


@dataclass
class LLMEndpoint:
    url: str
    model: str | None = None
    api_key_env: str | None = None  # None: the provider's usual variable, when set
    mode: str = "auto"
    timeout_s: float = 60.0
    tokenizer: str | None = None  # a local tokenizer dir: completion mode, local token counts
    extra_body: dict = field(default_factory=dict)
    name: str | None = None
    key_required: bool = False  # the spec named api_key_env: it must be set

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"LLM url {self.url!r} must start with http:// or https:// (e.g. http://host:8000/v1)")
        if self.mode not in LLM_MODES:
            raise ValueError(f"LLM mode {self.mode!r}: use one of {', '.join(LLM_MODES)}")
        if self.api_key_env is None:
            self.api_key_env = default_key_env(self.url, self.mode)
        else:
            self.key_required = True

    @classmethod
    def parse(cls, spec: str | dict, mode: str | None = None) -> LLMEndpoint:
        """An endpoint from `URL#model` or a dict; `mode` (a CLI flag) wins over the spec's."""
        if isinstance(spec, str):
            url, _, model = spec.partition("#")
            spec = {"url": url, "model": model or None}
        if not isinstance(spec, dict) or "url" not in spec:
            raise ValueError(f"LLM endpoint {spec!r}: give http(s)://host:port/v1#model or a dict with url and model")
        unknown = set(spec) - SPEC_KEYS
        if unknown:
            raise ValueError(f"LLM endpoint: unknown keys {sorted(unknown)}; use some of {sorted(SPEC_KEYS)}")
        d = dict(spec)
        legacy = d.pop("prompt_mode", None)
        if legacy is not None:
            if legacy not in _LEGACY_PROMPT_MODE:
                raise ValueError(
                    f"prompt_mode={legacy!r}: use mode: continue | completion | instruct | prefix | anthropic | auto"
                )
            d.setdefault("mode", _LEGACY_PROMPT_MODE[legacy])
        if mode is not None:
            d["mode"] = mode
        d["extra_body"] = dict(d.get("extra_body") or {})
        return cls(**{k: v for k, v in d.items() if v is not None or k == "model"})

    @property
    def api_key(self) -> str | None:
        key = os.environ.get(self.api_key_env or "") or None
        if key is None and self.key_required:
            raise ValueError(f"environment variable {self.api_key_env} (api_key_env) is not set: export the API key")
        return key


def redact(text: str, *secrets: str | None) -> str:
    """`text` with every secret (and its first/last 8 characters, as providers echo keys) replaced by ***."""
    for s in secrets:
        if not s:
            continue
        text = text.replace(s, "***")
        if len(s) >= 16:
            text = text.replace(s[:8], "***").replace(s[-8:], "***")
    return text


def is_http_spec(spec: object) -> bool:
    if isinstance(spec, dict):
        return "url" in spec
    return isinstance(spec, str) and spec.startswith(("http://", "https://"))


def with_mode(spec: str | dict | list | None, mode: str | None) -> str | dict | list | None:
    """`spec` with its continuation mode set to `mode` (a CLI `--llm-mode`; in a mesh, on every HTTP endpoint); a
    local model spec refuses one."""
    if mode is None:
        return spec
    if mode not in LLM_MODES:
        raise ValueError(f"--llm-mode {mode!r}: use one of {', '.join(LLM_MODES)}")
    members = spec if isinstance(spec, list) else spec.get("endpoints") if isinstance(spec, dict) else None
    if isinstance(members, list):  # a mesh: the mode of every HTTP endpoint (local members continue in process)
        if not any(is_http_spec(m) for m in members):
            raise ValueError(f"--llm-mode {mode}: no endpoint of the LLM mesh is an http(s):// server; drop the flag")
        members = [with_mode(m, mode) if is_http_spec(m) else m for m in members]
        return members if isinstance(spec, list) else {**spec, "endpoints": members}
    if not is_http_spec(spec):
        what = "the world's LLM" if spec is None else repr(spec)
        raise ValueError(
            f"--llm-mode {mode}: the LLM is a local model ({what}), which continues the trace in "
            "process; give an http(s)://host:port/v1#model LLM or drop the flag"
        )
    ep = LLMEndpoint.parse(spec) if isinstance(spec, str) else None
    return {"url": ep.url, "model": ep.model, "mode": mode} if ep else {**spec, "mode": mode}


def add_llm_arguments(parser) -> None:
    """`--llm SPEC` and `--llm-mode`, for the commands whose LLM comes from a config (curate, train, eval): `--llm`
    replaces the config's LLM (`llm_from_flags`)."""
    parser.add_argument(
        "--llm",
        default=None,
        metavar="SPEC",
        help="the LLM, in place of the config's: http(s)://host:port/v1#model (e.g. an API you pay for; the key from "
        "OPENAI_API_KEY, ANTHROPIC_API_KEY or DEEPSEEK_API_KEY), a model directory or a hub id",
    )
    add_llm_mode_argument(parser)


def llm_from_flags(spec: str | dict | list | None, llm: str | None, mode: str | None) -> str | dict | list | None:
    """The LLM a command runs with: `--llm` when given, else the config's `spec`; `--llm-mode` set on it."""
    return with_mode(spec if llm is None else llm, mode)


def add_llm_mode_argument(parser) -> None:
    """The `--llm-mode` flag every command that calls an LLM takes."""
    parser.add_argument(
        "--llm-mode",
        choices=LLM_MODES,
        default=None,
        help="how the HTTP LLM continues a partial trace (default: the spec's mode, else auto = "
        "detected at start-up); see docs/providers.md#point-it-at-your-llm",
    )
