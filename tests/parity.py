"""The one-execution-path parity check, shared by tests/test_demo.py (on the quick demo's trained models)
and runnable by hand on any demo directory:

    python tests/parity.py runs/demo-quick

The same world questions (single questions, conversation turns with their history, questions whose handoff meets an
LLM that drops the connection mid-answer every time, so the SLM falls back, and relay answers: up to RELAY_CALLS LLM
calls per answer, docs/relay.md) go through `pyrodash serve` (a real server process, the official `openai` SDK; relay:
the `pyrodash` object's `max_llm_calls`), `pyrodash eval` (`evaluate`, the batched driver; relay: a `pyrodash_relay`
method) and Stage 3's collaborative eval (`stage3.collaborate`; relay: its `relay`); each must give the same joint
text, segments, handoff positions, token counts, LLM calls and dollars.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import free_port, stop, wait_healthy  # noqa: E402
from test_server import UvicornThread  # noqa: E402
from test_server_faults import FaultInjectingLLM  # noqa: E402

from pyrodash.backends.hf.backend import HFBackend  # noqa: E402
from pyrodash.cost import Prices  # noqa: E402
from pyrodash.data.benchmarks import load_benchmark  # noqa: E402
from pyrodash.engine.conversation import example_messages  # noqa: E402
from pyrodash.engine.relay import RelayConfig  # noqa: E402
from pyrodash.eval.harness import EvalConfig, evaluate  # noqa: E402
from pyrodash.eval.names import method_name  # noqa: E402
from pyrodash.prompts import get_prompts  # noqa: E402
from pyrodash.record import Record  # noqa: E402
from pyrodash.report.load import read_records  # noqa: E402
from pyrodash.server.model_server import build_model_app  # noqa: E402
from pyrodash.train.models import FrozenLLM, load_local  # noqa: E402
from pyrodash.train.stage3 import collaborate  # noqa: E402

BUDGET = 300  # each model's, as the world's eval config and Stage 3 use
RELAY_CALLS = 4  # the relay group's max_llm_calls (docs/relay.md)


def _key(r: dict) -> tuple:
    """What must agree: the text, who wrote what (in order), the handoffs, the token counts (the relay's split of the
    LLM's input and the SLM's prefix-cache hits included), LLM calls, the fallback and the relay's fallback."""
    segs = tuple((s["by"], s["text"], bool(s.get("fallback"))) for s in r["segments"])
    return (
        r["output"],
        segs,
        r["handoff"],
        tuple(r["handoffs"]),
        r["slm_in"],
        r["slm_out"],
        r["slm_cached_in"],
        r["llm_in"],
        r["llm_out"],
        r["llm_prior_in"],
        r["llm_calls"],
        r["relay_fallback"],
        r["fallback"],
    )


def _served(url: str, messages: list[list[dict]], calls: int) -> list[dict]:
    extra = {"max_tokens_per_model": BUDGET}
    if calls > 1:  # relay: the request's `pyrodash` object (a single handoff sends none, as before relay existed)
        extra["pyrodash"] = {"max_llm_calls": calls}
    out = []
    with openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120) as c:
        for m in messages:
            r = c.chat.completions.create(
                model="pyrodash", messages=m, max_tokens=2 * BUDGET, temperature=0, top_p=1, extra_body=extra
            )
            p = dict(r.model_extra["pyrodash"])
            out.append({**p, "output": r.choices[0].message.content})
    return out


def _serve(slm: str, llm: str, prices: str, tmp: Path):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pyrodash",
            "serve",
            "--slm",
            slm,
            "--llm",
            llm,
            "--prompts",
            "world-v1",
            "--prices",
            prices,
            "--port",
            str(port),
            "--max-tokens",
            str(4 * BUDGET),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=tmp,
    )
    wait_healthy(f"http://127.0.0.1:{port}", proc, "pyrodash serve")
    return proc, f"http://127.0.0.1:{port}"


def _same(name: str, exs: list, served: list[dict], evald: list[dict], st3: list[dict]) -> dict[str, list[tuple]]:
    """{path: [record key per question]}, asserting serve == eval == stage3 (keys, and dollars to 1e-12)."""
    keys = {"serve": [_key(r) for r in served], "eval": [_key(r) for r in evald], "stage3": [_key(r) for r in st3]}
    for a, b in (("serve", "eval"), ("stage3", "eval")):
        for i, (x, y) in enumerate(zip(keys[a], keys[b], strict=True)):
            assert x == y, f"{name} question {exs[i].id}: {a} != {b}\n{x}\n{y}"
    for a in (served, st3):
        for x, y in zip(a, evald):
            assert abs(x["cost_usd"] - y["cost_usd"]) < 1e-12, (x["cost_usd"], y["cost_usd"])
    return keys


@dataclass(frozen=True)
class Demo:
    """What the three paths share: the demo's λ 0.6 SLM, prompts, prices, world, and a scratch directory."""

    cfg: dict
    slm_dir: str
    tmp: Path

    @property
    def prompts(self):
        return get_prompts(self.cfg["prompts"])


