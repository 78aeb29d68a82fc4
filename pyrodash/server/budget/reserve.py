"""The hard cap's ledger: reserve a request's worst-case dollars at admission, settle them to the billed dollars.

    ledger = MemoryLedger()                          # or FileLedger(db) / RedisLedger(store), see store.py
    ok, spent, held = await ledger.reserve(ticket, cap, ttl_s)   # atomic: spent + held + ticket.usd <= cap
    await ledger.settle(ticket, billed_usd)          # the reservation goes, the billed dollars count

Per budget and period: `spent` (billed dollars of the period's settled requests) and `held` (reservations of its
requests in flight, each expiring `ttl_s` wall seconds after admission, so a dead replica cannot hold budget).
`worst_case` is what a request may cost at most (docs/budgets.md says how it is bounded).
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass

from pyrodash.engine.requests import EngineRequest

MSG_OVERHEAD = 16  # chat-template tokens around one message (role markers, separators), counted generously


@dataclass
class Ticket:
    """One request's reservation on its budget's period (`where`: the store holding it)."""

    budget: str
    period: int
    id: str
    usd: float
    where: str = "memory"  # "memory" | "file" | "redis" | "local" (a replica's own share while Redis is down)


@dataclass(frozen=True)
class Worst:
    """The most a request may bill, per way of answering it: `collab` (the SLM handing off to the LLM), `llm` (the
    LLM alone), `slm` (the SLM alone); in the budget's dollars (LLM dollars, or all)."""

    collab: float
    llm: float
    slm: float


def chat_messages(engine, prompt) -> list[dict]:
    """The chat messages the engine makes of `prompt` (what it hashes for the handoff share, what it sends)."""
    get = getattr(engine, "messages", None)
    if callable(get):
        return get(prompt)
    return prompt if isinstance(prompt, list) else [{"role": "user", "content": str(prompt)}]


def _prompt_tokens(engine, prompt) -> int:
    """An upper bound on the prompt tokens of any request the engine builds for `prompt`: its UTF-8 bytes (a byte-level
    tokenizer never makes more tokens than bytes) plus the system prompts and template tokens."""
    n = 0
    for m in chat_messages(engine, prompt):
        content = m.get("content") if isinstance(m, dict) else m
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        n += len(str(text).encode()) + MSG_OVERHEAD
    prompts = getattr(engine, "prompts", None)
    if prompts is not None:
        texts = (prompts.offload_system, prompts.completion_system, prompts.handoff_template, prompts.question_template)
        n += sum(len((t or "").encode()) for t in texts) + 4 * MSG_OVERHEAD
    return n


def _llm_prices(engine) -> tuple[float, float, int]:
    """(dearest input price, dearest output price, endpoints) of the LLM, over a mesh's endpoints (USD per token)."""
    sheet = engine.prices
    members = getattr(getattr(engine, "llm", None), "members", None) or [None]
    sheets = [getattr(m, "prices", None) or sheet for m in members]
    p_in = max(max(s.llm_in, s.llm_cached_in or 0.0) for s in sheets)
    return p_in / 1e6, max(s.llm_out for s in sheets) / 1e6, len(members)


def worst_case(engine, call: EngineRequest, dollars: str) -> Worst | None:
    """A request's worst-case dollars, from its prompt, its token budget, its LLM calls and the prices (None: the engine
    has no price sheet, nothing to bound). Every LLM call (several in relay mode, `max_llm_calls`) and every attempt of
    it (1 + retries, on each endpoint of a mesh) is billed the prompt plus the whole budget as input; the output over
    all of them is at most the budget (a retry continues, a relay call writes part of the same answer)."""
    if getattr(engine, "prices", None) is None:
        return None
    per_model = int(call.max_tokens or 0)
    total = int(call.max_total_tokens or per_model)
    out = min(per_model or total, total)
    prompt_tokens = _prompt_tokens(engine, call.question)
    p_in, p_out, endpoints = _llm_prices(engine)
    retries = getattr(getattr(engine, "failure", None), "retries", 0)
    calls = max(1, int(call.max_llm_calls or getattr(engine, "max_llm_calls", 1) or 1))
    llm = calls * (1 + retries) * endpoints * (prompt_tokens + total) * p_in + out * p_out
    slm = 0.0
    if dollars == "all":  # the SLM's first pass and its resume after each LLM call (or a failed one)
        sheet = engine.prices
        slm = (1 + calls) * (prompt_tokens + total) * sheet.slm_in / 1e6 + total * sheet.slm_out / 1e6
    return Worst(collab=llm + slm, llm=llm, slm=slm)


# ---------------------------------------------------------------- in process


