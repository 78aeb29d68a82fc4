"""The evaluated methods. Each is a callable over a batch of (Example, sampling) items that returns one partial record
per item (output, usage, llm_calls, handoff, segments, ...); `pyrodash.evaluate` grades and stores them.

- `slm`, `slm+sft`, `llm`: one model answers alone (`Solo`); the question template, no system prompt, `<offload>`
  banned where the vocabulary has it (SLM+SFT is the Stage-2 model without P_s, as in the paper).
- `pyrodash@<λ>` / `pyrodash@<λ>+bias<b>`: the Collaborate Engine with the Stage-3 model for λ (`PyroDash`).
- `oracle`: one handoff exactly before the first step the SLM was not taught (`pyrodash.methods_oracle`), the
  ceiling of any single-handoff policy on the world.
- `routellm@<α>`: RouteLLM-MF (`pyrodash.routing.routellm_mf`), `glimprouter@<τ>`: GlimpRouter
  (`pyrodash.routing.glimprouter`).

In-process backends (`HFBackend.generate_batch`) are batched; any other backend (OpenAI-compatible HTTP) is driven
through its stream with `concurrency` requests in flight. PyroDash's batched path is Algorithm 1 with the engine's
own request builders (P_s, `<offload>` as a stop id, the handoff request), so its records equal `engine.run`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from pyrodash.backends.base import GenChunk, GenRequest
from pyrodash.conversation import example_messages
from pyrodash.cost import Prices, Usage
from pyrodash.data.example import Example
from pyrodash.engine import handoff_admitted
from pyrodash.prompts import OFFLOAD_TOKEN, Prompts, pack

Item = tuple[Example, dict]  # (example, sampling: temperature / top_p / seed)


@dataclass
class Gen:
    """One finished generation, whatever the backend."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    stop_token_id: int | None = None
    top_logprobs: list[dict[str, float]] | None = None
    eos: bool | None = None  # True: ended by EOS; False: by a stop string/id or length; None: unknown
    error: str | None = None  # the call failed after its retries (`pyrodash.backends.retry`); finish_reason "error"
    usage_estimated: bool = False


async def _collect_once(backend, req: GenRequest) -> Gen:
    text, tops, last = "", [], GenChunk()
    async with contextlib.aclosing(backend.stream(req)) as it:
        async for ch in it:
            text += ch.text
            tops += ch.top_logprobs or []
            if ch.finish_reason is not None:
                last = ch
    return Gen(text, last.finish_reason or "length", last.prompt_tokens or 0, last.completion_tokens or 0,
               last.cached_tokens or 0, last.stop_token_id, tops or None, None, usage_estimated=last.usage_estimated)


async def _collect(backend, req: GenRequest) -> Gen:
    """One HTTP call under the batch call policy: retried when it may pass, a failed `Gen` when it never does."""
    from pyrodash.backends.retry import RetryPolicy

    pol, error = RetryPolicy(), None
    for attempt in range(pol.retries + 1):
        if attempt:
            await asyncio.sleep(pol.backoff_s * 2 ** (attempt - 1))
        try:
            return await _collect_once(backend, req)
        except Exception as e:  # noqa: BLE001 - judged by the policy, recorded, never fatal
            error = f"attempt {attempt + 1}: {type(e).__name__}: {e}"
            if not getattr(e, "retryable", True):
                break
    return Gen("", "error", 0, 0, error=error)


def generate(backend, reqs: list[GenRequest], batch_size: int = 16, concurrency: int = 8) -> list[Gen]:
    """Run requests on a backend: batched when it has `generate_batch`, else `concurrency` streams at a time."""
    if not reqs:
        return []
    if hasattr(backend, "generate_batch"):
        eos_ids = getattr(backend, "eos_ids", set())
        out = []
        for r in backend.generate_batch(reqs, batch_size=batch_size):
            eos = r.finish_reason == "stop" and r.stop_token_id is None and bool(r.token_ids) \
                and r.token_ids[-1] in eos_ids
            out.append(Gen(r.text, r.finish_reason, r.prompt_tokens, r.completion_tokens, 0, r.stop_token_id,
                           r.top_logprobs, eos))
        return out

    async def main() -> list[Gen]:
        sem = asyncio.Semaphore(concurrency)

        async def one(r):
            async with sem:
                return await _collect(backend, r)

        return list(await asyncio.gather(*(one(r) for r in reqs)))

    return asyncio.run(main())


