"""Where the budgets' controller state lives: this process (`MemoryStore`), a SQLite file shared by the worker
processes of one `pyrodash serve --workers N` (`FileStore`), or one Redis hash per budget shared by every replica
(`RedisStore`), and beside it the hard cap's ledger of reservations (`store.ledger`: `reserve.py`, `reserve_redis.py`).

    store = RedisStore("redis://127.0.0.1:6379/0", prefix="pyrodash:budget:")
    result, view = await store.run("default", spec, lambda st, spec: arrive(st, spec, t, ...))

`run` applies a pacer step to the budget's `PacerState` atomically, so N replicas behind a balancer hold ONE budget.
How it does so in Redis, and what a replica does while Redis is down: docs/internals.md.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from pyrodash.server.budget.pacer import PacerSpec, PacerState, advance
from pyrodash.server.budget.reserve import FileLedger, LedgerError, MemoryLedger, connect
from pyrodash.server.budget.reserve_redis import RedisLedger, refused

log = logging.getLogger("pyrodash.serve")
WATCH_ATTEMPTS = 50  # a pacer step retried this often when other replicas write the budget's state in between
HEARTBEAT_S = 5.0  # a replica refreshes its heartbeat this often ...
ALIVE_S = 30.0  # ... and counts as alive this long after its last one


# maxmemory-policies that never evict a key without an expiry (no key of an open period has one)
KEEPS_THE_LEDGER = ("noeviction", "volatile-lru", "volatile-lfu", "volatile-random", "volatile-ttl")


def eviction_problem(policy: str | None) -> str | None:
    """What is wrong with a Redis of `policy` for the caps' ledger (None: nothing)."""
    if policy is None or policy in KEEPS_THE_LEDGER:
        return None
    return (
        f"Redis's maxmemory-policy is {policy}: when its memory fills it may evict the caps' ledger (the period's "
        "spent dollars) and admit a second cap. Run Redis with `--maxmemory-policy noeviction` (deploy/compose.yaml "
        "does), or set budgets.redis_eviction: warn to serve anyway"
    )


def _policy_of(config: dict | None, info: dict | None) -> str | None:
    if config and config.get("maxmemory-policy"):
        return str(config["maxmemory-policy"])
    return str(info["maxmemory_policy"]) if info and info.get("maxmemory_policy") else None


class MemoryStore:
    """In-process state (one replica, or replicas that do not share: each holds the whole budget)."""

    kind = "memory"

    def __init__(self) -> None:
        self.states: dict[str, PacerState] = {}
        self.ledger = MemoryLedger()  # the hard cap's reservations (pyrodash.server.budget.reserve)

    async def run(self, name: str, spec: PacerSpec, fn: Callable[[PacerState, PacerSpec], object]):
        st = self.states.setdefault(name, PacerState())
        return fn(st, spec), self.view()

    async def read(self, name: str, spec: PacerSpec) -> tuple[PacerState, PacerSpec, dict]:
        return self.states.get(name, PacerState()).copy(), spec, self.view()

    def view(self) -> dict:
        return {"store": "memory", "shared": False, "fallback": False, "replica_share": 1.0}

    async def aclose(self) -> None:
        return None


