"""The live bus on PostgreSQL, all of it: LISTEN for wake-ups, then tail committed rows.

Stored events: after each committed batch the writer sends one NOTIFY (a wake-up whose
payload names the writing node; payloads cap at 8000 bytes). Woken by another node, or
every `poll` seconds regardless, a node reads the rows other nodes stored in
transactions that finished since it last looked (see migration 0004). The LISTEN
connection is dedicated and direct (never through a transaction-pooling proxy); when it
drops, the node reconnects and catches up from its last position.

Ephemeral events (never stored) travel in the NOTIFY payload itself when they fit
(origin, tenant and event under 8000 bytes); larger ones reach only the node's own
subscribers. That is the documented trade-off: no table, no cleanup, no extra write.

Here: the SQL, the store's side (`PostgresBusRows`, mixed into PostgresStore: the
wake-up after a commit, the position, the tail read), one database's bus
(`PostgresBus`) and the relay's (`RoutedBus`: one PostgresBus per open database, for
relay.store.router). The interface is relay.store.EventBus.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import asyncpg

from relay import metrics
from relay.store import Deliver, StoreError
from relay.store.pgbase import DB_ERRORS, PostgresBase, failure
from relay.wire import Reason

log = logging.getLogger("relay.bus")

# The wake-up after committed batches (never the event: payloads cap at 8000 bytes; its
# payload is the writer's origin, so a node is not woken by its own batches), then every
# node reads the rows of transactions that finished since it last read. Sent after the
# commit, never in the batch's own transaction (PostgresBusRows._wake_nodes).
BUS_CHANNEL = "engram_events"
EPHEMERAL_CHANNEL = "engram_ephemeral"
NOTIFY_PAYLOAD_MAX = 7_999  # PostgreSQL refuses 8000 bytes and more
_RECONNECT_MAX = 5.0
_HELD_RETRY = 0.02  # first re-read after a held-back one (s); doubles up to the poll

BUS_XMIN = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
# `held`: other nodes' committed rows lie beyond the snapshot's xmin, i.e. a transaction
# still running holds them back (a long transaction delays live delivery across nodes;
# /metrics; the tail reads again soon, PostgresBus.run).
# Rows of other nodes only ($2 is this node's origin): a node's own rows were delivered
# when it stored them, and reading them back cost PostgreSQL and the relay a copy of
# every ingested event (a tail runs after every committed batch).
BUS_TAIL = (
    "WITH snap AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS hi)"
    " SELECT snap.hi::text, e.tenant, e.raw, e.origin,"
    " EXISTS (SELECT 1 FROM events h WHERE h.xid >= snap.hi"
    " AND h.origin IS DISTINCT FROM $2::text) AS held FROM snap"
    " LEFT JOIN events e ON e.xid >= $1::text::xid8 AND e.xid < snap.hi"
    " AND e.origin IS DISTINCT FROM $2::text"
    " ORDER BY e.xid, e.created_at, e.id"
)


def _retry_after(last: float | None, poll: float) -> float:
    """The wait before re-reading a tail that a running transaction held back.

    Its end sends no NOTIFY, and any transaction in the cluster that began before a
    commit holds that commit back (a busy neighbour's short writes often do): without a
    re-read, a held event would wait for the next poll. Backs off to `poll`.
    """
    return min(_HELD_RETRY if last is None else last * 2, poll)


class PostgresBusRows(PostgresBase):
    """The store's side of the bus: the wake-up after a commit, the tail's position and
    reads, NOTIFY. Mixed into PostgresStore (relay.store.pgbase)."""

    rows_seen: Callable[[list[tuple[str, bytes]], bool], None]  # relay.store.pgreader

    def _init_bus(self) -> None:
        self.bus_held_back = False  # set by bus_read (PostgresBus reports it)
        self._waking: asyncio.Task[None] | None = None  # the bus wake-up in flight
        self._wake_again = False  # a batch committed while it was in flight

    async def _stop_wakes(self) -> None:
        if self._waking is not None:
            await asyncio.gather(self._waking, return_exceptions=True)

    def _wake_nodes(self) -> None:
        """Tell other nodes (PostgresBus) that rows were stored: a NOTIFY in its own
        statement after the commit, at most one in flight, shared by the batches that
        commit meanwhile. Never inside the batch's transaction: PostgreSQL lets one
        notifying transaction commit at a time (a lock from PreCommit_Notify through the
        WAL flush), which made the writers take turns (bench/RESULTS-HISTORY.md, issue 24)."""
        if self._waking is not None:
            self._wake_again = True
            return
        self._waking = asyncio.ensure_future(self._send_wakes())

    async def _send_wakes(self) -> None:
        try:
            again = True
            while again:
                self._wake_again = False
                await self.notify(BUS_CHANNEL, self.node_id)
                again = self._wake_again
        finally:
            self._waking = None

    async def bus_position(self) -> str:
        """Where a new node starts tailing: the current snapshot's xmin."""
        try:
            return str(await self._pool.fetchval(BUS_XMIN))
        except DB_ERRORS as exc:
            raise StoreError(Reason.ERROR("could not read the bus position")) from exc

    async def notify(self, channel: str, payload: str) -> None:
        """Best-effort NOTIFY (ephemeral events): a failure is logged, never raised."""
        try:
            await self._pool.execute("SELECT pg_notify($1, $2)", channel, payload)
        except DB_ERRORS as exc:
            log.warning("notify failed: %s", failure(exc))

    async def bus_read(self, position: str) -> tuple[str, list[tuple[str, bytes]]]:
        """Rows stored by other nodes in transactions finished since `position`:
        (next position, [(tenant, raw)]), in commit-safe order."""
        try:
            rows = await self._pool.fetch(BUS_TAIL, position, self.node_id)
        except DB_ERRORS as exc:
            raise StoreError(Reason.ERROR("could not read new events")) from exc
        if not rows:  # pragma: no cover - the LEFT JOIN always yields the position row
            return position, []
        if self.replicas is not None and rows[-1][2] is not None:  # before they go live
            await self.replicas.note_position()
        out = [(r[1], r[2]) for r in rows if r[2] is not None and r[3] != self.node_id]
        self.bus_held_back = bool(rows[0][4])  # a running transaction holds the tail back
        self.rows_seen(out, self.bus_held_back)  # before they go live (the read cache)
        return rows[0][0], out


class PostgresBus:
    """One database's bus (relay.store.EventBus): its LISTEN connection and its tail."""

    def __init__(self, dsn: str, store: PostgresBusRows, poll: float = 1.0) -> None:
        self.dsn = dsn
        self.store = store
        self.poll = poll
        self._wake = asyncio.Event()
        self.connected = asyncio.Event()  # the LISTEN connection is up (tests, /readyz)
        self.held_since: float | None = None  # monotonic time the tail was first held back
        self._start: str | None = None  # the position `prepare` took
        metrics.watch_tail(self)

    def delay(self) -> float:
        """Seconds the tail has been held back by a running transaction (0: current).

        Rows committed after a transaction that is still open are not read until it ends
        (the snapshot's xmin stays put), so a long transaction delays live delivery
        across nodes; never loses it. `/metrics` and `/readyz` show this number.
        """
        since = self.held_since
        return 0.0 if since is None else time.monotonic() - since

    def _note_held(self, held: bool) -> None:
        if not held:
            self.held_since = None
        elif self.held_since is None:
            self.held_since = time.monotonic()

    async def prepare(self) -> None:
        """Take the starting position now, before the node accepts subscribers: an event
        committed between a subscription and the tail's first read is then still read."""
        self._start = await self._position()

    async def run(self, deliver: Deliver) -> None:
        position = self._start if self._start is not None else await self._position()
        listener = asyncio.create_task(self._listen(deliver))
        retry: float | None = None  # set while reads are held back
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), retry or self.poll)
                self._wake.clear()
                try:
                    position, rows = await self.store.bus_read(position)
                    held = self.store.bus_held_back
                    self._note_held(held)
                    retry = _retry_after(retry, self.poll) if held else None
                except StoreError as exc:
                    log.warning("bus read failed (will retry): %s", exc)
                    await asyncio.sleep(self.poll)
                    continue
                for tenant, raw in rows:
                    deliver(tenant, raw)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _position(self) -> str:
        while True:
            try:
                return await self.store.bus_position()
            except StoreError as exc:
                log.warning("bus start waiting for the database: %s", exc)
                await asyncio.sleep(self.poll)

    async def _listen(self, deliver: Deliver) -> None:
        """Keep one LISTEN connection up; every (re)connect triggers a catch-up read."""
        delay = 0.1
        origin = self.store.node_id

        def on_stored(_c: Any, _pid: int, _channel: str, payload: str) -> None:
            if payload != origin:  # this node's own batches were delivered when stored
                self._wake.set()

        def on_ephemeral(_c: Any, _pid: int, _channel: str, payload: str) -> None:
            sender, _, rest = payload.partition("\n")
            tenant, _, raw = rest.partition("\n")
            if sender != origin and raw:
                deliver(tenant, raw.encode())

        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self.dsn, timeout=10)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(BUS_CHANNEL, on_stored)
                await conn.add_listener(EPHEMERAL_CHANNEL, on_ephemeral)
                self.connected.set()
                self._wake.set()  # catch up on whatever committed while we were away
                delay = 0.1
                while not lost.is_set():  # asyncpg notices a dead socket on use
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), 5)
                    if not lost.is_set():
                        await conn.execute("SELECT 1", timeout=5)
            except DB_ERRORS as exc:
                log.warning("bus listener lost (%s); reconnecting", type(exc).__name__)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX)

    async def publish_ephemeral(self, tenant: str, raw: bytes) -> None:
        payload = f"{self.store.node_id}\n{tenant}\n{raw.decode()}"
        if len(payload.encode()) > NOTIFY_PAYLOAD_MAX:
            return  # too big for a NOTIFY: local subscribers only (see module docstring)
        await self.store.notify(EPHEMERAL_CHANNEL, payload)


