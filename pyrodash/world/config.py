"""WorldConfig: everything that determines a built world (task, split sizes, model shapes, training), with the
`full` and `quick` presets. Its `config_hash()` names the build cache: same hash + seed = same world
(`default_world_dir(cfg, seed)`, under `$PYRODASH_CACHE`, default ~/.cache/pyrodash).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

# Bump when the build code changes what a config builds (training step, data order), so cached worlds are rebuilt.
# 2: pretraining with fp32 eager attention under bf16 autocast (both models) and fused AdamW.
# 3: world v2 (runs of additions with counters, compact role tokens); pretraining in float32 with SDPA attention,
#    the two models one after the other on the build's threads.
# 4: the addition lines' counters before the worked addition ("(0,2) 68+7=75"), so the value a lookup needs
#    ends the line before the step boundary.
# 5: the SLM pretrains in a second process on 1 thread beside the LLM's first llm_beside_slm_steps steps (`build.py`
#    `train_models`); the full preset's models train as many steps as the quick one's.
BUILD_RECIPE = 5

# The five test tiers stand in for the paper's five benchmarks, easy to hard.
TIER_SPLITS = {"tier1": "GSM8K", "tier2": "Minerva", "tier3": "OlympiadBench", "tier4": "AIME24", "tier5": "AIME25"}


@dataclass(frozen=True)
class ModelSpec:
    """A Qwen3-shaped decoder trained from scratch."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    tie_embeddings: bool
    train_steps: int
    lr: float
    batch_size: int = 64
    warmup_steps: int = 100
    weight_decay: float = 0.01


# Fields that size the data splits or the build's evaluation only: pretraining never reads them (`pretrain.py` draws
# its own examples from its own RNG), so changing them keeps the models (`WorldConfig.models_hash`).
DATA_FIELDS = frozenset(
    {
        "n_test",
        "n_train",
        "n_val",
        "n_dev",
        "n_continue",
        "n_multiturn",
        "n_multiturn_train",
        "n_multiturn_val",
        "eval_batch_size",
        "preset",
    }
)


