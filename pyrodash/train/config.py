"""Training recipes: one YAML file -> `Recipe` (world/models/prompts/prices + curation + the three stage configs).

The stage configs subclass TRL's (`SFTConfig`, `GRPOConfig`) and add only what PyroDash needs (LoRA shape, the
`<offload>` init noise, lambda, the cost penalty, ...). Everything else in a stage's YAML section is a TRL/
transformers training argument and goes straight into the TRL dataclass, so TRL validates it.

    recipe = load_recipe("configs/world/quick.yaml")
    recipe.stage_config("stage2", output_dir="runs/x/stage2")   # -> Stage2Config (an SFTConfig)

A recipe YAML, every key commented: docs/internals.md.
"""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from trl import GRPOConfig, SFTConfig

from pyrodash.cost import Prices
from pyrodash.prompts import get_prompts
from pyrodash.world.config import WorldConfig, default_world_dir

ATTENTION_PROJECTIONS = ["q_proj", "k_proj", "v_proj", "o_proj"]
PLACEMENTS = ("random", "before_hard", "at_hard")
HARD_TARGETS = ("full", "to_first_offload")
COST_PENALTIES = ("normalized", "direct")


@dataclass
class CurateConfig:
    """EasyHard curation (see pyrodash.train.curate)."""

    source: str | None = "world:train"  # "world:<split>" | a local .jsonl | "hf:<dataset id>[:<config>]" | null
    split: str = "train"  # split of a HF dataset
    question_field: str = "question"  # HF / JSONL column names
    answer_field: str = "gold"  # the column holding the gold answer
    limit: int | None = None  # first N examples of the source
    heldout_source: str | None = "world:dev"  # labelled easy/hard by the base SLM, for the Stage 2 offload rates
    heldout_limit: int | None = 200  # first N held-out examples
    # your own data (no world split in source or conversations) and no heldout_source: this share of its
    # conversations (a question is a conversation of one) is carved into DIR/curated/val.jsonl, seeded by val_seed,
    # every turn of a conversation on one side, kept out of training and used as the held-out set; 0: no carve
    val_share: float = 0.2
    val_seed: int = 0  # the seed of that carve
    # Conversations (pyrodash.train.chat_logs): "world:<conversation split>" (e.g. world:multiturn_train) or a chat
    # log (.jsonl of OpenAI `messages`, one conversation per line; `pyrodash curate --chats FILE`); every answered
    # turn is curated after its history, as one more example. None: single questions only.
    conversations: str | None = None
    conversation_limit: int | None = None  # first N conversations
    range_max_turns: int | None = None  # the range rule's max_turns: later turns are not SLM targets (None: all)
    heldout_conversations: str | None = None  # conversation turns added to the held-out set (e.g. world:multiturn_val)
    heldout_conversation_limit: int | None = None  # first N of those conversations
    slm_max_new_tokens: int = 512  # the base SLM's answer length when it labels easy / hard
    llm_max_new_tokens: int = 1024  # the LLM's reconstruction length (Corpus B)
    batch_size: int = 32  # SLM / in-process LLM generation batch
    llm_concurrency: int = 16  # concurrent requests to an HTTP LLM
    reconstruct_with_gold: bool = False  # show the LLM the gold answer (real LLMs); the world LLM just solves
    step_sep: str = "\n\n"  # step boundary inside the reasoning
    offload_min: int = 1  # <offload> tokens inserted per hard target, at least
    offload_max: int = 4  # and at most
    placement: str = "random"  # "random" | "before_hard" (world: before the first step needing an untaught fact)
    # | "at_hard" (before every such step, nowhere else)
    hard_target: str = "full"  # "full" (the paper) | "to_first_offload": hard targets of Corpus B end at their
    # first <offload>, hard examples stay out of Corpus A (see pyrodash.train.curate)
    # Relay rows (pyrodash.train.relay_rows): a hard target is the whole solution with `<offload>` before every step
    # `placement` picks (at_hard: every untaught step) and that step written by the LLM (its span masked from the loss
    # in Stage 2), in place of the target cut at its first <offload>. Needs hard_target: to_first_offload (hard
    # examples out of Corpus A, where the LLM's steps would be trained without the mask).
    relay: bool = False
    seed: int = 0  # the placement's and the sampling's seed

    def carves_val(self) -> bool:
        """Whether curation carves val from the data (`val_share` > 0, no `heldout_source`, no world split)."""
        sources = [s for s in (self.source, self.conversations) if s]
        return bool(self.val_share) and not self.heldout_source and not any(s.startswith("world:") for s in sources)

    def validate(self) -> None:
        if not 1 <= self.offload_min <= self.offload_max:
            raise ValueError(f"curate: need 1 <= offload_min ({self.offload_min}) <= offload_max ({self.offload_max})")
        if self.placement not in PLACEMENTS:
            raise ValueError(f"curate.placement={self.placement!r}: choose one of {PLACEMENTS}")
        if self.hard_target not in HARD_TARGETS:
            raise ValueError(f"curate.hard_target={self.hard_target!r}: choose one of {HARD_TARGETS}")
        if not self.step_sep:
            raise ValueError("curate.step_sep must be a non-empty string (the step boundary, e.g. '\\n\\n')")
        if self.relay and self.hard_target != "to_first_offload":
            raise ValueError(
                f"curate.relay writes each hard target as a relay row and keeps hard examples out of Corpus A; "
                f"hard_target={self.hard_target!r} asks for full targets in Corpus A: set hard_target: to_first_offload"
            )
        if not 0.0 <= self.val_share < 1.0:
            raise ValueError(f"curate.val_share={self.val_share!r}: give a fraction in [0, 1), e.g. 0.2 (0: no carve)")
        for name in ("slm_max_new_tokens", "llm_max_new_tokens", "batch_size", "llm_concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"curate.{name} must be >= 1")


@dataclass
class LoraFields:
    """LoRA shape shared by the three stages (mixed into each stage config)."""

    lora_r: int = 8  # LoRA rank
    lora_alpha: int = 16  # LoRA scale (alpha / r multiplies the update)
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_target_modules: list[str] = field(default_factory=lambda: list(ATTENTION_PROJECTIONS))  # layers adapted

    def lora_config(self):
        from peft import LoraConfig

        if self.lora_r < 1:
            raise ValueError(f"lora_r={self.lora_r} must be >= 1")
        return LoraConfig(
            r=self.lora_r,
            lora_alpha=self.lora_alpha,
            lora_dropout=self.lora_dropout,
            target_modules=list(self.lora_target_modules),
            task_type="CAUSAL_LM",
            bias="none",
        )


@dataclass
class ChatFields:
    """The chat template a stage trains with (mixed into each stage config; set from the recipe's `chat_template:`)."""

    # template text or a file; None: the tokenizer's own, else PyroDash's default (pyrodash.train.chat_template)
    chat_template: str | None = None


@dataclass
class Stage1Config(ChatFields, LoraFields, SFTConfig):
    """Stage 1: `<offload>` rows + transient LoRA on Corpus B (adapters discarded afterwards)."""

    sigma: float = 0.1  # eq:offload-embed-init noise
    init_seed: int = 0  # seed of that noise
    length_chunks: int = 1  # forward passes a batch is cut into by row length (`pyrodash.train.length_chunks`)


@dataclass
class Stage2Config(ChatFields, LoraFields, SFTConfig):
    """Stage 2: SFT on A u B, assistant-only loss, embeddings frozen, LoRA on the attention projections; merged."""

    measure_max_new_tokens: int = 256  # generation length for the offload-rate measurement
    measure_limit: int | None = None  # held-out examples used for the measurement (None: all)
    length_chunks: int = 1  # forward passes a batch is cut into by row length (`pyrodash.train.length_chunks`)


@dataclass
class Stage3Config(ChatFields, LoraFields, GRPOConfig):
    """Stage 3: cost-aware GRPO with the LLM in the rollout."""

    lam: float = 0.1  # lambda of eq:grpo-total
    cost_penalty: str = "normalized"  # "normalized": R_eff = Cost_act / Cost_base; "direct": Cost_act in USD
    source: str = "world:train"  # training prompts (same syntax as curate.source)
    source_split: str = "train"  # split of a HF dataset
    question_field: str = "question"  # HF / JSONL column names
    answer_field: str = "gold"  # the column holding the gold answer
    train_limit: int | None = None  # first N prompts
    train_offset: int = 0  # skip the first N prompts (e.g. those curation used)
    # Conversation turns mixed into the training prompts (pyrodash.train.chat_logs): "world:<conversation split>"
    # or a chat-log .jsonl; its turns (after their history, as the server serves them) are added to the
    # `train_limit` single questions of `source` until they are `conversation_share` of all prompts.
    conversations: str | None = None
    conversation_share: float = 0.0  # share of the prompts that are conversation turns, in [0, 1)
    range_max_turns: int | None = None  # the range rule's max_turns: later turns are not training prompts (None: all)
    llm_max_new_tokens: int = 512  # the LLM's continuation length in a rollout
    llm_concurrency: int = 16  # concurrent requests to an HTTP LLM
    llm_batch_size: int = 64  # continuations decoded together by an in-process LLM
    slm_price: float | None = None  # C_s of eq:grpo-cost-actual (USD / M tokens); default: the sheet's slm_out
    # Rollouts per group of num_generations sampled with <offload> banned (0, the paper: all from the policy).
    # A policy that hands off with near certainty (low rollout temperature) never samples the other branch, so its
    # groups carry no signal on the decision; a few banned rollouts per group give λ something to compare
    # (pyrodash.train.stage3.ExploreBranches).
    explore_no_handoff: int = 0
    # Rollouts per group sampled with `explore_handoff_bias` added to the <offload> logit (before the temperature):
    # the other branch on problems the policy keeps to itself (a handoff there that scores below the group pushes
    # <offload> down). Tried on the quick world: pushed rollouts halve the handoffs the oracle would not make, and
    # no run reaches the oracle within the bar of its cost. Off in the recipes: docs/training.md.
    explore_handoff: int = 0
    explore_handoff_bias: float = 3.0  # the bias those rollouts add
    # Relay rollouts (pyrodash.train.relay_rollouts): up to max_llm_calls LLM calls per rollout through the engine's
    # relay, each LLM step in the rollout's completion and masked from the loss; 1 (the default): single handoff.
    max_llm_calls: int = 1
    relay_step_max_tokens: int = 64  # the cap of one relay step (the engine's RelayConfig.step_max_tokens)

    def validate(self) -> None:
        if self.lam < 0:
            raise ValueError(f"stage3.lam={self.lam} must be >= 0")
        if self.max_llm_calls < 1 or self.relay_step_max_tokens < 1:
            raise ValueError("stage3.max_llm_calls and stage3.relay_step_max_tokens must be >= 1")
        if self.max_llm_calls > 1 and self.use_vllm:
            raise ValueError("stage3.max_llm_calls > 1 (relay rollouts) works with in-process rollouts only")
        if not 0 <= self.explore_handoff <= self.num_generations - 1 - self.explore_no_handoff:
            raise ValueError(
                f"stage3.explore_handoff={self.explore_handoff} + explore_no_handoff={self.explore_no_handoff} must "
                f"leave at least one of the num_generations={self.num_generations} rollouts to the policy"
            )
        if not 0 <= self.explore_no_handoff < self.num_generations:
            raise ValueError(
                f"stage3.explore_no_handoff={self.explore_no_handoff} must be in [0, num_generations) "
                f"(num_generations={self.num_generations})"
            )
        local = self.per_device_train_batch_size * (self.steps_per_generation or self.gradient_accumulation_steps)
        if (self.explore_no_handoff or self.explore_handoff) and local % self.num_generations:
            # ExploreBranches finds a prompt's rollouts by row index within each process's generation batch (TRL
            # checks only the batch of all processes together)
            raise ValueError(
                f"stage3.explore_no_handoff / explore_handoff need each process's generation batch ({local}: "
                f"per_device_train_batch_size x steps_per_generation) to be a multiple of "
                f"num_generations ({self.num_generations})"
            )
        if not 0.0 <= self.conversation_share < 1.0:
            raise ValueError(f"stage3.conversation_share={self.conversation_share} must be in [0, 1)")
        if self.conversation_share and not self.conversations:
            raise ValueError("stage3.conversation_share > 0 needs stage3.conversations (e.g. world:multiturn_train)")
        if self.cost_penalty not in COST_PENALTIES:
            raise ValueError(f"stage3.cost_penalty={self.cost_penalty!r}: choose one of {COST_PENALTIES}")


STAGE_CLASSES: dict[str, type] = {"stage1": Stage1Config, "stage2": Stage2Config, "stage3": Stage3Config}
TOP_KEYS = {"name", "world", "slm", "llm", "chat_template", "prompts", "prices", "curate", "stage1", "stage2", "stage3"}


@dataclass
class Recipe:
    name: str  # the recipe's name (in the resolved config saved with every checkpoint)
    world: dict | None = None  # {dir, quick, seed}: a world directory (the commands build it when missing)
    slm: str | None = None  # the base SLM: a model directory, a hub id or DIR#file.gguf
    llm: Any = None  # str or dict (see pyrodash.backends.load_backend)
    chat_template: str | None = None  # the SLM's template (text or file) for every stage; docs/real-models.md
    prompts: str = "qwen-math-v1"  # the prompt set (world-v1 for the built-in world)
    prices: str = "paper"  # the price sheet of Stage 3's cost term (configs/prices/)
    curate: CurateConfig = field(default_factory=CurateConfig)  # the section below
    stage1: dict = field(default_factory=dict)  # raw sections; stage_config() builds the TRL dataclass
    stage2: dict = field(default_factory=dict)  # Stage 2's section (below)
    stage3: dict = field(default_factory=dict)  # Stage 3's section (below)
    path: str | None = None  # set by the loader: the file the recipe came from

    def world_dir(self) -> Path | None:
        """The world directory: `world.dir`, else the world's own cache dir for (quick|full, seed)."""
        if self.world is None:
            return None
        if self.world.get("dir"):
            return Path(self.world["dir"])
        cfg = WorldConfig.from_preset("quick" if self.world.get("quick") else "full")
        return default_world_dir(cfg, int(self.world.get("seed", 0)))

    def stage3_lambda(self, lam: float | None = None) -> float:
        """The λ of a Stage 3 run, resolved in this one place: `lam` (a command's --lambda) when given, else the
        recipe's `stage3.lam`, else Stage3Config's default. The run's directory, its config and its reward use it."""
        return float(lam if lam is not None else self.stage3.get("lam", _default(Stage3Config, "lam")))

    def stage_config(self, stage: str, output_dir: str | Path, validate_only: bool = False, **overrides) -> Any:
        """Build the stage's TRL config (validated by TRL's own __post_init__) for `output_dir`.

        Without a GPU, bf16 defaults to off (TRL defaults it on; transformers refuses it on CPU); `validate_only`
        also turns an explicit bf16/fp16 off, so a GPU recipe can still be checked on a CPU machine."""
        cls = STAGE_CLASSES[stage]
        raw = {**getattr(self, stage), **overrides, "output_dir": str(output_dir)}
        if self.chat_template is not None:
            raw.setdefault("chat_template", self.chat_template)
        if not _has_gpu():
            if validate_only:
                raw = {k: v for k, v in raw.items() if k not in ("bf16", "fp16", "tf32")}
            raw.setdefault("bf16", False)
        known = {f.name for f in fields(cls)}
        for old, new in _RENAMED:  # recipes keep the name every transformers knows; the new one where it exists
            if new in known and new not in raw:
                value = raw.pop(old, _default(cls, old))  # silent recipe: TRL's own default (it sets the old name)
                if value is not None:
                    raw[new] = value
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(
                f"{self.path or self.name}: {stage} has unknown keys {unknown}; they must be fields of "
                f"{cls.__name__} (PyroDash fields or TRL's {cls.__mro__[2].__name__})"
            )
        cfg = cls(**raw)
        if hasattr(cfg, "validate"):
            cfg.validate()
        return cfg

    def validate(self) -> None:
        get_prompts(self.prompts)
        Prices.from_yaml(self.prices)
        self.curate.validate()
        if self.world is None and (not self.slm or not self.llm):
            raise ValueError(f"{self.path or self.name}: a recipe without `world:` must name both `slm` and `llm`")
        if self.world is not None and not isinstance(self.world, dict):
            raise ValueError("`world:` must be a mapping like {quick: true, seed: 0} or {dir: worlds/quick}")
        for stage in STAGE_CLASSES:
            self.stage_config(stage, output_dir="/tmp/pyrodash-validate", validate_only=True)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("path")
        return d


# TrainingArguments keys transformers renamed (it warns on the old name where the new exists, and TRL's configs set
# the old one by default): a recipe's `gradient_checkpointing`, or TRL's default for it, goes in under
# `activation_checkpointing` on a transformers that has it.
_RENAMED = (
    ("gradient_checkpointing", "activation_checkpointing"),
    ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"),
)


def _default(cls, name: str):
    """The default of dataclass field `name` of `cls` (None when it has none)."""
    f = next((f for f in fields(cls) if f.name == name), None)
    if f is None:
        return None
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None


class _Loader(yaml.SafeLoader):
    """YAML 1.1 reads `1e-5` (no dot) as a string; recipes mean a float."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)\.?[0-9_]*(?:[eE][-+]?[0-9]+)$|^[-+]?(?:[0-9][0-9_]*)?\.[0-9_]+$"),
    list("-+0123456789."),
)


def load_yaml(text: str):
    return yaml.load(text, Loader=_Loader)


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def load_recipe(path: str | Path, overrides: dict | None = None) -> Recipe:
    """Load and validate a YAML recipe. `overrides` maps dotted keys ("stage3.lam") to values."""
    p = Path(path)
    if not p.exists():
        raise ValueError(f"config {path} not found; try configs/world/quick.yaml or configs/paper/*.yaml")
    data = load_yaml(p.read_text()) or {}
    if isinstance(data, dict) and "recipe_path" in data and isinstance(data.get("recipe"), dict):
        data = data["recipe"]  # a checkpoint's config.resolved.json (`save_resolved`): the recipe it ran
    if not isinstance(data, dict):
        raise ValueError(f"{p}: a recipe is a YAML mapping with keys {sorted(TOP_KEYS)}")
    for key, value in (overrides or {}).items():
        section, _, name = key.partition(".")
        if name:
            data.setdefault(section, {})[name] = value
        else:
            data[section] = value
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ValueError(f"{p}: unknown top-level keys {unknown}; expected some of {sorted(TOP_KEYS)}")
    cur = data.pop("curate", None) or {}
    known = {f.name for f in fields(CurateConfig)}
    if set(cur) - known:
        raise ValueError(f"{p}: curate has unknown keys {sorted(set(cur) - known)}; expected some of {sorted(known)}")
    recipe = Recipe(**{"name": p.stem, **data}, curate=CurateConfig(**cur), path=str(p))
    for stage in STAGE_CLASSES:
        if getattr(recipe, stage) is None:
            setattr(recipe, stage, {})
    recipe.validate()
    return recipe


def save_resolved(out_dir: str | Path, recipe: Recipe, stage_cfg: Any = None, extra: dict | None = None) -> Path:
    """Write `config.resolved.json` (the recipe, the stage's full TRL config, extras) beside a checkpoint."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc: dict = {"recipe": recipe.to_dict(), "recipe_path": recipe.path}
    if stage_cfg is not None:
        doc["stage_config"] = stage_cfg.to_dict() if hasattr(stage_cfg, "to_dict") else asdict(stage_cfg)
    if extra:
        doc.update(extra)
    path = out / "config.resolved.json"
    path.write_text(json.dumps(doc, indent=2, default=str))
    return path
