"""The run's answer store (pyrodash.backends.answer_store): a greedy generation decoded once in a run is read back by
every other method and step that asks the same model the same thing, and the records are the same with and without
it. Generations are counted by a counting wrapper around `HFBackend.generate_ids` (what the decode loop runs)."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace

import pytest
from tiny_models import tiny_model_dir

from pyrodash.backends.answer_store import AnswerStore, answer_counts
from pyrodash.backends.base import GenRequest, GenResult
from pyrodash.backends.hf.backend import HFBackend
from pyrodash.eval.build import Backends, build_methods
from pyrodash.eval.harness import EvalConfig, evaluate
from pyrodash.eval.methods import Env
from pyrodash.prompts import get_prompts
from pyrodash.world.multiturn import make_multiturn_split
from pyrodash.world.task import make_known, make_split, make_table


@pytest.fixture
def decoded(monkeypatch):
    """Counter of request rows decoded, by model name (the counting wrapper)."""
    counts: Counter = Counter()
    real = HFBackend.generate_ids

    def counting(self, prompts, reqs):
        counts[self.name] += len(prompts)
        return real(self, prompts, reqs)

    monkeypatch.setattr(HFBackend, "generate_ids", counting)
    return counts


def _reqs(n: int, **kw) -> list[GenRequest]:
    return [
        GenRequest(messages=[{"role": "user", "content": f"what is {i} + {i}?"}], max_tokens=8, **kw) for i in range(n)
    ]


def test_a_greedy_generation_is_decoded_once_across_backends_and_read_back_the_same(tmp_path, decoded):
    """A second backend on the same model (another worker) reads every greedy answer back, bit for bit (tokens,
    finish, usage, prompt ids); another budget, another model or a sampled request is decoded, never served."""
    path = tiny_model_dir(tmp_path / "m", seed=3)
    store = AnswerStore(tmp_path / "answers")
    a, b = HFBackend(path, name="m"), HFBackend(path, name="m")
    a.answers = b.answers = store
    first = a.generate_batch(_reqs(3) + _reqs(3)[:1])  # the repeat in the batch: decoded once (same_decode)
    assert decoded["m"] == 3
    again = b.generate_batch(_reqs(3))
    assert decoded["m"] == 3 and [r.to_json() for r in again] == [r.to_json() for r in first[:3]]
    assert [r.prompt_ids for r in again] == [r.prompt_ids for r in first[:3]]
    assert answer_counts(store.root) == {"served": 3, "generated": 3}
    b.generate_batch([replace(r, max_tokens=5) for r in _reqs(2)])  # another budget: another address
    assert decoded["m"] == 5
    b.generate_batch(_reqs(2, temperature=0.8, seed=1))  # sampled: never stored
    b.generate_batch(_reqs(2, temperature=0.8, seed=1))
    assert decoded["m"] == 9
    other = HFBackend(tiny_model_dir(tmp_path / "o", seed=5), name="m")
    other.answers = store
    other.generate_batch(_reqs(3))  # other weights: other addresses
    assert decoded["m"] == 12
    assert answer_counts(store.root) == {"served": 3, "generated": 3 + 2 + 3}


TABLE, KNOWN = make_table(0), make_known(0.65)


def _world(tmp_path):
    """A world directory with a tier and gold-history conversations of three turns."""
    data = tmp_path / "world" / "data"
    data.mkdir(parents=True)
    splits = {
        "tier1": make_split(0, "tier1", 4, [1], TABLE, KNOWN),
        "multiturn": make_multiturn_split(0, 3, 3, [1, 2], [1], TABLE, KNOWN),
    }
    for name, exs in splits.items():
        (data / f"{name}.jsonl").write_text("".join(json.dumps(e.to_dict()) + "\n" for e in exs))
    return tmp_path / "world"


def _config(tmp_path, run: str, world, methods: list, **kw) -> EvalConfig:
    models = {
        "slm": str(tiny_model_dir(tmp_path / "slm", seed=1)),
        "llm": str(tiny_model_dir(tmp_path / "llm", seed=3)),
        "pyrodash": {0.6: str(tiny_model_dir(tmp_path / "policy", seed=9))},
    }
    return EvalConfig(
        run_dir=str(tmp_path / run),
        benchmarks=["world:tier1", "world:multiturn"],
        methods=methods,
        models=models,
        world_dir=str(world),
        prompts="world-v1",
        max_tokens=12,
        batch_size=4,
        **kw,
    )


def _records(run_dir) -> dict[str, list[dict]]:
    """Each method's records without what a clock decides (latency_s) or how it was batched."""
    out = {}
    for p in sorted((run_dir / "records").glob("*.jsonl")):
        rows = [json.loads(x) for x in p.read_text().splitlines()]
        out[p.stem] = [{k: v for k, v in r.items() if k not in ("latency_s", "batch")} for r in rows]
    return out