class RoutedBus:
    """The relay's bus (relay.store.EventBus): one PostgresBus per database the router
    has open (each with its LISTEN); a row is delivered only while its tenant is placed
    on the database it came from (a moved tenant's old rows stay put).

    Given the router's parts, not the router (relay.store.router builds this bus):
    `stores`, its open stores by database URL (kept current by the router), and
    `database_of`, the database a tenant is placed on."""

    def __init__(
        self,
        stores: Mapping[str, PostgresBusRows],
        database_of: Callable[[str], str],
        poll: float,
    ) -> None:
        self._stores = stores
        self._database_of = database_of
        self._poll = poll
        self._buses: dict[str, PostgresBus] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._deliver: Deliver | None = None

    async def prepare(self) -> None:
        """Each open database's tail takes its starting position before subscribers come."""
        for url, store in list(self._stores.items()):
            if url not in self._buses:
                self._buses[url] = PostgresBus(url, store, poll=self._poll)
            await self._buses[url].prepare()

    def delay(self) -> float:
        """The longest any database's tail is held back by a running transaction."""
        return max((bus.delay() for bus in list(self._buses.values())), default=0.0)

    async def run(self, deliver: Deliver) -> None:
        self._deliver = deliver
        for url, store in list(self._stores.items()):
            self.start(url, store)
        try:
            await asyncio.Event().wait()  # until cancelled
        finally:
            await self.stop()

    def start(self, url: str, store: PostgresBusRows) -> None:
        if url not in self._buses:
            self._buses[url] = PostgresBus(url, store, poll=self._poll)
        if self._deliver is None or url in self._tasks:
            return
        deliver, database_of = self._deliver, self._database_of

        def placed(tenant: str, raw: bytes) -> None:
            if database_of(tenant) == url:  # a moved tenant's old rows stay put
                deliver(tenant, raw)

        self._tasks[url] = asyncio.create_task(self._buses[url].run(placed))

    def end(self, url: str) -> None:
        self._buses.pop(url, None)
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()

    async def stop(self) -> None:
        tasks = list(self._tasks.values())
        self._tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def publish_ephemeral(self, tenant: str, raw: bytes) -> None:
        bus = self._buses.get(self._database_of(tenant))
        if bus is not None:
            await bus.publish_ephemeral(tenant, raw)