def _eval_records(d: Demo, llm_spec: str | dict, exs: list, name: str, calls: int) -> list[dict]:
    """`pyrodash eval` of the λ 0.6 policy (relay: a `pyrodash_relay` method at `calls`), in the order of `exs`."""
    relay = calls > 1
    method = {"pyrodash_relay": {"lambda": 0.6, "calls": [calls]}} if relay else "pyrodash"
    ecfg = EvalConfig(
        run_dir=str(d.tmp / f"eval-{name}"),
        benchmarks=sorted({ex.benchmark for ex in exs}),
        methods=[method],
        models={"llm": llm_spec, "pyrodash": {0.6: d.slm_dir}},
        prompts=d.cfg["prompts"],
        prices=d.cfg["prices"],
        max_tokens=BUDGET,
        world_dir=d.cfg["world_dir"],
    )
    file = method_name("pyrodash", 0.6, "relay", calls) if relay else "pyrodash@0.6"
    recs = {
        (r["benchmark"], r["id"]): r
        for r in read_records(evaluate(ecfg, examples=exs, quiet=True) / "records" / f"{file}.jsonl")
    }
    return [recs[(ex.benchmark, ex.id)] for ex in exs]


def _paths(d: Demo, llm_spec: str | dict, exs: list, name: str, served_llm: str, calls: int = 1):
    """serve, eval and Stage 3 on `exs`, up to `calls` LLM calls per answer: {path: [record key]} (asserted equal)."""
    evald = _eval_records(d, llm_spec, exs, name, calls)
    msgs = [example_messages(d.prompts, ex.question, ex.meta.get("history")) for ex in exs]
    model, tok = load_local(d.slm_dir)
    prices, relay = Prices(**d.cfg["prices"]), (RelayConfig(max_llm_calls=calls) if calls > 1 else None)
    dones = collaborate(model, tok, FrozenLLM.from_spec(llm_spec), msgs, d.prompts, prices, BUDGET, BUDGET, relay=relay)
    st3 = [Record.from_done(x).to_json() for x in dones]
    proc, url = _serve(d.slm_dir, served_llm, str(d.tmp / "prices.yaml"), d.tmp)
    try:
        served = _served(url, msgs, calls)
    finally:
        stop(proc)
    return _same(name, exs, served, evald, st3)


def check_parity(
    run_dir: Path, tmp: Path, n_single: int = 6, n_turns: int = 4, n_faults: int = 3, n_relay: int = 4
) -> dict:
    """Run the three paths on the same questions; returns {group: {path: [record key per question]}} (asserting
    equality) for the groups local, faults and relay."""
    cfg = json.loads((run_dir / "config.resolved.json").read_text())
    d = Demo(cfg, cfg["models"]["pyrodash"]["0.6"], tmp)
    llm_dir, world = cfg["models"]["llm"], cfg["world_dir"]
    single = load_benchmark("world:tier2", path=world) + load_benchmark("world:tier4", path=world)
    turns = [ex for ex in load_benchmark("world:multiturn", path=world) if ex.meta.get("turn", 1) > 1]
    # questions that hand off (from the demo's own records): a fault there forces the fallback
    handed = {r["id"] for r in read_records(run_dir / "records" / "pyrodash@0.6.jsonl") if r.get("handoff")}
    examples = single[:n_single] + turns[:n_turns]
    faulty = [ex for ex in single if ex.id in handed][:n_faults]
    assert len(examples) == n_single + n_turns and len(faulty) == n_faults
    (tmp / "prices.yaml").write_text(json.dumps(cfg["prices"]))
    out = _paths(d, llm_dir, examples, "local", llm_dir)
    assert any(k[2] is not None for k in out["eval"]) and any(k[2] is None for k in out["eval"])  # both branches
    # relay: handed-off questions with more than one untaught step (where a relay may hand off again), and turns
    hard = [ex for ex in single + turns if ex.id in handed and len(ex.meta.get("hard_steps") or ()) > 1]
    relayed = _paths(d, llm_dir, hard[:n_relay], "relay", llm_dir, RELAY_CALLS)
    assert len(hard) >= n_relay and any(k[10] > 1 and len(k[3]) > 1 for k in relayed["eval"]), relayed["eval"]
    # the LLM behind an HTTP server that cuts every answer after 3 chunks: each path retries, then falls back
    with UvicornThread(build_model_app(HFBackend(llm_dir), model_name="llm"), log_level="error") as up:
        fault = FaultInjectingLLM(up.url)
        fault.mode, fault.cut_after = "cut", 3
        with UvicornThread(fault.app, log_level="error") as cut:
            spec = {"url": f"{cut.url}/v1", "model": "llm"}
            fell = _paths(d, spec, faulty, "faults", f"{cut.url}/v1#llm")
    assert all(k[-1] for k in fell["eval"]), "every faulty handoff ends in the SLM's fallback"
    return {"local": out, "faults": fell, "relay": relayed}


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        res = check_parity(Path(sys.argv[1]), Path(d))
        print({k: len(v["eval"]) for k, v in res.items()}, "questions: serve == eval == stage3")
        print("relay: LLM calls / handoffs per answer", [(k[10], len(k[3])) for k in res["relay"]["eval"]])
