"""Model backends: in-process transformers (`hf.py`) and OpenAI-compatible HTTP (`openai_compat.py`).

`load_backend(spec)` turns a command-line or YAML backend spec into a backend:
  - "path/to/model" or "org/hub-id"                   -> HFBackend (in-process transformers)
  - "http://host:port/v1#model" (fragment optional)    -> OpenAICompatBackend (else the server's first model)
  - {"path": ..., "device": ...}                       -> HFBackend
  - {"url": ..., "model": ..., "api_key_env": ..., "timeout_s": ..., "tokenizer": ..., "mode": ...}
                                                       -> OpenAICompatBackend
Without a `mode` an HTTP backend continues a prefix vLLM-style (what an SLM server needs). For the LLM side use
`load_llm(spec, mode)` (`pyrodash.backends.endpoint`): mode auto by default, detected by a start-up probe.
"""

from __future__ import annotations

from pyrodash.backends.base import Backend, BackendError, GenChunk, GenRequest, GenResult
from pyrodash.backends.endpoint import SPEC_KEYS as _HTTP_KEYS
from pyrodash.backends.endpoint import load_llm

__all__ = ["Backend", "BackendError", "GenChunk", "GenRequest", "GenResult", "load_backend", "load_llm"]
_HF_KEYS = {"path", "device", "dtype", "name"}


def load_backend(spec: str | dict) -> Backend:
    """A backend from a spec string or dict (see the module docstring)."""
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            url, _, model = spec.partition("#")
            spec = {"url": url, "model": model or None}
        else:
            spec = {"path": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"backend spec {spec!r}: give a model path / hub id, an http(s)://.../v1#model URL or a dict")
    if "url" in spec:
        unknown = set(spec) - _HTTP_KEYS
        if unknown:
            raise ValueError(f"backend spec: unknown keys {sorted(unknown)} for a server; use {sorted(_HTTP_KEYS)}")
        from pyrodash.backends.openai_compat import OpenAICompatBackend

        return OpenAICompatBackend(**spec)
    if "path" in spec:
        unknown = set(spec) - _HF_KEYS
        if unknown:
            raise ValueError(f"backend spec: unknown keys {sorted(unknown)} for a local model; use {sorted(_HF_KEYS)}")
        from pyrodash.backends.hf import HFBackend

        return HFBackend(spec["path"], device=spec.get("device"), dtype=spec.get("dtype", "auto"),
                         name=spec.get("name"))
    raise ValueError(f"backend spec {spec!r}: a dict needs 'path' (local model) or 'url' (OpenAI-compatible server)")
