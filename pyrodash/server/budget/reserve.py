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
import sqlite3
import threading
import time
from dataclasses import dataclass

from pyrodash.backends.base import GenRequest, Meshed, Tokenizes
from pyrodash.engine.requests import EngineRequest

MSG_OVERHEAD = 16  # chat-template tokens around one message (role markers, separators), counted generously
TOOLS_OVERHEAD = 256  # a template's text around the tools it shows (how to call them, their list), generously


class LedgerError(Exception):
    """The caps' ledger could not answer: a locked or read-only SQLite file, a Redis that refuses the script (out of
    memory, a read-only replica), a Redis state that kept changing under every retry. Nothing was reserved or
    settled by the step that failed; `retry_after_s`: when the caller may try again."""

    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


def clamp_billed(billed: float, bound: float) -> float:
    """What a settlement may write: `billed` when it is a finite number >= 0; a non-finite one is the reservation's
    `bound` (what the request may have cost), a negative one 0. The ledger never stores NaN or lowers `spent`; the
    callers flag such numbers (`Budgets.record`)."""
    if not math.isfinite(billed):
        return max(0.0, bound) if math.isfinite(bound) else 0.0
    return max(0.0, billed)


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


def _text_bytes(messages: list, prefix: str = "", tools: list[dict] | None = None) -> int:
    """An upper bound on the tokens of `messages` and `prefix`: their UTF-8 bytes (a byte-level tokenizer never makes
    more tokens than bytes) plus the chat template's tokens around each message; an assistant's tool calls and a tool
    result's call id as sent, and the tools' schemas with the template's text around them (`TOOLS_OVERHEAD`)."""
    n = len(prefix.encode())
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else m
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
        n += len(str(text).encode()) + MSG_OVERHEAD
        if isinstance(m, dict) and (m.get("tool_calls") or m.get("tool_call_id")):
            n += len(json.dumps([m.get("tool_calls"), m.get("tool_call_id")], ensure_ascii=False).encode())
    if tools:
        n += len(json.dumps(tools, ensure_ascii=False).encode()) + TOOLS_OVERHEAD
    return n


def _counted(engine, req: GenRequest) -> int | None:
    """`req`'s prompt tokens as the LLM's own tokenizer counts them (an in-process LLM; a mesh: the most any of its
    endpoints counts, when each can), else None."""
    llm = getattr(engine, "llm", None)  # (an engine without an LLM: a test double's)
    backends = [m.backend for m in llm.members] if isinstance(llm, Meshed) else [llm]
    if not all(isinstance(b, Tokenizes) for b in backends):
        return None
    try:
        return max(len(b.prompt_ids(req)) for b in backends)
    except Exception:  # noqa: BLE001 - a tokenizer that cannot render this prompt: the byte bound instead
        return None


def _llm_prices(engine) -> tuple[float, float, int]:
    """(dearest input price, dearest output price, endpoints) of the LLM, over a mesh's endpoints (USD per token)."""
    sheet = engine.prices
    llm = getattr(engine, "llm", None)
    members = llm.members if isinstance(llm, Meshed) else [None]
    sheets = [(m.prices if m is not None else None) or sheet for m in members]
    p_in = max(max(s.llm_in, s.llm_cached_in or 0.0) for s in sheets)
    return p_in / 1e6, max(s.llm_out for s in sheets) / 1e6, len(members)


@dataclass(frozen=True)
class CallBound:
    """The most one LLM call may bill: its input dollars, and its output tokens at `usd_per_out` each."""

    in_usd: float
    out_tokens: int
    usd_per_out: float

    @property
    def usd(self) -> float:
        return self.in_usd + self.out_tokens * self.usd_per_out


def call_bound(engine, prompt_tokens: int, out_tokens: int) -> CallBound:
    """One LLM call of `prompt_tokens` in and at most `out_tokens` out, at the dearest prices. On a mesh every endpoint
    may be tried in the one call: each takeover re-sends the prompt with what streamed so far and grants at least one
    more token."""
    p_in, p_out, n = _llm_prices(engine)
    tokens_in = prompt_tokens + (n - 1) * (prompt_tokens + out_tokens)
    return CallBound(tokens_in * p_in, out_tokens + n - 1, p_out)


def request_bound(engine, req: GenRequest) -> CallBound:
    """What the LLM call `req` may bill (`EngineRequest.gate` asks with it): its prompt counted by the LLM's tokenizer
    where the LLM runs in process, else bounded by its bytes; its output by `req.max_tokens`."""
    n = _counted(engine, req)
    bound = n if n is not None else _text_bytes(req.messages, req.prefix, req.tools)
    return call_bound(engine, bound, int(req.max_tokens))


