"""PostgresStore's reads: REQ, COUNT and the NIP-77 set, one statement each.

The statements are built by relay.store.sqlread (REQ) and relay.store.sqlcount (COUNT,
NIP-77); they run on the read slots, shared round-robin over client addresses and
coalesced when concurrent reads have one shape (relay.store.readbatch), or on a healthy,
caught-up read replica (relay.store.replicas). A NIP-77 set is read off the REQ slots.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import asyncpg

from relay.config import DEFAULT_PRIVATE, Settings
from relay.filters import Filter
from relay.store import DEFAULT_TENANT, StoreError
from relay.store.pgbase import DB_ERRORS, PostgresBase, failure
from relay.store.readbatch import ReadBatcher
from relay.store.sqlcount import build_count, build_items
from relay.store.sqlread import build_query
from relay.wire import Reason

log = logging.getLogger("relay.store")


class PostgresReader(PostgresBase):
    """The reads of PostgresStore (EventReads)."""

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

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        """Raw events matching any filter: created_at desc, id asc, each filter limited."""
        built = build_query(filters, tenant, viewer, int(time.time()), private, *self._scan)
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
