"""The hard cap's ledger in Redis, shared by every replica: each reservation and settlement is one Lua script (atomic
across replicas: no check-then-increment race), with a per-replica fallback while Redis is unreachable.

Keys per budget and period: `<prefix>{<budget>:cap:<period>}:spent` (a float), `...:held` (a hash: request id ->
reserved dollars) and `...:expires` (a sorted set: request id -> wall-clock expiry); `<budget>` is the budget's
ledger key (name, period length, origin). No key of an open period has an expiry (a closed period's get one,
`RedisLedger._close_old`), so only an eviction policy that evicts any key (allkeys-*) can lose spend: the server
checks the policy at start-up (`store.check_eviction`). Each script first drops the
reservations past their expiry. While Redis is down, a replica reserves against its own share (1/N) of the period's
remaining cap as it last saw it (cap - spent - held), in the state_dir's file (`Fallback`, below: shared by its workers,
kept across a restart); once Redis is back, its reservations in flight move to Redis, the dollars it settled
meanwhile are added to the shared `spent` (each settlement once), and Redis's totals are read again.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable

from pyrodash.server.budget.reserve import FileLedger, LedgerError, Ticket, clamp_billed, connect

log = logging.getLogger("pyrodash.serve")

# KEYS: spent, held, expires, expired, settled. Reservations past their expiry (ARGV[1] of `_EXPIRE`: now) count as
# spent at their worst case (`expired`: id -> dollars charged, corrected when the request's settlement comes).
_EXPIRE = """
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
for _, r in ipairs(dead) do
  local usd = redis.call('HGET', KEYS[2], r)
  if usd then
    redis.call('HDEL', KEYS[2], r)
    redis.call('HSET', KEYS[4], r, usd)
    redis.call('INCRBYFLOAT', KEYS[1], usd)
  end
end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1]) end
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(v) end
"""

# ARGV: now, id, usd, cap, expires, force ('1': no cap check; a ticket settled already is not held again)
_RESERVE = (
    _EXPIRE
    + """
local usd = tonumber(ARGV[3])
local ok = 0
if ARGV[6] == '1' and redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 1 then
  return {1, tostring(spent), tostring(held)}
end
if ARGV[6] == '1' or spent + held + usd <= tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[2])
  held = held + usd
  ok = 1
end
return {ok, tostring(spent), tostring(held)}
"""
)

# ARGV: now, id, billed. Returns {live (1: it was held), spent}; a second settle of one id changes nothing.
_SETTLE = (
    _EXPIRE
    + """
