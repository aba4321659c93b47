"""PostgresStore's control: what the relay reads and runs besides events.

The tenant configuration and moderation lists it polls (relay.store.tenants,
relay.store.moderation), administrative actions on a pooled connection (NIP-86,
`engram tenant`), health for /readyz, planner statistics after a bulk load, and the
NIP-40 purge of expired rows. Database failures become StoreError (`error: …`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from relay.moderation import Moderation
from relay.store import StoreError, moderation, tenants
from relay.store.migrate import migration_status
from relay.store.pgbase import ACQUIRE_TIMEOUT, ADMIN_ERRORS, DB_ERRORS, PostgresBase, failure
from relay.store.sqlwrite import PURGE_EXPIRED
from relay.tenants import TenantConfig
from relay.wire import Reason

log = logging.getLogger("relay.store")
T = TypeVar("T")

_CONFIG_UNREADABLE = Reason.ERROR("could not read tenant configuration")


class PostgresControl(PostgresBase):
    """The control side of PostgresStore (for one database; StoreRouter's StoreControl
    spans them)."""

    forget_reads: Callable[[], None]  # relay.store.pgreader (its read cache)

    async def tenant_version(self) -> int:
        """Version of the tenant configuration (bumped on every change)."""
        try:
            return await tenants.config_version(self._pool)
        except DB_ERRORS as exc:
            raise StoreError(_CONFIG_UNREADABLE) from exc

    async def load_tenants(self) -> list[TenantConfig]:
        try:
            return await tenants.load_tenants(self._pool)
        except DB_ERRORS as exc:
            raise StoreError(_CONFIG_UNREADABLE) from exc

    async def load_moderation(self) -> dict[str, Moderation]:
        try:
            return await moderation.load_moderation(self._pool)
        except ADMIN_ERRORS as exc:
            raise StoreError(Reason.ERROR("could not read moderation settings")) from exc

    async def run_admin(self, action: Callable[[Any], Awaitable[T]]) -> T:
        """Run an administrative action (relay.store.moderation) on a pooled connection;
        database failures become StoreError."""
        try:
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                return await action(conn)
        except ADMIN_ERRORS as exc:
            log.error("administrative action failed: %s", failure(exc))
            raise StoreError(Reason.ERROR(f"database error: {failure(exc)}")) from exc
        finally:
            self.forget_reads()  # a ban deletes rows no event announces (readcache)

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

    async def analyze(self) -> None:
        """Planner statistics now, after a bulk load (`engram import`).

        The live path leaves statistics to autovacuum (after 10% of the rows changed, at
        most once a minute): the relay's own ANALYZE every 50,000 rows cost 25-50 us of
        PostgreSQL CPU per ingested event (to_tsvector over a 30,000-row sample each time,
        bench/RESULTS-HISTORY.md "Statistics off the ingest path"). A failure is logged, never
        raised: statistics are an optimisation, and the load itself has succeeded.
        """
        try:
            async with self._pool.acquire(timeout=ACQUIRE_TIMEOUT) as conn:
                await conn.execute("ANALYZE events")
        except DB_ERRORS as exc:
            log.warning("ANALYZE failed: %s", failure(exc))

    async def purge_expired(self, now: int, batch: int = 5_000) -> int:
        """NIP-40: delete expired rows, `batch` per transaction; returns how many."""
        total = 0
        while True:
            try:
                status = await self._pool.execute(PURGE_EXPIRED, now, batch)
            except DB_ERRORS as exc:
                raise StoreError(Reason.ERROR("could not purge expired events")) from exc
            n = int(status.split()[-1])
            total += n
            if n < batch:
                return total
