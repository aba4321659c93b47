"""PostgresStore: the asyncpg event store, with a group-commit writer.

The only module that touches asyncpg. Writes: `save` queues the event; one writer task
drains the queue into one transaction per batch (multi-row INSERT ... SELECT FROM
unnest(...)), and answers each caller only after that transaction committed. Reads: one
statement per REQ (a UNION ALL of one sub-select per filter), built by `relay.store.sql`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from engram.head import beats
from engram.nip01 import Event
from engram.nip62 import KIND_VANISH
from engram.replace import NEWER_STORED, superseded_message
from engram.replace import TIE_LOST as TIE_LOST_MESSAGE
from relay import metrics
from relay.config import DEFAULT_PRIVATE, Settings
from relay.filters import Filter
from relay.moderation import Moderation
from relay.store import (
    DEFAULT_TENANT,
    Saved,
    SaveResult,
    SaveStatus,
    StoreError,
    moderation,
    submit_to,
    tenants,
)
from relay.store import sql as q
from relay.store.migrate import apply_migrations, migration_status
from relay.store.readbatch import ReadBatcher
from relay.store.sql import Row, RowError, encode_row
from relay.tenants import TenantConfig

log = logging.getLogger("relay.store")
T = TypeVar("T")

_CONNECT_TIMEOUT = 10.0  # seconds to open a connection; a dead host must not hang writes
_COMMAND_TIMEOUT = 60.0  # seconds per statement
_ACQUIRE_TIMEOUT = 30.0  # seconds to wait for a pooled connection
_BATCH_BYTES_MAX = 16 * 1024 * 1024  # raw bytes per batch, on top of write_batch_max

# What a lost or broken database connection raises. InternalClientError ("cannot switch to
# state 12; another operation (2) is in progress"): a pooled connection that had read the
# server's termination notice (PostgreSQL shut down or restarted) but not yet its closed
# socket; the pool drops it on release, so the next try gets a fresh one. Uncaught, it
# ended the live tail's task for good (seen by deploy/test-image: outage, then SIGTERM).
DB_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)

STORED = SaveResult(SaveStatus.STORED)
DUPLICATE = SaveResult(SaveStatus.DUPLICATE, "duplicate: already have this event")
# a version that wins its address is stored (engram.replace: which one, in the message)
STALE, TIE_LOST = (SaveResult(SaveStatus.STALE, m) for m in (NEWER_STORED, TIE_LOST_MESSAGE))
CLOSED = SaveResult(SaveStatus.ERROR, "error: the store is closed")


BLOCKED = SaveResult(
    SaveStatus.BLOCKED, "blocked: this event was deleted by its author (NIP-09 or NIP-62)"
)

DeletionTargets = tuple[list[bytes], list[tuple[int, str]]]


class _Pending:
    __slots__ = ("deletes", "done", "row", "tenant")

    def __init__(
        self,
        tenant: str,
        row: Row,
        done: Saved | None,
        deletes: DeletionTargets | None = None,
    ) -> None:
        self.tenant, self.row, self.done, self.deletes = tenant, row, done, deletes

    def answer(self, result: SaveResult) -> None:
        """Tell the caller its outcome: the first answer counts, later ones are dropped."""
        done, self.done = self.done, None
        if done is not None:
            try:
                done(result)
            except Exception:  # one caller's failure must not leave the batch unanswered
                log.exception("save callback failed")

    @property
    def vanish(self) -> bool:
        """A NIP-62 request to vanish (the pipeline took only those naming this relay)."""
        return self.row[3] == KIND_VANISH

    @property
    def key(self) -> tuple[str, bytes]:
        return self.tenant, self.row[0]

    @property
    def address(self) -> tuple[str, bytes, int, str] | None:
        d = self.row[4]
        return None if d is None else (self.tenant, self.row[1], self.row[3], d)

    def beats(self, other: _Pending) -> bool:
        """Head selection (`engram.head.beats`): newer created_at, then the lower id."""
        a, b = self.row, other.row
        return beats(a[2], a[0], b[2], b[0])


def _columns(batch: list[_Pending]) -> list[list[Any]]:
    """Per-column arrays for the unnest() insert ($1 tenant, then the Row fields).

    A column that is NULL on every row (`d`, `owner`, `expires_at` of a batch of notes)
    goes as an empty array: unnest() pads a shorter array with NULLs, and asyncpg
    spends ~0.3 us encoding each NULL element (bench/RESULTS.md, issue 24)."""
    n = len(batch)
    columns: list[list[Any]] = [[p.tenant for p in batch]]
    for i, c in enumerate(zip(*(p.row for p in batch), strict=True)):
        columns.append([] if i in q.ROW_NULLABLE and c.count(None) == n else list(c))
    return columns


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query (RESET ALL, UNLISTEN *, …): one
    extra round trip per query (measured as most of PostgreSQL's CPU per REQ). Nothing
    here changes session state: transactions are always closed by their context
    managers, LISTEN runs on its own connection, advisory locks are released explicitly.
    """


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:200]