def test_two_steps_that_need_the_same_llm_answers_generate_each_once(tmp_path, decoded):
    """Step 1 evaluates the LLM alone; step 2 (a fresh process's backends) the PyroDash policy under a range rule of
    one turn, whose turns 2-3 go to the LLM alone: every routed turn's LLM answer is read from the store, none decoded
    again. The records equal those of the same two steps without the store
    (`answers: off`), where the routed turns are decoded a second time."""
    world = _world(tmp_path)
    rule = {"max_turns": 1}
    steps = lambda run, **kw: [  # noqa: E731
        _config(tmp_path, run, world, ["llm"], **kw),
        _config(tmp_path, run, world, ["pyrodash"], range_rule=rule, **kw),
    ]
    with_store = steps("run")
    for cfg in with_store:
        evaluate(cfg, quiet=True)
    llm = with_store[0].models["llm"].rsplit("/", 1)[-1]
    llm_decodes = decoded[llm]
    recs = _records(tmp_path / "run")
    routed = [r for r in recs["pyrodash@0.6"] if r.get("routed") == "range"]
    assert len(routed) == 6  # turns 2 and 3 of three conversations
    assert llm_decodes == len(recs["llm"])  # the LLM decoded each of its own questions once, nothing for the policy
    counts = answer_counts(tmp_path / "run" / "answers")
    assert counts["served"] >= len(routed)

    decoded.clear()
    for cfg in steps("off", answers="off"):
        evaluate(cfg, quiet=True)
    assert decoded[llm] >= llm_decodes + len(routed)  # without the store the routed turns decode again
    assert not (tmp_path / "off" / "answers").exists()
    assert _records(tmp_path / "off") == recs


def test_a_config_made_for_another_run_dir_keeps_the_store(tmp_path, decoded):
    """The oracle and the LLM alone evaluated again in a run dir made from the first config (as the demo's relay run
    re-evaluates them beside its relay points): each of their SLM and LLM generations is read back, none decoded,
    and the records equal the first run's and those of the same evaluation without a store."""
    world = _world(tmp_path)
    first = replace(_config(tmp_path, "run", world, ["llm", "oracle"]), benchmarks=["world:tier1"])
    evaluate(first, quiet=True)
    decodes = sum(decoded.values())
    assert decodes > 0
    evaluate(replace(first, run_dir=str(tmp_path / "run" / "relay")), quiet=True)
    assert sum(decoded.values()) == decodes and not (tmp_path / "run" / "relay" / "answers").exists()
    env = Env(get_prompts(first.prompts), first.price_sheet(), first.max_tokens, first.batch_size)
    bare = replace(first, run_dir=str(tmp_path / "bare"))
    evaluate(bare, build_methods(bare, env, Backends()), quiet=True)  # backends without a store
    assert sum(decoded.values()) == 2 * decodes
    assert _records(tmp_path / "run") == _records(tmp_path / "run" / "relay") == _records(tmp_path / "bare")
    assert answer_counts(tmp_path / "run" / "answers") == {"served": decodes, "generated": decodes}


def test_the_report_says_how_many_generations_came_from_the_store(tmp_path):
    """summary.json's `answers` and report.md's line are the store's counts, read through the run's resolved
    config; a run evaluated with `answers: off` has zeros and no line."""
    from pyrodash.report.render import write_report

    world = _world(tmp_path)
    cfg = replace(_config(tmp_path, "run", world, ["slm", "llm"]), benchmarks=["world:tier1"])
    evaluate(cfg, quiet=True)
    evaluate(replace(cfg, methods=["llm", "slm"]), quiet=True)  # (resumed: nothing left to answer)
    evaluate(replace(cfg, run_dir=str(tmp_path / "run" / "again")), quiet=True)  # the same answers, read back
    counts = answer_counts(tmp_path / "run" / "answers")
    assert counts == {"served": 8, "generated": 8}  # 4 questions, 2 models
    md = write_report(tmp_path / "run").read_text()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["answers"] == counts
    assert "Answer store: 8 of 16 greedy generations were read back" in md
    off = replace(cfg, run_dir=str(tmp_path / "off"), answers="off")
    evaluate(off, quiet=True)
    md = write_report(tmp_path / "off").read_text()
    assert json.loads((tmp_path / "off" / "summary.json").read_text())["answers"] == {"served": 0, "generated": 0}
    assert "Answer store" not in md


