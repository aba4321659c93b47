"""PostgresStore's writes: the group-commit writer.

`enqueue` turns an event into a row (relay.store.sqlwrite) and queues it; one of
`write_concurrency` writer tasks drains the queue into one transaction per batch
(multi-row INSERT ... SELECT FROM unnest(...)), and answers each caller only after that
transaction committed. Deletions (NIP-09), requests to vanish (NIP-62) and the
replaceable/addressable head rule run inside the batch's transaction. After a batch that
stored something, the other nodes are woken (relay.store.pgbus).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from typing import Any

from engram.head import beats
from engram.kinds import KIND_DELETION
from engram.nip01 import Event
from engram.nip62 import KIND_VANISH
from relay import metrics
from relay.config import Settings
from relay.store import (
    BLOCKED,
    CLOSED,
    DUPLICATE,
    STALE,
    STORED,
    ByEnqueue,
    Saved,
    SaveResult,
    SaveStatus,
    error_result,
    stale_result,
)
from relay.store import sqlwrite as q
from relay.store.pgbase import ACQUIRE_TIMEOUT, PostgresBase, failure
from relay.store.sqlwrite import Row, RowError, encode_row
from relay.store.tagindex import tag_key

log = logging.getLogger("relay.store")

_BATCH_BYTES_MAX = 16 * 1024 * 1024  # raw bytes per batch, on top of write_batch_max

DeletionTargets = tuple[list[bytes], list[tuple[int, str]]]


class Pending:
    """One queued event: its tenant, its row, who to tell, and what it deletes."""

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

    def beats(self, other: Pending) -> bool:
        """Head selection (`engram.head.beats`): newer created_at, then the lower id."""
        a, b = self.row, other.row
        return beats(a[2], a[0], b[2], b[0])


# With the writer merging the search index's pending list itself (`search_clean_bytes`),
# an insert merges it only past this: four times the list the writer lets grow, a safety
# net for a writer that falls behind, never the batches' cadence.
_PENDING_LIST_LIMIT = "16MB"


def session_settings(settings: Settings) -> dict[str, str]:
    """Settings of the store's database sessions (PostgreSQL's startup parameters)."""
    return {"gin_pending_list_limit": _PENDING_LIST_LIMIT} if settings.search_clean_bytes else {}


class PostgresWriter(ByEnqueue, PostgresBase):
    """The writes of PostgresStore (EventWrites)."""

    _wake_nodes: Callable[[], None]  # relay.store.pgbus.PostgresBusRows
    changed: Callable[[str, bytes, int], None]  # relay.store.pgreader (its read cache)
    stored: Callable[[str, Row], None]  # ... the same

    def _init_writer(self, settings: Settings) -> None:
        self._batch_max = max(1, settings.write_batch_max)
        self._pending: collections.deque[Pending] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._writers: list[asyncio.Task[None]] = []
        self._write_concurrency = max(1, settings.write_concurrency)
        kinds = settings.search_kinds
        self._search_kinds = None if kinds is None else frozenset(kinds)
        self._clean_bytes = max(0, settings.search_clean_bytes)
        self._unclean = 0  # bytes of searched content stored since the last merge began
        self._cleaning: asyncio.Task[None] | None = None

    def _start_writers(self) -> None:
        # Several writers: while one batch waits for its commit (fsync), the next is being
        # inserted. Each batch locks its rows in address order, so they cannot deadlock.
        self._writers = [
            asyncio.create_task(self._run_writer(), name=f"engram-store-writer-{i}")
            for i in range(self._write_concurrency)
        ]

    async def _stop_writers(self) -> None:
        """Stop accepting saves; the writers write what is queued, then end."""
        self._closing = True
        self._wakeup.set()
        if self._writers:  # a cancelled writer answered its events (_writer_failed)
            await asyncio.gather(*self._writers, return_exceptions=True)
        if self._cleaning is not None:  # before the pool closes under it
            await asyncio.gather(self._cleaning, return_exceptions=True)

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
        deletes = q.deletion_targets(event) if event.kind == KIND_DELETION else None
        self._pending.append(Pending(tenant, row, done, deletes))
        self._wakeup.set()

    async def _run_writer(self) -> None:
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch: list[Pending] = []
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
                self._written(batch)
                self._writer_failed(batch, results, exc)
                if not isinstance(exc, Exception):
                    raise
                continue
            self._written(batch, results)
            if any(r.status is SaveStatus.STORED for r in results):
                self._wake_nodes()
                if self._clean_bytes:  # off by default: nothing to count per batch
                    self._stored_searched(batch, results)
            for p, result in zip(batch, results, strict=True):
                p.answer(result)

    def _stored_searched(self, batch: list[Pending], results: list[SaveResult]) -> None:
        """Count the searched content the batch stored: past `search_clean_bytes` since
        the last merge, the search index's pending list is merged by a statement of its
        own (one at a time), so that no batch's insert does it and waits
        (sqlwrite.CLEAN_SEARCH_PENDING)."""
        stored = zip(batch, results, strict=True)
        self._unclean += sum(len(p.row[7]) for p, r in stored if r.status is SaveStatus.STORED)
        if not self._clean_bytes or self._unclean < self._clean_bytes or self._cleaning:
            return
        self._unclean = 0
        self._cleaning = asyncio.create_task(self._clean_search(), name="engram-search-merge")

    async def _clean_search(self) -> None:
        try:
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                await conn.execute(q.CLEAN_SEARCH_PENDING)
        except Exception as exc:  # e.g. not the index's owner: the inserts merge it then
            log.warning("search index merge failed (%s); not trying again", failure(exc))
            self._clean_bytes = 0
        finally:
            self._cleaning = None

    def _written(self, batch: list[Pending], results: list[SaveResult] | None = None) -> None:
        """Before any answer or live delivery: the read cache learns what the batch
        stored (relay.store.readcache: a regular event joins its author's prefixes),
        and what it may have changed otherwise (committed or not, a failed batch's
        events too) is read from the database again."""
        if results is None:
            for p in batch:
                self.changed(p.tenant, p.row[1], p.row[3])
            return
        for p, result in zip(batch, results, strict=True):
            if result.status is SaveStatus.STORED:
                self.stored(p.tenant, p.row)
            else:
                self.changed(p.tenant, p.row[1], p.row[3])

    def _writer_failed(
        self, batch: list[Pending], results: list[SaveResult] | None, exc: BaseException
    ) -> None:
        """Answer every event a failing writer leaves: a committed batch (the replica
        position call failed) its results, the primary answering reads for a while
        (`ReplicaSet.position_unknown`); an unwritten batch an error; and on cancellation
        (this writer stops) everything still queued an error too."""
        if isinstance(exc, Exception):
            log.error("store writer failed", exc_info=exc)
        if results is not None:
            if self.replicas is not None:
                self.replicas.position_unknown(failure(exc))
            for p, result in zip(batch, results, strict=True):
                p.answer(result)
        if results is None or not isinstance(exc, Exception):
            stopped = not isinstance(exc, Exception)
            fail = CLOSED if stopped else error_result(failure(exc))
            for p in (*batch, *self._pending):
                p.answer(fail)

    async def _write(self, batch: list[Pending]) -> list[SaveResult]:
        """One transaction for the batch; on failure, each event on its own.

        A batch that is one INSERT (only regular, or only replaceable events, and no
        deletion request) runs it in autocommit: one round trip, and the statement is
        the transaction. Otherwise BEGIN ... COMMIT around every statement.
        """
        kinds = {p.address is None for p in batch}
        single = len(kinds) == 1 and not any(p.deletes or p.vanish for p in batch)
        try:
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                if single:
                    return await self._insert_batch(conn, batch)
                async with conn.transaction():
                    return await self._insert_batch(conn, batch)
        except Exception as exc:
            log.warning("batch of %d failed (%s); retrying one by one", len(batch), failure(exc))
        return await self._write_one_by_one(batch)

    async def _insert_batch(self, conn: Any, batch: list[Pending]) -> list[SaveResult]:
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
        self, conn: Any, batch: list[Pending], missing: list[int], results: list[Any]
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
                else:
                    results[i] = stale_result(batch[i].row[2], head and head[1])

    async def _deleted_earlier(self, conn: Any, batch: list[Pending]) -> set[int]:
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

    async def _apply_deletions(self, conn: Any, requests: list[Pending]) -> None:
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

    async def _apply_vanish(self, conn: Any, requests: list[Pending]) -> None:
        """NIP-62, in the batch's transaction: remember each stored request to vanish and
        delete what it covers (relay.store.sqlwrite.VANISH*)."""
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
        p_tags = [tag_key("p", pk.hex()) for pk in pubkeys]
        await conn.execute(q.VANISH_GIFT_WRAPS, tenants_, p_tags, stamps)

    async def _insert(self, conn: Any, sql: str, rows: list[Pending]) -> set[tuple[str, bytes]]:
        """Run a multi-row insert; returns the (tenant, id) of the rows it stored.

        unnest() of per-column arrays: one statement, one round trip, whatever the batch
        size. COPY into a temp table then INSERT ... SELECT was measured slower for our
        batch sizes (bench/store_insert.py --copy), as it needs an extra round trip.
        """
        params = q.insert_parameters([p.tenant for p in rows], [p.row for p in rows], self.node_id)
        return set(map(tuple, await conn.fetch(sql, *params)))

    async def _write_one_by_one(self, batch: list[Pending]) -> list[SaveResult]:
        """Each event under its own savepoint, so one event's failure fails only it."""
        results: list[SaveResult] = []
        try:
            async with (
                self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn,
                conn.transaction(),
            ):
                for p in batch:
                    try:
                        async with conn.transaction():  # a savepoint
                            results.extend(await self._insert_batch(conn, [p]))
                    except Exception as exc:
                        if conn.is_closed():
                            raise
                        log.warning("event rejected by the database: %s", failure(exc))
                        results.append(error_result(f"could not store: {exc}"))
        except Exception as exc:  # nothing committed: no event may be reported STORED
            log.error("database unavailable: %s", failure(exc))
            return [error_result("database unavailable")] * len(batch)
        return results