def _first_prompt(engine, call: EngineRequest, handoff: bool) -> int:
    """The prompt tokens of a request's first LLM call before it runs: the handoff request without its partial
    answer (`handoff`), else the conversation as given (the LLM alone); counted where the LLM's tokenizer is known."""
    messages = chat_messages(engine, call.question)
    tools = call.tools.schemas() if call.tools is not None else None  # shown to the LLM in its prompt too
    if handoff and callable(getattr(engine, "llm_request", None)):
        req = engine.llm_request(messages, "", 1, {}, **({"tools": tools} if tools else {}))
    else:
        req = GenRequest(messages=list(messages), tools=tools)
    n = _counted(engine, req)
    if n is not None:
        return n
    n = _text_bytes(req.messages, req.prefix, req.tools)
    prompts = getattr(engine, "prompts", None)
    if handoff and prompts is not None and not callable(getattr(engine, "llm_request", None)):
        n += sum(len((t or "").encode()) for t in (prompts.offload_system, prompts.handoff_template)) + MSG_OVERHEAD
    return n


def worst_case(engine, call: EngineRequest, dollars: str) -> Worst | None:
    """What a request reserves at admission (None: the engine has no price sheet, nothing to bound): its first LLM
    call's bound (a handoff reads the prompt and at most `max_tokens` of the SLM's partial answer; the LLM alone reads
    the conversation), each further call (a retry, a relay step) reserved by the gate before it is made; in
    `dollars: all` the SLM's own decoding too (its first pass and a resume after each call)."""
    if getattr(engine, "prices", None) is None:
        return None
    per_model = int(call.max_tokens or 0)
    total = int(call.max_total_tokens or per_model)
    out = min(per_model or total, total)
    collab = call_bound(engine, _first_prompt(engine, call, True) + out, out).usd
    alone = call_bound(engine, _first_prompt(engine, call, False), out).usd
    slm = 0.0
    if dollars == "all":
        sheet = engine.prices
        calls = max(1, int(call.max_llm_calls or getattr(engine, "max_llm_calls", 1) or 1))
        prompts = getattr(engine, "prompts", None)
        texts = () if prompts is None else (prompts.offload_system, prompts.completion_system)
        tools = call.tools.schemas() if call.tools is not None else None
        prompt = _text_bytes(chat_messages(engine, call.question), tools=tools) + _text_bytes([t or "" for t in texts])
        slm = (1 + calls) * (prompt + total) * sheet.slm_in / 1e6 + total * sheet.slm_out / 1e6
    return Worst(collab=collab + slm, llm=alone, slm=slm)


# ---------------------------------------------------------------- in process


