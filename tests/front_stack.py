"""The stack the wire-API tests share (tests/test_server_responses.py, test_server_messages.py, test_fronts_litellm.py):
`pyrodash serve`'s app on 127.0.0.1 over real tiny models, the SLM in process and the LLM behind its own
OpenAI-compatible server, with an operating point ("mid") at which the SLM hands off mid-answer on `QUESTION`."""

from __future__ import annotations

from contextlib import contextmanager

from test_server import OPS, UvicornThread, llm_server, make_engine, remote, serve_config
from tiny_models import CLEAN_LLM_SEEDS, HANDOFF_SLM_SEED, mid_trace_bias, tiny_model_dir

from pyrodash.backends.hf.backend import HFBackend
from pyrodash.prompts import get_prompts
from pyrodash.server.app import build_app

QUESTION = "Start 47: +3, f."


@contextmanager
def front_stack(tmp_path_factory, **config):
    """(the pyrodash server, its config): operating points as tests/test_server.py's, plus "mid"."""
    slm = HFBackend(tiny_model_dir(tmp_path_factory.mktemp("slm"), seed=HANDOFF_SLM_SEED), name="tiny-slm")
    llm_dir = tiny_model_dir(tmp_path_factory.mktemp("llm"), seed=CLEAN_LLM_SEEDS[1], offload=False)
    bias = mid_trace_bias(slm, get_prompts("world-v1"), QUESTION)
    cfg = serve_config(operating_points={**OPS, "mid": bias}, **config)
    with llm_server(HFBackend(llm_dir, name="tiny-llm")) as lsrv:
        engine = make_engine(slm, remote(lsrv.url), cfg)
        with UvicornThread(build_app(cfg, engine=engine)) as srv:
            yield srv, cfg


def assert_mid_handoff(p: dict, text: str) -> None:
    """A PyroDash answer: the SLM wrote a few tokens, handed off once, the LLM finished; billed and priced."""
    assert p["handoff"] is not None and p["handoff"] >= 1 and p["llm_calls"] == 1, p
    assert not p["fallback"] and p["llm_out"] >= 1 and p["cost_usd"] > 0
    assert [s["by"] for s in p["segments"]] == ["slm", "llm"] and text == "".join(s["text"] for s in p["segments"])
    assert p["llm_only_cost_usd"] is not None and "overhead_ms" in p