class PostgresStore:
    """EventStore on PostgreSQL. Create with `await PostgresStore.open(dsn, settings)`."""

    replicas: Any = None  # a relay.store.replicas.ReplicaSet when read replicas are set

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self._pool = pool
        metrics.watch_pool(self, pool)
        self._batch_max = max(1, settings.write_batch_max)
        self._query_timeout = settings.query_timeout_seconds
        self._scan = (settings.scan_max, settings.search_walk, settings.search_window)
        self.node_id = uuid.uuid4().hex  # `origin` of the rows this process stores
        self.bus_held_back = False  # set by bus_read (relay.store.pgbus reports it)
        self._pending: collections.deque[_Pending] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._writers: list[asyncio.Task[None]] = []
        self._waking: asyncio.Task[None] | None = None  # the bus wake-up in flight
        self._wake_again = False  # a batch committed while it was in flight
        self._write_concurrency = max(1, settings.write_concurrency)
        self._reads = ReadBatcher(
            pool,
            self._query_timeout,
            settings.read_batch_max,
            settings.read_concurrency,
            settings.negentropy_read_concurrency,
        )
        kinds = settings.search_kinds
        self._search_kinds = None if kinds is None else frozenset(kinds)

    @classmethod
    async def open(cls, dsn: str, settings: Settings) -> PostgresStore:
        """Connect a pool, apply pending migrations, start the writer task."""
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min(settings.db_pool_min, settings.db_pool_max),
            max_size=settings.db_pool_max,
            timeout=_CONNECT_TIMEOUT,
            command_timeout=_COMMAND_TIMEOUT,
            reset=_keep_session,
        )
        try:
            async with pool.acquire() as conn:
                await apply_migrations(conn)
        except BaseException:
            await pool.close()
            raise
        store = cls(pool, settings)
        if settings.replica_urls:  # REQ/COUNT from read replicas (relay.store.replicas)
            from relay.store.replicas import ReplicaSet

            store.replicas = ReplicaSet(settings.replica_urls, settings, pool)
            await store.replicas.start()
        # Several writers: while one batch waits for its commit (fsync), the next is being
        # inserted. Each batch locks its rows in address order, so they cannot deadlock.
        store._writers = [
            asyncio.create_task(store._run_writer(), name=f"engram-store-writer-{i}")
            for i in range(store._write_concurrency)
        ]
        return store

    async def close(self) -> None:
        """Stop accepting saves, write what is queued, stop the writer, close the pool."""
        self._closing = True
        self._wakeup.set()
        if self._writers:  # a cancelled writer answered its events (_writer_failed)
            await asyncio.gather(*self._writers, return_exceptions=True)
        if self._waking is not None:
            await asyncio.gather(self._waking, return_exceptions=True)
        if self.replicas is not None:
            await self.replicas.close()
        try:
            await asyncio.wait_for(self._pool.close(), timeout=10)
        except TimeoutError:
            self._pool.terminate()

    # --- writes ---------------------------------------------------------------------

    async def save(self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT) -> SaveResult:
        """Store durably; returns only after the transaction holding the event committed."""
        return await self.submit(event, raw, tenant)

    def submit(
        self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT
    ) -> asyncio.Future[SaveResult]:
        """`save` without a coroutine: the future resolves after the commit."""
        return submit_to(self.enqueue, event, raw, tenant)

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        """`done(result)` after the batch holding the event commits (EventStore.enqueue);
        at once when the store is closing or the event cannot be a row."""
        if self._closing:
            done(CLOSED)
            return
        try:
            row = encode_row(event, raw, self._search_kinds)
        except RowError as exc:
            done(SaveResult(SaveStatus.ERROR, str(exc)))
            return
        deletes = q.deletion_targets(event) if event.kind == q.KIND_DELETION else None
        self._pending.append(_Pending(tenant, row, done, deletes))
        self._wakeup.set()

    async def _run_writer(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch: list[_Pending] = []
            size = 0
            while self._pending and len(batch) < self._batch_max and size < _BATCH_BYTES_MAX:
                p = self._pending.popleft()
                batch.append(p)
                size += len(p.row[8])
            started = metrics.start()
            results: list[SaveResult] | None = None
            try:
                results = await self._write(batch)
                metrics.batch_written(len(batch), started)
                if self.replicas is not None:  # before any OK: read-your-writes
                    await self.replicas.note_position()
            except BaseException as exc:  # a bug or cancellation: never leave callers hanging
                self._writer_failed(batch, results, exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            if any(r.status is SaveStatus.STORED for r in results):
                self._wake_nodes()
            for p, result in zip(batch, results, strict=True):
                p.answer(result)

    def _wake_nodes(self) -> None:
        """Tell other nodes (relay.store.pgbus) that rows were stored: a NOTIFY in its own
        statement after the commit, at most one in flight, shared by the batches that
        commit meanwhile. Never inside the batch's transaction: PostgreSQL lets one
        notifying transaction commit at a time (a lock from PreCommit_Notify through the
        WAL flush), which made the writers take turns (bench/RESULTS.md, issue 24)."""
        if self._waking is not None:
            self._wake_again = True
            return
        self._waking = asyncio.ensure_future(self._send_wakes())

    async def _send_wakes(self) -> None:
        try:
            again = True
            while again:
                self._wake_again = False
                await self.notify(q.BUS_CHANNEL, self.node_id)
                again = self._wake_again
        finally:
            self._waking = None

    def _writer_failed(
        self, batch: list[_Pending], results: list[SaveResult] | None, exc: BaseException
    ) -> None:
        """Answer every event a failing writer leaves: a committed batch (the replica
        position call failed) its results, the primary answering reads for a while
        (`ReplicaSet.position_unknown`); an unwritten batch an error; and on cancellation
        (this writer stops) everything still queued an error too."""
        if isinstance(exc, Exception):
            log.error("store writer failed", exc_info=exc)
        if results is not None:
            if self.replicas is not None:
                self.replicas.position_unknown(_reason(exc))
            for p, result in zip(batch, results, strict=True):
                p.answer(result)
        if results is None or not isinstance(exc, Exception):
            stopped = not isinstance(exc, Exception)
            fail = CLOSED if stopped else SaveResult(SaveStatus.ERROR, f"error: {_reason(exc)}")
            for p in (*batch, *self._pending):
                p.answer(fail)

    async def analyze(self) -> None:
        """Planner statistics now, after a bulk load (`engram import`).

        The live path leaves statistics to autovacuum (after 10% of the rows changed, at
        most once a minute): the relay's own ANALYZE every 50,000 rows cost 25-50 us of
        PostgreSQL CPU per ingested event (to_tsvector over a 30,000-row sample each time,
        bench/RESULTS.md "Statistics off the ingest path"). A failure is logged, never
        raised: statistics are an optimisation, and the load itself has succeeded.
        """
        try:
            async with self._pool.acquire(timeout=_ACQUIRE_TIMEOUT) as conn:
                await conn.execute("ANALYZE events")
        except DB_ERRORS as exc:
            log.warning("ANALYZE failed: %s", _reason(exc))

    async def _write(self, batch: list[_Pending]) -> list[SaveResult]:
        """One transaction for the batch; on failure, each event on its own.

        A batch that is one INSERT (only regular, or only replaceable events, and no
        deletion request) runs it in autocommit: one round trip, and the statement is
        the transaction. Otherwise BEGIN ... COMMIT around every statement.
        """
        kinds = {p.address is None for p in batch}
        single = len(kinds) == 1 and not any(p.deletes or p.vanish for p in batch)
        try:
            async with self._pool.acquire(timeout=_ACQUIRE_TIMEOUT) as conn:
                if single:
                    return await self._insert_batch(conn, batch)
                async with conn.transaction():
                    return await self._insert_batch(conn, batch)
        except Exception as exc:
            log.warning("batch of %d failed (%s); retrying one by one", len(batch), _reason(exc))
        return await self._write_one_by_one(batch)

    async def _insert_batch(self, conn: Any, batch: list[_Pending]) -> list[SaveResult]:
        """Insert a batch; results in batch order. Rows that did not go in are classified
        afterwards (BLOCKED, DUPLICATE or STALE), which the common batch never needs."""
        results: list[SaveResult | None] = [None] * len(batch)
        first: dict[tuple[str, bytes], int] = {}  # (tenant, id) -> first index in batch
        dup_of: dict[int, int] = {}
        winner: dict[tuple[str, bytes, int, str], int] = {}
        losers: list[int] = []
        regular: list[int] = []
        for i, p in enumerate(batch):
            j = first.setdefault(p.key, i)
            if j != i:
                dup_of[i] = j
                continue
            addr = p.address
            if addr is None:
                regular.append(i)
            elif (w := winner.get(addr)) is None:
                winner[addr] = i
            elif p.beats(batch[w]):  # two in one statement would make Postgres raise
                winner[addr] = i
                losers.append(w)
            else:
                losers.append(i)
        missing = list(losers)
        if regular:
            rows = [batch[i] for i in sorted(regular, key=lambda i: batch[i].key)]
            stored = await self._insert(conn, q.INSERT_REGULAR, rows)
            for i in regular:
                if batch[i].key in stored:
                    results[i] = STORED
                else:
                    missing.append(i)
        if winner:
            # Sorted by address: concurrent writers (other relays) lock rows in one order.
            rows = [batch[i] for i in sorted(winner.values(), key=lambda i: batch[i].address)]
            stored = await self._insert(conn, q.INSERT_REPLACEABLE, rows)
            for i in winner.values():
                if batch[i].key in stored:
                    results[i] = STORED
                else:
                    missing.append(i)
        if missing:
            await self._classify(conn, batch, missing, results)
        for i, j in dup_of.items():
            results[i] = DUPLICATE if results[j] is STORED else results[j]
        await self._apply_deletions(
            conn, [p for p, r in zip(batch, results, strict=True) if r is STORED and p.deletes]
        )
        await self._apply_vanish(
            conn, [p for p, r in zip(batch, results, strict=True) if r is STORED and p.vanish]
        )
        return [r if r is not None else STALE for r in results]

    async def _classify(
        self, conn: Any, batch: list[_Pending], missing: list[int], results: list[Any]
    ) -> None:
        """Why events did not go in: deleted by their author (BLOCKED), already stored
        (DUPLICATE), or beaten by the version of their address that is stored (STALE:
        newer, or of the same second with a lower id)."""
        blocked = await self._deleted_earlier(conn, [batch[i] for i in missing])
        check: list[int] = []
        for k, i in enumerate(missing):
            if k in blocked:
                results[i] = BLOCKED
            elif batch[i].address is None:
                results[i] = DUPLICATE
            else:
                check.append(i)
        if check:
            addrs = [batch[i].address for i in check]
            rows = await conn.fetch(
                q.SELECT_HEADS, check, *(list(c) for c in zip(*addrs, strict=True))
            )
            heads = {r[0]: (bytes(r[1]), r[2]) for r in rows}
            for i in check:
                head = heads.get(i)
                if head is not None and head[0] == batch[i].row[0]:
                    results[i] = DUPLICATE
                elif superseded_message(batch[i].row[2], head and head[1]) == NEWER_STORED:
                    results[i] = STALE
                else:
                    results[i] = TIE_LOST

    async def _deleted_earlier(self, conn: Any, batch: list[_Pending]) -> set[int]:
        """NIP-09: indexes of batch events their author already deleted."""
        rows = await conn.fetch(
            q.SELECT_DELETED,
            list(range(len(batch))),
            [p.tenant for p in batch],
            [p.row[0] for p in batch],
            [p.row[1] for p in batch],
            [p.row[3] for p in batch],
            [p.row[4] for p in batch],
            [p.row[2] for p in batch],
            [p.row[6] for p in batch],
        )
        return {r[0] for r in rows}

    async def _apply_deletions(self, conn: Any, requests: list[_Pending]) -> None:
        """NIP-09, in the batch's transaction: delete (and remember) what the stored
        deletion requests name, only ever the requester's own events."""
        ids: list[tuple[str, bytes, bytes]] = []
        addrs: list[tuple[str, bytes, int, str, int]] = []
        for p in requests:
            assert p.deletes is not None
            tenant, pubkey, created_at = p.tenant, p.row[1], p.row[2]
            ids.extend((tenant, i, pubkey) for i in p.deletes[0])
            addrs.extend((tenant, pubkey, k, d, created_at) for k, d in p.deletes[1])
        if ids:
            await conn.execute(q.DELETE_IDS, *map(list, zip(*ids, strict=True)))
        if addrs:
            await conn.execute(q.DELETE_ADDRESSES, *map(list, zip(*addrs, strict=True)))

    async def _apply_vanish(self, conn: Any, requests: list[_Pending]) -> None:
        """NIP-62, in the batch's transaction: remember each stored request to vanish and
        delete what it covers (relay.store.sql.VANISH*)."""
        if not requests:
            return
        until: dict[tuple[str, bytes], int] = {}
        for p in requests:  # one row per author: ON CONFLICT may touch a row only once
            key = (p.tenant, p.row[1])
            until[key] = max(until.get(key, p.row[2]), p.row[2])
        tenants_, pubkeys = [k[0] for k in until], [k[1] for k in until]
        stamps = list(until.values())
        await conn.execute(q.VANISH, tenants_, pubkeys, stamps)
        await conn.execute(q.VANISH_AUTHOR, tenants_, pubkeys, stamps)
        p_tags = [q.tag_key("p", pk.hex()) for pk in pubkeys]
        await conn.execute(q.VANISH_GIFT_WRAPS, tenants_, p_tags, stamps)

    async def _insert(self, conn: Any, sql: str, rows: list[_Pending]) -> set[tuple[str, bytes]]:
        """Run a multi-row insert; returns the (tenant, id) of the rows it stored.

        unnest() of per-column arrays: one statement, one round trip, whatever the batch
        size. COPY into a temp table then INSERT ... SELECT was measured slower for our
        batch sizes (bench/store_insert.py --copy), as it needs an extra round trip.
        """
        return set(map(tuple, await conn.fetch(sql, *_columns(rows), self.node_id)))

    async def _write_one_by_one(self, batch: list[_Pending]) -> list[SaveResult]:
        """Each event under its own savepoint, so one event's failure fails only it."""
        results: list[SaveResult] = []
        try:
            async with (
                self._pool.acquire(timeout=_ACQUIRE_TIMEOUT) as conn,
                conn.transaction(),
            ):
                for p in batch:
                    try:
                        async with conn.transaction():  # a savepoint
                            results.extend(await self._insert_batch(conn, [p]))
                    except Exception as exc:
                        if conn.is_closed():
                            raise
                        log.warning("event rejected by the database: %s", _reason(exc))
                        results.append(
                            SaveResult(SaveStatus.ERROR, f"error: could not store: {exc}")
                        )
        except Exception as exc:  # nothing committed: no event may be reported STORED
            log.error("database unavailable: %s", _reason(exc))
            return [SaveResult(SaveStatus.ERROR, "error: database unavailable")] * len(batch)
        return results

    # --- reads ----------------------------------------------------------------------

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        """Raw events matching any filter: created_at desc, id asc, each filter limited."""
        built = q.build_query(filters, tenant, viewer, int(time.time()), private, *self._scan)
        if built is None:
            return []
        rows = await self._fetch(*built)
        if len(filters) == 1:  # ordered by the statement (also within a batch: readbatch)
            return [r[0] for r in rows]
        merged = {r[2]: r for r in rows}  # the same event may match several filters
        return [r[0] for r in sorted(merged.values(), key=lambda r: (-r[1], r[2]))]

    async def count(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> int:
        """Number of distinct events matching any filter (NIP-45: `limit` is ignored)."""
        built = q.build_count(filters, tenant, viewer, int(time.time()), private)
        if built is None:
            return 0
        rows = await self._fetch(*built)
        return int(rows[0][0])

    async def negentropy_items(
        self,
        f: Filter,
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        limit: int = 500_001,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> tuple[list[int], bytes]:
        """NIP-77: the (created_at, id)-ordered set of at most `limit` matching events."""
        built = q.build_items(f, tenant, viewer, int(time.time()), limit, private)
        if built is None:
            return [], b""
        rows = await self._fetch(*built, bulk=True)  # never on the REQ slots
        _count, ids, stamps = rows[0]
        return list(stamps), bytes(ids)

    async def tenant_version(self) -> int:
        """Version of the tenant configuration (bumped on every change)."""
        try:
            return await tenants.config_version(self._pool)
        except DB_ERRORS as exc:
            raise StoreError("error: could not read tenant configuration") from exc

    async def load_tenants(self) -> list[TenantConfig]:
        try:
            return await tenants.load_tenants(self._pool)
        except DB_ERRORS as exc:
            raise StoreError("error: could not read tenant configuration") from exc

    async def load_moderation(self) -> dict[str, Moderation]:
        try:
            return await moderation.load_moderation(self._pool)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise StoreError("error: could not read moderation settings") from exc

    async def run_admin(self, action: Callable[[Any], Awaitable[T]]) -> T:
        """Run an administrative action (relay.store.moderation) on a pooled connection;
        database failures become StoreError."""
        try:
            async with self._pool.acquire(timeout=_ACQUIRE_TIMEOUT) as conn:
                return await action(conn)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.error("administrative action failed: %s", _reason(exc))
            raise StoreError(f"error: database error: {_reason(exc)}") from exc

    async def ping(self) -> bool:
        """True if the database answers within 5 seconds."""
        try:
            return await self._pool.fetchval("SELECT 1", timeout=5) == 1
        except Exception:
            return False

    async def migrations_current(self) -> bool:
        """True if every migration this version ships is applied (for /readyz)."""
        try:
            async with self._pool.acquire(timeout=5) as conn:
                status = await asyncio.wait_for(migration_status(conn), 5)
        except Exception:
            return False
        return all(applied for _, applied in status)

    # --- the live bus (rows other nodes stored) -------------------------------------

    async def bus_position(self) -> str:
        """Where a new node starts tailing: the current snapshot's xmin."""
        try:
            return str(await self._pool.fetchval(q.BUS_XMIN))
        except DB_ERRORS as exc:
            raise StoreError("error: could not read the bus position") from exc

    async def notify(self, channel: str, payload: str) -> None:
        """Best-effort NOTIFY (ephemeral events): a failure is logged, never raised."""
        try:
            await self._pool.execute("SELECT pg_notify($1, $2)", channel, payload)
        except DB_ERRORS as exc:
            log.warning("notify failed: %s", _reason(exc))

    async def bus_read(self, position: str) -> tuple[str, list[tuple[str, bytes]]]:
        """Rows stored by other nodes in transactions finished since `position`:
        (next position, [(tenant, raw)]), in commit-safe order."""
        try:
            rows = await self._pool.fetch(q.BUS_TAIL, position, self.node_id)
        except DB_ERRORS as exc:
            raise StoreError("error: could not read new events") from exc
        if not rows:  # pragma: no cover - the LEFT JOIN always yields the position row
            return position, []
        if self.replicas is not None and rows[-1][2] is not None:  # before they go live
            await self.replicas.note_position()
        out = [(r[1], r[2]) for r in rows if r[2] is not None and r[3] != self.node_id]
        self.bus_held_back = bool(rows[0][4])  # a running transaction holds the tail back
        return rows[0][0], out

    async def purge_expired(self, now: int, batch: int = 5_000) -> int:
        """NIP-40: delete expired rows, `batch` per transaction; returns how many."""
        total = 0
        while True:
            try:
                status = await self._pool.execute(q.PURGE_EXPIRED, now, batch)
            except DB_ERRORS as exc:
                raise StoreError("error: could not purge expired events") from exc
            n = int(status.split()[-1])
            total += n
            if n < batch:
                return total

    async def _fetch(self, sql: str, params: list[Any], bulk: bool = False) -> list[Any]:
        if self.replicas is not None:  # a healthy replica that has replayed our writes
            rows = await self.replicas.fetch(sql, params, self._query_timeout)
            if rows is not None:
                return rows  # type: ignore[no-any-return]
        try:
            if bulk:
                return await self._reads.fetch_bulk(sql, params)
            return await self._reads.fetch(sql, params)  # batched or not, on the read slots
        except TimeoutError as exc:  # asyncpg cancels the statement server-side
            raise StoreError(f"error: query timed out after {self._query_timeout:g} s") from exc
        except DB_ERRORS as exc:
            log.error("query failed: %s", _reason(exc))
            raise StoreError("error: could not read from the database") from exc