def _ban_offload(backend) -> dict[int, float]:
    tid = backend.token_id(OFFLOAD_TOKEN) if hasattr(backend, "token_id") else None
    return {} if tid is None else {tid: float("-inf")}


class Method:
    name: str

    def __call__(self, items: list[Item]) -> list[dict]:
        raise NotImplementedError


@dataclass
class Env:
    """What every method shares: prompts, prices, the answer budget and the batching knobs."""

    prompts: Prompts
    prices: Prices
    max_tokens: int = 256
    batch_size: int = 16
    concurrency: int = 8
    # Solo answers by backend and request, shared by every method that needs the same one: RouteLLM's chosen model
    # answers exactly as `slm`/`llm` do (same model, same prompt, same decoding), as RouteLLM's own evaluation reuses
    # stored model answers. Each entry keeps the per-item latency of the batch that produced it.
    solo_memo: dict = field(default_factory=dict)

    def chat(self, ex: Example) -> list[dict]:
        """The messages every method puts to a model for `ex` (earlier turns of a conversation first)."""
        return example_messages(self.prompts, ex.question, ex.meta.get("history"))


class Solo(Method):
    """One model answers the whole query alone."""

    def __init__(self, name: str, backend, role: str, env: Env):
        if role not in ("slm", "llm"):
            raise ValueError(f"role={role!r}: use 'slm' or 'llm'")
        self.name, self.backend, self.role, self.env = name, backend, role, env

    def requests(self, items: list[Item]) -> list[GenRequest]:
        ban = _ban_offload(self.backend) if self.role == "slm" else {}  # an LLM has no <offload>
        return [GenRequest(messages=self.env.chat(ex), max_tokens=self.env.max_tokens, logit_bias=dict(ban), **s)
                for ex, s in items]

    def records(self, gens: list[Gen], latencies: list[float | None] | None = None) -> list[dict]:
        out = []
        for i, g in enumerate(gens):
            if self.role == "slm":
                u = Usage(slm_in=g.prompt_tokens, slm_out=g.completion_tokens)
            else:
                u = Usage(llm_in=g.prompt_tokens, llm_out=g.completion_tokens, llm_cached_in=g.cached_tokens,
                          llm_calls=1)
            out.append({"output": g.text, "usage": u.to_dict(), "llm_calls": u.llm_calls, "handoff": None,
                        "finish_reason": g.finish_reason, "segments": [{"model": self.role, "text": g.text}]})
            if g.error is not None:
                out[-1].update(llm_failed=self.role == "llm", llm_errors=[g.error])
            if g.usage_estimated:
                out[-1]["usage_estimated"] = True
            if latencies and latencies[i] is not None:  # an answer generated earlier for another method
                out[-1].update(latency_s=latencies[i], reused_answer=True)
        return out

    def __call__(self, items: list[Item]) -> list[dict]:
        reqs = self.requests(items)
        keys = [(id(self.backend), repr(r)) for r in reqs]
        memo = self.env.solo_memo
        todo = [i for i, k in enumerate(keys) if k not in memo]
        if todo:
            t0 = time.perf_counter()
            gens = generate(self.backend, [reqs[i] for i in todo], self.env.batch_size, self.env.concurrency)
            dt = (time.perf_counter() - t0) / len(todo)
            for i, g in zip(todo, gens, strict=True):
                memo[keys[i]] = (g, dt)
        fresh = set(todo)
        return self.records([memo[k][0] for k in keys],
                            [None if i in fresh else memo[k][1] for i, k in enumerate(keys)])


