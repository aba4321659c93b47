"""Bulk maintenance queries: export in keyset pages, prune in bounded DELETE batches.

Used by `engram export` / `engram prune` and the relay's background retention task
(`relay.retention`). Every function takes one asyncpg connection and runs statements in
autocommit mode: an export page or a prune batch is its own short transaction, so a
large table is never held in memory, in one snapshot, or under one long lock.

SQL is built from fixed fragments only; every value travels as a `$n` parameter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engram import KIND_REVISION, KIND_VERDICT

if TYPE_CHECKING:
    import asyncpg

EXPORT_PAGE = 1_000  # rows per export statement
PRUNE_BATCH = 5_000  # rows per prune transaction

_INT8_MIN, _INT8_MAX = -(2**63), 2**63 - 1

# pg_try_advisory_lock key of the retention pass (one relay at a time prunes):
# sha256(b"engram-relay/retention")[:8] as a signed big-endian int8.
RETENTION_LOCK_KEY = -8057350561224538863

# Oldest first, i.e. exactly the reverse of the relay's REQ order (created_at DESC, id):
# a backward scan of events_time, and a re-import replays replaces in their order.
_EXPORT_FIRST = (
    "SELECT raw, created_at, id FROM events"
    " WHERE tenant = $1 AND created_at >= $2 AND created_at <= $3"
    " ORDER BY created_at, id DESC LIMIT $4"
)
_EXPORT_NEXT = (
    "SELECT raw, created_at, id FROM events"
    " WHERE tenant = $1 AND created_at >= $2 AND created_at <= $3"
    " AND (created_at > $2 OR id < $5)"
    " ORDER BY created_at, id DESC LIMIT $4"
)

# Distinct tenants by a loose index scan (one index probe per tenant, not a table scan).
_TENANTS = (
    "WITH RECURSIVE t(tenant) AS ("
    " (SELECT tenant FROM events ORDER BY tenant LIMIT 1)"
    " UNION ALL"
    " SELECT (SELECT e.tenant FROM events e WHERE e.tenant > t.tenant"
    " ORDER BY e.tenant LIMIT 1) FROM t WHERE t.tenant IS NOT NULL"
    ") SELECT tenant FROM t WHERE tenant IS NOT NULL"
)


@dataclass(frozen=True)
class Selection:
    """Which kinds a prune touches.

    `kinds` set: exactly those kinds (replaceable or not: naming a kind is explicit).
    `kinds` None: every regular kind; replaceable (0, 3, 10000-19999) and addressable
    (30000-39999, engrams 30174 among them) heads only with `include_replaceable`, and
    so is agent memory's history (revisions 4174, owner verdicts 4175: regular events
    that are memory, kept like its heads).
    """

    kinds: tuple[int, ...] | None = None
    include_replaceable: bool = False

    def where(self) -> tuple[str, list[Any]]:
        """WHERE terms after `tenant = $1 AND created_at < $2`, and their parameters."""
        if self.kinds is not None:
            return " AND kind = ANY($3::int4[])", [list(self.kinds)]
        if not self.include_replaceable:
            # `d` is NULL exactly for regular events (CHECK events_d_iff_replaceable).
            return f" AND d IS NULL AND kind NOT IN ({KIND_REVISION}, {KIND_VERDICT})", []
        return "", []

    def describe(self) -> str:
        if self.kinds is not None:
            return "kind " + ", ".join(map(str, self.kinds))
        if self.include_replaceable:
            return "all kinds"
        return "regular kinds (replaceable and addressable heads, and memory history, kept)"


async def list_tenants(conn: asyncpg.Connection) -> list[str]:
    """Every `events.tenant` value that holds at least one event."""
    return [r[0] for r in await conn.fetch(_TENANTS)]


async def export_raw(
    conn: asyncpg.Connection,
    tenant: str,
    since: int | None = None,
    until: int | None = None,
    page: int = EXPORT_PAGE,
) -> AsyncIterator[bytes]:
    """Raw events of a tenant, oldest first, `since <= created_at <= until`.

    Keyset pagination on (created_at, id): one short statement per page, no long
    transaction; events stored meanwhile may or may not be included.
    """
    lo = _INT8_MIN if since is None else since
    hi = _INT8_MAX if until is None else until
    rows = await conn.fetch(_EXPORT_FIRST, tenant, lo, hi, page)
    while rows:
        for r in rows:
            yield bytes(r[0])
        if len(rows) < page:
            return
        last = rows[-1]
        rows = await conn.fetch(_EXPORT_NEXT, tenant, last[1], hi, page, last[2])


def _prune_sql(selection: Selection) -> tuple[str, str, list[Any]]:
    extra, params = selection.where()
    base = f"FROM events WHERE tenant = $1 AND created_at < $2{extra}"
    n = f"${3 + len(params)}"
    # Pick the oldest batch by index (events_time, so rows already deleted by earlier
    # batches are not scanned again and again), then delete exactly those rows by their
    # physical address (a TID scan, proportional to the batch, whatever the table's size).
    # The
    # conditions are checked again on delete: a head replaced meanwhile by a newer version
    # is deleted only if that version is selected too.
    delete = (
        "DELETE FROM events WHERE ctid = ANY(ARRAY("
        f"SELECT ctid {base} ORDER BY created_at LIMIT {n}::int8))"
        f" AND tenant = $1 AND created_at < $2{extra}"
    )
    return f"SELECT count(*) {base}", delete, params


async def count_prunable(
    conn: asyncpg.Connection, tenant: str, cutoff: int, selection: Selection
) -> int:
    """How many events `prune` would delete now (for --dry-run)."""
    count, _, params = _prune_sql(selection)
    return int(await conn.fetchval(count, tenant, cutoff, *params))


async def prune_batch(
    conn: asyncpg.Connection, tenant: str, cutoff: int, selection: Selection, batch: int
) -> int:
    """Delete at most `batch` selected events with created_at < cutoff; returns how many."""
    _, delete, params = _prune_sql(selection)
    status = await conn.execute(delete, tenant, cutoff, *params, batch)
    return int(status.split()[-1])


async def prune(
    conn: asyncpg.Connection,
    tenant: str,
    cutoff: int,
    selection: Selection,
    batch: int = PRUNE_BATCH,
    between: Callable[[int], Awaitable[None]] | None = None,
) -> tuple[int, int]:
    """Delete every selected event older than `cutoff`, `batch` rows per transaction.

    `between(deleted_so_far)` is awaited after each full batch (progress, or a pause so
    a running relay's writes get their turn). Returns (events deleted, batches run).
    """
    if batch < 1:
        raise ValueError("batch must be at least 1")
    deleted = batches = 0
    while True:
        n = await prune_batch(conn, tenant, cutoff, selection, batch)
        deleted += n
        batches += 1
        if n < batch:
            return deleted, batches
        if between is not None:
            await between(deleted)


async def prune_tenants(
    conn: asyncpg.Connection,
    tenants: Sequence[str],
    cutoff: int,
    selection: Selection,
    batch: int = PRUNE_BATCH,
    between: Callable[[int], Awaitable[None]] | None = None,
) -> dict[str, tuple[int, int]]:
    """`prune` for each tenant in turn: tenant -> (events deleted, batches run)."""
    return {t: await prune(conn, t, cutoff, selection, batch, between) for t in tenants}


async def try_retention_lock(conn: asyncpg.Connection) -> bool:
    """Session advisory lock: only one relay process runs a retention pass at a time."""
    return bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", RETENTION_LOCK_KEY))