def test_the_report_finds_the_runs_store_from_another_working_directory(tmp_path, monkeypatch):
    """A run evaluated with a relative run dir records a relative store path; `pyrodash report` run from another
    directory on the run's absolute path still counts the run's own store (it once read zeros there)."""
    from pyrodash.report.render import write_report

    world = _world(tmp_path)
    monkeypatch.chdir(tmp_path)
    cfg = replace(_config(tmp_path, "run", world, ["slm"]), benchmarks=["world:tier1"], run_dir="run", answers=None)
    evaluate(cfg, quiet=True)
    assert json.loads((tmp_path / "run" / "config.resolved.json").read_text())["answers"] == "run/answers"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    write_report(tmp_path / "run")
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["answers"] == {"served": 0, "generated": 4}


def test_the_range_calibration_reads_the_llm_half_decoded_beside_training(tmp_path, decoded, monkeypatch):
    """`llm_validation_answers` (the demo's step beside training) decodes the LLM alone on the validation turns it is
    told to (`LLM_TURNS_AHEAD`; here every one, then the first two) into the run's store; `calibrate_long` after it
    decodes the policy's turns and only the LLM answers the store lacks, and reads the others back. Without that step
    the calibration decodes them itself, and the calibrations are the same."""
    import pyrodash.world.multiturn as multiturn
    from pyrodash.eval.long import VALIDATION, calibrate_long, llm_validation_answers

    world = _world(tmp_path)
    data, split = world / "data", VALIDATION.split(":")[1]
    (data / f"{split}.jsonl").write_text((data / "multiturn.jsonl").read_text())
    monkeypatch.setattr(multiturn, "LONG_SPLITS", {split: (3, 3)})  # the tiny world's: 3 conversations of 3 turns
    cfg = _config(tmp_path, "run", world, ["llm"])
    llm = cfg.models["llm"].rsplit("/", 1)[-1]
    turns = llm_validation_answers(cfg)
    assert turns == 9 and decoded[llm] == turns  # three conversations of three turns
    decoded.clear()
    read_back = calibrate_long(cfg, 0.6)
    assert decoded[llm] == 0  # the policy's own handoffs aside, every LLM answer came from the store
    decoded.clear()
    alone = calibrate_long(replace(cfg, run_dir=str(tmp_path / "alone"), answers="off"), 0.6)
    measured = sum(r["n"] for r in alone["by_turn"] if r["llm_acc"] is not None)  # up to the first turn out of range
    assert decoded[llm] >= measured and alone["by_turn"] == read_back["by_turn"]
    decoded.clear()
    ahead = replace(cfg, run_dir=str(tmp_path / "ahead"), answers=str(tmp_path / "ahead-answers"))
    assert llm_validation_answers(ahead, turns=2) == 6 and decoded[llm] == 6  # turns 1-2 of the 3 conversations
    decoded.clear()
    assert calibrate_long(ahead, 0.6)["by_turn"] == read_back["by_turn"]
    # the LLM answers decoded now: turn 3's, where the calibration reached it (no handoff decodes any: as above)
    assert decoded[llm] == sum(r["n"] for r in read_back["by_turn"][2:] if r["llm_acc"] is not None)


def test_a_results_json_is_asdicts_copy_without_the_prompt_ids():
    """`GenResult.to_json` is `dataclasses.asdict` less `prompt_ids`, a copy (changing it leaves the result as it was),
    and reads back as the same result but for the prompt's ids (the request has them)."""
    from dataclasses import asdict

    r = GenResult("x", token_ids=[5, 6], prompt_ids=list(range(900)), top_logprobs=[{"a": -0.1}], prompt_tokens=900)
    d = r.to_json()
    want = asdict(r)
    del want["prompt_ids"]
    assert d == want and list(d) == list(want)
    d["token_ids"].append(7)
    d["top_logprobs"][0]["a"] = 0.0
    assert r.token_ids == [5, 6] and r.top_logprobs == [{"a": -0.1}]
    assert GenResult.from_json(r.to_json()) == GenResult(**{**want})
