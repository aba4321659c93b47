"""PostgresStore's reads: REQ, COUNT and the NIP-77 set, one statement each.

The statements are built by relay.store.sqlread (REQ) and relay.store.sqlcount (COUNT,
NIP-77); they run on the read slots, shared round-robin over client addresses and
coalesced when concurrent reads have one shape (relay.store.readbatch), or on a healthy,
caught-up read replica (relay.store.replicas). A NIP-77 set is read off the REQ slots.
A REQ for authors' newest events is answered from memory when it can be
(relay.store.readcache: the store's writer, its bus and its admin actions keep it
current through `changed`, `rows_seen` and `forget_reads`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from typing import Any

import asyncpg

from engram.nip01 import is_hex
from relay.config import DEFAULT_PRIVATE, Settings
from relay.filters import UNPLANNED, Filter, SharedFilters
from relay.store import DEFAULT_TENANT, StoreError
from relay.store.pgbase import DB_ERRORS, PostgresBase, failure
from relay.store.readbatch import ReadBatcher
from relay.store.readcache import Need, Needs, ReadCache, plan_all
from relay.store.sqlcount import build_count, build_items
from relay.store.sqlread import build_prefix, build_query
from relay.store.sqlwrite import Row
from relay.wire import Reason, raw_author

log = logging.getLogger("relay.store")

# Background reads of prefixes past their refresh time, at most this many at once.
REFRESHES_MAX = 32


class PostgresReader(PostgresBase):
    """The reads of PostgresStore (EventReads)."""

    bus_held_back: bool  # relay.store.pgbus.PostgresBusRows

    def _init_reader(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self._query_timeout = settings.query_timeout_seconds
        self._scan = (settings.scan_max, settings.search_walk, settings.search_window)
        self._reads = ReadBatcher(
            pool,
            self._query_timeout,
            settings.read_batch_max,
            settings.read_concurrency,
            settings.negentropy_read_concurrency,
        )
        self.read_cache: ReadCache | None = None
        if settings.read_cache_bytes > 0:
            self.read_cache = ReadCache(settings.read_cache_bytes, settings.read_cache_seconds)
        # the cache answers only while the bus is current: a tail read, not held back,
        # within two polls (it reads at least once a poll); never before the first
        self._bus_current_at = -math.inf
        self._refreshes: set[asyncio.Task[None]] = set()  # background fills (_refresh_due)
        self._bus_current_for = 2 * settings.bus_poll_seconds + 0.5

    # --- what keeps the cache current (relay.store.readcache) ----------------------------

    def changed(self, tenant: str, pubkey: bytes, kind: int) -> None:
        """The writer stored an event of `pubkey` (before it answers): forget what it may
        have changed."""
        if self.read_cache is not None:
            self.read_cache.changed(tenant, pubkey, kind)

    def stored(self, tenant: str, row: Row) -> None:
        """The writer stored this row (before it answers): into the cache's prefixes of
        its author when nothing else may have changed (ReadCache.stored)."""
        if self.read_cache is not None:
            # build_prefix's columns: raw, created_at, id, kind, owner, expires_at
            self.read_cache.stored(tenant, row[1], (row[8], row[2], row[0], row[3], row[5], row[9]))

    def rows_seen(self, rows: list[tuple[str, bytes]], held: bool) -> None:
        """The bus read other nodes' rows (before it hands them on): forget what they may
        have changed; the cache is current again if no running transaction held the
        tail back."""
        cache = self.read_cache
        if cache is None:
            return
        for tenant, raw in rows:
            try:
                pubkey, kind = raw_author(raw)
                author = bytes.fromhex(pubkey)
            except ValueError:  # not an event this relay wrote: nothing of it is trusted
                cache.forget_tenant(tenant)
                continue
            cache.changed(tenant, author, kind)
        if not held:
            self._bus_current_at = time.monotonic()

    def read_cache_current(self) -> bool:
        """Whether REQs may be answered from the cache now (see _init_reader)."""
        return (
            self.read_cache is not None
            and not self.bus_held_back
            and time.monotonic() - self._bus_current_at <= self._bus_current_for
        )

    def forget_reads(self) -> None:
        """After an administrative action (bans, a sweep): the cache starts empty."""
        if self.read_cache is not None:
            self.read_cache.clear()

    # --- EventReads -----------------------------------------------------------------------

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        """Raw events matching any filter: created_at desc, id asc, each filter limited."""
        now = int(time.time())
        if self.read_cache_current():
            cached = await self._cached_or_filled(filters, tenant, viewer, now, private)
            if cached is not None:
                return cached
        built = build_query(filters, tenant, viewer, now, private, *self._scan)
        if built is None:
            return []
        rows = await self._fetch(*built)
        if len(filters) == 1:  # ordered by the statement (also within a batch: readbatch)
            return [r[0] for r in rows]
        merged = {r[2]: r for r in rows}  # the same event may match several filters
        return [r[0] for r in sorted(merged.values(), key=lambda r: (-r[1], r[2]))]

    def cached(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes] | None:
        """`query`'s answer from the cache as it is now (no fill, no I/O), or None."""
        cache = self.read_cache
        if cache is None or self.bus_held_back:  # read_cache_current, with one clock read
            return None
        clock = time.monotonic()
        if clock - self._bus_current_at > self._bus_current_for:
            return None
        if type(filters) is SharedFilters:  # kept by relay.reqmemo: planned once
            plans = filters.plans
            if plans is UNPLANNED:
                plans = filters.plans = plan_all(filters)
        else:
            plans = plan_all(filters)
        if plans is None:
            return None
        v = bytes.fromhex(viewer) if viewer is not None and is_hex(viewer, 64) else None
        got = cache.answer(plans, filters, tenant, v, int(time.time()), clock, private)
        if cache.due:
            self._refresh_due()
        return None if isinstance(got, Needs) else got

    def _refresh_due(self) -> None:
        """Read again, in the background, the prefixes past their refresh time that just
        answered (at most REFRESHES_MAX at once; the others at a later answer)."""
        cache = self.read_cache
        assert cache is not None
        due, cache.due = cache.due, []
        loop = asyncio.get_running_loop()
        for tenant, need, prefix in due:
            if len(self._refreshes) >= REFRESHES_MAX:
                cache.later(prefix)
                continue
            task = loop.create_task(self._refresh(tenant, need))
            self._refreshes.add(task)
            task.add_done_callback(self._refreshes.discard)

    async def _refresh(self, tenant: str, need: Need) -> None:
        with contextlib.suppress(StoreError):  # logged; the prefix expires as it would
            await self._fill(tenant, need, int(time.time()))

    async def _cached_or_filled(
        self,
        filters: list[Filter],
        tenant: str,
        viewer: str | None,
        now: int,
        private: frozenset[int],
    ) -> list[bytes] | None:
        """The answer from the cache, filling the prefixes it lacks first; or None."""
        cache = self.read_cache
        assert cache is not None
        plans = plan_all(filters)
        if plans is None:
            return None
        v = bytes.fromhex(viewer) if viewer is not None and is_hex(viewer, 64) else None
        got = cache.answer(plans, filters, tenant, v, now, time.monotonic(), private)
        if isinstance(got, Needs):
            if len(got) == 1:  # in this task: no hop through another
                await self._fill(tenant, got[0], now)
            else:
                await asyncio.gather(*(self._fill(tenant, need, now) for need in got))
            got = cache.answer(plans, filters, tenant, v, now, time.monotonic(), private)
        if cache.due:
            self._refresh_due()
        return None if isinstance(got, Needs) else got

    async def _fill(self, tenant: str, need: Need, now: int) -> None:
        """Read one author's prefix into the cache (dropped if a change overtakes it)."""
        cache = self.read_cache
        assert cache is not None
        fill = cache.begin(tenant, need)
        try:
            rows = await self._fetch(*build_prefix(tenant, *need, now))
        except BaseException:
            cache.end(fill)
            raise
        cache.put(fill, rows, time.monotonic())

    async def count(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> int:
        """Number of distinct events matching any filter (NIP-45: `limit` is ignored)."""
        built = build_count(filters, tenant, viewer, int(time.time()), private)
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
        built = build_items(f, tenant, viewer, int(time.time()), limit, private)
        if built is None:
            return [], b""
        rows = await self._fetch(*built, bulk=True)  # never on the REQ slots
        _count, ids, stamps = rows[0]
        return list(stamps), bytes(ids)

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
            raise StoreError(
                Reason.ERROR(f"query timed out after {self._query_timeout:g} s")
            ) from exc
        except DB_ERRORS as exc:
            log.error("query failed: %s", failure(exc))
            raise StoreError(Reason.ERROR("could not read from the database")) from exc