class PyroDash(Method):
    """The Collaborate Engine with a trained SLM at a fixed offload_bias and handoff_share."""

    def __init__(self, name: str, slm, llm, env: Env, offload_bias: float = 0.0, handoff_share: float = 1.0):
        from pyrodash.engine import CollaborateEngine

        self.name, self.env, self.bias, self.share = name, env, float(offload_bias), float(handoff_share)
        self.engine = CollaborateEngine(slm, llm, env.prompts, env.prices, offload_bias=self.bias,
                                        max_tokens=env.max_tokens, handoff_share=self.share)

    def _record(self, slm_text: str, llm_text: str, usage: Usage, handoff: int | None, finish: str,
                fallback: bool = False, errors: list[str] | None = None, estimated: bool = False,
                admitted: bool = True) -> dict:
        segs = [{"model": "slm", "text": slm_text}] + ([{"model": "llm", "text": llm_text}] if handoff is not None
                                                        else [])
        return {"output": slm_text + llm_text, "usage": usage.to_dict(), "llm_calls": usage.llm_calls,
                "handoff": handoff, "finish_reason": finish, "segments": segs, "offload_bias": self.bias,
                "handoff_share": self.share, "handoff_admitted": admitted,
                "fallback": fallback, "llm_errors": list(errors or []), "usage_estimated": estimated}

    def __call__(self, items: list[Item]) -> list[dict]:
        eng = self.engine
        if not (hasattr(eng.slm, "generate_batch") and hasattr(eng.llm, "generate_batch")):
            return self._via_engine(items)
        oid, budget = eng.offload_id, eng.max_tokens
        msgs = [eng.messages(self.env.chat(ex)) for ex, _ in items]
        samp = [{"stop": [], **s} for _, s in items]
        reqs = [eng.slm_request(m, **s) for m, (_, s) in zip(msgs, items)]
        slm = generate(eng.slm, reqs, self.env.batch_size)
        hand = [i for i, g in enumerate(slm) if g.stop_token_id == oid]
        lreqs = [eng.llm_request(msgs[i], pack(slm[i].text), budget, samp[i]) for i in hand]
        llm = dict(zip(hand, generate(eng.llm, lreqs, self.env.batch_size)))
        out = []
        for i, g in enumerate(slm):
            u = Usage(slm_in=g.prompt_tokens, slm_out=g.completion_tokens)
            if i not in llm:
                out.append(self._record(g.text, "", u, None, g.finish_reason,
                                        admitted=handoff_admitted(msgs[i], self.share)))
                continue
            lg = llm[i]
            u += Usage(llm_in=lg.prompt_tokens, llm_out=lg.completion_tokens, llm_cached_in=lg.cached_tokens,
                       llm_calls=1)
            out.append(self._record(g.text, lg.text, u, max(g.completion_tokens - 1, 0), lg.finish_reason))
        return out

    def _via_engine(self, items: list[Item]) -> list[dict]:
        async def main():
            sem = asyncio.Semaphore(self.env.concurrency)

            async def one(ex, s):
                async with sem:
                    return await self.engine.arun(self.env.chat(ex), **s)

            return await asyncio.gather(*(one(ex, s) for ex, s in items))

        out = []
        for d in asyncio.run(main()):
            rec = self._record(d.slm_text, d.llm_text, d.usage, d.handoff, d.finish_reason, d.fallback, d.errors,
                               d.usage_estimated, d.handoff_admitted)
            if d.llm_endpoints and (len(d.llm_endpoints) > 1 or d.llm_endpoints[0]["price"] != {
                    "llm_in": self.env.prices.llm_in, "llm_out": self.env.prices.llm_out,
                    "llm_cached_in": self.env.prices.llm_cached_in}):  # fmt: skip
                rec["llm_endpoints"] = d.llm_endpoints  # a mesh: who was called, at which price
            out.append(rec)
        return out


class RouteLLM(Method):
    """RouteLLM-MF at threshold α: the query goes to the LLM when P(LLM wins) >= α; that model answers it all."""

    def __init__(self, name: str, router, alpha: float, embed, slm: Solo, llm: Solo):
        self.name, self.router, self.alpha, self.embed, self.slm, self.llm = name, router, alpha, embed, slm, llm

    def __call__(self, items: list[Item]) -> list[dict]:
        wins = self.router.win_rate(self.embed([ex.question for ex, _ in items]))
        to_llm = [w >= self.alpha for w in wins]
        parts = {True: [it for it, b in zip(items, to_llm) if b], False: [it for it, b in zip(items, to_llm) if not b]}
        res = {True: iter(self.llm(parts[True]) if parts[True] else []),
               False: iter(self.slm(parts[False]) if parts[False] else [])}
        out = []
        for b, w in zip(to_llm, wins):
            r = next(res[b])
            r.update(route="llm" if b else "slm", win_rate=round(w, 6), alpha=self.alpha)
            out.append(r)
        return out


