"""The one LLM loader (`pyrodash.backends.load_llm`) and the backends' layering.

- README's "From Python" example, run as written (same calls) with a real `transformers serve` as the LLM: one LLM
  call per handoff, no fallback, and the answers of the in-process LLM (a drift bug once: the example built
  the LLM with `load_backend`, which never ran the start-up probe, and fell back on every handoff there).
- `load_llm` takes an endpoint (probed), a local model and a mesh; training's `FrozenLLM.from_spec` goes through it
  (a mesh works in training; an in-process LLM is still frozen float32 with batched generation).
- `pyrodash.backends` imports no module above it and no own module inside a function.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from servers import free_port
from test_readme_endpoints import _process
from tiny_models import CLEAN_LLM_SEEDS, HANDOFF_SLM_SEED, mid_trace_bias, tiny_model_dir

import pyrodash
from pyrodash.backends import load_backend, load_llm
from pyrodash.backends.base import GenRequest
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.backends.http.openai_compat import OpenAICompatBackend
from pyrodash.backends.mesh import MeshBackend
from pyrodash.prompts import get_prompts
from pyrodash.server.model_server import build_model_app, serve_in_thread

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = get_prompts("world-v1")
QUESTIONS = [
    "Start 47: +3, f.",
    "Start 12: +5, f, +2, f.",
    "Start 5: x2, f.",
    "Start 31: +4, f, x3, f.",
    "Start 8: +1, f.",
]
README_SLM, README_LLM, README_QUESTION = "runs/q/stage1", "http://127.0.0.1:8001/v1#llm", '"47: +3x8 f2"'


def readme_python_example() -> str:
    """The code of the "From Python" example (docs/providers.md)."""
    text = (ROOT / "docs" / "providers.md").read_text()
    code = text.split("\nFrom Python:\n", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    for literal in (README_SLM, README_LLM, README_QUESTION):
        assert literal in code, f"README's From Python example no longer has {literal}: update this test"
    return code


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    slm_dir = tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=HANDOFF_SLM_SEED)
    llm_dir = tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=CLEAN_LLM_SEEDS[1], offload=False)
    return slm_dir, llm_dir, HFBackend(slm_dir)


def run_readme_example(code: str, slm: str, llm: str, question: str, bias: float, capsys, monkeypatch):
    """README's example with its SLM path, LLM spec and question replaced, the engine at `bias` (a mid-trace
    handoff of the tiny SLM) and 24 tokens a model; returns the `done` it printed."""
    monkeypatch.setattr(
        pyrodash, "CollaborateEngine", functools.partial(pyrodash.CollaborateEngine, offload_bias=bias, max_tokens=24)
    )
    src = code.replace(README_SLM, slm).replace(README_LLM, llm).replace(README_QUESTION, repr(question))
    scope: dict = {}
    capsys.readouterr()
    exec(compile(src, "README.md (From Python)", "exec"), scope)  # noqa: S102 - the README's own example
    done = scope["done"]
    assert done.output in capsys.readouterr().out
    return done


@pytest.mark.slow
def test_readme_python_example_with_transformers_serve(tiny, capsys, monkeypatch, tmp_path):
    slm_dir, llm_dir, slm = tiny
    code = readme_python_example()
    port = free_port()
    (tmp_path / "hub").mkdir()
    env = {**os.environ, "HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"}
    exe = shutil.which("transformers") or str(Path(sys.executable).parent / "transformers")
    cmd = [exe, "serve", "--host", "127.0.0.1", "--port", str(port), str(llm_dir)]
    served, local = [], []
    with _process(cmd, f"http://127.0.0.1:{port}/health", env, tmp_path / "serve.log"):
        for q in QUESTIONS:
            bias = mid_trace_bias(slm, PROMPTS, q)
            served.append(
                run_readme_example(
                    code, str(slm_dir), f"http://127.0.0.1:{port}/v1#{llm_dir}", q, bias, capsys, monkeypatch
                )
            )
            local.append(run_readme_example(code, str(slm_dir), str(llm_dir), q, bias, capsys, monkeypatch))
    for q, done, ref in zip(QUESTIONS, served, local, strict=True):
        assert done.handoff is not None and done.usage.llm_calls == 1, (q, done.to_dict())
        assert not done.fallback and not done.errors and done.usage.llm_out > 0, (q, done.errors)
        assert ref.handoff == done.handoff and not ref.fallback
        assert (done.llm_text, done.output) == (ref.llm_text, ref.output), q  # the in-process LLM's answer


# ---------------------------------------------------------------- the loader


def test_load_llm_local_endpoint_and_probe(tiny, monkeypatch):
    _, llm_dir, _ = tiny
    assert isinstance(load_llm(str(llm_dir)), HFBackend)
    with pytest.raises(ValueError, match="a local LLM continues the trace in process"):
        load_llm(str(llm_dir), "instruct")
    with serve_in_thread(build_model_app(HFBackend(llm_dir), "llm")) as url:
        llm = load_llm(f"{url}#llm")  # probed: the mode is detected and recorded
        assert isinstance(llm, OpenAICompatBackend) and llm.report is not None and llm.wire.mode == "continue"
        plain = load_backend(f"{url}#llm")  # the generic loader never probes (not for an LLM)
        assert plain.report is None
        seen = []

        def local(spec):
            seen.append(spec)
            return HFBackend(spec["path"] if isinstance(spec, dict) else spec, name="mine")

        mesh = load_llm([f"{url}#llm", {"path": str(llm_dir), "name": "in-process"}], "continue", local=local)
        assert isinstance(mesh, MeshBackend) and [m.name for m in mesh.members] == ["llm", "in-process"]
        assert seen == [{"path": str(llm_dir), "name": "in-process"}] and mesh.members[0].backend.report is not None
    with pytest.raises(ValueError, match="no endpoint of the LLM mesh is an http"):
        load_llm([str(llm_dir)], "instruct")


def test_frozen_llm_loads_through_the_one_loader_and_takes_a_mesh(tiny):
    from pyrodash.train.models import FrozenLLM

    _, llm_dir, _ = tiny
    local = FrozenLLM.from_spec(str(llm_dir), batch_size=4)
    assert isinstance(local.backend, HFBackend) and hasattr(local.backend, "generate_batch")
    params = list(local.backend.model.parameters())
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in params)
    assert local.key == str(llm_dir)  # call journals of an in-process LLM keep their key
    reqs = [GenRequest(messages=[{"role": "user", "content": q}], max_tokens=8) for q in QUESTIONS[:3]]
    want = [g.text for g in local.generate(reqs)]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(serve_in_thread(build_model_app(local.backend, "llm"))) for _ in range(2)]
        mesh = FrozenLLM.from_spec([f"{urls[0]}#llm", f"{urls[1]}#llm"], concurrency=2)
        assert isinstance(mesh.backend, MeshBackend) and all(m.backend.report is not None for m in mesh.backend.members)
        assert mesh.style == "continue" and mesh.key.startswith("[")
        gens = mesh.generate(reqs)
    assert [g.text for g in gens] == want and mesh.calls == 3 and mesh.failures == 0


# ---------------------------------------------------------------- layering


def _own_imports(path: Path) -> list[tuple[str, bool]]:
    """(imported pyrodash module, inside a function?) for every import of the package in `path`."""
    tree = ast.parse(path.read_text())
    out = []

    def visit(node, in_func: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_func or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("pyrodash"):
                out.append((child.module, inner))
            elif isinstance(child, ast.Import):
                out.extend((a.name, inner) for a in child.names if a.name.startswith("pyrodash"))
            visit(child, inner)

    visit(tree, False)
    return out


# imports that stay inside a function: `hf` imports torch (seconds), loaded only when a local model is
IN_FUNCTION = {("loader.py", "pyrodash.backends.hf.backend")}


BACKENDS = ROOT / "pyrodash" / "backends"


def _backend_modules() -> list[str]:
    """Every module of pyrodash.backends, its rooms (hf/, http/) included, as a dotted name."""
    names = (".".join(p.relative_to(ROOT).with_suffix("").parts) for p in sorted(BACKENDS.rglob("*.py")))
    return [n.removesuffix(".__init__") for n in names]


def test_backends_import_only_leaf_modules_and_at_module_top():
    allowed = ("pyrodash.backends", "pyrodash.cost", "pyrodash.chat")  # leaves: prices, the typed conversation
    for path in sorted(BACKENDS.rglob("*.py")):
        name = str(path.relative_to(BACKENDS))
        for mod, in_func in _own_imports(path):
            assert mod.startswith(allowed), f"{name} imports {mod}: backends may import only {allowed}"
            assert not in_func or (name, mod) in IN_FUNCTION, (
                f"{name} imports {mod} inside a function: move it to the module top"
            )


def test_every_backends_module_imports_first_in_a_fresh_interpreter():
    code = "import importlib, sys; importlib.import_module(sys.argv[1])"
    for mod in _backend_modules():
        r = subprocess.run([sys.executable, "-c", code, mod], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"import {mod}: {r.stderr[-2000:]}"
