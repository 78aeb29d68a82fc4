"""Loading the SLM for training, and the frozen LLM used by curation and the Stage 3 reward.

    model, tok = load_local("worlds/quick-seed0/slm")              # trainable, float32 on CPU
    llm = FrozenLLM.from_spec("worlds/quick-seed0/llm")            # in-process: batched generation
    llm = FrozenLLM.from_spec("http://127.0.0.1:8000/v1#glm-5.2")  # any OpenAI-compatible server: concurrent calls
    gens = llm.generate([GenRequest(...), ...])
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pyrodash.backends.base import GenRequest
from pyrodash.train.generate import Gen, generate


def load_local(path: str | Path, device: str | None = None):
    """An in-process causal LM and its tokenizer (float32 on CPU, the checkpoint's dtype on GPU)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.float32 if device == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype).to(device)
    tok = AutoTokenizer.from_pretrained(str(path))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    if not getattr(tok, "chat_template", None):
        raise ValueError(f"{path}: the tokenizer has no chat template; training needs one (with {{% generation %}} "
                         "markers for the assistant-only loss)")
    return model, tok


def is_remote(spec: Any) -> bool:
    if isinstance(spec, dict):
        return "url" in spec
    return isinstance(spec, str) and spec.startswith(("http://", "https://"))


class FrozenLLM:
    """The LLM M_l, never trained: a backend plus the batch size / concurrency its calls are issued with."""

    def __init__(self, backend, batch_size: int = 32, concurrency: int = 16):
        self.backend, self.batch_size, self.concurrency = backend, batch_size, concurrency
        self.calls = 0  # requests issued so far (each one is an LLM call)

    @classmethod
    def from_spec(cls, spec: Any, batch_size: int = 32, concurrency: int = 16) -> FrozenLLM:
        if spec is None:
            raise ValueError("no LLM given: set `llm:` in the recipe (a path, hub id or http(s)://host:port/v1#model)")
        if is_remote(spec):
            from pyrodash.backends import load_backend

            return cls(load_backend(spec), batch_size=batch_size, concurrency=concurrency)
        from pyrodash.backends.hf import HFBackend

        model, tok = load_local(spec["path"] if isinstance(spec, dict) else spec)
        model.requires_grad_(False)
        return cls(HFBackend(model, tok), batch_size=batch_size, concurrency=concurrency)

    def generate(self, reqs: list[GenRequest], desc: str | None = None) -> list[Gen]:
        """One LLM call per request, all issued together (batched in-process, concurrent over HTTP)."""
        self.calls += len(reqs)
        return generate(self.backend, reqs, batch_size=self.batch_size, concurrency=self.concurrency, desc=desc)
