"""An LLM mesh: several LLM endpoints behind one `Backend`, so a handoff stays one call from the engine's side.

    from pyrodash.backends import load_llm    # the one LLM loader builds a mesh from a list or {endpoints: ...}
    llm = load_llm([{"url": "http://a:8001/v1#llm", "prices": "paper"},
                    {"url": "http://b:8002/v1#llm", "prices": {"input_cost_per_token": 2e-7, ...}}])
    llm = load_llm({"endpoints": [...], "policy": "cheapest", "cooldown_s": 30, "timeout_s": 20})

Policies "fallback" (the order given) and "cheapest" (the lowest estimated cost first); a failing endpoint cools
down, and the next one continues mid-stream from the text already streamed. The policies, the accounting of each
upstream call and the spec forms: docs/internals.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from pyrodash.backends.base import (
    Backend,
    BackendError,
    ContinuesPrefix,
    GenChunk,
    GenRequest,
    Tokenizes,
    Warms,
    estimate_tokens,
)
from pyrodash.backends.http.probe import reachability
from pyrodash.chat import without_open_call
from pyrodash.cost import Prices

POLICIES = ("fallback", "cheapest")
OPTIONS = ("policy", "cooldown_s", "timeout_s", "name")  # a mesh spec's keys besides `endpoints`


@dataclass
class Member:
    backend: Backend
    name: str
    prices: Prices | None = None
    cooldown_until: float = 0.0  # time.monotonic() before which this endpoint is cooling down
    failures: int = 0

    def healthy(self, now: float) -> bool:
        return now >= self.cooldown_until


class MeshBackend:
    """Several LLM endpoints as one backend (see the module docstring)."""

    def __init__(
        self,
        members: list[Member],
        policy: str = "fallback",
        cooldown_s: float = 30.0,
        timeout_s: float = 30.0,
        name: str | None = None,
    ):
        if not members:
            raise ValueError("an LLM mesh needs at least one endpoint")
        if policy not in POLICIES:
            raise ValueError(f"llm policy {policy!r}: use one of {POLICIES}")
        if cooldown_s < 0 or timeout_s <= 0:
            raise ValueError("llm mesh: cooldown_s >= 0 and timeout_s > 0 are required")
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise ValueError(f"llm mesh endpoint names must differ (got {names}); give each a `name`")
        if policy == "cheapest" and any(m.prices is None for m in members):
            missing = [m.name for m in members if m.prices is None]
            raise ValueError(f"policy 'cheapest' needs a price sheet on every endpoint: add `prices` to {missing}")
        self.members, self.policy = members, policy
        self.cooldown_s, self.timeout_s = float(cooldown_s), float(timeout_s)
        self.name = name or f"mesh[{policy}]({', '.join(names)})"

    # ---- routing -------------------------------------------------------------------------------------------
    def estimated_cost(self, m: Member, req: GenRequest) -> float:
        p = m.prices
        assert p is not None
        return estimate_tokens(req.messages, req.prefix) * p.llm_in + req.max_tokens * p.llm_out

    def order(self, req: GenRequest) -> list[Member]:
        """Endpoints in the order they will be tried: healthy ones by policy, then cooling ones by policy."""
        ranked = list(self.members)
        if self.policy == "cheapest":
            ranked.sort(key=lambda m: self.estimated_cost(m, req))  # stable: ties keep the configured order
        now = time.monotonic()
        return [m for m in ranked if m.healthy(now)] + [m for m in ranked if not m.healthy(now)]

    def status(self) -> list[dict]:
        now = time.monotonic()
        return [
            {
                "endpoint": m.name,
                "healthy": m.healthy(now),
                "cooldown_left_s": max(m.cooldown_until - now, 0.0),
                "failures": m.failures,
            }
            for m in self.members
        ]

    # ---- the protocol --------------------------------------------------------------------------------------
    async def stream(self, req: GenRequest) -> AsyncIterator[GenChunk]:
        entries: list[dict] = []
        streamed, decoded = "", 0
        errors: list[str] = []
        for m in self.order(req):
            sub = req
            if streamed:  # continue from everything already streamed (a half tool call is written again, whole)
                budget = max(req.max_tokens - decoded, 1)
                sub = dataclasses.replace(req, prefix=req.prefix + without_open_call(streamed), max_tokens=budget)
            text, n, final = "", 0, GenChunk()
            try:
                async with contextlib.aclosing(m.backend.stream(sub)) as it:
                    while True:
                        async with asyncio.timeout(self.timeout_s):
                            ch = await anext(it, None)
                        if ch is None:
                            break
                        n += len(ch.token_ids) or int(bool(ch.text))
                        if ch.text:
                            text += ch.text
                            streamed += ch.text
                            yield GenChunk(text=ch.text, token_ids=list(ch.token_ids), top_logprobs=ch.top_logprobs)
                        if ch.finish_reason is not None:
                            final = ch
            except Exception as e:  # noqa: BLE001 - any member failure hands over to the next endpoint
                errors.append(self._failed(m, e))
                rep = getattr(e, "usage", None)
                rep = rep if isinstance(rep, GenChunk) else None
                entries.append(self._entry(m, sub, text, n, rep, int(getattr(e, "reached_server", True)), errors[-1]))
                decoded += entries[-1]["llm_out"]
                continue
            entries.append(self._entry(m, sub, text, n, final, 1, None))
            yield _usage(entries, finish_reason=final.finish_reason or "stop", stop_token_id=final.stop_token_id)
            return
        raise BackendError(
            f"every LLM endpoint failed ({'; '.join(errors)})",
            reached_server=any(e["calls"] for e in entries),
            usage=_usage(entries),
            kind="all_endpoints_failed",
        )

    def _failed(self, m: Member, e: Exception) -> str:
        """A member's failure: its message, and the member cools down."""
        msg = f"{m.name}: {type(e).__name__}: {e}" if str(e) else f"{m.name}: {type(e).__name__}"
        if isinstance(e, TimeoutError):
            msg = f"{m.name}: no chunk within {self.timeout_s}s"
        m.failures += 1
        m.cooldown_until = time.monotonic() + self.cooldown_s
        return msg

    @staticmethod
    def _entry(
        m: Member, req: GenRequest, text: str, n: int, rep: GenChunk | None, reached: int, error: str | None
    ) -> dict:
        """One upstream call's record: server-reported usage, else what was delivered (estimated input)."""
        estimated = bool(rep is not None and rep.usage_estimated)
        llm_in = rep.prompt_tokens if rep is not None else None
        llm_out = rep.completion_tokens if rep is not None else None
        if llm_out is None:
            llm_out, estimated = n, bool(n)
        if llm_in is None and reached:
            counts = isinstance(m.backend, Tokenizes)
            llm_in = len(m.backend.prompt_ids(req)) if counts else estimate_tokens(req.messages, req.prefix)
            estimated = estimated or not counts
        return {
            "endpoint": m.name,
            "calls": reached,
            "llm_in": llm_in or 0,
            "llm_out": llm_out,
            "llm_cached_in": (rep.cached_tokens if rep is not None else None) or 0,
            "text": text,
            "prices": m.prices.to_dict() if m.prices is not None else None,
            "error": error,
            "estimated": estimated,
            "client_stop": bool(rep is not None and rep.client_stop),
        }

    def token_id(self, token: str) -> int | None:
        return self.members[0].backend.token_id(token)

    @property
    def continues_prefix(self) -> bool:
        """Every endpoint continues an assistant prefix (else the engine hands off in its instruct style; a
        takeover still continues the streamed text as the new endpoint's prefix)."""
        return all(m.backend.continues_prefix for m in self.members if isinstance(m.backend, ContinuesPrefix))

    async def warm(self) -> None:
        """Open connections to every HTTP endpoint ahead of a handoff (best effort, as each backend's `warm`)."""
        await asyncio.gather(
            *(m.backend.warm() for m in self.members if isinstance(m.backend, Warms)), return_exceptions=True
        )

    async def health(self) -> None:
        """Raises unless at least one endpoint answers (used by the server's /health)."""
        results = await asyncio.gather(*(reachability(m.backend) for m in self.members))
        if not any(r["reachable"] for r in results):
            raise ConnectionError("; ".join(f"{m.name}: {r.get('error')}" for m, r in zip(self.members, results)))

    async def aclose(self) -> None:
        for m in self.members:
            await m.backend.aclose()


