"""Loading the SLM for training, and the frozen LLM used by curation and the Stage 3 reward.

    model, tok = load_local("worlds/quick-seed0/slm")              # trainable, float32 on CPU
    llm = FrozenLLM.from_spec("worlds/quick-seed0/llm")            # in-process: batched generation
    llm = FrozenLLM.from_spec("http://127.0.0.1:8000/v1#glm-5.2")  # any OpenAI-compatible server: concurrent calls
    llm = FrozenLLM.from_spec(["http://a:8001/v1#llm", "http://b:8002/v1#llm"])   # a mesh (fallback in order)
    gens = llm.generate([GenRequest(...), ...], cache="runs/x/llm_calls.jsonl")   # journaled: resumable

The LLM is loaded by the one LLM loader, `pyrodash.backends.load_llm`. A call that still fails comes back as a
`GenResult` with finish_reason "error", never as an exception; `cache=PATH` journals each result, so a killed run
resumes. The call policy over HTTP and the journal: docs/internals.md.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from pyrodash.backends import load_llm
from pyrodash.backends.base import ContinuesPrefix, GenRequest, GenResult
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.hf.chat_template import resolve_template
from pyrodash.backends.hf.gguf import local_model_path
from pyrodash.backends.retry import BATCH
from pyrodash.train.generate import generate


def load_local(path: str | Path, device: str | None = None, chat_template: str | None = None):
    """An in-process causal LM and its tokenizer (float32 on CPU, the checkpoint's dtype on GPU). `path`: a model
    directory, hub id or GGUF file (`pyrodash.backends.hf.gguf`); the tokenizer gets `chat_template` (a recipe's text or
    file) when given, else keeps its own, else PyroDash's default (`pyrodash.train.chat_template`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if device == "cpu" else "auto"
    src = local_model_path(str(path))
    model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype).to(device)
    tok = AutoTokenizer.from_pretrained(src)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.chat_template = resolve_template(tok, chat_template, path)
    return model, tok


def load_frozen(spec: str | dict) -> HFBackend:
    """An in-process LLM for training (`load_llm`'s local loader): `load_local`'s model with gradients off."""
    model, tok = load_local(spec["path"] if isinstance(spec, dict) else spec)
    model.requires_grad_(False)
    return HFBackend(model, tok)


class FrozenLLM:
    """The LLM M_l, never trained: a backend plus the batch size / concurrency its calls are issued with."""

    def __init__(self, backend, batch_size: int = 32, concurrency: int = 16, key: str = "", policy=None):
        self.backend, self.batch_size, self.concurrency = backend, batch_size, concurrency
        self.key = key or backend.name  # identifies the LLM in call journals
        self.policy = policy or BATCH  # (a FailurePolicy)
        self.calls = 0  # requests issued so far (each one is an LLM call)
        self.failures = 0  # calls that failed after their retries (returned as finish_reason "error")
        self.reused = 0  # results taken from a call journal instead of a call

    @property
    def style(self) -> str:
        """The handoff style this LLM needs: "instruct" when its endpoint cannot continue a prefix."""
        prefix = not isinstance(self.backend, ContinuesPrefix) or self.backend.continues_prefix
        return "continue" if prefix else "instruct"

    @classmethod
    def from_spec(cls, spec: Any, batch_size: int = 32, concurrency: int = 16, mode: str | None = None) -> FrozenLLM:
        """The LLM of a recipe's `llm:`, loaded by the one LLM loader (`pyrodash.backends.load_llm`: an endpoint is
        probed for its continuation mode, a list or `{endpoints: ...}` is a mesh); an in-process model (alone or in
        a mesh) is loaded frozen by `load_frozen` (float32 on CPU, batched generation)."""
        if spec is None:
            raise ValueError("no LLM given: set `llm:` in the recipe (a path, hub id or http(s)://host:port/v1#model)")
        backend = load_llm(spec, mode, local=load_frozen)
        # a local model is journaled under its path (as before; its public name, e.g. "llm", is not unique), anything
        # else under its whole spec
        if isinstance(backend, HFBackend):
            key = str(spec.get("path") if isinstance(spec, dict) else spec)
        else:
            key = json.dumps(spec, sort_keys=True, default=str)
        return cls(backend, batch_size=batch_size, concurrency=concurrency, key=key)

    def generate(
        self, reqs: list[GenRequest], desc: str | None = None, cache: str | Path | None = None
    ) -> list[GenResult]:
        """One LLM call per request, all issued together (batched in-process, concurrent over HTTP); with `cache`,
        journaled results are reused and new ones appended as they arrive."""
        journal = CallJournal(cache, self.key) if cache else None
        out: list[GenResult | None] = [journal.get(r) if journal else None for r in reqs]
        todo = [i for i, g in enumerate(out) if g is None]
        self.reused += len(reqs) - len(todo)

        def arrived(j: int, g: GenResult) -> None:
            if journal is not None and g.finish_reason != "error":
                journal.append(reqs[todo[j]], g)

        gens = generate(
            self.backend,
            [reqs[i] for i in todo],
            batch_size=self.batch_size,
            concurrency=self.concurrency,
            desc=desc,
            policy=self.policy,
            on_result=arrived,
        )
        for i, g in zip(todo, gens, strict=True):
            out[i] = g
        self.calls += len(todo)
        self.failures += sum(g.finish_reason == "error" for g in gens)
        return out  # type: ignore[return-value]


class CallJournal:
    """LLM results keyed by (LLM, request), one JSON line each, appended (and flushed) as results arrive; a torn last
    line (a killed run) is skipped when read."""

    def __init__(self, path: str | Path, llm_key: str):
        self.path, self.llm_key = Path(path), llm_key
        self.entries: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text().splitlines():
                try:
                    row = json.loads(line)
                    self.entries[row["key"]] = row["gen"]
                except (ValueError, KeyError, TypeError):
                    continue
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def key(self, req: GenRequest) -> str:
        return hashlib.sha256(
            json.dumps([self.llm_key, asdict(req)], sort_keys=True, default=str).encode()
        ).hexdigest()[:24]

    def get(self, req: GenRequest) -> GenResult | None:
        g = self.entries.get(self.key(req))
        return GenResult.from_json(g) if g is not None else None

    def append(self, req: GenRequest, gen: GenResult) -> None:
        k = self.key(req)
        self.entries[k] = gen.to_json()
        with self.path.open("a") as f:
            f.write(json.dumps({"key": k, "gen": self.entries[k]}) + "\n")
            f.flush()
