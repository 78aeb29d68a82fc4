"""The eval config (`pyrodash eval --config FILE`): which methods answer which benchmarks with which models, and how.

    cfg = EvalConfig.from_yaml("configs/eval/world-quick.yaml", run_dir="runs/x")
    other = dataclasses.replace(cfg, methods=["llm"])        # validated again, as any construction

A pydantic dataclass: every key's type, default and meaning are in its `Field` (the schema
`pydantic.TypeAdapter(EvalConfig).json_schema()` is what docs/reference/configs.md renders), a bad value is a
`ValueError` whose message names the key, the value and what to write instead, in one line (`one_line`), and
`dataclasses.replace` / `asdict` work as on any dataclass. `config.resolved.json` of a run reads back as its config.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BeforeValidator, ConfigDict, Field, ValidationError, field_validator
from pydantic.dataclasses import dataclass

from pyrodash.cost import Prices
from pyrodash.engine.range_rule import RangeRule


def _listed(v: Any) -> Any:
    """`benchmarks: gsm8k` is a one-item list, not the letters g, s, m ..."""
    return [v] if isinstance(v, (str, dict)) else v


def _path(v: Any) -> Any:
    """A Path from Python callers is a path too."""
    return os.fspath(v) if isinstance(v, os.PathLike) else v


PathStr = Annotated[str, BeforeValidator(_path)]
PositiveInt = Annotated[int, Field(gt=0)]

# what a key takes, in the words of the one-line error (`one_line`): "<key>=<value> must be <this>"
EXPECT = {
    "run_dir": "a directory path",
    "answers": 'a directory path or "off"',
    "benchmarks": "a list of benchmark names such as [gsm8k, world:test]",
    "methods": "a list such as [slm, llm, pyrodash]",
    "models": "a mapping (key: value lines)",
    "benchmark_paths": "a mapping (key: value lines) of benchmark name -> JSONL file",
    "samples": "a positive integer (k of avg@k) per benchmark",
    "benchmark_methods": "a list of method names or regular expressions per benchmark, e.g. [slm, llm, "
    "'pyrodash@[0-9.]+']",
    "world_dir": "a directory path",
    "prices": "a price sheet name, a YAML path or a mapping",
    "prompts": "a prompt set name such as qwen-math-v1",
    "max_tokens": "a positive integer, e.g. max_tokens: 256",
    "batch_size": "a positive integer, e.g. batch_size: 16",
    "concurrency": "a positive integer, e.g. concurrency: 8",
    "limit": "a positive integer or null (every example)",
    "sample_temperature": "a non-negative number",
    "sample_top_p": "a non-negative number",
    "llm_mode": "a continuation mode (auto, continue, completion, instruct, prefix, anthropic) or null",
    "range_rule": "a mapping {max_turns, max_context_tokens} or null",
}


@dataclass(config=ConfigDict(strict=True, extra="forbid"))
class EvalConfig:
    """An evaluation: methods x benchmarks, written to `run_dir` (docs/evaluation.md)."""

    run_dir: PathStr = Field(description="where records/<method>.jsonl, report.md and summary.json go")
    benchmarks: Annotated[list[Annotated[str, Field(min_length=1)]], BeforeValidator(_listed), Field(min_length=1)] = (
        Field(
            description="world:<split>, a known benchmark name (gsm8k, math500, ...) or one in benchmark_paths; "
            "a single name is a one-item list"
        )
    )
    methods: Annotated[list, BeforeValidator(_listed)] = Field(
        default_factory=lambda: ["slm", "llm"],
        description="names or {name: options}: [Evaluation and reports](../evaluation.md)",
    )
    models: dict = Field(
        default_factory=dict, description="slm, llm, sft: backend specs; pyrodash: {λ: checkpoint or spec}"
    )
    llm_mode: str | None = Field(
        default=None, description="continuation mode of an HTTP LLM (null: the spec's, else auto-detected)"
    )
    world_dir: Annotated[str | None, BeforeValidator(_path)] = Field(
        default=None, description="the built world, for world:<split> benchmarks"
    )
    benchmark_paths: dict[str, PathStr] = Field(
        default_factory=dict, description="benchmark name -> local JSONL file (real benchmarks, your own data)"
    )
    limit: PositiveInt | None = Field(default=None, description="examples per benchmark (null: every example)")
    samples: dict[str, PositiveInt] = Field(
        default_factory=dict, description="benchmark name -> k for avg@k (the paper: aime24/aime25 -> 32)"
    )
    benchmark_methods: dict[str, list[Annotated[str, Field(min_length=1)]]] = Field(
        default_factory=dict,
        description="benchmark -> the methods that run on it (regular expressions matched against the whole method "
        'name, e.g. "pyrodash@[0-9.]+" for every λ but no sweep point); a benchmark not listed runs every method',
    )
    sample_temperature: Annotated[float, Field(ge=0)] = Field(
        default=0.6, description="sampling temperature of the avg@k benchmarks (the others decode greedily)"
    )
    sample_top_p: Annotated[float, Field(ge=0)] = Field(default=0.95, description="and their nucleus (top_p)")
    prices: str | dict = Field(
        default="paper", description="a sheet under configs/prices/ (paper, cached), a YAML path or a mapping"
    )
    prompts: str = Field(default="qwen-math-v1", description="the prompt set (world-v1 for the built-in world)")
    max_tokens: PositiveInt = Field(default=256, description="new tokens per answer")
    batch_size: PositiveInt = Field(default=16, description="questions decoded together by an in-process model")
    concurrency: PositiveInt = Field(default=8, description="requests in flight to an HTTP model")
    range_rule: dict | None = Field(
        default=None,
        description="the SLM's range for the PyroDash methods: {max_turns, max_context_tokens}, past it the LLM "
        'alone (`routed: "range"` in the record); null: off. `pyrodash calibrate --range` measures it '
        "([Conversations](../conversations.md))",
    )
    answers: Annotated[str | None, BeforeValidator(_path)] = Field(
        default=None,
        description="the answer store: greedy generations of the in-process models, kept on disk and read back "
        "whenever a method or step asks a model the same thing; null: RUN_DIR/answers (a config made from this one "
        'with another run_dir keeps the same store); "off": none',
    )

    @field_validator("benchmark_methods")
    @classmethod
    def _patterns(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        for b, pats in v.items():
            for x in pats:
                try:
                    re.compile(x)
                except re.error as e:
                    raise ValueError(f"benchmark_methods.{b}: {x!r} is not a regular expression ({e})") from None
        return v

    @field_validator("range_rule")
    @classmethod
    def _range_rule(cls, v: dict | None) -> dict | None:
        """Stored whole ({max_turns, max_context_tokens}): the same rule compares equal however it was written."""
        return None if v is None else RangeRule.of(v).to_dict()

    def __post_init__(self) -> None:
        if self.answers is None:
            self.answers = os.path.join(self.run_dir, "answers")

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides) -> EvalConfig:
        """The config in YAML file `path` (or a run's config.resolved.json), with `overrides` (None: not given)."""
        p = Path(path)
        data = _read_mapping(p)
        data = _from_resolved(data, p) | {k: v for k, v in overrides.items() if v is not None}
        known = {f.name for f in dataclasses.fields(cls)}
        if set(data) - known:
            raise ValueError(
                f"eval config {p}: unknown keys {sorted(set(data) - known, key=str)}; expected {sorted(known)}"
            )
        missing = [k for k in ("run_dir", "benchmarks") if k not in data]
        if missing:
            raise ValueError(
                f"eval config {p}: missing {', '.join(missing)}; e.g. run_dir: runs/x, benchmarks: [gsm8k]"
            )
        try:
            return cls(**data)
        except ValueError as e:
            raise ValueError(f"{e} (in {p})") from None

    def check_models(self) -> None:
        """Fail before anything is written when a model spec names a local directory that is not there (URLs and
        hub ids such as Qwen/Qwen3-1.7B are not checked here)."""
        models = self.models or {}
        specs = [(f"models.{k}", v) for k, v in models.items() if k != "pyrodash"]
        pyro = models.get("pyrodash") or {}
        if not isinstance(pyro, dict):
            raise ValueError("eval config: models.pyrodash must map each λ to a checkpoint, e.g. {0.6: runs/x/lam0.6}")
        specs += [(f"models.pyrodash.{lam}", v) for lam, v in pyro.items()]
        for key, spec in specs:
            path = spec.get("path") if isinstance(spec, dict) else spec
            if isinstance(spec, dict) and "url" in spec:
                continue
            if not isinstance(path, str) or not path:
                raise ValueError(f"eval config: {key}={spec!r} must be a model path, hub id or backend spec")
            if "://" in path or Path(path).exists():
                continue
            if path.count("/") == 1 and not path.startswith((".", "/", "~")):
                continue  # a hub id
            raise ValueError(
                f"eval config: {key}={path} does not exist; build or train that model first or fix the "
                "path (nothing was written)"
            )

    def runs_on(self, method: str, benchmark: str) -> bool:
        """Whether `method` runs on `benchmark` (`benchmark_methods`)."""
        pats = self.benchmark_methods.get(benchmark)
        return pats is None or any(re.fullmatch(p, method) for p in pats)

    def price_sheet(self) -> Prices:
        return Prices(**self.prices) if isinstance(self.prices, dict) else Prices.from_yaml(self.prices)


def one_line(e: ValidationError) -> str:
    """A pydantic error on an eval config as one line: the first bad key, its value and what it takes."""
    err = e.errors(include_url=False)[0]
    key = ".".join(str(x) for x in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    if err["type"] == "value_error" or not err["loc"]:
        line = f"eval config: {msg}"
    elif err["type"] == "unexpected_keyword_argument":
        line = f"eval config: unknown key {key!r}; expected {sorted(f.name for f in dataclasses.fields(EvalConfig))}"
    elif err["type"] in ("missing", "missing_argument"):
        line = f"eval config: missing {key}; e.g. run_dir: runs/x, benchmarks: [gsm8k]"
    else:
        line = f"eval config: {key}={err['input']!r} must be {EXPECT.get(str(err['loc'][0]), msg)} ({msg})"
    more = len(e.errors()) - 1
    return line + (f"; and {more} more error{'s' * (more > 1)}" if more else "")


_validated_init = EvalConfig.__init__


def _init(self: EvalConfig, *args: Any, **kwargs: Any) -> None:
    """pydantic's `__init__`, its ValidationError (a ValueError) as one line (`one_line`): the CLI prints it whole."""
    try:
        _validated_init(self, *args, **kwargs)
    except ValidationError as e:
        raise ValueError(one_line(e)) from None


EvalConfig.__init__ = _init  # (dataclasses.replace constructs through it too)


def _read_mapping(p: Path) -> dict:
    if not p.exists():
        raise ValueError(f"eval config {p} not found; see configs/eval/ for examples")
    if not p.is_file():
        raise ValueError(f"eval config {p} is a directory: pass the YAML file, e.g. configs/eval/world-quick.yaml")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        where = getattr(e, "problem_mark", None)
        at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
        what = getattr(e, "problem", None) or type(e).__name__
        raise ValueError(f"eval config {p} is not valid YAML{at} ({what}); fix the file") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(
            f"eval config {p}: the top level must be a mapping (run_dir: ..., benchmarks: [...]), "
            f"not a {type(data).__name__}"
        )
    return data


def _from_resolved(data: dict, path: Path) -> dict:
    """A run's `config.resolved.json` as a config: it is evaluated with the numbers in `prices`, the ones the run used;
    `prices_sheet` (the sheet as configured) stays the config's `prices` while it still resolves to those numbers, so
    the run resolves to the same file again."""
    if "prices_sheet" not in data:
        return data
    sheet, numbers = data["prices_sheet"], data.get("prices")
    if not isinstance(numbers, dict):
        raise ValueError(
            f"eval config {path}: prices_sheet is written by `pyrodash eval` into config.resolved.json beside the "
            "resolved prices (a mapping: slm_in, slm_out, llm_in, llm_out); give prices instead"
        )
    try:
        same = (Prices(**sheet) if isinstance(sheet, dict) else Prices.from_yaml(sheet)).to_dict() == numbers
    except (TypeError, ValueError, OSError, yaml.YAMLError):
        same = False  # a sheet gone or changed: the numbers the run used
    return {k: v for k, v in data.items() if k != "prices_sheet"} | {"prices": sheet if same else numbers}
