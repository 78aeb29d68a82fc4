"""Benchmark loaders: the real shared/benchmarks files, user paths, subsampling, errors, world delegation, CLI."""

from __future__ import annotations

import json
import re

import pytest

from pyrodash.cli import main
from pyrodash.data import benchmarks as bm
from pyrodash.data.benchmarks import load_benchmark, local_file
from pyrodash.data.example import Example

# name -> row count of the files in shared/benchmarks
EXPECTED = {"gsm8k": 1319, "minerva": 272, "olympiadbench": 675, "aime24": 30, "aime25": 30}


def _need(name: str):
    f = local_file(name)
    if f is None:
        pytest.skip(f"no local {name} file: shared/benchmarks not found (CI has it at ../shared/benchmarks)")
    return f


def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("name", list(EXPECTED))
def test_real_benchmark_files_load_uniform_examples(name):
    f = _need(name)
    exs = load_benchmark(name)
    assert len(exs) == EXPECTED[name]
    assert all(isinstance(e, Example) and e.benchmark == name for e in exs)
    assert all(e.question.strip() and e.gold.strip() for e in exs)
    assert len({e.id for e in exs}) == len(exs), "ids must be unique"
    assert load_benchmark(name, path=f) == exs  # the same rows through an explicit path
    assert all(Example.from_dict(e.to_dict()) == e for e in exs[:5])


def test_gsm8k_gold_is_the_number_after_hashes_without_commas():
    f = _need("gsm8k")
    raw = [json.loads(line) for line in f.read_text().splitlines()]
    exs = load_benchmark("gsm8k")
    for r, e in zip(raw, exs):
        assert e.gold == r["answer"].split("####")[-1].strip().replace(",", "")
        assert re.fullmatch(r"-?\d+(\.\d+)?", e.gold), e.gold
        assert "####" not in e.meta["solution"]
    with_commas = [e for r, e in zip(raw, exs) if "," in r["answer"].split("####")[-1]]
    assert with_commas, "the GSM8K test split has golds like '1,450,000'"


def test_aime_golds_are_integers():
    for name in ("aime24", "aime25"):
        _need(name)
        assert all(re.fullmatch(r"\d{1,3}", e.gold) for e in load_benchmark(name))


def test_minerva_gold_is_the_last_box_of_the_solution():
    _need("minerva")
    from pyrodash.grading import extract_answer

    exs = load_benchmark("minerva")
    assert all(e.gold == extract_answer(e.meta["solution"]).strip("$").strip() for e in exs)


def test_olympiadbench_multi_answer_golds_join_the_answers():
    _need("olympiadbench")
    exs = load_benchmark("olympiadbench")
    multi = [e for e in exs if e.meta["is_multiple_answer"]]
    assert len(multi) == 94
    assert all("$" not in e.gold for e in exs)
    assert any(e.gold == "69, 84" for e in multi)  # '$69$,$84$' in the file


@pytest.mark.parametrize(
    ("raw", "parts"),
    [
        ("$69$,$84$", ["69", "84"]),
        ("1,3", ["1,3"]),
        ("$221,$8$", ["221", "8"]),  # unbalanced `$` in the real file: both parts kept
        ("$(1,2),$3$", ["(1,2)", "3"]),  # commas inside brackets do not split
        ("$a=2$, $a=-6-4 \\sqrt{2}$", ["a=2", "a=-6-4 \\sqrt{2}"]),
        ("$(-\\infty, 0) \\cup\\{1\\}$.", ["(-\\infty, 0) \\cup\\{1\\}"]),
        ("$f(x)=a x+b$, where $b$ is an arbitrary integer", ["f(x)=a x+b, where b is an arbitrary integer"]),
    ],
)
def test_olympiadbench_answer_parts(raw, parts):
    assert bm._strip_dollars(raw) == parts


def test_olympiadbench_real_file_has_no_truncated_or_prose_multi_golds():
    _need("olympiadbench")
    exs = load_benchmark("olympiadbench")
    assert not [e.gold for e in exs if e.gold.rstrip().endswith(",")], "a gold lost its last part"
    assert any(e.meta["answers"] == ["221", "8"] for e in exs)  # '$221,$8$' in the file
    prose = [e for e in exs if "where" in e.gold]
    assert prose and all(len(e.meta["answers"]) == 1 for e in prose)


def test_limit_and_seed_subsample_deterministically_in_file_order(tmp_path):
    f = _write_jsonl(tmp_path / "gsm.jsonl", [{"question": f"q{i}", "answer": f"s\n#### {i}"} for i in range(50)])
    all_ = load_benchmark("gsm8k", path=f, limit=None)
    assert [e.gold for e in all_] == [str(i) for i in range(50)]
    first = load_benchmark("gsm8k", path=f, limit=5, seed=None)
    assert [e.gold for e in first] == ["0", "1", "2", "3", "4"]
    a = load_benchmark("gsm8k", path=f, limit=10, seed=0)
    assert a == load_benchmark("gsm8k", path=f, limit=10, seed=0)
    assert [e.id for e in a] != [e.id for e in load_benchmark("gsm8k", path=f, limit=10, seed=1)]
    order = [int(e.gold) for e in a]
    assert order == sorted(order) and len(set(order)) == 10
    assert len(load_benchmark("gsm8k", path=f, limit=500)) == 50
    for bad in (0, -1, 2.5):
        with pytest.raises(ValueError, match="limit"):
            load_benchmark("gsm8k", path=f, limit=bad)