def is_mesh_spec(spec: object) -> bool:
    return isinstance(spec, list) or (isinstance(spec, dict) and ("endpoints" in spec or "prices" in spec))


def spec_from_flags(
    llms: list[str] | None,
    prices: list[str] | None = None,
    policy: str | None = None,
    cooldown_s: float | None = None,
    timeout_s: float | None = None,
) -> str | dict | None:
    """The LLM spec of repeatable `--llm` flags (with `--llm-prices` paired in order, `--llm-policy`, ...): one
    endpoint stays a plain spec; several (or any mesh option) make a mesh spec."""
    if not llms:
        if prices or policy or cooldown_s is not None or timeout_s is not None:
            raise ValueError("--llm-prices/--llm-policy/--llm-cooldown/--llm-timeout need at least one --llm")
        return None
    prices = list(prices or [])
    if len(prices) > len(llms):
        raise ValueError(f"{len(prices)} --llm-prices for {len(llms)} --llm: give one price sheet per --llm, in order")
    if len(llms) == 1 and not prices and policy is None and cooldown_s is None and timeout_s is None:
        return llms[0]
    members: list[str | dict] = []
    for i, url in enumerate(llms):
        member: dict = (
            {"url": url.partition("#")[0], "model": url.partition("#")[2] or None}
            if url.startswith(("http://", "https://"))
            else {"path": url}
        )
        if i < len(prices):
            member["prices"] = prices[i]
        members.append(member)
    opts = {"policy": policy, "cooldown_s": cooldown_s, "timeout_s": timeout_s}
    return {"endpoints": members, **{k: v for k, v in opts.items() if v is not None}}


def _usage(entries: list[dict], **final) -> GenChunk:
    """The tokens and endpoints of every attempt of one answer, summed (the last chunk, or a failure's usage)."""
    return GenChunk(
        **final,
        prompt_tokens=sum(e["llm_in"] for e in entries),
        completion_tokens=sum(e["llm_out"] for e in entries),
        cached_tokens=sum(e["llm_cached_in"] for e in entries),
        endpoints=entries,
        usage_estimated=any(e["estimated"] for e in entries),
    )
