"""The hard cap's ledger in Redis, shared by every replica: each reservation and settlement is one Lua script (atomic
across replicas: no check-then-increment race), with a per-replica fallback while Redis is unreachable.

Keys per budget and period: `<prefix>{<budget>:cap:<period>}:spent` (a float), `...:held` (a hash: request id ->
reserved dollars) and `...:expires` (a sorted set: request id -> wall-clock expiry). Each script first drops the
reservations past their expiry. While Redis is down, a replica reserves against its own share (1/N) of the period's
remaining cap as it last saw it (cap - spent - held), in process; once Redis is back, its reservations in flight move
to Redis and the dollars it settled meanwhile are added to the shared `spent`.
"""

from __future__ import annotations

import logging

from pyrodash.server.budget.reserve import MemoryLedger, Ticket

log = logging.getLogger("pyrodash.serve")

_RESERVE = """
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[4])
for _, r in ipairs(dead) do redis.call('HDEL', KEYS[2], r) end
if #dead > 0 then redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[4]) end
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(v) end
local usd = tonumber(ARGV[2])
local ok = 0
if ARGV[6] == '1' or spent + held + usd <= tonumber(ARGV[3]) then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
  held = held + usd
  ok = 1
end
for _, k in ipairs(KEYS) do redis.call('EXPIRE', k, ARGV[7]) end
return {ok, tostring(spent), tostring(held)}
"""

_SETTLE = """
local live = redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
local spent = redis.call('INCRBYFLOAT', KEYS[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return {live, spent}
"""

_READ = """
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
local spent = tonumber(redis.call('GET', KEYS[1]) or '0')
local held = 0
for _, v in ipairs(redis.call('HVALS', KEYS[2])) do held = held + tonumber(v) end
return {tostring(spent), tostring(held)}
"""


class RedisLedger:
    """Reservations in Redis through `store` (a `RedisStore`: its client, whether Redis is up, its share)."""

    kind = "redis"

    keep_s = 3 * 86400  # a period's keys outlive it (settlements arrive late), then Redis drops them

    def __init__(self, store) -> None:
        self.store = store
        self.reserve_script = store.client.register_script(_RESERVE)
        self.settle_script = store.client.register_script(_SETTLE)
        self.read_script = store.client.register_script(_READ)
        self.seen: dict[tuple[str, int], tuple[float, float]] = {}  # (spent, held) as last read, per budget period
        self.local = MemoryLedger(store.clock)  # the fallback: this replica's own share
        self.live: dict[str, tuple[Ticket, float]] = {}  # local reservations in flight: id -> (ticket, expiry)
        self.pending: list[tuple[Ticket, float]] = []  # settlements to send once Redis is back

    def keys(self, name: str, period: int) -> list[str]:
        base = f"{self.store.prefix}{{{name}:cap:{period}}}"  # (a hash tag: one slot for the script's keys)
        return [f"{base}:spent", f"{base}:held", f"{base}:expires"]

    @property
    def down(self) -> bool:
        return self.store.down_since is not None

    async def _call(self, script, keys: list[str], args: list):
        """A script's result, or None when Redis failed (then the store falls back and says so)."""
        if self.down:
            return None
        try:
            return await script(keys=keys, args=args)
        except Exception as e:  # noqa: BLE001 - any Redis failure: fall back
            if not self.store.lost(e):
                raise
            return None

    async def reserve(self, t: Ticket, cap: float, ttl_s: float) -> tuple[bool, float, float]:
        await self.store.reconnect_when_due()
        now = self.store.clock()
        args = [t.id, repr(t.usd), repr(cap), repr(now), repr(now + ttl_s), "0", self.keep_s]
        out = await self._call(self.reserve_script, self.keys(t.budget, t.period), args)
        if out is not None:
            spent, held = float(out[1]), float(out[2])
            self.seen[(t.budget, t.period)] = (spent, held)
            t.where = "redis"
            return bool(int(out[0])), spent, held
        key = (t.budget, t.period)
        if key not in self.local.caps:  # this replica's share of what was left when it last saw Redis
            spent, held = self.seen.get(key, (0.0, 0.0))
            self.local.caps[key] = max(0.0, cap - spent - held) * self.store.share
            log.warning(
                "budget %s: Redis unreachable: this replica reserves within $%.6g (1/%d of the cap's remaining)",
                t.budget,
                self.local.caps[key],
                self.store.replicas,
            )
        t.where = "local"
        ok, spent, held = self.local.reserve_now(t, cap, ttl_s)
        if ok:
            self.live[t.id] = (t, now + ttl_s)
        return ok, spent, held

    async def settle(self, t: Ticket, billed: float) -> bool:
        if t.where == "local":
            self.live.pop(t.id, None)
            live = self.local.settle_now(t, billed)
            self.pending.append((Ticket(t.budget, t.period, t.id, 0.0, "local"), billed))
            await self.flush()
            return live
        out = await self._call(self.settle_script, self.keys(t.budget, t.period), [t.id, repr(billed), self.keep_s])
        if out is None:  # reserved in Redis, settled while it is down: sent when it is back (the reservation holds
            self.pending.append((t, billed))  # its place meanwhile, or expires)
            return True
        return bool(int(out[0]))

    async def read(self, name: str, period: int) -> tuple[float, float]:
        out = await self._call(self.read_script, self.keys(name, period), [repr(self.store.clock())])
        if out is None:
            spent, held = self.local.read_now(name, period)
            seen_spent, seen_held = self.seen.get((name, period), (0.0, 0.0))
            return seen_spent + spent, seen_held + held
        self.seen[(name, period)] = (float(out[0]), float(out[1]))
        return self.seen[(name, period)]

    async def flush(self) -> None:
        """Redis is back: this replica's reservations in flight move there, its settlements are sent."""
        if self.down:
            return
        for rid, (t, expires) in list(self.live.items()):
            # held in Redis from now on (admitted within this replica's share: no cap check)
            args = [t.id, repr(t.usd), "0", repr(self.store.clock()), repr(expires), "1", self.keep_s]
            if await self._call(self.reserve_script, self.keys(t.budget, t.period), args) is None:
                return
            self.local.settle_now(t, 0.0)
            t.where = "redis"
            del self.live[rid]
        while self.pending:
            t, billed = self.pending[0]
            if (
                await self._call(self.settle_script, self.keys(t.budget, t.period), [t.id, repr(billed), self.keep_s])
                is None
            ):
                return
            self.pending.pop(0)
        self.local.caps.clear()
        self.local.periods.clear()
