"""Dollar budgets in `pyrodash serve` (docs/budgets.md): which budget a request draws on (its bearer key, else
`budgets.default`), its reservation on the hard cap (`reserve.py`), the operating point its pacer gives it
(`pacer.py`), and what the server shows (`pyrodash.budget`, GET /v1/budget, /health, `pyrodash_budget_*`).

    kwargs, grant = await pace(app, request, prompt, kwargs, mode)   # before the engine call: share / bias (or 429)
    run = EngineRun(metered(app, engine, grant), ...)                 # the Done's dollars settle the reservation
    info = with_budget(info, grant)                                   # the response's pyrodash.budget

States: `paced`, `policy` (the policy's own point), `capped` (the worst case did not fit the cap: the SLM alone),
`refused` (429), `learning` (nothing measured yet: handoffs only within reserved headroom), `solo`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import hmac
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from pyrodash.engine import handoff_admitted
from pyrodash.engine.range_rule import RangeRule
from pyrodash.engine.requests import EngineRequest
from pyrodash.events import Done
from pyrodash.server import protocol
from pyrodash.server.budget.config import Budget, BudgetsConfig
from pyrodash.server.budget.gate import Gate, new_ticket, usage_dollars
from pyrodash.server.budget.metrics import BudgetMetrics
from pyrodash.server.budget.pacer import BIAS, Decision, PacerSpec, arrive, finish, spend_rate
from pyrodash.server.budget.reserve import LedgerError, Ticket, Worst, chat_messages, period_of, worst_case
from pyrodash.server.budget.store import FileStore, MemoryStore, RedisStore, ledger_file
from pyrodash.server.metrics import MULTIPROC_ENV
from pyrodash.world.config import cache_root

log = logging.getLogger("pyrodash.serve")


class Refused(protocol.APIError):
    """429 at a budget's hard cap, with the Retry-After header (seconds to the period's end)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(429, message, type="insufficient_quota", code="budget_exceeded")
        self.headers = {"Retry-After": str(max(1, retry_after))}


class LedgerUnavailable(protocol.APIError):
    """503 when the caps' ledger cannot answer (a locked SQLite file, a Redis refusing writes): no request is
    admitted that the cap has not covered; Retry-After says when to try again."""

    def __init__(self, budget: str, err: LedgerError):
        super().__init__(
            503,
            f"The budget '{budget}' cannot admit requests now: {err}. Nothing was charged; retry in "
            f"{err.retry_after_s} s.",
            type="server_error",
            code="budget_ledger_unavailable",
        )
        self.headers = {"Retry-After": str(max(1, err.retry_after_s))}


@dataclass
class Grant:
    """One request's draw on a budget: the pacer's decision and what the response says about it."""

    budget: Budget
    decision: Decision
    info: dict
    ticket: Ticket | None = None  # its reservation at admission on the hard cap (None: no cap, or nothing reserved)
    gate: Gate | None = None  # its LLM calls' reservations (a capped budget), `EngineRequest.gate`
    slm_usd: float = 0.0  # the part of `ticket` for the SLM's own dollars (`dollars: all`)
    started: bool = False  # the engine began the request (its stream was entered)


