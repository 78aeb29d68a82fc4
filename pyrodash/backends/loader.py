"""Backends from command-line or YAML specs: `load_llm` (the one LLM loader), `load_slm` and `load_backend`.

    llm = load_llm("http://127.0.0.1:8001/v1#llm")            # an endpoint: probed at start-up (mode auto)
    llm = load_llm("worlds/quick/llm")                         # a local model dir / hub id: in process
    llm = load_llm(["http://a:8001/v1#llm", "http://b:8002/v1#llm"])   # a mesh (`pyrodash.backends.mesh`)
    llm = load_llm(spec, local=frozen_loader)                  # training: its own in-process loading
    slm = load_slm("http://127.0.0.1:8000/v1#slm")            # an SLM server: checked to stop at <offload>
    b = load_backend("path/or/hub-id")                         # any backend, no check (SLMs, tools, tests)

A spec is a path / hub id, a URL with `#model`, their dict forms, or for the LLM a list (a mesh); the spec forms in
full (GGUF files, a backend's name, misconfigured and unreachable endpoints): docs/internals.md.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

from pyrodash.backends.base import Backend
from pyrodash.backends.hf.gguf import local_model_path
from pyrodash.backends.http.endpoint import SPEC_KEYS, LLMEndpoint, is_http_spec
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.backends.http.slm_probe import probe_slm
from pyrodash.backends.mesh import OPTIONS, Member, MeshBackend, is_mesh_spec
from pyrodash.cost import Prices

log = logging.getLogger("pyrodash.mesh")
HF_KEYS = {"path", "device", "dtype", "name", "chat_template"}
LocalLoader = Callable[[str | dict], Backend]  # an in-process model from its path / hub id or {"path": ...} spec


def load_backend(spec: str | dict) -> Backend:
    """A backend from a spec string or dict (module docstring), without any start-up check: use `load_llm` for the
    LLM and `load_slm` for the SLM."""
    if isinstance(spec, str):
        if spec.startswith(("http://", "https://")):
            url, _, model = spec.partition("#")
            spec = {"url": url, "model": model or None}
        else:
            spec = {"path": spec}
    if not isinstance(spec, dict):
        raise ValueError(f"backend spec {spec!r}: give a model path / hub id, an http(s)://.../v1#model URL or a dict")
    if "url" in spec:
        unknown = set(spec) - SPEC_KEYS
        if unknown:
            raise ValueError(f"backend spec: unknown keys {sorted(unknown)} for a server; use {sorted(SPEC_KEYS)}")
        return OpenAICompatBackend(**spec)
    if "path" in spec:
        unknown = set(spec) - HF_KEYS
        if unknown:
            raise ValueError(f"backend spec: unknown keys {sorted(unknown)} for a local model; use {sorted(HF_KEYS)}")
        from pyrodash.backends.hf.backend import HFBackend  # torch + transformers: only when a local model is loaded

        return HFBackend(
            local_model_path(spec["path"]),
            device=spec.get("device"),
            dtype=spec.get("dtype", "auto"),
            name=spec.get("name"),
            chat_template=spec.get("chat_template"),
        )
    raise ValueError(f"backend spec {spec!r}: a dict needs 'path' (local model) or 'url' (OpenAI-compatible server)")


def with_chat_template(spec: str | dict | None, template: str | None, flag: str = "--chat-template"):
    """`spec` with `chat_template` set for an in-process model (a path / hub id / GGUF, or its dict); a server
    applies its own template, so giving one for an http(s) spec is an error naming the fix."""
    if template is None or spec is None:
        return spec
    if is_http_spec(spec) or (isinstance(spec, dict) and "path" not in spec):
        raise ValueError(
            f"{flag} applies to an in-process model (a directory, hub id or .gguf); a server applies its own"
        )
    return {**spec, "chat_template": template} if isinstance(spec, dict) else {"path": spec, "chat_template": template}


def load_slm(spec: str | dict) -> Backend:
    """The SLM backend of a spec; an HTTP SLM server is checked once (`probe_slm`): it must stop at `<offload>`
    (stop_token_ids) and report which stop token ended a generation, else a one-line ValueError naming the fix."""
    backend = load_backend(spec)
    if is_http_spec(spec):
        rep = probe_slm(backend)
        if rep.error:
            raise ValueError(rep.error)
    return backend


def load_llm(spec: str | dict | list, mode: str | None = None, *, local: LocalLoader | None = None) -> Backend:
    """The LLM backend a spec describes (module docstring): one endpoint, probed here; a local model (loaded by
    `local` when given, else `load_backend`: in process, `mode` must be unset, auto or continue); or a
    `MeshBackend` (`mode` applies to every HTTP endpoint; each is probed, one failing its probe only warns)."""
    if isinstance(spec, list) or (isinstance(spec, dict) and "endpoints" in spec):
        opts = {"endpoints": spec} if isinstance(spec, list) else dict(spec)
        members = opts.pop("endpoints")
        unknown = set(opts) - set(OPTIONS)
        if unknown:
            raise ValueError(f"llm mesh: unknown keys {sorted(unknown)}; use endpoints, {', '.join(OPTIONS)}")
        if not isinstance(members, list) or not members:
            raise ValueError("llm mesh: `endpoints` must be a non-empty list of backend specs")
        if mode not in (None, "auto", "continue") and not any(is_http_spec(m) for m in members):
            raise ValueError(f"--llm-mode {mode}: no endpoint of the LLM mesh is an http(s):// server; drop the flag")
        return MeshBackend(_distinct([_member(m, mode, local) for m in members], members), **opts)
    if is_mesh_spec(spec):  # one endpoint with its own price sheet
        return MeshBackend([_member(spec, mode, local)])
    backend = _open(spec, mode, local)
    if isinstance(backend, OpenAICompatBackend):
        backend.resolve(raise_on_unreachable=False)
    return backend


def _open(spec: str | dict, mode: str | None, local: LocalLoader | None) -> Backend:
    """One LLM endpoint or local model, not yet probed."""
    if is_http_spec(spec):
        return OpenAICompatBackend.from_endpoint(LLMEndpoint.parse(spec, mode))
    if mode not in (None, "auto", "continue"):
        raise ValueError(
            f"--llm-mode {mode}: a local LLM continues the trace in process; drop the flag or give an "
            "http(s):// endpoint"
        )
    if local is None:
        return load_backend(spec)
    if isinstance(spec, dict) and (set(spec) - HF_KEYS or "path" not in spec):
        raise ValueError(f"LLM spec {spec!r}: a local model is a path / hub id or a dict with {sorted(HF_KEYS)}")
    return local(spec)


def _distinct(members: list[Member], specs: list) -> list[Member]:
    """Default names that collide (two endpoints serving the same model: both "llm") get their position, "llm-1",
    "llm-2"; names given in the specs are kept (MeshBackend refuses two equal ones)."""
    counts = Counter(m.name for m in members)
    for i, (m, spec) in enumerate(zip(members, specs)):
        if counts[m.name] > 1 and not (isinstance(spec, dict) and spec.get("name")):
            m.name = f"{m.name}-{i + 1}"
    return members


def _member(spec: str | dict, mode: str | None, local: LocalLoader | None) -> Member:
    """One mesh endpoint, loaded and probed as a single LLM is (but a failed probe only warns: the endpoint fails its
    calls and cools down like one that breaks later), with its own price sheet."""
    prices = None
    if isinstance(spec, dict):
        spec = dict(spec)
        prices = spec.pop("prices", None)
    backend = _open(spec, mode if is_http_spec(spec) else None, local)
    name = (spec.get("name") if isinstance(spec, dict) else None) or backend.name
    if isinstance(backend, OpenAICompatBackend):
        try:
            backend.resolve(raise_on_unreachable=False)
        except ValueError as e:
            log.warning("LLM mesh endpoint %s failed its start-up probe: %s", name, e)
    return Member(backend, name, Prices.load(prices) if prices is not None else None)