if ARGV[2] ~= '' and redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 1 then return {1, tostring(spent)} end
local live = redis.call('HDEL', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
local charged = tonumber(redis.call('HGET', KEYS[4], ARGV[2]) or '0')
redis.call('HDEL', KEYS[4], ARGV[2])
spent = redis.call('INCRBYFLOAT', KEYS[1], tonumber(ARGV[3]) - charged)
if ARGV[2] ~= '' then redis.call('SADD', KEYS[5], ARGV[2]) end
return {live, tostring(spent)}
"""
)

_READ = (
    _EXPIRE
    + """
return {tostring(spent), tostring(held)}
"""
)


def refused(e: BaseException, retry_after_s: int = 2) -> LedgerError | None:
    """A Redis that answered the step with an error (out of memory, a read-only replica, a script error) as a
    `LedgerError` (it is reachable: no fallback share; the request gets a 503); None for anything else."""
    try:
        from redis.exceptions import ConnectionError as RConn
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RTimeout
    except ImportError:  # pragma: no cover
        return None
    if not isinstance(e, RedisError) or isinstance(e, (RConn, RTimeout)):
        return None
    first = (str(e).splitlines() or [""])[0][:160]
    return LedgerError(f"Redis refused the caps' ledger step ({type(e).__name__}: {first})", retry_after_s)


class RedisLedger:
    """Reservations in Redis through `store` (a `RedisStore`: its client, whether Redis is up, its share)."""

    kind = "redis"

    keep_s = 3 * 86400  # a closed period's keys are kept this long (late settlements), then Redis drops them
    closing = 8  # periods 2 .. 2 + closing - 1 behind are given their expiry when a replica enters a new period

    def __init__(self, store, fallback_path=None) -> None:
        self.store = store
        self.reserve_script = store.client.register_script(_RESERVE)
        self.settle_script = store.client.register_script(_SETTLE)
        self.read_script = store.client.register_script(_READ)
        self.seen: dict[tuple[str, int], tuple[float, float]] = {}  # (spent, held) as last read, per budget period
        # the fallback: this host's own share, in the state_dir's file (":memory:": this process only)
        self.local = Fallback(connect(fallback_path or ":memory:"), store.clock)
        self.opened: dict[str, int] = {}  # budget -> the newest period this replica reserved in
        self.watched: dict[str, Callable[[], int]] = {}  # budget -> its current period (read by every refresh)

    def keys(self, name: str, period: int) -> list[str]:
        base = f"{self.store.prefix}{{{name}:cap:{period}}}"  # (a hash tag: one slot for the script's keys)
        return [f"{base}:{k}" for k in ("spent", "held", "expires", "expired", "settled")]

    @property
    def down(self) -> bool:
        return self.store.down_since is not None

    async def _call(self, script, keys: list[str], args: list):
        """A script's result, or None when Redis failed (then the store falls back and says so)."""
        if self.down:
            return None
        if self.store.evicting:  # (`redis_eviction: refuse`, a policy found after start-up)
            raise LedgerError(self.store.evicting, 30)
        try:
            return await script(keys=keys, args=args)
        except Exception as e:  # noqa: BLE001 - Redis unreachable: fall back; Redis refusing: a LedgerError
            if (err := refused(e, int(self.store.retry_s) or 1)) is not None:
                raise err from e
            if not self.store.lost(e):
                raise
            return None

    async def reserve(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        await self.store.reconnect_when_due()
        now = self.store.clock()
        args = [repr(now), t.id, repr(t.usd), repr(cap), repr(now + ttl_s), "0"]
        out = await self._call(self.reserve_script, self.keys(t.budget, t.period), args)
        if out is not None:
            await self._close_old(t.budget, t.period)
            spent, held = float(out[1]), float(out[2])
            self.seen[(t.budget, t.period)] = (spent, held)
            t.where = "redis"
            return bool(int(out[0])), spent, held
        return self._reserve_locally(t, cap, ttl_s)

    def _reserve_locally(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        """Redis is down: `t` within this host's share of what was left when Redis was last seen (by any of its
        workers, before a restart too), on the file's local book."""
        self.local.remember(self.seen)
        ok, spent, held, share, created = self.local.reserve(t, cap, self.store.share, ttl_s)
        if created:
            log.warning(
                "budget %s: Redis unreachable: this replica reserves within $%.6g (1/%d of the cap's remaining)",
                t.budget,
                share,
                self.store.replicas,
            )
        t.where = "local"
        return ok, spent, held

    async def settle(self, t: Ticket, billed: float) -> bool:
        billed = clamp_billed(billed, t.usd)
        if t.where == "local":
            live = self.local.settle_local(t, billed)
            # its settlement is Redis's from now on (sent now or once Redis is back): a second settle goes that way,
            # where Redis's settled set makes it a no-op
            t.where = "redis"
            await self.flush()
            return live
        out = await self._settle(t, billed)
        if out is None:  # reserved in Redis, settled while it is down: sent when it is back (the reservation holds
            self.local.defer(t, billed)  # its place meanwhile, or expires)
            return True
        return bool(int(out[0]))

    async def _settle(self, t: Ticket, billed: float):
        args = [repr(self.store.clock()), t.id, repr(billed)]
        return await self._call(self.settle_script, self.keys(t.budget, t.period), args)

    async def _close_old(self, name: str, period: int) -> None:
        """The first time this replica reserves in `period`: the keys of the periods two and more behind (closed:
        nothing settles into them) get their expiry. An open period's keys have none, so no eviction policy that
        evicts only keys with an expiry (volatile-*) can drop what it spent."""
        if self.opened.get(name, -1) >= period:
            return
        self.opened[name] = period
        try:
            async with self.store.client.pipeline(transaction=False) as pipe:
                for old in range(period - 1 - self.closing, period - 1):
                    for key in self.keys(name, old):
                        pipe.expire(key, self.keep_s)
                await pipe.execute()
        except Exception as e:  # noqa: BLE001 - a closed period kept longer is no harm; tried again next period
            log.warning("budget %s: could not set the expiry of closed periods' keys (%s)", name, type(e).__name__)

    async def read(self, name: str, period: int) -> tuple[float, float]:
        out = await self._call(self.read_script, self.keys(name, period), [repr(self.store.clock())])
        if out is None:
            spent, held = self.local.read(name, period)
            seen = self.seen.get((name, period)) or self.local.seen(name, period) or (0.0, 0.0)
            return seen[0] + spent, seen[1] + held
        self.seen[(name, period)] = (float(out[0]), float(out[1]))
        return self.seen[(name, period)]

    def watch(self, name: str, period_now: Callable[[], int]) -> None:
        """Read budget `name`'s current period (`period_now()`) at every refresh, before it has served a request."""
        self.watched[name] = period_now

    async def refresh_seen(self) -> None:
        """Redis's totals of every period this replica has seen and of each watched budget's current period, read
        again (the heartbeat, a flush): the share of the next outage is taken of what is left then, not of what was
        left at this replica's last request."""
        wanted = set(self.seen) | {(name, period_now()) for name, period_now in self.watched.items()}
        newest: dict[str, int] = {}
        for name, period in wanted:
            newest[name] = max(newest.get(name, period), period)
        for name, period in sorted(wanted):
            if period < newest[name] - 1:
                self.seen.pop((name, period), None)  # (closed)
                continue
            await self.read(name, period)
            if self.down:
                return
        self.local.remember(self.seen)

    async def flush(self) -> None:
        """Redis is up: the local reservations in flight of this host (every worker's, a dead process's too) move
        there, its settlements are sent (each once: Redis's settled set), Redis's totals are read again, and the
        outage's shares go."""
        if self.down:
            return
        for t, expires in self.local.live_rows():
            # held in Redis from now on (admitted within this host's share: no cap check; one settled already, no)
            args = [repr(self.store.clock()), t.id, repr(t.usd), "0", repr(expires), "1"]
            if await self._call(self.reserve_script, self.keys(t.budget, t.period), args) is None:
                return
            self.local.moved(t)
        for seq, t, billed in self.local.pending_rows():
            if await self._settle(t, billed) is None:
                return
            self.local.sent(seq)
        await self.refresh_seen()
        if not self.down:
            self.local.clear_if_done()


# ---------------------------------------------------------------- the fallback share, in the state_dir's file
#
# A replica's own share of each capped budget while Redis is unreachable, kept in the SQLite file of
# `budgets.state_dir` (`ledger.sqlite`): the workers of one `pyrodash serve --workers N` share it, and a replica
# restarted during an outage finds what it spent and the share it was given.
#
#     fb = Fallback(connect(path))
#     fb.remember(seen)                                      # Redis's (spent, held) per budget period, as last read
#     ok, spent, held, share = fb.reserve(t, cap, 1 / n, ttl_s)  # within (cap - spent - held) / n, set once
#     fb.settle_local(t, billed)                             # its dollars, and a settlement to send to Redis
#     fb.live_rows(), fb.pending_rows()                      # what Redis must get once back (`RedisLedger.flush`)
#
# Tables beside the file ledger's (`reserve.FileLedger`, whose rows hold the local reservations under the budget's
# ledger key prefixed `fallback:`): `fb_seen` (Redis's totals as last read), `fb_share` (each period's local cap for
# the outage, set by the first worker that needed it), `fb_live` (local reservations in flight: moved to Redis on its
# return), `fb_pending` (settlements to send; each has an id, so a repeat is a no-op in Redis).

_FALLBACK_TABLES = (
    "CREATE TABLE IF NOT EXISTS fb_seen (name TEXT, period INTEGER, spent REAL, held REAL, PRIMARY KEY (name, period))",
    "CREATE TABLE IF NOT EXISTS fb_share (name TEXT, period INTEGER, cap REAL, PRIMARY KEY (name, period))",
    "CREATE TABLE IF NOT EXISTS fb_live (id TEXT PRIMARY KEY, name TEXT, period INTEGER, usd REAL, expires REAL)",
    "CREATE TABLE IF NOT EXISTS fb_pending (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT, name TEXT, "
    "period INTEGER, billed REAL)",
)
PREFIX = "fallback:"


class Fallback:
    """The fallback ledger (the comment above); every method is one transaction on the file."""

    def __init__(self, db, clock) -> None:
        self.book = FileLedger(db, clock)
        self.db = db
        for sql in _FALLBACK_TABLES:
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