class GlimpRouter(Method):
    def __init__(self, name: str, slm, llm, env: Env, tau: float, top_k: int = 20):
        self.name, self.slm, self.llm, self.env, self.tau, self.top_k = name, slm, llm, env, tau, top_k

    def __call__(self, items: list[Item]) -> list[dict]:
        from pyrodash.routing.glimprouter import run_glimprouter

        def gen(role: str, reqs: list[GenRequest]) -> list[Gen]:
            return generate(self.slm if role == "slm" else self.llm, reqs, self.env.batch_size, self.env.concurrency)

        its = [(self.env.chat(ex), s) for ex, s in items]
        out = run_glimprouter(its, self.tau, gen, self.env.max_tokens, top_k=self.top_k,
                              slm_logit_bias=_ban_offload(self.slm))
        for r in out:
            r["tau"] = self.tau
        return out


def timed(method: Method, items: list[Item]) -> list[dict]:
    """Run a batch and stamp each record with its share of the batch's wall time."""
    t0 = time.perf_counter()
    out = method(items)
    if len(out) != len(items):
        raise RuntimeError(f"method {method.name} returned {len(out)} records for {len(items)} items")
    dt = (time.perf_counter() - t0) / max(len(items), 1)
    for r in out:
        r.setdefault("latency_s", dt)
        r["batch"] = len(items)
    return out


def knob(x: float) -> str:
    """How a knob value appears in a method name (`pyrodash@0.1`, `routellm@0.4213`)."""
    return f"{float(x):.4g}"


# --- building the methods of an eval config -----------------------------------------------------------------------


class Backends:
    """Backends loaded once per spec and shared by every method that uses them."""

    def __init__(self):
        self._cache: dict[str, object] = {}

    def get(self, spec, llm: bool = False, mode: str | None = None, offload: bool = False):
        """The backend of `spec`; `llm=True`: an LLM endpoint (its continuation mode probed at load, `mode`
        overriding the spec's); `offload=True`: an HTTP SLM is checked to stop at <offload>."""
        key = repr(spec) if mode is None else repr((spec, mode))  # one backend per spec, whatever its role
        if key not in self._cache:
            from pyrodash.backends import load_backend
            from pyrodash.backends.endpoint import load_slm
            from pyrodash.backends.mesh import load_llm  # one endpoint, or several behind one handoff (a mesh)

            self._cache[key] = load_llm(spec, mode) if llm else load_slm(spec) if offload else load_backend(spec)
        return self._cache[key]


def _method_specs(methods: list) -> list[tuple[str, dict]]:
    out = []
    for m in methods:
        if isinstance(m, str):
            out.append((m, {}))
        elif isinstance(m, dict) and len(m) == 1:
            (k, v), = m.items()
            out.append((k, dict(v or {})))
        else:
            raise ValueError(f"method entry {m!r}: use a name (slm, slm+sft, llm, pyrodash) or a one-key mapping "
                             "like {glimprouter: {taus: [0.9]}}")
    return out


# eval method -> (its option listing the values, the name suffix, the PyroDash argument they set)
SWEEPS = {"pyrodash_bias": ("biases", "bias", "offload_bias"), "pyrodash_share": ("shares", "share", "handoff_share")}


