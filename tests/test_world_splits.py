"""The world's three uses of held-out data: `dev` (recipe work), `val` (picking an operating point), the test tiers
(the report). `val` is drawn last, from a stream of its own, so its size moves no other split; the long conversations
a build writes are the ones a world built without them makes on first use; no question is in two splits."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from pyrodash.world.build import make_splits, write_splits
from pyrodash.world.config import WorldConfig
from pyrodash.world.multiturn import LONG_SPLITS, ensure_long_split

# a small question space (3 addends, one lead-run length: 300 questions a tier), so that a `val` drawn before another
# split would take some of that split's questions and move it
SMALL = replace(
    WorldConfig.from_preset("quick"),
    n_test=6,
    n_train=20,
    n_dev=8,
    n_val=10,
    n_multiturn=3,
    n_multiturn_train=4,
    max_addend=3,
    lead_runs=(7, 7),
)


def test_the_quick_world_can_tell_one_point_on_val():
    quick = WorldConfig.from_preset("quick")
    assert quick.n_val >= 150 and WorldConfig().n_val >= 150  # one question is at most 0.67 points
    assert LONG_SPLITS["multiturn6_val"][0] >= 150


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 60), st.integers(0, 2))
def test_val_size_moves_no_other_split_and_no_question_is_in_two(n_val, seed):
    base = make_splits(replace(SMALL, n_val=0), seed)
    grown = make_splits(replace(SMALL, n_val=n_val), seed)
    assert len(grown["val"]) == n_val
    for name, exs in base.items():
        if name != "val":
            assert grown[name] == exs, name
    singles = [ex.question for name, exs in grown.items() for ex in exs if "turn" not in ex.meta]
    openers = [ex.question for exs in grown.values() for ex in exs if ex.meta.get("turn") == 1]
    assert len(set(singles)) == len(singles) and not set(openers) & set(singles)
    assert len(set(openers)) == len(openers)


def test_a_build_writes_the_long_splits_a_world_without_them_would_make(tmp_path):
    splits = make_splits(SMALL, 0)
    write_splits({k: v for k, v in splits.items() if k not in LONG_SPLITS}, tmp_path / "data")
    (tmp_path / "world.json").write_text(json.dumps({"config": SMALL.to_dict(), "seed": 0}))
    for name in LONG_SPLITS:
        made = [json.loads(x) for x in ensure_long_split(tmp_path, name).read_text().splitlines()]
        assert made == [ex.to_dict() for ex in splits[name]], name


def test_val_size_keeps_a_worlds_measurements_and_an_older_world_json_reads_its_dev():
    """The build's measurements (tiers, continuations, conversation turns) do not read `val`, so its size keeps them
    reusable (`build.reusable_measurements`); `dev` moves the splits after it, so its size does not. A world.json from
    before `dev` existed (the shipped base models') had its dev under `n_val`, and reads as the quick preset."""
    from pyrodash.world.shipped import SHIPPED

    quick = WorldConfig.from_preset("quick")
    assert quick.measurements_hash() == replace(quick, n_val=7).measurements_hash()
    assert quick.measurements_hash() != replace(quick, n_dev=7).measurements_hash()
    shipped = json.loads((SHIPPED / "seed0" / "world.json").read_text())["config"]
    if "n_dev" not in shipped:
        assert WorldConfig.from_stored(shipped).measurements_hash() == quick.measurements_hash()
