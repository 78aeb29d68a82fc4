"""Building the methods of an eval config: `build_methods(cfg, env)` -> {name: method}, loading each model once
(`Backends`), training or loading the RouteLLM-MF router and calibrating GlimpRouter's τ on the training pool.

    methods = build_methods(EvalConfig.from_yaml("configs/eval/world-quick.yaml"), env)
"""

from __future__ import annotations

import json
from pathlib import Path

from pyrodash.backends import load_backend, load_llm, load_slm
from pyrodash.backends.answer_store import ANSWERS_OFF, AnswerStore
from pyrodash.engine.range_rule import RangeRule
from pyrodash.eval.methods import Env, GlimpRouter, Method, PyroDash, RouteLLM, Solo
from pyrodash.eval.names import method_name
from pyrodash.eval.oracle import Oracle, RelayOracle
from pyrodash.eval.routing.routellm_mf import MFRouter, calibrate_alpha, embed_texts, make_labels, train_mf
from pyrodash.grading import grade_batch


class Backends:
    """Backends loaded once per spec and shared by every method that uses them; `answers`: the run's answer store,
    attached to every in-process model (`pyrodash.backends.answer_store`; None: none)."""

    def __init__(self, answers: AnswerStore | None = None):
        self._cache: dict[str, object] = {}
        self.answers = answers

    def get(self, spec, llm: bool = False, mode: str | None = None, offload: bool = False):
        """The backend of `spec`; `llm=True`: an LLM endpoint (its continuation mode probed at load, `mode`
        overriding the spec's); `offload=True`: an HTTP SLM is checked to stop at <offload>."""
        key = repr(spec) if mode is None else repr((spec, mode))  # one backend per spec, whatever its role
        if key not in self._cache:
            backend = load_llm(spec, mode) if llm else load_slm(spec) if offload else load_backend(spec)
            if self.answers is not None and hasattr(backend, "answers"):
                backend.answers = self.answers
            self._cache[key] = backend
        return self._cache[key]


def run_answers(cfg) -> AnswerStore | None:
    """The answer store of an EvalConfig-like `cfg` (its `answers` directory; None when it is "off" or unset)."""
    where = getattr(cfg, "answers", None)
    return None if where in (None, ANSWERS_OFF) else AnswerStore(where)


def method_specs(methods: list) -> list[tuple[str, dict]]:
    out = []
    for m in methods:
        if isinstance(m, str):
            out.append((m, {}))
        elif isinstance(m, dict) and len(m) == 1:
            ((k, v),) = m.items()
            out.append((k, dict(v or {})))
        else:
            raise ValueError(
                f"method entry {m!r}: use a name (slm, slm+sft, llm, pyrodash) or a one-key mapping "
                "like {glimprouter: {taus: [0.9]}}"
            )
    return out


# eval method -> (its option listing the values, the name suffix, the PyroDash argument they set)
SWEEPS = {
    "pyrodash_bias": ("biases", "bias", "offload_bias"),
    "pyrodash_share": ("shares", "share", "handoff_share"),
    "pyrodash_relay": ("calls", "relay", "max_llm_calls"),  # the single-handoff policy in relay mode
}
# pyrodash_bias / pyrodash_share take `max_llm_calls: n` too: the sweep in relay mode (`pyrodash@<λ>+bias<b>+relay<n>`)


def sweep_lambda(opt: dict, lam_specs: dict) -> float:
    """The λ policy a sweep (`pyrodash_bias`, `pyrodash_share`) moves: its `lambda`, else the smallest λ given."""
    return float(opt.get("lambda", min(lam_specs) if lam_specs else 0))


def sweep_relay(kind: str, opt: dict) -> int | None:
    """The relay mode of a bias or share sweep (`max_llm_calls: n`, n > 1: each point `...+relay<n>`), else None."""
    if "max_llm_calls" not in opt:
        return None
    n = opt["max_llm_calls"]
    if kind == "pyrodash_relay" or not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(
            f"{kind} max_llm_calls={n!r}: a whole number >= 1 on pyrodash_bias or pyrodash_share (pyrodash_relay "
            "sweeps the calls itself)"
        )
    return n if n > 1 else None


