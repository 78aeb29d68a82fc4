"""No LLM call without a reservation that covers it: a capped request's `Gate` (`EngineRequest.gate`), asked by the
engine before each LLM call (the handoff, a retry, a relay step, the LLM alone), and what its reservations settle to.

    gate = Gate(ledger, ticket_of, engine, cap, ttl_s, pool_usd)    # pool: what admission reserved for the first call
    ok = await gate(req)               # the call's bound fits what is reserved, or a new reservation for the rest
    usd = billed(done, "llm")          # the Done's dollars

A call the cap cannot cover is not made: the engine then lets the SLM finish, as after a failed call. A request that
ends without a Done (its client went away) settles at `Gate.cut_usd`: every call's input bound plus the output it
had streamed (its UTF-8 bytes, a bound on its tokens) and `CUT_TOKENS` per call the upstream may still have generated
before it saw the cancel, never above the calls' bounds.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable

from pyrodash.events import Done
from pyrodash.server.budget.reserve import CallBound, LedgerError, Ticket, request_bound

CUT_TOKENS = 64  # output tokens an upstream may generate after a cancel before it stops (per call cut mid-stream)


class Gate:
    """One request's LLM calls against its budget's hard cap (module docstring)."""

    def __init__(
        self,
        ledger,
        ticket_of: Callable[[float], Ticket],
        engine,
        cap: float,
        ttl_s: float,
        pool: float = 0.0,
        on_reserved: Callable[[float], None] | None = None,
    ):
        self.ledger, self.ticket_of, self.engine = ledger, ticket_of, engine
        self.cap, self.ttl_s = cap, ttl_s
        self.pool = pool  # LLM dollars the request's tickets cover
        self.tickets: list[Ticket] = []  # the reservations made here (admission's is the grant's)
        self.calls: list[CallBound] = []  # the bound of each call made
        self.denied: list[str] = []  # why a call was not made
        self.streamed = 0  # UTF-8 bytes of LLM output seen (a bound on its tokens)
        self.ledger_errors = 0  # calls not made because the ledger could not answer
        self.closed = False  # the request is over (or never ran): no more calls
        self.on_reserved = on_reserved

    @property
    def committed(self) -> float:
        return sum(c.usd for c in self.calls)

    async def __call__(self, req) -> bool:
        """Whether the LLM call `req` may be made: its bound fits what the request holds, else a reservation for the
        rest fits the cap."""
        if self.closed:
            self.denied.append("an LLM call was not made: its request had ended")
            return False
        bound = request_bound(self.engine, req)
        need = self.committed + bound.usd - self.pool
        if need > 1e-12:
            ticket = self.ticket_of(need)
            try:
                ok, spent, held = await self.ledger.reserve(ticket, self.cap, self.ttl_s)
            except LedgerError as e:  # a ledger that cannot answer covers nothing: the call is not made
                self.ledger_errors += 1
                self.denied.append(f"an LLM call was not made: the caps' ledger cannot answer ({e})")
                return False
            if self.on_reserved is not None:
                self.on_reserved(held)
            if not ok:
                self.denied.append(
                    f"an LLM call's bound ${bound.usd:.6g} does not fit: ${spent:.6g} spent and ${held:.6g} "
                    f"reserved of the cap ${self.cap:.6g}"
                )
                return False
            self.tickets.append(ticket)
            self.pool += need
        self.calls.append(bound)
        return True

    def cut_usd(self) -> float:
        """The most the calls made may have billed when the request ended without a Done: input bounds, plus the
        output streamed and `CUT_TOKENS` per call, each call's output at most its bound."""
        if not self.calls:
            return 0.0
        out_cap = sum(c.out_tokens for c in self.calls)
        out = min(out_cap, self.streamed + CUT_TOKENS * len(self.calls))
        return sum(c.in_usd for c in self.calls) + out * max(c.usd_per_out for c in self.calls)


def new_ticket(budget: str, period: int) -> Callable[[float], Ticket]:
    return lambda usd: Ticket(budget, period, uuid.uuid4().hex, usd)


def billed(done: Done, dollars: str) -> float:
    """The Done's dollars on a budget: its LLM endpoints' (`dollars: llm`), or with the SLM's too (`all`); cached
    tokens count at most the input tokens (`pyrodash.cost.Usage.components`). Odd figures count as 0 here:
    `usage_dollars` says which they were."""
    return usage_dollars(done, dollars)[0]


def _odd(x: float) -> str | None:
    """ "non_finite" or "negative" for a dollar figure no provider bills, else None."""
    if not math.isfinite(x):
        return "non_finite"
    return "negative" if x < 0 else None


def usage_dollars(done: Done, dollars: str) -> tuple[float, list[str]]:
    """(the Done's sane dollars on a budget, the kinds of odd figures left out: "non_finite", "negative"). Each LLM
    endpoint's `cost_usd` and, with `dollars: all`, the SLM's part of `cost_usd` count only when finite and >= 0."""
    odd: list[str] = []
    llm = 0.0
    for e in done.llm_endpoints:
        x = float(e.get("cost_usd", 0.0))
        if (kind := _odd(x)) is not None:
            odd.append(kind)
        else:
            llm += x
    if dollars == "llm":
        return llm, odd
    total = float(done.cost_usd)
    if (kind := _odd(total)) is not None:
        return llm, [*odd, kind]
    if odd:  # the SLM's part is the total less endpoints we cannot read: not to be trusted either
        return llm, odd
    return max(0.0, total - llm) + llm, odd