def ledger_file(path: str | Path) -> FileLedger:
    """The hard caps' ledger in the SQLite file `path` (made with its folder if missing): it outlives the server, and
    every process that opens it (the workers of `--workers N`, a restarted server) holds the same caps."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        db = connect(path)
    except (OSError, sqlite3.Error) as e:
        raise ValueError(
            f"budgets.state_dir: cannot keep the caps' ledger in {path} ({e}): set a writable folder"
        ) from None
    return FileLedger(db)


class FileStore:
    """The state in a SQLite file shared by the processes of one `pyrodash serve --workers N` (they hold ONE budget,
    as replicas do through Redis; without it each worker would spend the whole budget). Each step is one
    `BEGIN IMMEDIATE` transaction (the file's lock), well under a millisecond."""

    kind = "file"

    def __init__(self, path: str | Path):
        self.path = str(path)
        self.db = sqlite3.connect(self.path, timeout=10, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("CREATE TABLE IF NOT EXISTS budgets (name TEXT PRIMARY KEY, state TEXT NOT NULL)")
        self.ledger = FileLedger(self.db)  # the hard cap's reservations, in the same file

    def _load(self, name: str) -> PacerState:
        row = self.db.execute("SELECT state FROM budgets WHERE name = ?", (name,)).fetchone()
        return PacerState.from_strings(json.loads(row[0])) if row else PacerState()

    async def run(self, name: str, spec: PacerSpec, fn: Callable[[PacerState, PacerSpec], object]):
        try:
            self.db.execute("BEGIN IMMEDIATE")
            try:
                st = self._load(name)
                result = fn(st, spec)
                self.db.execute("INSERT OR REPLACE INTO budgets VALUES (?, ?)", (name, json.dumps(st.to_strings())))
                self.db.execute("COMMIT")
            except BaseException:
                if self.db.in_transaction:
                    self.db.execute("ROLLBACK")
                raise
        except sqlite3.Error as e:  # a locked or read-only file: the step is not made
            raise LedgerError(f"the budgets' state file cannot be written ({e})") from e
        return result, self.view()

    async def read(self, name: str, spec: PacerSpec) -> tuple[PacerState, PacerSpec, dict]:
        return self._load(name), spec, self.view()

    def view(self) -> dict:
        return {"store": "file", "shared": True, "fallback": False, "replica_share": 1.0}

    async def aclose(self) -> None:
        self.db.close()


def scaled(spec: PacerSpec, share: float) -> PacerSpec:
    """A replica's part of a budget: target and cap times `share`."""
    return replace(spec, rate=spec.rate * share, cap=None if spec.cap is None else spec.cap * share)


class RedisStore:
    """State shared through Redis, with a per-replica fallback (module docstring)."""

    kind = "redis"

    def __init__(
        self,
        url: str,
        prefix: str = "pyrodash:budget:",
        replicas: int | None = None,
        timeout_s: float = 0.25,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.time,
        eviction: str = "refuse",
        fallback_path: str | Path | None = None,
    ):
        import redis.asyncio as aioredis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RConn

        self.url, self.prefix, self.replicas_hint = url, prefix, replicas
        self.timeout_s, self.retry_s, self.clock = timeout_s, retry_s, clock
        # a pooled connection that died with a Redis restart is retried once on a fresh one (a timeout is not: the
        # request would wait twice before the fallback)
        self.client = aioredis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1, supported_errors=(RConn,)),
            retry_on_error=[RConn],
        )
        self.id = uuid.uuid4().hex[:12]
        self.replicas = replicas or 1  # replicas seen alive (heartbeats), at least 1
        self._beat_at = 0.0
        self.down_since: float | None = None
        self.error: str | None = None
        self._retry_at = 0.0
        self.last: dict[str, PacerState] = {}  # the shared state as last read, per budget
        self.local: dict[str, PacerState] = {}  # fallback state while Redis is down
        self.pending: dict[str, dict[float, float]] = {}  # dollars charged while down: budget -> period -> usd
        self.specs: dict[str, PacerSpec] = {}  # each budget's spec, as last used (to merge its pending dollars)
        self.fallbacks = 0  # times this replica lost Redis
        self.eviction = eviction  # "refuse" | "warn": a Redis whose maxmemory-policy may evict the ledger
        self.policy: str | None = None  # Redis's maxmemory-policy, once read
        self.policy_checked = False
        self.evicting: str | None = None  # why the ledger refuses this Redis (`eviction: refuse`, found after start)
        self.locks: dict[str, asyncio.Lock] = {}
        self._beater: asyncio.Task | None = None  # heartbeats (and reconnects) on a timer, from the first use on
        # the hard cap's reservations: Lua scripts on the same client; while Redis is down, this host's share in
        # `fallback_path` (the state_dir's ledger file; None: in this process)
        self.ledger = RedisLedger(self, fallback_path)

    # ------------------------------------------------------------ Redis's eviction policy

    def check_eviction_now(self) -> None:
        """At start-up: Redis's maxmemory-policy, read once (a blocking call); a policy that may evict the ledger
        raises ValueError (`eviction: refuse`, the server does not start) or is logged (`warn`). An unreachable
        Redis is checked at first contact instead (`_check_eviction`)."""
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s)
        try:
            try:
                config, info = client.config_get("maxmemory-policy"), None
            except redis.ResponseError:  # (CONFIG disabled, as on some managed Redis)
                config, info = None, client.info("memory")
        except (redis.ConnectionError, redis.TimeoutError, OSError):
            return
        finally:
            client.close()
        self._judge(_policy_of(config, info), at_start=True)

    async def _check_eviction(self) -> None:
        from redis.exceptions import ResponseError

        try:
            config, info = await self.client.config_get("maxmemory-policy"), None
        except ResponseError:
            config, info = None, await self.client.info("memory")
        self._judge(_policy_of(config, info), at_start=False)

    def _judge(self, policy: str | None, at_start: bool) -> None:
        self.policy, self.policy_checked = policy, True
        problem = eviction_problem(policy)
        if policy is None:
            log.warning("budgets: Redis's maxmemory-policy cannot be read: make sure it is noeviction")
        if problem is None:
            return
        if self.eviction == "refuse" and at_start:
            raise ValueError(f"budgets.redis_url: {problem}")
        log.warning("budgets: %s", problem)
        if self.eviction == "refuse":  # found after start-up: the ledger answers 503 until Redis is fixed
            self.evicting = problem

    # ------------------------------------------------------------ the public surface

    async def run(self, name: str, spec: PacerSpec, fn: Callable[[PacerState, PacerSpec], object]):
        self.specs[name] = spec
        await self.reconnect_when_due()
        if self.down_since is None:
            try:
                return await self._shared(name, spec, fn), self.view()
            except Exception as e:  # noqa: BLE001 - Redis unreachable: fall back, say so; refusing: LedgerError
                self._raise_refusal(e)
                self._go_down(e)
        return self._fallback(name, spec, fn), self.view()

    async def read(self, name: str, spec: PacerSpec) -> tuple[PacerState, PacerSpec, dict]:
        """The budget's state as this replica uses it now (shared, or its fallback share)."""
        if self.down_since is None:
            try:
                raw = await self.client.hgetall(self.key(name))
                st = PacerState.from_strings(raw)
                self.last[name] = st.copy()
                return st, spec, self.view()
            except Exception as e:  # noqa: BLE001
                self._raise_refusal(e)
                self._go_down(e)
        st = self._local_state(name)
        return st.copy(), scaled(spec, self.share), self.view()

    async def reconnect_when_due(self) -> None:
        """While Redis is down: try it again every `retry_s`."""
        self._start_beating()
        if self.down_since is not None and time.monotonic() >= self._retry_at:
            await self._try_reconnect()

    @property
    def share(self) -> float:
        return 1.0 / max(1, self.replicas)

    def view(self) -> dict:
        down = self.down_since is not None
        out = {
            "store": "redis",
            "shared": not down,
            "fallback": down,
            "replica_share": self.share if down else 1.0,
            "replicas_seen": self.replicas,
            "redis_eviction_policy": self.policy,
        }
        if self.evicting or eviction_problem(self.policy):
            out["redis_eviction_warning"] = eviction_problem(self.policy)
        if down:
            out["redis_error"] = self.error
            out["down_for_s"] = round(time.monotonic() - self.down_since, 1)
        return out

    def key(self, name: str) -> str:
        return f"{self.prefix}{name}"

    async def aclose(self) -> None:
        if self._beater is not None:
            self._beater.cancel()
        try:
            await self.client.aclose()
        except Exception:  # noqa: BLE001 - closing a client whose server is gone
            pass

    def _raise_refusal(self, e: BaseException) -> None:
        """`e` again unless it is Redis being unreachable: a Redis that refused the step as a `LedgerError`."""
        if (err := refused(e, int(self.retry_s) or 1)) is not None:
            raise err from e
        if not _redis_failure(e):
            raise e

    # ------------------------------------------------------------ shared

    async def _shared(self, name: str, spec: PacerSpec, fn):
        from redis.exceptions import WatchError

        await self._heartbeat()
        key = self.key(name)
        # one step at a time per budget on this replica: WATCH retries only when another replica wrote in between
        lock = self.locks.setdefault(name, asyncio.Lock())
        async with lock, self.client.pipeline(transaction=True) as pipe:
            for _ in range(WATCH_ATTEMPTS):
                try:
                    await pipe.watch(key)
                    st = PacerState.from_strings(await pipe.hgetall(key))
                    result = fn(st, spec)
                    pipe.multi()
                    pipe.hset(key, mapping=st.to_strings())
                    await pipe.execute()
                    self.last[name] = st
                    return result
                except WatchError:
                    continue
        raise LedgerError(
            f"budget {name}: its state in Redis kept changing under {WATCH_ATTEMPTS} attempts (replicas writing it "
            "faster than one step completes)",
            int(self.retry_s) or 1,
        )

    def _start_beating(self) -> None:
        if self._beater is None:
            self._beater = asyncio.ensure_future(self._beat_forever())

    async def _beat_forever(self) -> None:
        """An idle replica still counts among the replicas alive, and comes back to Redis (its settlements sent)
        without waiting for a request."""
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                if self.down_since is None:
                    await self._heartbeat()
                    await self.ledger.refresh_seen()
                else:
                    await self.reconnect_when_due()
            except Exception as e:  # noqa: BLE001 - a failed beat: the next request finds Redis down and says so
                if not _redis_failure(e):
                    log.exception("budgets: a heartbeat failed")

    async def _heartbeat(self) -> None:
        now = time.monotonic()
        if now < self._beat_at:
            return
        self._beat_at = now + HEARTBEAT_S
        wall = self.clock()
        key = f"{self.prefix}replicas"
        async with self.client.pipeline(transaction=False) as pipe:
            pipe.zadd(key, {self.id: wall})
            pipe.zremrangebyscore(key, "-inf", wall - 10 * ALIVE_S)
            pipe.zcount(key, wall - ALIVE_S, "+inf")
            _, _, alive = await pipe.execute()
        self.replicas = max(1, int(alive), self.replicas_hint or 1)
        if not self.policy_checked:
            await self._check_eviction()

    # ------------------------------------------------------------ fallback

    def lost(self, e: BaseException) -> bool:
        """Whether `e` is Redis being unreachable (then this replica falls back, and says so) rather than a bug."""
        if not _redis_failure(e):
            return False
        self._go_down(e)
        return True

    def _go_down(self, e: BaseException) -> None:
        if self.down_since is None:
            self.down_since = time.monotonic()
            self.fallbacks += 1
            log.warning(
                "budgets: Redis unreachable (%s): this replica holds 1/%d of each budget until it is back",
                type(e).__name__,
                self.replicas,
            )
        self.error = type(e).__name__
        self._retry_at = time.monotonic() + self.retry_s

    def _local_state(self, name: str) -> PacerState:
        st = self.local.get(name)
        if st is None:  # this replica's share of the state it last read
            st = self.last.get(name, PacerState()).copy()
            k = self.share
            st.bank *= k
            st.period_spend *= k
            st.arrivals *= k
            st.arrivals_fast *= k
            st.rate *= k
            self.local[name] = st
        return st

    def _fallback(self, name: str, spec: PacerSpec, fn):
        st = self._local_state(name)
        before = st.spend
        result = fn(st, scaled(spec, self.share))
        if st.spend != before:
            by_period = self.pending.setdefault(name, {})
            by_period[st.period] = by_period.get(st.period, 0.0) + (st.spend - before)
        return result

    async def _try_reconnect(self) -> None:
        """Redis again? Then add what was charged meanwhile to the shared counters and drop the fallback state."""
        self._retry_at = time.monotonic() + self.retry_s
        since = self.down_since
        try:
            await self.client.ping()
            for name, by_period in list(self.pending.items()):
                local = self.local.get(name)

                def merge(st: PacerState, spec: PacerSpec, by_period=by_period, local=local) -> None:
                    # to the fallback's last step (budget seconds; the next request advances further)
                    advance(st, spec, max(st.t, local.t if local is not None else st.t))
                    for period, usd in by_period.items():
                        st.spend += usd
                        st.bank -= usd
                        if period == st.period:
                            st.period_spend += usd

                await self._shared(name, self.specs[name], merge)
                del self.pending[name]
            self.down_since = None  # (the ledger's scripts run only while Redis is up)
            await self.ledger.flush()
            if self.down_since is not None:
                return
        except Exception as e:  # noqa: BLE001
            if not (_redis_failure(e) or isinstance(e, LedgerError) or refused(e) is not None):
                raise
            self._go_down(e)  # (unreachable, or reachable and refusing writes: this replica stays on its share)
            return
        log.warning(
            "budgets: Redis is back after %.1f s: this replica shares the budgets again",
            time.monotonic() - (since or time.monotonic()),
        )
        self.down_since, self.error = None, None
        self.local.clear()


def _redis_failure(e: BaseException) -> bool:
    """A Redis connection problem (fall back) rather than a bug (raise)."""
    try:
        from redis.exceptions import ConnectionError as RConn
        from redis.exceptions import TimeoutError as RTimeout
    except ImportError:  # pragma: no cover
        return False
    return isinstance(e, (RConn, RTimeout, ConnectionError, TimeoutError, OSError))