def build_methods(cfg, env: Env, backends: Backends | None = None, load_examples=None) -> dict[str, Method]:
    """{name: method} for an EvalConfig-like `cfg` (fields models, methods, run_dir). `load_examples(name, limit)`
    loads a training pool for RouteLLM. Models load lazily through `backends`."""
    be = backends or Backends(run_answers(cfg))
    models = dict(cfg.models or {})

    def model(key: str):
        if not models.get(key):
            raise ValueError(f"this method needs models.{key} in the eval config (a model path or backend spec)")
        return be.get(models[key], llm=key == "llm", mode=getattr(cfg, "llm_mode", None) if key == "llm" else None)

    lam_specs = {float(k): v for k, v in (models.get("pyrodash") or {}).items()}
    rule = RangeRule.of(getattr(cfg, "range_rule", None))  # the SLM's range, for every PyroDash method
    out: dict[str, Method] = {}
    for kind, opt in method_specs(cfg.methods):
        if kind in ("slm", "llm"):
            out[kind] = Solo(kind, model(kind), kind, env)
        elif kind == "slm+sft":
            out[kind] = Solo(kind, model("sft"), "slm", env)
        elif kind == "pyrodash":
            lams = opt.get("lambdas", sorted(lam_specs))
            for lam in lams:
                if float(lam) not in lam_specs:
                    raise ValueError(f"pyrodash λ={lam} has no checkpoint: add it under models.pyrodash")
                name = method_name("pyrodash", lam)
                out[name] = PyroDash(name, be.get(lam_specs[float(lam)], offload=True), model("llm"), env, rule=rule)
        elif kind in SWEEPS:  # one λ policy across offload_bias or handoff_share values
            lam = sweep_lambda(opt, lam_specs)
            if lam not in lam_specs:
                raise ValueError(f"{kind} lambda={lam} has no checkpoint under models.pyrodash")
            key, suffix, field_ = SWEEPS[kind]
            calls = sweep_relay(kind, opt)
            for v in opt.get(key, []):
                name = method_name("pyrodash", lam, suffix, v, relay=calls)
                knobs = {field_: float(v)} | ({"max_llm_calls": calls} if calls else {})
                out[name] = PyroDash(name, be.get(lam_specs[lam], offload=True), model("llm"), env, rule=rule, **knobs)
        elif kind == "oracle":
            out[kind] = Oracle(kind, model("slm"), model("llm"), env)
        elif kind == "relay_oracle":  # a handoff before every untaught step, the LLM writing that step
            out[kind] = RelayOracle(kind, model("slm"), model("llm"), env, int(opt.get("step_max_tokens", 64)))
        elif kind == "glimprouter":
            taus = [float(t) for t in opt.get("taus", [] if opt.get("step_shares") else [0.9])]
            if opt.get("step_shares"):
                taus += calibrate_glimprouter(opt, env, model("slm"), Path(cfg.run_dir), load_examples)
            for tau in taus:
                name = method_name("glimprouter", tau)
                out[name] = GlimpRouter(name, model("slm"), model("llm"), env, float(tau), int(opt.get("top_k", 20)))
        elif kind == "routellm":
            out.update(build_routellm(opt, env, model("slm"), model("llm"), be, Path(cfg.run_dir), load_examples))
        else:
            raise ValueError(
                f"unknown method {kind!r}: use slm, slm+sft, llm, oracle, relay_oracle, pyrodash, pyrodash_bias, "
                "pyrodash_share, routellm, glimprouter"
            )
    return out


