"""A replica's own share of each capped budget while Redis is unreachable, kept in the SQLite file of
`budgets.state_dir` (`ledger.sqlite`): the workers of one `pyrodash serve --workers N` share it, and a replica
restarted during an outage finds what it spent and the share it was given.

    fb = Fallback(connect(path))
    fb.remember(seen)                                      # Redis's (spent, held) per budget period, as last read
    ok, spent, held, share = fb.reserve(t, cap, 1 / n, ttl_s)  # within (cap - spent - held) / n, set once
    fb.settle_local(t, billed)                             # its dollars, and a settlement to send to Redis
    fb.live_rows(), fb.pending_rows()                      # what Redis must get once back (`RedisLedger.flush`)

Tables beside the file ledger's (`reserve.FileLedger`, whose rows hold the local reservations under the budget's
ledger key prefixed `fallback:`): `fb_seen` (Redis's totals as last read), `fb_share` (each period's local cap for
the outage, set by the first worker that needed it), `fb_live` (local reservations in flight: moved to Redis on its
return), `fb_pending` (settlements to send; each has an id, so a repeat is a no-op in Redis).
"""

from __future__ import annotations

import uuid

from pyrodash.server.budget.reserve import FileLedger, Ticket

_TABLES = (
    "CREATE TABLE IF NOT EXISTS fb_seen (name TEXT, period INTEGER, spent REAL, held REAL, PRIMARY KEY (name, period))",
    "CREATE TABLE IF NOT EXISTS fb_share (name TEXT, period INTEGER, cap REAL, PRIMARY KEY (name, period))",
    "CREATE TABLE IF NOT EXISTS fb_live (id TEXT PRIMARY KEY, name TEXT, period INTEGER, usd REAL, expires REAL)",
    "CREATE TABLE IF NOT EXISTS fb_pending (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, name TEXT, "
    "period INTEGER, billed REAL)",
)
PREFIX = "fallback:"


class Fallback:
    """The fallback ledger (module docstring); every method is one transaction on the file."""

    def __init__(self, db, clock) -> None:
        self.book = FileLedger(db, clock)
        self.db = db
        for sql in _TABLES:
            db.execute(sql)

    def _local(self, t: Ticket, usd: float | None = None) -> Ticket:
        return Ticket(PREFIX + t.budget, t.period, t.id, t.usd if usd is None else usd, "local")

    def remember(self, seen: dict[tuple[str, int], tuple[float, float]]) -> None:
        """Redis's totals as this replica last read them, for a worker or a restart that has not read them."""
        rows = [(n, p, s, h) for (n, p), (s, h) in seen.items()]
        if rows:
            self.book._tx(lambda: self.db.executemany("INSERT OR REPLACE INTO fb_seen VALUES (?, ?, ?, ?)", rows))

    def seen(self, name: str, period: int) -> tuple[float, float] | None:
        row = self.db.execute("SELECT spent, held FROM fb_seen WHERE name = ? AND period = ?", (name, period))
        got = row.fetchone()
        return (got[0], got[1]) if got else None

    def reserve(self, t: Ticket, cap: float, share: float, ttl_s: float) -> tuple[bool, float, float, float, bool]:
        """(ok, spent, held, the local cap, whether this call set it): `t` reserved within the period's local cap,
        which the first reservation of the outage sets to `share` of what Redis had left when last seen (nothing
        seen: the whole cap, as far as this file knows)."""

        def step():
            row = self.db.execute("SELECT cap FROM fb_share WHERE name = ? AND period = ?", (t.budget, t.period))
            got, created = row.fetchone(), False
            if got is None:
                spent, held = self.seen(t.budget, t.period) or (0.0, 0.0)
                local = max(0.0, cap - spent - held) * share
                self.db.execute("INSERT INTO fb_share VALUES (?, ?, ?)", (t.budget, t.period, local))
                created = True
            else:
                local = got[0]
            ok, spent, held = self.book.reserve_step(self._local(t), local, ttl_s)
            if ok:
                expires = self.book.clock() + ttl_s
                self.db.execute(
                    "INSERT OR REPLACE INTO fb_live VALUES (?, ?, ?, ?, ?)", (t.id, t.budget, t.period, t.usd, expires)
                )
            return ok, spent, held, local, created

        return self.book._tx(step)

    def settle_local(self, t: Ticket, billed: float) -> bool:
        """A local reservation settled: its dollars on the local book, and a settlement for Redis."""

        def step():
            live = self.book.settle_step(self._local(t), billed)
            self.db.execute("DELETE FROM fb_live WHERE id = ?", (t.id,))
            self._pend(t, billed)
            return live

        return self.book._tx(step)

    def defer(self, t: Ticket, billed: float) -> None:
        """A settlement for Redis that could not be sent (Redis is down): sent once it is back."""
        self.book._tx(lambda: self._pend(t, billed))

    def _pend(self, t: Ticket, billed: float) -> None:
        rid = t.id or f"uncovered-{uuid.uuid4().hex}"  # (an id: a second send is a no-op in Redis)
        self.db.execute(
            "INSERT INTO fb_pending (id, name, period, billed) VALUES (?, ?, ?, ?)", (rid, t.budget, t.period, billed)
        )

    def live_rows(self) -> list[tuple[Ticket, float]]:
        rows = self.db.execute("SELECT id, name, period, usd, expires FROM fb_live").fetchall()
        return [(Ticket(n, p, i, u, "local"), e) for i, n, p, u, e in rows]

    def pending_rows(self) -> list[tuple[int, Ticket, float]]:
        rows = self.db.execute("SELECT seq, id, name, period, billed FROM fb_pending ORDER BY seq").fetchall()
        return [(seq, Ticket(n, p, i, 0.0, "redis"), b) for seq, i, n, p, b in rows]

    def moved(self, t: Ticket) -> None:
        """A local reservation now held in Redis: released here."""

        def step():
            if self.db.execute("DELETE FROM fb_live WHERE id = ?", (t.id,)).rowcount:
                self.book.settle_step(self._local(t, 0.0), 0.0)

        self.book._tx(step)

    def sent(self, seq: int) -> None:
        self.book._tx(lambda: self.db.execute("DELETE FROM fb_pending WHERE seq = ?", (seq,)))

    def clear_if_done(self) -> bool:
        """Everything is in Redis: the outage's shares and local books go (the next outage starts from Redis's totals
        as seen then). False while something is still to send."""

        def step():
            left = self.db.execute("SELECT (SELECT COUNT(*) FROM fb_live) + (SELECT COUNT(*) FROM fb_pending)")
            if left.fetchone()[0]:
                return False
            self.db.execute("DELETE FROM fb_share")
            for table in ("cap_spent", "cap_held", "cap_expired", "cap_settled"):
                self.db.execute(f"DELETE FROM {table} WHERE name LIKE ?", (PREFIX + "%",))
            return True

        return self.book._tx(step)

    def read(self, name: str, period: int) -> tuple[float, float]:
        """(spent, held) of this host's local book for the period."""
        return self.book._tx(lambda: self.book._totals(PREFIX + name, period))

    def has_share(self, name: str, period: int) -> bool:
        q = "SELECT 1 FROM fb_share WHERE name = ? AND period = ?"
        return self.db.execute(q, (name, period)).fetchone() is not None