def build_methods(cfg, env: Env, backends: Backends | None = None, load_examples=None) -> dict[str, Method]:
    """{name: method} for an EvalConfig-like `cfg` (fields models, methods, run_dir). `load_examples(name, limit)`
    loads a training pool for RouteLLM. Models load lazily through `backends`."""
    be = backends or Backends()
    models = dict(cfg.models or {})

    def model(key: str):
        if not models.get(key):
            raise ValueError(f"this method needs models.{key} in the eval config (a model path or backend spec)")
        return be.get(models[key], llm=key == "llm", mode=getattr(cfg, "llm_mode", None) if key == "llm" else None)

    lam_specs = {float(k): v for k, v in (models.get("pyrodash") or {}).items()}
    out: dict[str, Method] = {}
    for kind, opt in _method_specs(cfg.methods):
        if kind in ("slm", "llm"):
            out[kind] = Solo(kind, model(kind), kind, env)
        elif kind == "slm+sft":
            out[kind] = Solo(kind, model("sft"), "slm", env)
        elif kind == "pyrodash":
            lams = opt.get("lambdas", sorted(lam_specs))
            for lam in lams:
                if float(lam) not in lam_specs:
                    raise ValueError(f"pyrodash λ={lam} has no checkpoint: add it under models.pyrodash")
                name = f"pyrodash@{knob(lam)}"
                out[name] = PyroDash(name, be.get(lam_specs[float(lam)], offload=True), model("llm"), env)
        elif kind in SWEEPS:  # one λ policy across offload_bias or handoff_share values
            lam = float(opt.get("lambda", min(lam_specs) if lam_specs else 0))
            if lam not in lam_specs:
                raise ValueError(f"{kind} lambda={lam} has no checkpoint under models.pyrodash")
            key, suffix, field_ = SWEEPS[kind]
            for v in opt.get(key, []):
                name = f"pyrodash@{knob(lam)}+{suffix}{knob(v)}"
                out[name] = PyroDash(name, be.get(lam_specs[lam], offload=True), model("llm"), env,
                                     **{field_: float(v)})
        elif kind == "oracle":
            from pyrodash.methods_oracle import Oracle

            out[kind] = Oracle(kind, model("slm"), model("llm"), env)
        elif kind == "glimprouter":
            taus = [float(t) for t in opt.get("taus", [] if opt.get("step_shares") else [0.9])]
            if opt.get("step_shares"):
                taus += calibrate_glimprouter(opt, env, model("slm"), Path(cfg.run_dir), load_examples)
            for tau in taus:
                name = f"glimprouter@{knob(tau)}"
                out[name] = GlimpRouter(name, model("slm"), model("llm"), env, float(tau), int(opt.get("top_k", 20)))
        elif kind == "routellm":
            out.update(build_routellm(opt, env, model("slm"), model("llm"), be, Path(cfg.run_dir), load_examples))
        else:
            raise ValueError(f"unknown method {kind!r}: use slm, slm+sft, llm, oracle, pyrodash, pyrodash_bias, "
                             "pyrodash_share, routellm, glimprouter")
    return out


def calibrate_glimprouter(opt: dict, env: Env, slm, run_dir: Path, load_examples) -> list[float]:
    """τ values that hand a target share of steps to the LLM (`step_shares`), from the SLM's first-token entropies
    at the step boundaries of its own answers on the training pool (no labels: GlimpRouter stays training-free).
    Cached in RUN_DIR/glimprouter/taus.json."""
    import json

    from pyrodash.routing.routellm_mf import calibrate_alpha

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
    path.write_text(json.dumps({"spec": spec, "taus": taus, "n_steps": len(ents),
                                "entropy_quantiles": {str(q): ordered[int(q * (len(ents) - 1))]
                                                      for q in (0.1, 0.5, 0.9, 0.99)}}, indent=2) + "\n")
    return taus


def _encoder(spec, slm, be: Backends):
    """(model, tokenizer) of the query encoder: `spec` if given, else the SLM itself."""
    src = be.get(spec) if spec else slm
    if not (hasattr(src, "model") and hasattr(src, "tokenizer")):
        raise ValueError("RouteLLM-MF needs a local encoder: set routellm.encoder to a local model path (the SLM's "
                         "mean-pooled hidden states are the default when the SLM runs in-process)")
    return src.model, src.tokenizer


def build_routellm(opt: dict, env: Env, slm, llm, be: Backends, run_dir: Path, load_examples) -> dict[str, Method]:
    """Train (or load from RUN_DIR/routellm/) the MF router on the training pool, then one method per α."""
    import json

    from pyrodash.grading import grade_batch
    from pyrodash.routing.routellm_mf import MFRouter, calibrate_alpha, embed_texts, make_labels, train_mf

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
        router = train_mf(emb, labels, dim=int(opt.get("dim", 16)), epochs=int(opt.get("epochs", 300)),
                          meta={"spec": spec, "pool": len(pool), "slm_acc": sum(s_ok) / len(pool),
                                "llm_acc": sum(l_ok) / len(pool)})
        router.meta["pool_win_rates"] = router.win_rate(embed([ex.question for ex in pool]))
        router.save(out_dir)
    wins = router.meta["pool_win_rates"]
    alphas = [float(a) for a in opt.get("alphas", [])]
    alphas += [calibrate_alpha(wins, float(s)) for s in opt.get("shares", [])]
    if not alphas:
        raise ValueError("routellm needs alphas: [...] or shares: [...] (target LLM shares to calibrate α to)")
    (out_dir / "alphas.json").write_text(json.dumps({"alphas": alphas, "shares": opt.get("shares", [])}) + "\n")
    sl, ll = Solo("slm", slm, "slm", env), Solo("llm", llm, "llm", env)
    return {f"routellm@{knob(a)}": RouteLLM(f"routellm@{knob(a)}", router, a, embed, sl, ll) for a in alphas}
