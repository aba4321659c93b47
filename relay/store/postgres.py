"""PostgresStore: the event store on one PostgreSQL database.

Its parts, one module per seam of the store interface (relay.store): writes, the
group-commit writer (relay.store.pgwriter); reads (pgreader, statements from sqlread and
sqlcount); control (pgcontrol); and the rows of the live bus (pgbus). This module opens
the pool, applies the migrations, starts the writers, and closes it all in order.
"""

from __future__ import annotations

import asyncio
import uuid

import asyncpg

from relay import metrics
from relay.config import Settings
from relay.store.migrate import apply_migrations
from relay.store.pgbus import PostgresBusRows
from relay.store.pgcontrol import PostgresControl
from relay.store.pgreader import PostgresReader
from relay.store.pgwriter import PostgresWriter, session_settings

_CONNECT_TIMEOUT = 10.0  # seconds to open a connection; a dead host must not hang writes
_COMMAND_TIMEOUT = 60.0  # seconds per statement


async def _keep_session(conn: asyncpg.Connection) -> None:
    """Pool release without asyncpg's default reset query (RESET ALL, UNLISTEN *, …): one
    extra round trip per query (measured as most of PostgreSQL's CPU per REQ). Nothing
    here changes session state: transactions are always closed by their context
    managers, LISTEN runs on its own connection, advisory locks are released explicitly.
    """


class PostgresStore(PostgresWriter, PostgresReader, PostgresControl, PostgresBusRows):
    """EventStore on PostgreSQL (its control for one database: StoreRouter spans several).
    Create with `await PostgresStore.open(dsn, settings)`."""

    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self._pool = pool
        metrics.watch_pool(self, pool)
        self.node_id = uuid.uuid4().hex  # `origin` of the rows this process stores
        self._init_writer(settings)
        self._init_reader(pool, settings)
        self._init_bus()

    @classmethod
    async def open(cls, dsn: str, settings: Settings) -> PostgresStore:
        """Connect a pool, apply pending migrations, start the writer tasks."""
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min(settings.db_pool_min, settings.db_pool_max),
            max_size=settings.db_pool_max,
            timeout=_CONNECT_TIMEOUT,
            command_timeout=_COMMAND_TIMEOUT,
            reset=_keep_session,
            server_settings=session_settings(settings),
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
        store._start_writers()
        return store

    async def close(self) -> None:
        """Stop accepting saves, write what is queued, stop the writers, close the pool."""
        await self._stop_writers()
        await self._stop_wakes()
        if self.replicas is not None:
            await self.replicas.close()
        try:
            await asyncio.wait_for(self._pool.close(), timeout=10)
        except TimeoutError:
            self._pool.terminate()