class MemoryLedger:
    """The ledger in this process, under a lock (one replica, or the fallback share of a replica without Redis)."""

    kind = "memory"

    def __init__(self, clock=time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        # (budget, period) -> {"spent": usd, "held": {id: (usd, expires)}, "expired": {id: usd}, "settled": {id}}
        self.periods: dict[tuple[str, int], dict] = {}
        self.caps: dict[tuple[str, int], float] = {}  # a cap of its own per period (RedisLedger's fallback share)

    def _book(self, name: str, period: int) -> dict:
        for key in [k for k in self.periods if k[0] == name and k[1] < period - 1]:
            del self.periods[key]  # a period two behind is closed: nothing settles into it any more
        book = self.periods.setdefault((name, period), {"spent": 0.0, "held": {}, "expired": {}, "settled": set()})
        now = self.clock()
        for i in [i for i, (_, exp) in book["held"].items() if exp <= now]:
            usd, _ = book["held"].pop(i)  # an expired reservation counts as spent at its worst case
            book["expired"][i] = usd
            book["spent"] += usd
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
        billed = clamp_billed(billed, t.usd)
        with self.lock:
            book = self._book(t.budget, t.period)
            if t.id and t.id in book["settled"]:
                return True  # settled already: a second settle changes nothing
            live = book["held"].pop(t.id, None) is not None
            book["spent"] += billed - book["expired"].pop(t.id, 0.0)  # (an expired one: its worst case corrected)
            if t.id:
                book["settled"].add(t.id)
            return live

    def read_now(self, name: str, period: int) -> tuple[float, float]:
        with self.lock:
            book = self._book(name, period)
            return book["spent"], sum(usd for usd, _ in book["held"].values())

    async def reserve(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        return self.reserve_now(t, cap, ttl_s)

    async def settle(self, t: Ticket, billed: float) -> bool:
        """The reservation goes and `billed` counts; False when it had expired (the request outlived its ttl: its
        worst case, counted then, is replaced by `billed`). Settling a ticket twice counts it once."""
        return self.settle_now(t, billed)

    async def read(self, name: str, period: int) -> tuple[float, float]:
        return self.read_now(name, period)


# ---------------------------------------------------------------- one SQLite file (one server, its workers)

_TABLES = (
    "CREATE TABLE IF NOT EXISTS cap_spent (name TEXT, period INTEGER, usd REAL, PRIMARY KEY (name, period))",
    "CREATE TABLE IF NOT EXISTS cap_held (name TEXT, period INTEGER, id TEXT, usd REAL, expires REAL, "
    "PRIMARY KEY (name, period, id))",
    "CREATE TABLE IF NOT EXISTS cap_expired (name TEXT, period INTEGER, id TEXT, usd REAL, "
    "PRIMARY KEY (name, period, id))",
    "CREATE TABLE IF NOT EXISTS cap_settled (name TEXT, period INTEGER, id TEXT, PRIMARY KEY (name, period, id))",
)
_ADD_SPENT = "INSERT INTO cap_spent VALUES (?, ?, ?) ON CONFLICT (name, period) DO UPDATE SET usd = usd + excluded.usd"


class FileLedger:
    """The ledger in a SQLite file (`budgets.state_dir`: it outlives the server, and the workers of `--workers N`
    share it); each step one `BEGIN IMMEDIATE` transaction."""

    kind = "file"

    def __init__(self, db, clock=time.time) -> None:
        self.db, self.clock = db, clock
        for sql in _TABLES:
            self.db.execute(sql)

    def _totals(self, name: str, period: int) -> tuple[float, float]:
        now = self.clock()
        dead = self.db.execute("SELECT name, period, id, usd FROM cap_held WHERE expires <= ?", (now,)).fetchall()
        for n, p, i, usd in dead:  # an expired reservation counts as spent at its worst case
            self.db.execute("INSERT OR REPLACE INTO cap_expired VALUES (?, ?, ?, ?)", (n, p, i, usd))
            self.db.execute(_ADD_SPENT, (n, p, usd))
        self.db.execute("DELETE FROM cap_held WHERE expires <= ?", (now,))
        for table in ("cap_spent", "cap_expired", "cap_settled"):  # this budget's periods two behind are closed
            self.db.execute(f"DELETE FROM {table} WHERE name = ? AND period < ?", (name, period - 1))
        row = self.db.execute("SELECT usd FROM cap_spent WHERE name = ? AND period = ?", (name, period)).fetchone()
        held = self.db.execute("SELECT SUM(usd) FROM cap_held WHERE name = ? AND period = ?", (name, period)).fetchone()
        return (row[0] if row else 0.0), (held[0] or 0.0)

    def _tx(self, fn):
        """`fn` in one `BEGIN IMMEDIATE` transaction; a file that cannot be written (locked past the busy timeout,
        read-only, full) is a `LedgerError`, with nothing written."""
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as e:
            raise LedgerError(f"the caps' ledger file cannot be written ({e})") from e
        try:
            out = fn()
            self.db.execute("COMMIT")
            return out
        except BaseException as e:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if isinstance(e, sqlite3.Error):
                raise LedgerError(f"the caps' ledger file cannot be written ({e})") from e
            raise

    def reserve_step(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        """`reserve`'s writes, inside a transaction the caller holds."""
        spent, held = self._totals(t.budget, t.period)
        if spent + held + t.usd > cap:
            return False, spent, held
        self.db.execute(
            "INSERT OR REPLACE INTO cap_held VALUES (?, ?, ?, ?, ?)",
            (t.budget, t.period, t.id, t.usd, self.clock() + ttl_s),
        )
        return True, spent, held + t.usd

    def settle_step(self, t: Ticket, billed: float) -> bool:
        """`settle`'s writes, inside a transaction the caller holds."""
        billed = clamp_billed(billed, t.usd)
        self._totals(t.budget, t.period)
        key = (t.budget, t.period, t.id)
        where = "WHERE name = ? AND period = ? AND id = ?"
        if t.id and self.db.execute(f"SELECT 1 FROM cap_settled {where}", key).fetchone():
            return True  # settled already
        live = self.db.execute(f"DELETE FROM cap_held {where}", key).rowcount > 0
        charged = self.db.execute(f"SELECT usd FROM cap_expired {where}", key).fetchone()
        self.db.execute(f"DELETE FROM cap_expired {where}", key)
        self.db.execute(_ADD_SPENT, (t.budget, t.period, billed - (charged[0] if charged else 0.0)))
        if t.id:
            self.db.execute("INSERT INTO cap_settled VALUES (?, ?, ?)", key)
        return live

    async def reserve(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        return self._tx(lambda: self.reserve_step(t, cap, ttl_s))

    async def settle(self, t: Ticket, billed: float) -> bool:
        return self._tx(lambda: self.settle_step(t, billed))

    async def read(self, name: str, period: int) -> tuple[float, float]:
        return self._tx(lambda: self._totals(name, period))


def connect(path) -> sqlite3.Connection:
    """A connection to the SQLite file `path` (":memory:": this process only) as the ledgers use it: autocommit
    (each step its own `BEGIN IMMEDIATE`), WAL, shared by the threads of one process."""
    db = sqlite3.connect(str(path), timeout=10, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def period_of(t: float, period_s: float) -> int:
    """The index of the period that budget time `t` falls in."""
    return math.floor(t / period_s)