def calibrate_glimprouter(opt: dict, env: Env, slm, run_dir: Path, load_examples) -> list[float]:
    """τ values that hand a target share of steps to the LLM (`step_shares`), from the SLM's first-token entropies
    at the step boundaries of its own answers on the training pool (no labels: GlimpRouter stays training-free).
    Cached in RUN_DIR/glimprouter/taus.json."""
    spec = {k: opt.get(k) for k in ("train", "train_limit", "step_shares", "top_k")}
    path = run_dir / "glimprouter" / "taus.json"
    cached = json.loads(path.read_text()) if path.exists() else {}
    if cached.get("spec") == spec:
        return cached["taus"]
    if not opt.get("train") or load_examples is None:
        raise ValueError("glimprouter step_shares needs train: <benchmark> (e.g. world:train) to calibrate τ on")
    pool = load_examples(opt["train"], opt.get("train_limit"))
    greedy = {"temperature": 0.0, "top_p": 1.0, "seed": None}
    probe = GlimpRouter("probe", slm, slm, env, float("inf"), int(opt.get("top_k", 20)))
    ents = [h for r in probe([(ex, greedy) for ex in pool]) for h in r["entropies"]]
    taus = [calibrate_alpha(ents, float(s)) for s in opt["step_shares"]]
    ordered = sorted(ents)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "spec": spec,
                "taus": taus,
                "n_steps": len(ents),
                "entropy_quantiles": {str(q): ordered[int(q * (len(ents) - 1))] for q in (0.1, 0.5, 0.9, 0.99)},
            },
            indent=2,
        )
        + "\n"
    )
    return taus


def _encoder(spec, slm, be: Backends):
    """(model, tokenizer) of the query encoder: `spec` if given, else the SLM itself."""
    src = be.get(spec) if spec else slm
    if not (hasattr(src, "model") and hasattr(src, "tokenizer")):
        raise ValueError(
            "RouteLLM-MF needs a local encoder: set routellm.encoder to a local model path (the SLM's "
            "mean-pooled hidden states are the default when the SLM runs in-process)"
        )
    return src.model, src.tokenizer


def build_routellm(opt: dict, env: Env, slm, llm, be: Backends, run_dir: Path, load_examples) -> dict[str, Method]:
    """Train (or load from RUN_DIR/routellm/) the MF router on the training pool, then one method per α."""
    enc_model, enc_tok = _encoder(opt.get("encoder"), slm, be)

    def embed(questions: list[str]):
        return embed_texts(enc_model, enc_tok, [env.prompts.question(q) for q in questions])

    spec = {k: opt.get(k) for k in ("train", "train_limit", "ties", "dim", "epochs", "encoder")}
    out_dir = run_dir / "routellm"
    router = None
    if (out_dir / "router.json").exists():
        router = MFRouter.load(out_dir)
        if router.meta.get("spec") != spec:
            router = None
    if router is None:
        if not opt.get("train") or load_examples is None:
            raise ValueError("routellm needs train: <benchmark> (e.g. world:train) for its training pool")
        pool = load_examples(opt["train"], opt.get("train_limit"))
        greedy = {"temperature": 0.0, "top_p": 1.0, "seed": None}
        items = [(ex, greedy) for ex in pool]
        golds = [ex.gold for ex in pool]
        s_ok = grade_batch([r["output"] for r in Solo("slm", slm, "slm", env)(items)], golds, workers=0)
        l_ok = grade_batch([r["output"] for r in Solo("llm", llm, "llm", env)(items)], golds, workers=0)
        idx, labels = make_labels(s_ok, l_ok, opt.get("ties", "drop"))
        emb = embed([pool[i].question for i in idx])
        router = train_mf(
            emb,
            labels,
            dim=int(opt.get("dim", 16)),
            epochs=int(opt.get("epochs", 300)),
            meta={"spec": spec, "pool": len(pool), "slm_acc": sum(s_ok) / len(pool), "llm_acc": sum(l_ok) / len(pool)},
        )
        router.meta["pool_win_rates"] = router.win_rate(embed([ex.question for ex in pool]))
        router.save(out_dir)
    wins = router.meta["pool_win_rates"]
    alphas = [float(a) for a in opt.get("alphas", [])]
    alphas += [calibrate_alpha(wins, float(s)) for s in opt.get("shares", [])]
    if not alphas:
        raise ValueError("routellm needs alphas: [...] or shares: [...] (target LLM shares to calibrate α to)")
    (out_dir / "alphas.json").write_text(json.dumps({"alphas": alphas, "shares": opt.get("shares", [])}) + "\n")
    sl, ll = Solo("slm", slm, "slm", env), Solo("llm", llm, "llm", env)
    names = [method_name("routellm", a) for a in alphas]
    return {n: RouteLLM(n, router, a, embed, sl, ll) for n, a in zip(names, alphas, strict=True)}
