"""Read replicas: REQ and COUNT read from PostgreSQL streaming replicas, in turn.

PostgreSQL's own machinery does the copying (streaming replication, `pg_basebackup -R`);
this module only decides, per read, whether a replica may answer it:

- A monitor checks every replica each `replica_check_seconds`: it must be in recovery (a
  standby), and its lag is the age of the oldest primary WAL it has not replayed yet
  (sampled primary write positions, so an idle primary never makes a replica look late).
  A replica that fails or lags past `replica_max_lag_seconds` leaves the rotation and
  comes back by itself at the first good check.
- Read-your-writes: the store calls `note_position` after every committed batch and
  before the live bus hands on events, which records the primary's WAL write position. A
  replica answers a read only once it has replayed that position, so it holds everything
  this node has already acknowledged or sent live (a connection reads its own writes, and
  nothing falls between the stored part of a REQ and its live part). A replica still short
  of it gets `replica_wait_seconds`, then the primary answers.
- A read that fails on a replica is never the client's failure: the caller falls back to
  the primary (`fetch` returns None).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import weakref
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from prometheus_client.core import GaugeMetricFamily

from relay import metrics
from relay.config import Settings

log = logging.getLogger("relay.replicas")

# WAL positions as int8 bytes: asyncpg has no codec for pg_lsn.
PRIMARY_POSITION = "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::int8"
_REPLICA_CHECK = "SELECT pg_is_in_recovery(), (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::int8"
_REPLAY_POSITION = "SELECT (pg_last_wal_replay_lsn() - '0/0'::pg_lsn)::int8"

STATES = ("up", "lagging", "down", "not_standby")
_CONNECT_TIMEOUT = 5.0
_POLL_INTERVAL = 0.002  # seconds between replay-position reads while reads wait on it


def label(url: str) -> str:
    """host:port/database of a URL, never its credentials (the metrics label)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "replica"
    if not host and "host=" in parts.query:  # unix socket: ?host=/dir
        host = parts.query.split("host=", 1)[1].split("&", 1)[0]
    return f"{host}{':' + str(port) if port else ''}{parts.path}"


class Replica:
    """One replica: its pool, its state, and the reads waiting for its replay."""

    def __init__(self, url: str, name: str) -> None:
        self.url = url
        self.name = name
        self.pool: asyncpg.Pool | None = None
        self.state = "down"  # until the first good check
        self.lag: float | None = None
        self.replay = 0  # last replay position seen
        self.reason = "not checked yet"
        self._waiters: list[tuple[int, asyncio.Future[bool]]] = []
        self._poller: asyncio.Task[None] | None = None

    def leave(self, reason: str, state: str = "down") -> None:
        if self.state == "up":
            log.warning("replica %s leaves the rotation: %s", self.name, reason)
        self.state, self.reason = state, reason

    async def reach(self, position: int, timeout: float) -> bool:
        """True once this replica has replayed `position` (within `timeout` seconds)."""
        if self.replay >= position:
            return True
        if timeout <= 0:
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        entry = (position, future)
        self._waiters.append(entry)
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout)
        except TimeoutError:
            return False
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(entry)

    async def _poll(self) -> None:
        """One replay-position reader for every waiting read (not one per read)."""
        assert self.pool is not None
        while self._waiters:
            try:
                replay = await self.pool.fetchval(_REPLAY_POSITION, timeout=2)
            except Exception as exc:  # the monitor decides about the rotation
                log.debug("replica %s replay read failed: %s", self.name, exc)
                replay = None
            if replay is None:
                self._settle(False)
                return
            self.replay = max(self.replay, int(replay))
            waiting = []
            for target, future in self._waiters:
                if target <= self.replay:
                    if not future.done():
                        future.set_result(True)
                else:
                    waiting.append((target, future))
            self._waiters = waiting
            if waiting:
                await asyncio.sleep(_POLL_INTERVAL)

    def _settle(self, value: bool) -> None:
        for _, future in self._waiters:
            if not future.done():
                future.set_result(value)
        self._waiters = []


