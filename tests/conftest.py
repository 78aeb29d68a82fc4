"""Fixtures shared by test modules: the quick demo, run once per test session.

`quick_demo` is `pyrodash demo --quick` into a temporary directory (the world from the cache; on a fresh machine built
there from the base models that ship with PyroDash, which `tests/test_world.py` rebuilds from scratch).
tests/test_demo.py checks its report; tests/test_train.py starts from its curated corpora and its Stage 1 and Stage 2
checkpoints (the same recipe makes the same ones), so CI trains them once.
"""

from __future__ import annotations

import time

import pytest


@pytest.fixture(scope="session")
def quick_demo(tmp_path_factory):
    from pyrodash.cli import main

    out = tmp_path_factory.mktemp("demo")
    t0 = time.perf_counter()
    assert main(["demo", "--quick", "--out", str(out)]) == 0
    print(f"quick demo wall time: {time.perf_counter() - t0:.0f}s")
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny SLM and LLM (`tiny_slm`, `tiny_llm` of tests/test_server.py), built once per test module; a module may
    define its own `models` instead."""
    from test_server import tiny_llm, tiny_slm

    return tiny_slm(tmp_path_factory), tiny_llm(tmp_path_factory)
