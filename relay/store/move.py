"""The database side of `engram tenant move`: connections, and the rows of one tenant
committed since a position (the live bus's xid tail, migration 0004, for one tenant).

The copy itself goes through the export/import path (`maintenance.export_raw`, then the
relay's own ingest rules); this module only finds what to copy and counts it.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from relay.store import StoreError
from relay.store.pgbus import BUS_XMIN
from relay.wire import Reason

# Rows of one tenant whose transactions finished in [$1, current xmin): none skipped, even
# a transaction that committed late (see 0004_live_bus.sql).
_CHANGED = (
    "WITH snap AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS hi)"
    " SELECT snap.hi::text, e.raw FROM snap"
    " LEFT JOIN events e ON e.tenant = $2 AND e.xid >= $1::text::xid8 AND e.xid < snap.hi"
    " ORDER BY e.xid, e.created_at, e.id"
)


async def connect(url: str) -> Any:
    try:
        return await asyncpg.connect(url, timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise StoreError(Reason.ERROR(f"cannot reach the database: {exc}")) from exc


async def position(conn: Any) -> str:
    """Where a tail of later changes starts: every transaction before it has finished."""
    return str(await conn.fetchval(BUS_XMIN))


async def changed_since(conn: Any, tenant: str, since: str) -> tuple[str, list[bytes]]:
    """(next position, raw events of `tenant` committed since `since`), in commit order."""
    rows = await conn.fetch(_CHANGED, since, tenant)
    return rows[0][0], [bytes(r[1]) for r in rows if r[1] is not None]


async def purge_tenant_events(conn: Any, tenant: str) -> int:
    """Delete a tenant's rows from one database (after it moved away), in batches."""
    total = 0
    while True:
        status = await conn.execute(
            "DELETE FROM events WHERE ctid = ANY(ARRAY("
            "SELECT ctid FROM events WHERE tenant = $1 LIMIT 5000))",
            tenant,
        )
        n = int(status.split()[-1])
        total += n
        if n == 0:
            return total