@dataclass(frozen=True)
class WorldConfig:
    known_frac: float = 0.65  # fraction of the lookup table the SLM is taught
    tiers: tuple[int, ...] = (1, 2, 3, 4, 5)  # lookups per problem of tier1..tier5
    # Tier mix of pretraining examples, weighted to long chains (more lookups per example: the table is what takes
    # the LLM longest to learn).
    pretrain_tiers: tuple[int, ...] = (1, 2, 3, 3, 4, 4, 5, 5, 5)
    max_addend: int = 9  # additions are "+1" .. "+max_addend" (mod 100)
    lead_runs: tuple[int, int] = (7, 9)  # additions before the first lookup, drawn from lo..hi (`task.py`)
    pretrain_lead_runs: tuple[int, int] = (1, 9)  # the same in pretraining (shorter runs: more lookups per token)
    n_test: int = 200  # problems per test tier
    n_train: int = 2000  # train pool (curation, SFT, GRPO), all tiers mixed
    # Three disjoint uses of held-out data (`make_splits`): `dev` for recipe work (curation's held-out set: the Stage 2
    # offload rates, Stage 3's held-out evaluation), `val` for picking an operating point (`pyrodash select`), the
    # tiers for the report only. `dev` is drawn where the world's validation split always was (before `train`, same
    # stream), `val` after every other split from its own stream, so train and test hold what they held before. `val`
    # resolves a one-point difference: 150 questions at least (one question is 0.67 points).
    n_dev: int = 200
    n_val: int = 200
    n_continue: int = 200  # problems for the LLM-continues-a-gold-prefix check
    system_frac: float = 0.25  # fraction of pretraining examples with a (world-v1) system message
    # Conversations (`pyrodash.world.multiturn`): a share of pretraining examples are chats of 2..multiturn_turns
    # turns whose follow-ups ("Then: +4x7 f1") continue from the previous answer; the `multiturn` split holds
    # n_multiturn conversations of multiturn_turns turns (world.json: `multiturn_accuracy`). A 10% share, not the
    # earlier world's 20%: conversations are the longest examples (up to ~650 tokens), and the build's time is tokens.
    multiturn_frac: float = 0.2
    multiturn_turns: int = 3
    followup_tiers: tuple[int, ...] = (1, 2)  # lookups per follow-up turn
    # Conversation splits (`make_splits`): `multiturn` (test, n_multiturn conversations), `multiturn_val` and
    # `multiturn_train` (curation and Stage 3 draw their conversation turns from these); each from its own RNG and
    # drawn after the single-question splits, so those stay as they were.
    n_multiturn: int = 150
    n_multiturn_train: int = 400
    n_multiturn_val: int = 60
    # Small batches: the table is memorised per update, not per example (measured on the earlier world, same CPU
    # time: the LLM at batch 48 x 400 steps solved 1% of problems, at batch 16 x 1200 steps 59%, at batch 8 x 2000
    # 66%).
    # 1800 SLM / 1400 LLM steps in both presets (the full preset's are its larger splits and longer Stage 3). Fewer do
    # not hold up, measured: at 1500 SLM steps the base SLM slips on "+9" carries (65+9=75) in the lead run of hard
    # problems, and the oracle single handoff fell to 97.3 / 98.0 / 96.7% on seeds 0 / 1 / 2 (100% at 1800 on seed
    # 0); at 1250 LLM steps seed 1's LLM solved 82% (tier 5: 63%), and at 1250 with lr 4e-3 100%, but its follow-up
    # turns fell to 40-60%. More do not either: the full preset's LLM at 2000 steps (lr 3e-3; the cosine decay comes
    # later) had not learnt the table on seed 1 (12.9% of problems), where 1400 steps had on seeds 0, 1 and 2.
    slm: ModelSpec = field(default_factory=lambda: ModelSpec(64, 2, 4, 256, True, 1800, 3e-3, 8, 50))
    # The LLM: 2 layers, 128 wide (552k params, 3.8x the SLM), batch 8. Measured on the quick world of seed 0 (40 test
    # problems at checkpoints, 2 cores shared with another run): 2x128 solved 93% after 750 of 1000 steps and 98% at
    # 1000 (143 s); 3x96 (the earlier world's LLM) 83% at 750 of 1000, 172 ms a step against 2x128's 140.
    llm: ModelSpec = field(default_factory=lambda: ModelSpec(128, 2, 4, 512, False, 1400, 3e-3, 8, 50))
    # LLM steps trained beside the SLM (the SLM in another process on 1 thread, the LLM on the other cores), after
    # which the LLM takes every core (`build.py` `train_models`). Measured on 2 cores with both running: SLM 60 ms a
    # step on 1 thread (1800 steps: ~108 s), LLM 145 ms, so the SLM is done near the LLM's 750th step.
    llm_beside_slm_steps: int = 800
    eval_batch_size: int = 200
    preset: str = "full"

    def __post_init__(self) -> None:
        if not 0.0 < self.known_frac < 1.0:
            raise ValueError(f"known_frac must be in (0, 1), got {self.known_frac}")
        if len(self.tiers) != len(TIER_SPLITS) or any(t < 1 for t in self.tiers):
            raise ValueError(f"tiers must list {len(TIER_SPLITS)} lookup counts >= 1, got {self.tiers}")
        if not self.pretrain_tiers or any(t < 1 for t in self.pretrain_tiers):
            raise ValueError(f"pretrain_tiers must list lookup counts >= 1, got {self.pretrain_tiers}")
        if not 0.0 <= self.system_frac <= 1.0:
            raise ValueError(f"system_frac must be in [0, 1], got {self.system_frac}")
        if not 0.0 <= self.multiturn_frac < 1.0:
            raise ValueError(f"multiturn_frac must be in [0, 1), got {self.multiturn_frac}")
        if self.multiturn_turns < 2 or not self.followup_tiers or any(t < 1 for t in self.followup_tiers):
            raise ValueError(
                f"multiturn_turns must be >= 2 and followup_tiers list lookup counts >= 1, got "
                f"{self.multiturn_turns} and {self.followup_tiers}"
            )
        for name, (lo, hi) in (("lead_runs", self.lead_runs), ("pretrain_lead_runs", self.pretrain_lead_runs)):
            if not 1 <= lo <= hi <= 9:
                raise ValueError(f"{name} must be (lo, hi) with 1 <= lo <= hi <= 9, got {(lo, hi)}")
        if self.llm_beside_slm_steps < 0:
            raise ValueError(f"llm_beside_slm_steps must be >= 0, got {self.llm_beside_slm_steps}")
        for name in ("n_multiturn", "n_multiturn_train", "n_multiturn_val"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    @classmethod
    def from_preset(cls, name: str) -> WorldConfig:
        if name == "full":
            return cls()
        if name == "quick":
            base = cls()
            # the same models (same seed: the same weights), smaller splits
            return replace(
                base,
                n_test=30,
                n_train=300,
                n_dev=50,
                n_val=150,
                n_continue=60,
                n_multiturn=60,
                n_multiturn_train=100,
                n_multiturn_val=20,
                preset="quick",
            )
        raise ValueError(f"unknown world preset {name!r}; choose 'full' or 'quick'")

    def to_dict(self) -> dict:
        return asdict(self)

    def config_hash(self) -> str:
        blob = json.dumps({**self.to_dict(), "build_recipe": BUILD_RECIPE}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    def measurements_hash(self) -> str:
        """The hash of what a build's measurements depend on: the config without `n_val` (`val` is drawn after every
        other split, so its size moves nothing they measure; `build.reusable_measurements`)."""
        d = {k: v for k, v in self.to_dict().items() if k != "n_val"}
        return hashlib.sha256(json.dumps({**d, "build_recipe": BUILD_RECIPE}, sort_keys=True).encode()).hexdigest()[:10]

    @classmethod
    def from_stored(cls, d: dict) -> WorldConfig:
        """`from_dict` of a world.json's config, also one written before the `dev` split existed: its validation split
        was drawn where `dev` is, so its `n_val` is that world's `n_dev` (its `val` was none)."""
        d = dict(d)
        if "n_dev" not in d:
            d["n_dev"], d["n_val"] = d.get("n_val", cls.n_dev), 0
        return cls.from_dict(d)

    def models_hash(self) -> str:
        """The hash of what the two pretrained models depend on: the config without the fields that only size the
        data splits or the build's evaluation (`DATA_FIELDS`). Two configs with the same models hash and seed train
        the same models, so a build reuses the models of a cached world that differs in its splits only."""
        d = {k: v for k, v in self.to_dict().items() if k not in DATA_FIELDS}
        blob = json.dumps({**d, "build_recipe": BUILD_RECIPE}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:10]

    @classmethod
    def from_dict(cls, d: dict) -> WorldConfig:
        d = dict(d)
        d["slm"], d["llm"] = ModelSpec(**d["slm"]), ModelSpec(**d["llm"])
        d["tiers"], d["pretrain_tiers"] = tuple(d["tiers"]), tuple(d["pretrain_tiers"])
        for key in ("lead_runs", "pretrain_lead_runs"):
            if key in d:
                d[key] = tuple(d[key])
        if "followup_tiers" in d:
            d["followup_tiers"] = tuple(d["followup_tiers"])
        return cls(**d)


def cache_root() -> Path:
    return Path(os.environ.get("PYRODASH_CACHE") or Path.home() / ".cache" / "pyrodash")


def default_world_dir(cfg: WorldConfig, seed: int) -> Path:
    """Where `pyrodash world build` caches the world of (cfg, seed)."""
    return cache_root() / "worlds" / f"{cfg.preset}-seed{seed}-{cfg.config_hash()}"