class ReplicaSet:
    """The replicas of one primary: rotation, monitor and metrics."""

    def __init__(self, urls: list[str], settings: Settings, primary: asyncpg.Pool) -> None:
        self.replicas = [Replica(u, label(u)) for u in urls]
        self._primary = primary
        self._settings = settings
        self.max_lag = settings.replica_max_lag_seconds
        self._every = max(0.05, settings.replica_check_seconds)
        self._wait = settings.replica_wait_seconds
        self._next = 0
        self.position = 0  # WAL a replica must have replayed to answer (see note_position)
        self._primary_only_until = 0.0  # position unknown: the primary answers until then
        # (monotonic time, primary write position), newest last, for the lag
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._monitor: asyncio.Task[None] | None = None
        self.checked = asyncio.Event()  # set after every monitor round (tests wait on it)
        _COLLECTOR.sets.add(self)

    async def start(self) -> None:
        """Create the pools (connecting lazily: a replica down at start-up is no error)
        and run the first check, then keep checking in the background."""
        s = self._settings
        for r in self.replicas:
            r.pool = await asyncpg.create_pool(
                r.url,
                min_size=0,
                max_size=s.db_pool_max,
                timeout=_CONNECT_TIMEOUT,
                command_timeout=60.0,
                reset=_keep_session,
            )
        await self.check()
        self._monitor = asyncio.create_task(self._run(), name="engram-replica-monitor")

    async def close(self) -> None:
        if self._monitor is not None:
            self._monitor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._monitor
        for r in self.replicas:
            r._settle(False)
            if r.pool is not None:
                try:
                    await asyncio.wait_for(r.pool.close(), timeout=5)
                except TimeoutError:
                    r.pool.terminate()

    # --- reads ----------------------------------------------------------------------

    def _pick(self) -> Replica | None:
        """The next replica in the rotation (round robin over the healthy ones)."""
        n = len(self.replicas)
        for i in range(n):
            r = self.replicas[(self._next + i) % n]
            if r.state == "up":
                self._next = (self._next + i + 1) % n
                return r
        return None

    async def note_position(self) -> None:
        """Record the primary's WAL write position: everything this node acknowledged or
        delivered live so far lies before it."""
        try:
            position = int(await self._primary.fetchval(PRIMARY_POSITION, timeout=5))
        except Exception as exc:
            self.position_unknown(str(exc))
            return
        self.position = max(self.position, position)

    def position_unknown(self, why: str) -> None:
        """A write was acknowledged without its position: the primary answers every read
        for a while (a replica is past any position within `max_lag` or leaves)."""
        log.warning("WAL position unavailable (%s); reading the primary", why)
        self._primary_only_until = time.monotonic() + self.max_lag

    async def fetch(self, sql: str, params: list[Any], timeout: float) -> Any:
        """Rows from a healthy replica that has replayed `position`, or None: the primary
        must answer (no healthy replica, none caught up in time, or the read failed)."""
        r = self._pick()
        if r is None or r.pool is None or time.monotonic() < self._primary_only_until:
            return None
        if not await r.reach(self.position, self._wait):
            return None
        try:
            async with r.pool.acquire(timeout=_CONNECT_TIMEOUT) as conn:
                return list(await conn.fetch(sql, *params, timeout=timeout))
        except (TimeoutError, asyncpg.QueryCanceledError, asyncpg.SerializationError) as exc:
            # a slow query or a recovery conflict: the replica is fine, the primary retries
            log.info("replica %s read abandoned (%s); reading the primary", r.name, exc)
        except Exception as exc:
            r.leave(f"{type(exc).__name__}: {exc}"[:200])
            log.warning("replica %s read failed (%s); reading the primary", r.name, r.reason)
        return None

    # --- monitor --------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            try:
                await self.check()
            except Exception:  # never let the monitor die
                log.exception("replica check failed")

    async def check(self) -> None:
        """Sample the primary's write position, then check every replica."""
        now = time.monotonic()
        try:
            position = int(await self._primary.fetchval(PRIMARY_POSITION, timeout=5))
        except Exception as exc:  # without the primary, keep the last verdicts
            log.warning("replica check: primary position unavailable: %s", exc)
        else:
            self._samples.append((now, position))
            horizon = now - (self.max_lag + 3 * self._every + 1)
            while len(self._samples) > 2 and self._samples[1][0] < horizon:
                self._samples.popleft()
        await asyncio.gather(*(self._check_one(r) for r in self.replicas))
        self.checked.set()
        self.checked = asyncio.Event()

    async def _check_one(self, r: Replica) -> None:
        assert r.pool is not None
        try:
            row = await asyncio.wait_for(
                r.pool.fetchrow(_REPLICA_CHECK), timeout=max(1.0, min(5.0, 2 * self._every))
            )
        except Exception as exc:
            r.lag = None
            r.leave(f"{type(exc).__name__}: {exc}"[:200])
            return
        assert row is not None
        if not row[0] or row[1] is None:
            r.lag = None
            r.leave("not a standby (pg_is_in_recovery() is false)", "not_standby")
            return
        r.replay = max(r.replay, int(row[1]))
        r.lag = self.lag_of(r.replay)
        if r.lag > self.max_lag:
            r.leave(f"{r.lag:.1f} s behind the primary", "lagging")
        elif r.state != "up":
            log.info("replica %s joins the rotation", r.name)
            r.state, r.reason = "up", ""

    def lag_of(self, replay: int) -> float:
        """Seconds since the primary first wrote WAL this replay position lacks (0 when
        the replica holds everything the last sample saw)."""
        if not self._samples or replay >= self._samples[-1][1]:
            return 0.0
        now = time.monotonic()
        for t, position in self._samples:
            if position > replay:
                return now - t
        return 0.0  # pragma: no cover - the last sample is past `replay` here


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without a reset query: reads change no session state."""


class _Collector:
    """engram_replica_lag_seconds{replica} and engram_replica_state{replica,state}."""

    def __init__(self) -> None:
        self.sets: weakref.WeakSet[ReplicaSet] = weakref.WeakSet()

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        replicas = [r for s in list(self.sets) for r in s.replicas]
        if not replicas:
            return
        lag = GaugeMetricFamily(
            "engram_replica_lag_seconds",
            "Age of the oldest primary WAL a read replica has not replayed (NaN: unknown).",
            labels=["replica"],
        )
        state = GaugeMetricFamily(
            "engram_replica_state",
            "1 for a read replica's current state (up serves reads).",
            labels=["replica", "state"],
        )
        for r in replicas:
            lag.add_metric([r.name], float("nan") if r.lag is None else r.lag)
            for s in STATES:
                state.add_metric([r.name, s], 1.0 if r.state == s else 0.0)
        yield lag
        yield state


_COLLECTOR = _Collector()
metrics.REGISTRY.register(_COLLECTOR)  # type: ignore[arg-type]