def test_user_paths_env_dir_and_math500(tmp_path, monkeypatch):
    rows = [
        {
            "problem": "What is $1+1$?",
            "solution": "It is $\\boxed{2}$.",
            "answer": "2",
            "subject": "Algebra",
            "level": 1,
            "unique_id": "test/algebra/1.json",
        }
    ]
    _write_jsonl(tmp_path / "bench" / "math500" / "test.jsonl", rows)
    by_dir = load_benchmark("math500", path=tmp_path / "bench" / "math500")
    assert by_dir[0].id == "math500-test/algebra/1.json" and by_dir[0].gold == "2"
    assert by_dir[0].meta["subject"] == "Algebra"
    monkeypatch.setenv(bm.ENV_DIR, str(tmp_path / "bench"))
    assert load_benchmark("MATH-500") == by_dir  # found through PYRODASH_BENCHMARKS_DIR, alias accepted
    # a Minerva-style file with an explicit answer field, and one without (gold from the last box)
    f = _write_jsonl(
        tmp_path / "m.jsonl",
        [{"problem": "p", "solution": r"\boxed{1} no, \boxed{\frac{3}{4}}"}, {"question": "q", "answer": "$7$"}],
    )
    assert [e.gold for e in load_benchmark("minerva_math", path=f)] == [r"\frac{3}{4}", "7"]


def test_missing_everything_names_both_options(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")

    def offline(*a, **k):
        raise ConnectionError("hub unreachable (test)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.setenv(bm.ENV_DIR, str(tmp_path))  # an empty benchmarks dir
    with pytest.raises(ValueError, match="path=") as err:
        load_benchmark("aime25")
    msg = str(err.value)
    assert bm.ENV_DIR in msg and "math-ai/aime25" in msg and "hub" in msg


def test_bad_inputs_raise_clear_errors(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown benchmark"):
        load_benchmark("gsm9k")
    with pytest.raises(ValueError, match="does not exist"):
        load_benchmark("gsm8k", path=tmp_path / "nope.jsonl")
    f = _write_jsonl(tmp_path / "g.jsonl", [{"question": "q", "answer": "no hashes"}])
    with pytest.raises(ValueError, match="####"):
        load_benchmark("gsm8k", path=f)
    f.write_text('{"question": "q"\n')
    with pytest.raises(ValueError, match="not valid JSON"):
        load_benchmark("gsm8k", path=f)
    monkeypatch.setenv(bm.ENV_DIR, str(tmp_path / "missing"))
    with pytest.raises(ValueError, match=bm.ENV_DIR):
        load_benchmark("gsm8k")


def test_world_names_delegate_to_the_world_builder(tmp_path):
    with pytest.raises(ValueError, match="path="):
        load_benchmark("world:tier3")
    pytest.importorskip("pyrodash.world.build", reason="pyrodash.world.build not written yet")
    exs = [
        Example(
            id=f"w{i}",
            benchmark="world:tier3",
            question=f"{i}+{i}=",
            gold=str(2 * i),
            meta={"steps": [], "hard_steps": []},
        )
        for i in range(6)
    ]
    _write_jsonl(tmp_path / "data" / "tier3.jsonl", [e.to_dict() for e in exs])
    assert load_benchmark("world:tier3", path=tmp_path, limit=None) == exs
    assert len(load_benchmark("world:tier3", path=tmp_path, limit=3, seed=0)) == 3


def test_cli_lists_and_shows(tmp_path, capsys, monkeypatch):
    f = _write_jsonl(tmp_path / "a.jsonl", [{"problem": f"p{i}", "answer": str(i)} for i in range(9)])
    assert main(["benchmarks", "aime25", "--path", str(f), "--limit", "3", "--json"]) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    assert [x["gold"] for x in lines] == ["0", "1", "2"]
    assert main(["benchmarks", "aime25", "--path", str(f), "--limit", "0"]) == 0
    assert "aime25-8" in capsys.readouterr().out
    _write_jsonl(tmp_path / "bench" / "aime24" / "test.jsonl", [{"problem": "p", "answer": "1"}])
    monkeypatch.setenv(bm.ENV_DIR, str(tmp_path / "bench"))
    assert main(["benchmarks", "--json"]) == 0
    listed = {x["name"]: x for x in map(json.loads, capsys.readouterr().out.splitlines())}
    assert set(listed) == set(bm.BENCHMARK_NAMES)
    assert listed["aime24"]["rows"] == 1 and listed["gsm8k"]["rows"] is None
    assert "openai/gsm8k" in listed["gsm8k"]["source"]
    assert main(["benchmarks", "nope"]) == 2
