"""Model backends in rooms: the interface at the top (`base.py`: `Backend` and the optional capabilities callers
check), the in-process model stack (`hf/`: transformers and our decode loop), the OpenAI-compatible client stack
(`http/`: continuation modes, probes, the lean client), LLM meshes (`mesh.py`), the one failure policy (`retry.py`),
loaded from command-line or YAML specs (`loader.py`):

    llm = load_llm("http://127.0.0.1:8001/v1#llm")    # THE LLM loader: an endpoint (probed), a local model, a mesh
    slm = load_slm("runs/q/stage1")                    # the SLM (an HTTP SLM server is checked to stop at <offload>)
    b = load_backend("http://127.0.0.1:8000/v1#m")    # any backend, no start-up check

Every command, the server, evaluation and training load their LLM with `load_llm` (see `pyrodash.backends.loader`
for the spec forms); `load_backend` never runs the LLM's start-up continuation-mode probe.

Layering: this package imports only the leaf modules (`pyrodash.cost`) besides its own, never the engine, the server,
training or the commands; `hf/` and `http/` never import each other (import-linter's `backend-rooms`).
"""

from __future__ import annotations

from pyrodash.backends.base import Backend, BackendError, GenChunk, GenRequest, GenResult
from pyrodash.backends.loader import load_backend, load_llm, load_slm

__all__ = ["Backend", "BackendError", "GenChunk", "GenRequest", "GenResult", "load_backend", "load_llm", "load_slm"]