class Budgets:
    """The server's budgets: which one a request draws on, its pacer steps, its state for /v1/budget."""

    def __init__(
        self, cfg: BudgetsConfig, default_bias: float = 0.0, registry=None, clock: Callable[[], float] = time.time
    ):
        self.cfg, self.clock = cfg, clock
        self.by_name = {b.name: b for b in cfg.budgets}
        self.specs = {b.name: self._spec(b, default_bias) for b in cfg.budgets}
        shared_dir = os.environ.get(MULTIPROC_ENV)  # set for the workers of `pyrodash serve --workers N`
        capped = any(b.cap_usd is not None for b in cfg.budgets)
        state = Path(cfg.state_dir).expanduser() if cfg.state_dir else cache_root() / "budgets"
        if cfg.redis_url:  # (the caps' fallback while Redis is down: the state_dir's file, surviving a restart)
            url, timeout, evict = cfg.redis_url, cfg.redis_timeout_s, cfg.redis_eviction
            fallback = _state_file(state) if capped else None
            self.store = RedisStore(
                url, cfg.redis_prefix, cfg.replicas, timeout, clock=clock, eviction=evict, fallback_path=fallback
            )
            self.store.check_eviction_now()
            for b in cfg.budgets:  # each capped budget's period is read by every heartbeat, served or not
                if b.cap_usd is not None:
                    spec = self.specs[b.name]
                    self.store.ledger.watch(self.ledger_key(b), lambda s=spec: period_of(self.now(), s.period_s))
        elif shared_dir:  # the workers of one server hold one budget, in a file beside their metrics
            self.store = FileStore(Path(shared_dir) / "pyrodash-budgets.sqlite")
        else:
            self.store = MemoryStore()
        if not cfg.redis_url and capped:  # the caps outlive the server
            self.store.ledger = ledger_file(state / "ledger.sqlite")
        self.metrics = BudgetMetrics(registry) if registry is not None else None
        self.utilisation: dict[str, list[float]] = {}  # budget -> [billed, reserved] of this replica's settled requests
        self._releases: set[asyncio.Future] = set()  # releases of requests that never ran, in flight
        if self.metrics is not None:
            for b in cfg.budgets:
                self.metrics.target.labels(b.name).set(b.usd_per_hour)
                if b.cap_usd is not None:
                    self.metrics.cap.labels(b.name).set(b.cap_usd)

    def _spec(self, b: Budget, default_bias: float) -> PacerSpec:
        c, period = self.cfg.controller, b.period_s
        head = c.head_start_s if c.head_start_s is not None else min(period / 12, 300.0)
        prior_c1 = prior_c0 = None
        if self.cfg.curve is not None:
            top, floor = self.cfg.curve.at(default_bias), self.cfg.curve.cost[0]
            # the curve counts all dollars; LLM dollars: what the policy adds over the SLM alone
            prior_c1, prior_c0 = (top, floor) if b.dollars == "all" else (max(0.0, top - floor), 0.0)
        return PacerSpec(
            rate=b.usd_per_period / period,
            period_s=period,
            cap=b.cap_usd,
            at_cap=b.at_cap,
            knob=self.cfg.knob,
            integral_s=c.integral_s or min(period, 3600.0),
            rate_window_s=c.rate_window_s,
            bank_s=c.bank_s or min(period, 3600.0),
            debt_s=c.debt_s or min(period, 3600.0),
            cost_window=c.cost_window,
            head_start_s=head,
            prior_c1=prior_c1,
            prior_c0=prior_c0,
            curve=self.cfg.curve,
            curve_top_bias=default_bias,
        )

    def ledger_key(self, b: Budget) -> str:
        """The budget's rows in the caps' ledger: its name, its period's wall length and the periods' origin
        (`name/3600s/0`), so two servers sharing a state directory or a Redis hold one cap only where they mean the
        same periods, and one never closes or counts the other's."""
        wall = b.period_s / self.cfg.time_compression
        return f"{b.name}/{wall:.17g}s/{self.cfg.period_origin:.17g}"

    def now(self) -> float:
        """The budgets' clock: seconds since `period_origin`, times `time_compression`."""
        return (self.clock() - self.cfg.period_origin) * self.cfg.time_compression

    # ------------------------------------------------------------ which budget

    def key_budget(self, request: Request) -> Budget | None:
        """The budget whose key the request's bearer token is (None: no budget key)."""
        scheme, _, token = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        digest = hashlib.sha256(token.strip().encode()).digest()
        found = None
        for b in self.cfg.keys:  # every key compared, in constant time each
            if hmac.compare_digest(digest, b.key_digest or b""):
                found = b
        return found

    def key_ok(self, request: Request) -> bool:
        """Whether the request's bearer key is a budget's key (such a key is a valid API key of this server)."""
        return self.key_budget(request) is not None

    def which(self, request: Request) -> Budget | None:
        return self.key_budget(request) or self.cfg.default

    # ------------------------------------------------------------ the two steps of a request

    async def pace(self, request: Request, engine, call: EngineRequest) -> tuple[EngineRequest, Grant | None]:
        """The request at the operating point its budget gives it (handoff share, offload bias), with its reservation
        on the hard cap for the way the engine will answer it (a turn past the SLM's range: the LLM alone) and the
        gate its every LLM call asks; raises `Refused` at the cap (`at_cap: refuse`, or one model alone), and
        `LedgerUnavailable` (503) when the ledger or the budget's state cannot answer."""
        budget = self.which(request)
        if budget is None:
            return call, None
        try:
            return await self._pace(budget, engine, call)
        except LedgerError as e:
            log.warning("budget %s: the ledger cannot answer (%s): 503", budget.name, e)
            self._inc("ledger_errors", budget.name, 1, "admission")
            raise LedgerUnavailable(budget.name, e) from e

    async def _pace(self, budget: Budget, engine, call: EngineRequest) -> tuple[EngineRequest, Grant]:
        mode, routed = _route(engine, call)
        solo = mode != "collab"
        messages = chat_messages(engine, call.question)
        base_share = float(1.0 if call.handoff_share is None else call.handoff_share)
        base_bias = float(call.offload_bias or 0.0)
        t = self.now()
        spec = self.specs[budget.name]
        worst = worst_case(engine, call, budget.dollars)
        ticket, cap, reason = await self._reserve(budget, spec, t, worst, mode, bool(routed))

        def step(st, spec):
            d = arrive(st, spec, t, lambda share: handoff_admitted(messages, share), base_share, base_bias, solo, cap)
            return d, st.copy(), spec

        try:
            (d, st, spec), view = await self.store.run(budget.name, spec, step)
        except BaseException:
            if ticket is not None:  # not admitted after all: nothing was spent
                await self.store.ledger.settle(ticket, 0.0)
            raise
        if ticket is not None and not cap and not solo and not d.admitted and budget.dollars == "llm":
            await self.store.ledger.settle(ticket, 0.0)  # outside the handoff share: no LLM call, nothing held
            ticket = None
        refused = d.state == "refused" or (solo and cap == "refuse")  # (one model alone: refused at the cap)
        self._count(budget, d, st, spec, view, cap, refused)
        left = self._left_s(st, spec)
        if refused:
            raise Refused(
                f"The budget '{budget.name}' reached its hard cap of ${budget.cap_usd:g} for this "
                f"{budget.period} ({reason}); it resets in {left} s.",
                left,
            )
        moved = {k: v for k in ("handoff_share", "offload_bias") if (v := getattr(d, k)) is not None}
        if routed and cap:  # past the SLM's range at the cap: the SLM answers, never handing off
            moved.update(range_rule=RangeRule(), handoff_share=0.0)
            reason = f"{reason}; the turn is past the SLM's range (the LLM alone): the SLM answers it"
        call = dataclasses.replace(call, **moved) if moved else call
        info = self._info(budget, d, st, spec, view, call, left)
        info["reserved_usd"] = ticket.usd if ticket is not None else 0.0
        info["reason"] = reason
        grant = Grant(budget, d, info, ticket, slm_usd=min(ticket.usd, worst.slm) if ticket is not None else 0.0)
        if spec.cap is not None and worst is not None:  # every LLM call asks the cap first
            pool = ticket.usd - grant.slm_usd if ticket is not None else 0.0
            reserved = lambda held: self._reserved(budget, held)  # noqa: E731
            ticket_of = new_ticket(self.ledger_key(budget), period_of(t, spec.period_s))
            grant.gate = Gate(
                self.store.ledger, ticket_of, engine, spec.cap, self.cfg.reservation_ttl_s, pool, reserved
            )
            call = dataclasses.replace(call, gate=grant.gate)
        self._release_when_unstarted(grant)
        return call, grant

    def _release_when_unstarted(self, grant: Grant) -> None:
        """When the HTTP request is over and its engine run never started (the client went while it queued for the
        concurrency limit), its reservations go at once instead of expiring at their worst case."""
        task = asyncio.current_task()
        if task is None or (grant.ticket is None and grant.gate is None):
            return

        def over(_task) -> None:
            if not grant.started:
                job = asyncio.ensure_future(self.release(grant))
                self._releases.add(job)
                job.add_done_callback(self._releases.discard)

        task.add_done_callback(over)

    async def release(self, grant: Grant) -> None:
        """A request that never ran: nothing was billed, its reservations are settled to $0 and its gate closed."""
        if grant.started:
            return
        gate = grant.gate
        tickets = ([grant.ticket] if grant.ticket is not None else []) + (gate.tickets if gate is not None else [])
        grant.ticket = None
        if gate is not None:
            gate.tickets, gate.closed, gate.pool = [], True, 0.0
        if not tickets:
            return
        log.info("budget %s: a request ended before it ran: its reservations released", grant.budget.name)
        try:
            await self._settle(grant.budget.name, tickets, 0.0)
        except LedgerError as e:
            self._ledger_failed(grant, "settle", e)

    async def _reserve(
        self, budget: Budget, spec: PacerSpec, t: float, worst: Worst | None, mode: str, routed: bool = False
    ) -> tuple[Ticket | None, str, str | None]:
        """The request's reservation on the hard cap: (ticket, the cap's verdict for the pacer, why it was turned).
        The first LLM call of the way it will be answered must fit (spent + held + its bound <= cap), else the SLM
        alone (its own worst case reserved when it bills the budget's dollars) or 429 per `at_cap`; a turn routed to
        the LLM alone by the range rule is the SLM's at the cap, as a handoff is."""
        if spec.cap is None or worst is None:
            return None, "", None
        period = period_of(t, spec.period_s)
        want = {"collab": worst.collab, "llm": worst.llm}.get(mode, worst.slm)
        ttl = self.cfg.reservation_ttl_s
        ledger = self.store.ledger
        ticket = Ticket(self.ledger_key(budget), period, uuid.uuid4().hex, want)
        ok, spent, held = await ledger.reserve(ticket, spec.cap, ttl) if want > 0 else (True, 0.0, 0.0)
        self._reserved(budget, held)
        if ok:
            return (ticket if want > 0 else None), "", None
        reason = (
            f"worst case ${want:.6g} does not fit: ${spent:.6g} spent and ${held:.6g} reserved of the cap "
            f"${spec.cap:.6g}"
        )
        if (mode != "collab" and not routed) or budget.at_cap == "refuse":
            return None, "refuse", reason
        if worst.slm <= 0:
            return None, "slm", reason
        ticket = Ticket(self.ledger_key(budget), period, uuid.uuid4().hex, worst.slm)
        ok, _, held = await ledger.reserve(ticket, spec.cap, ttl)
        self._reserved(budget, held)
        return (ticket, "slm", reason) if ok else (None, "refuse", reason + "; nor the SLM's alone")

    def _reserved(self, budget: Budget, held: float) -> None:
        if self.metrics is not None:
            self.metrics.reserved.labels(budget.name).set(held)

    def _count(self, budget: Budget, d: Decision, st, spec: PacerSpec, view: dict, cap: str, refused: bool) -> None:
        if self.metrics is None:
            return
        self._gauges(budget, st, spec, view)
        self.metrics.requests.labels(budget.name, d.state).inc()
        if d.state in ("capped", "refused"):
            self.metrics.cap_hits.labels(budget.name).inc()
        if cap:
            self.metrics.turned.labels(budget.name, "refused" if refused else "slm").inc()
        if d.paced and d.state != "refused":
            self.metrics.knob.labels(budget.name, "spend_fraction").set(d.level)
            if d.handoff_share is not None:
                self.metrics.knob.labels(budget.name, "handoff_share").set(d.handoff_share)
            if d.offload_bias is not None:
                self.metrics.knob.labels(budget.name, "offload_bias").set(d.offload_bias)

    def _info(
        self, budget: Budget, d: Decision, st, spec: PacerSpec, view: dict, call: EngineRequest, left: int
    ) -> dict:
        """The response's `pyrodash.budget`."""
        return {
            "name": budget.name,
            "dollars": budget.dollars,
            "state": d.state,
            "spend_fraction": round(d.level, 4) if d.paced else None,
            "handoff_share": call.handoff_share if d.paced else None,
            "offload_bias": call.offload_bias if d.paced else None,
            "admitted": d.admitted,
            "target_usd_per_hour": spec.rate * 3600.0,
            "spend_usd_per_hour": spend_rate(st, spec) * 3600.0,
            "period": budget.period,
            "period_spend_usd": st.period_spend,
            "cap_usd": spec.cap,
            "period_ends_in_s": left,
            "store": view["store"],
            "fallback": view["fallback"],
        }

    async def record(self, grant: Grant, done: Done | None) -> None:
        """The Done's dollars, on the budget (replacing the expected dollars charged at admission), and the
        reservations settled to them (once: a second call finds none). Without a Done (the client went, the engine
        failed) the billed dollars are unknown: the reservations settle at the bound of what was made
        (`Gate.cut_usd`) and the pacer keeps the expected dollars."""
        name, gate = grant.budget.name, grant.gate
        tickets = ([grant.ticket] if grant.ticket is not None else []) + (gate.tickets if gate is not None else [])
        grant.ticket = None
        if gate is not None:
            gate.tickets = []
            gate.closed = True
            if gate.denied:
                grant.info["reason"] = gate.denied[-1]
                grant.info["calls_denied"] = len(gate.denied)
                self._inc("turned", name, len(gate.denied), "call")
            self._inc("ledger_errors", name, gate.ledger_errors, "call")
            gate.ledger_errors = 0
        reserved = sum(t.usd for t in tickets)
        usd = self._billed(grant, done, reserved) if done is not None else None
        try:
            if tickets:
                cut = (gate.cut_usd() if gate is not None else reserved - grant.slm_usd) + grant.slm_usd
                await self._settle(name, tickets, min(cut, reserved) if usd is None else usd)
            elif usd and self.specs[name].cap is not None:  # billed without a reservation (nothing was expected)
                uncovered = Ticket(self.ledger_key(grant.budget), int(grant.decision.period), "", 0.0)
                await self.store.ledger.settle(uncovered, usd)
        except LedgerError as e:  # the reservations stay: they expire and count at their worst case
            self._ledger_failed(grant, "settle", e)
        if usd is None:
            return
        if self.specs[name].cap is not None:
            self._utilised(grant, usd, reserved)
        t = self.now()

        def step(st, spec):
            finish(st, spec, t, grant.decision, usd)
            return st.copy(), spec

        try:
            (st, spec), view = await self.store.run(name, self.specs[name], step)
        except LedgerError as e:
            self._ledger_failed(grant, "pacer", e)
            return
        if self.metrics is not None:
            self.metrics.spend.labels(name).inc(max(0.0, usd))
            self._gauges(grant.budget, st, spec, view)

    def _billed(self, grant: Grant, done: Done, reserved: float) -> float:
        """The Done's dollars on the budget. A negative or non-finite figure (a provider's odd usage) is not
        trusted: the request is billed at the most it could have cost (its reservations, or the sane part when
        more) and the response, the log and `pyrodash_budget_usage_anomalies_total` say so."""
        usd, odd = usage_dollars(done, grant.budget.dollars)
        if not odd:
            return usd
        name = grant.budget.name
        charged = max(usd, reserved)
        grant.info["anomaly"] = (
            f"usage with {', '.join(odd)} dollars: billed at the request's bound ${charged:.6g} instead"
        )
        log.warning("budget %s: %s", name, grant.info["anomaly"])
        for kind in sorted(set(odd)):
            self._inc("anomalies", name, 1, kind)
        return charged

    def _ledger_failed(self, grant: Grant, where: str, e: LedgerError) -> None:
        """A settlement (or pacer step) the ledger could not take: logged, counted and said in the response; its
        reservations stay on the cap until they expire (counted then at their worst case)."""
        name = grant.budget.name
        log.warning("budget %s: the ledger could not record a request's dollars (%s): %s", name, where, e)
        grant.info["ledger_error"] = str(e)
        self._inc("ledger_errors", name, 1, where)

    async def _settle(self, name: str, tickets: list[Ticket], usd: float) -> None:
        """A request's reservations settled: the first to the dollars billed, the others to nothing."""
        expired = 0
        for i, ticket in enumerate(tickets):
            expired += not await self.store.ledger.settle(ticket, usd if i == 0 else 0.0)
        if expired:
            log.warning("budget %s: a request outlived its reservation (reservation_ttl_s)", name)
            self._inc("expired", name, expired)

    def _utilised(self, grant: Grant, usd: float, reserved: float) -> None:
        """A settled request's billed and reserved dollars (the cap's utilisation), and what passed its bound."""
        name = grant.budget.name
        over = usd - reserved if usd > reserved + 1e-12 else 0.0
        grant.info["billed_usd"] = usd
        grant.info["overrun_usd"] = over
        tally = self.utilisation.setdefault(name, [0.0, 0.0])
        tally[0], tally[1] = tally[0] + usd, tally[1] + reserved
        if over:
            log.warning("budget %s: a request billed $%.6g over what it reserved (usage above its bound)", name, over)
            self._inc("overrun", name, over)
        self._inc("billed", name, usd)
        self._inc("held_total", name, reserved)
        if self.metrics is not None and tally[1] > 0:
            self.metrics.utilisation.labels(name).set(tally[0] / tally[1])

    def _inc(self, attr: str, name: str, by: float, *labels: str) -> None:
        if self.metrics is not None and by > 0:
            getattr(self.metrics, attr).labels(name, *labels).inc(by)

    # ------------------------------------------------------------ what is shown

    async def _seen(self, budget: Budget):
        return await self.store.read(budget.name, self.specs[budget.name])

    def _left_s(self, st, spec: PacerSpec) -> int:
        """Wall-clock seconds to the end of the current period."""
        t = self.now()
        end = (math.floor(t / spec.period_s) + 1) * spec.period_s
        return int(math.ceil((end - t) / self.cfg.time_compression))

    def _gauges(self, budget: Budget, st, spec: PacerSpec, view: dict) -> None:
        m = self.metrics
        m.target.labels(budget.name).set(spec.rate * 3600.0)
        m.rate.labels(budget.name).set(spend_rate(st, spec) * 3600.0)
        m.period_spend.labels(budget.name).set(st.period_spend)
        m.fallback.set(1 if view["fallback"] else 0)
        m.replica_share.set(view["replica_share"])

    async def state(self, only: Budget | None = None) -> dict:
        """GET /v1/budget's body."""
        rows, view = [], self.store.view()
        for b in [only] if only is not None else self.cfg.budgets:
            st, spec, view = await self._seen(b)
            level = st.level
            cap_spent, held = (None, None)
            if spec.cap is not None:  # the cap's ledger: billed dollars of the period's requests, and reservations
                cap_spent, held = await self.store.ledger.read(self.ledger_key(b), period_of(self.now(), spec.period_s))
            row = {
                "name": b.name,
                "dollars": b.dollars,
                "period": b.period,
                "target_usd_per_hour": spec.rate * 3600.0,
                "target_usd_per_period": spec.rate * spec.period_s,
                "cap_usd": spec.cap,
                "at_cap": b.at_cap if b.cap_usd is not None else None,
                "period_spend_usd": st.period_spend,
                "period_ends_in_s": self._left_s(st, spec),
                "spend_usd_total": st.spend,
                "spend_usd_per_hour": spend_rate(st, spec) * 3600.0,
                "knob": self.cfg.knob,
                "spend_fraction": level,
                "requests": int(st.requests),
                "cap_hits": int(st.cap_hits),
                "capped": spec.cap is not None and cap_spent + held >= spec.cap,
                "cap_spent_usd": cap_spent,
                "reserved_usd": held,
                "utilisation": self._utilisation(b.name) if spec.cap is not None else None,
            }
            if self.cfg.knob == BIAS:
                row["offload_bias"] = self.cfg.curve.bias_for(level, spec.curve_top_bias) if self.cfg.curve else None
            else:
                row["handoff_share"] = level
            rows.append(row)
        if self.metrics is not None:
            self.metrics.fallback.set(1 if view["fallback"] else 0)
            self.metrics.replica_share.set(view["replica_share"])
        ledger = self.store.ledger.kind  # where the caps' ledger lives: redis, file (state_dir), memory
        out = {"object": "budgets", "store": view, "ledger": ledger, "time_compression": self.cfg.time_compression}
        return {**out, "data": rows}

    def _utilisation(self, name: str) -> float | None:
        """Billed / reserved dollars of this replica's settled requests (None: none settled yet)."""
        got, held = self.utilisation.get(name, (0.0, 0.0))
        return got / held if held > 0 else None

    def health(self) -> dict:
        view = self.store.view()
        out = {"store": view["store"], "budgets": [b.name for b in self.cfg.budgets]}
        if view["store"] == "redis":
            out["redis"] = "down" if view["fallback"] else "up"
            out["mode"] = f"own share 1/{round(1 / view['replica_share'])}" if view["fallback"] else "shared"
        return out

    async def aclose(self) -> None:
        await self.store.aclose()
        close = getattr(getattr(self.store.ledger, "db", None), "close", None)
        if close is not None:
            close()


def _state_file(state: Path) -> Path:
    """`state`/ledger.sqlite, its folder made (a ValueError naming the setting when it cannot be)."""
    try:
        state.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        msg = f"budgets.state_dir: cannot keep the caps' ledger in {state} ({e}): set a writable folder"
        raise ValueError(msg) from None
    return state / "ledger.sqlite"


# ---------------------------------------------------------------- the server's hooks


def _route(engine, call: EngineRequest) -> tuple[str, str | None]:
    """(the mode the engine will run `call` in, why it was routed): a collab turn past the SLM's range is the LLM's
    alone (`CollaborateEngine.route`); a rule the engine cannot apply fails in the engine itself, as asked."""
    route = getattr(engine, "route", None)
    if not callable(route):
        return call.mode, None
    try:
        return route(call)
    except ValueError:
        return call.mode, None