class MemoryLedger:
    """The ledger in this process, under a lock (one replica, or the fallback share of a replica without Redis)."""

    kind = "memory"

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.periods: dict[tuple[str, int], dict] = {}  # (budget, period) -> {"spent": usd, "held": {id: (usd, exp)}}
        self.caps: dict[tuple[str, int], float] = {}  # a cap of its own per period (RedisLedger's fallback share)

    def _book(self, name: str, period: int) -> dict:
        for key in [k for k in self.periods if k[0] == name and k[1] < period - 1]:
            del self.periods[key]  # a period two behind is closed: nothing settles into it any more
        book = self.periods.setdefault((name, period), {"spent": 0.0, "held": {}})
        now = self.clock()
        book["held"] = {i: (usd, exp) for i, (usd, exp) in book["held"].items() if exp > now}
        return book

    def reserve_now(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        cap = self.caps.get((t.budget, t.period), cap)
        with self.lock:
            book = self._book(t.budget, t.period)
            held = sum(usd for usd, _ in book["held"].values())
            if book["spent"] + held + t.usd > cap:
                return False, book["spent"], held
            book["held"][t.id] = (t.usd, self.clock() + ttl_s)
            return True, book["spent"], held + t.usd

    def settle_now(self, t: Ticket, billed: float) -> bool:
        with self.lock:
            book = self._book(t.budget, t.period)
            live = book["held"].pop(t.id, None) is not None
            book["spent"] += billed
            return live

    def read_now(self, name: str, period: int) -> tuple[float, float]:
        with self.lock:
            book = self._book(name, period)
            return book["spent"], sum(usd for usd, _ in book["held"].values())

    async def reserve(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        return self.reserve_now(t, cap, ttl_s)

    async def settle(self, t: Ticket, billed: float) -> bool:
        """The reservation goes and `billed` counts; False when it had expired (the request outlived its ttl)."""
        return self.settle_now(t, billed)

    async def read(self, name: str, period: int) -> tuple[float, float]:
        return self.read_now(name, period)


# ---------------------------------------------------------------- one SQLite file (the workers of one server)


class FileLedger:
    """The ledger in the SQLite file of a `FileStore`; each step one `BEGIN IMMEDIATE` transaction."""

    kind = "file"

    def __init__(self, db, clock=time.time) -> None:
        self.db, self.clock = db, clock
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS cap_spent (name TEXT, period INTEGER, usd REAL, PRIMARY KEY (name, period))"
        )
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS cap_held (name TEXT, period INTEGER, id TEXT, usd REAL, expires REAL, "
            "PRIMARY KEY (name, period, id))"
        )

    def _totals(self, name: str, period: int) -> tuple[float, float]:
        self.db.execute("DELETE FROM cap_held WHERE expires <= ?", (self.clock(),))
        self.db.execute("DELETE FROM cap_spent WHERE period < ?", (period - 1,))
        row = self.db.execute("SELECT usd FROM cap_spent WHERE name = ? AND period = ?", (name, period)).fetchone()
        held = self.db.execute("SELECT SUM(usd) FROM cap_held WHERE name = ? AND period = ?", (name, period)).fetchone()
        return (row[0] if row else 0.0), (held[0] or 0.0)

    def _tx(self, fn):
        self.db.execute("BEGIN IMMEDIATE")
        try:
            out = fn()
            self.db.execute("COMMIT")
            return out
        except BaseException:
            self.db.execute("ROLLBACK")
            raise

    async def reserve(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        def step():
            spent, held = self._totals(t.budget, t.period)
            if spent + held + t.usd > cap:
                return False, spent, held
            self.db.execute(
                "INSERT OR REPLACE INTO cap_held VALUES (?, ?, ?, ?, ?)",
                (t.budget, t.period, t.id, t.usd, self.clock() + ttl_s),
            )
            return True, spent, held + t.usd

        return self._tx(step)

    async def settle(self, t: Ticket, billed: float) -> bool:
        def step():
            key = (t.budget, t.period, t.id)
            live = self.db.execute("DELETE FROM cap_held WHERE name = ? AND period = ? AND id = ?", key).rowcount > 0
            self.db.execute(
                "INSERT INTO cap_spent VALUES (?, ?, ?) ON CONFLICT (name, period) DO UPDATE SET usd = usd + ?",
                (t.budget, t.period, billed, billed),
            )
            return live

        return self._tx(step)

    async def read(self, name: str, period: int) -> tuple[float, float]:
        return self._tx(lambda: self._totals(name, period))


def period_of(t: float, period_s: float) -> int:
    """The index of the period that budget time `t` falls in."""
    return math.floor(t / period_s)
