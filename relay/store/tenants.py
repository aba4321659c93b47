"""Tenant administration in PostgreSQL (used by `engram tenant …` and the relay's reload).

Every change bumps `tenant_config_version` (triggers in 0002_tenants.sql), which running
relays poll.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import asyncpg

from relay.store.moderation import clear_tenant as clear_moderation
from relay.tenants import DEFAULT_TENANT, TenantConfig
from relay.wire import Reason

T = TypeVar("T")

_COLUMNS = (
    "name",
    "description",
    "pubkey",
    "contact",
    "icon",
    "write_policy",
    "auth_required",
    "database_url",
    "public_urls",
    "auth_challenge",
)


async def config_version(conn: asyncpg.Connection | asyncpg.Pool) -> int:
    return int(await conn.fetchval("SELECT version FROM tenant_config_version"))


async def load_tenants(
    conn: asyncpg.Connection | asyncpg.Pool, host: str | None = None
) -> list[TenantConfig]:
    """Every tenant (or just the one on `host`), with its aliases, members and admins."""
    rows = await conn.fetch(
        """
        SELECT t.*,
          COALESCE((SELECT array_agg(alias ORDER BY alias) FROM tenant_aliases a
                    WHERE a.host = t.host), '{}') AS aliases,
          COALESCE((SELECT array_agg(pubkey ORDER BY pubkey) FROM tenant_members m
                    WHERE m.host = t.host), '{}') AS members,
          COALESCE((SELECT array_agg(pubkey ORDER BY pubkey) FROM tenant_admins d
                    WHERE d.host = t.host), '{}') AS admins
        FROM tenants t WHERE $1::text IS NULL OR t.host = $1 ORDER BY t.host
        """,
        host,
    )
    return [
        TenantConfig(
            host=r["host"],
            **{c: list(r[c]) if c == "public_urls" else r[c] for c in _COLUMNS},
            limits=json.loads(r["limits"]),
            aliases=list(r["aliases"]),
            members=list(r["members"]),
            admins=list(r["admins"]),
        )
        for r in rows
    ]


async def get_tenant(conn: asyncpg.Connection, host: str) -> TenantConfig | None:
    found = await load_tenants(conn, host)
    return found[0] if found else None


async def host_taken(conn: asyncpg.Connection, host: str) -> bool:
    return bool(
        await conn.fetchval(
            "SELECT EXISTS (SELECT 1 FROM tenants WHERE host = $1)"
            " OR EXISTS (SELECT 1 FROM tenant_aliases WHERE alias = $1)",
            host,
        )
    )


async def add_tenant(conn: asyncpg.Connection, cfg: TenantConfig) -> None:
    async with conn.transaction():
        await conn.execute(
            f"INSERT INTO tenants (host, {', '.join(_COLUMNS)}, limits)"
            f" VALUES ({', '.join(f'${i}' for i in range(1, len(_COLUMNS) + 3))})",
            cfg.host,
            *(getattr(cfg, c) for c in _COLUMNS),
            json.dumps(cfg.limits),
        )
        for alias in cfg.aliases:
            await conn.execute("INSERT INTO tenant_aliases VALUES ($1, $2)", alias, cfg.host)
        for pubkey in cfg.members:
            await add_member(conn, cfg.host, pubkey)
        for pubkey in cfg.admins:
            await conn.execute("INSERT INTO tenant_admins VALUES ($1, $2)", cfg.host, pubkey)


async def update_tenant(conn: asyncpg.Connection, host: str, **fields: Any) -> None:
    """Set the given columns (and `limits`, merged into the stored overrides)."""
    async with conn.transaction():
        for column, value in fields.items():
            if column == "limits":
                await conn.execute(
                    "UPDATE tenants SET limits = limits || $2::jsonb WHERE host = $1",
                    host,
                    json.dumps(value),
                )
            elif column == "aliases":
                for alias in value:
                    await conn.execute("INSERT INTO tenant_aliases VALUES ($1, $2)", alias, host)
            elif column in _COLUMNS:
                # column names come from the fixed tuple above, never from input
                await conn.execute(f"UPDATE tenants SET {column} = $2 WHERE host = $1", host, value)
            else:
                raise ValueError(f"unknown tenant field {column!r}")


async def has_tenants(conn: asyncpg.Connection) -> bool:
    """Whether any tenant is configured (the built-in tenant's own row is none: with it
    alone the relay still serves every host as one)."""
    query = "SELECT EXISTS (SELECT 1 FROM tenants WHERE host <> $1)"
    return bool(await conn.fetchval(query, DEFAULT_TENANT))


# Every table holding rows of a tenant, by its `tenant` column: events and their tag
# index, deletions, NIP-62 requests to vanish, moderation (migrations 0001-0021).
_TENANT_TABLES = (
    "SELECT c.table_name FROM information_schema.columns c"
    " JOIN information_schema.tables t USING (table_schema, table_name)"
    " WHERE c.table_schema = current_schema() AND c.column_name = 'tenant'"
    " AND t.table_type = 'BASE TABLE' ORDER BY c.table_name"
)


async def adopt_default(conn: asyncpg.Connection, host: str) -> int:
    """Give the built-in tenant's rows to the tenant on `host`, which must hold none, in
    the caller's transaction: every table with a `tenant` column (found in the schema,
    so a later migration's table is not forgotten). Returns the events adopted. Rows
    keep their transaction ids (`xid`): the live bus does not deliver them again."""
    if await conn.fetchval("SELECT EXISTS (SELECT 1 FROM events WHERE tenant = $1)", host):
        raise ValueError(f"{host} already holds events")
    adopted = 0
    for row in await conn.fetch(_TENANT_TABLES):
        table = row["table_name"]
        # a table name from the schema, quoted; the values are parameters
        status = await conn.execute(
            f'UPDATE "{table}" SET tenant = $1 WHERE tenant = $2', host, DEFAULT_TENANT
        )
        if table == "events":
            adopted = int(status.split()[-1])
    return adopted


async def event_count(conn: asyncpg.Connection, host: str) -> int:
    return int(await conn.fetchval("SELECT count(*) FROM events WHERE tenant = $1", host))


async def events_database(conn: asyncpg.Connection, host: str) -> str | None:
    """The URL of the tenant's own database, or None: its events are in this one."""
    return await conn.fetchval("SELECT database_url FROM tenants WHERE host = $1", host)  # type: ignore[no-any-return]


async def on_events_database(
    conn: asyncpg.Connection, host: str, action: Callable[[asyncpg.Connection], Awaitable[T]]
) -> T:
    """Run `action` on a connection to the database holding the tenant's events."""
    url = await events_database(conn, host)
    if not url:
        return await action(conn)
    other = await asyncpg.connect(url, timeout=10)
    try:
        return await action(other)
    finally:
        await other.close()


async def remove_tenant(conn: asyncpg.Connection, host: str, purge: bool) -> int:
    """Delete the tenant (and with `purge` its events); returns the events deleted."""
    async with conn.transaction():
        deleted = 0
        if purge:
            deleted = int(
                (await conn.execute("DELETE FROM events WHERE tenant = $1", host)).split()[-1]
            )
        await conn.execute("DELETE FROM tenants WHERE host = $1", host)
        await clear_moderation(conn, host)
        return deleted


async def add_member(conn: asyncpg.Connection, host: str, pubkey: str) -> bool:
    status = await conn.execute(
        "INSERT INTO tenant_members (host, pubkey) VALUES ($1, $2) ON CONFLICT DO NOTHING",
        host,
        pubkey,
    )
    return status.endswith(" 1")


async def remove_member(conn: asyncpg.Connection, host: str, pubkey: str) -> bool:
    status = await conn.execute(
        "DELETE FROM tenant_members WHERE host = $1 AND pubkey = $2", host, pubkey
    )
    return status.endswith(" 1")


async def run_admin(dsn: str, action: Callable[[asyncpg.Connection], Awaitable[T]]) -> T:
    """Migrate (so the tables exist), connect, run one admin action, disconnect."""
    from relay.store import StoreError
    from relay.store.migrate import migrate_url

    try:
        await migrate_url(dsn)
        conn = await asyncpg.connect(dsn)
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreError(Reason.ERROR(f"cannot reach the database: {exc}")) from exc
    try:
        return await action(conn)
    except asyncpg.PostgresError as exc:
        raise StoreError(Reason.ERROR(f"database error: {exc}")) from exc
    finally:
        await conn.close()


async def migrate_everywhere(dsn: str) -> list[tuple[str | None, str]]:
    """Migrate the relay's database, then every tenant database it names:
    [(tenant database URL or None for the relay's, version applied)]."""
    from relay.store.migrate import migrate_url

    applied: list[tuple[str | None, str]] = [(None, v) for v in await migrate_url(dsn)]
    conn = await asyncpg.connect(dsn)
    try:
        urls = await conn.fetch(
            "SELECT DISTINCT database_url FROM tenants WHERE database_url IS NOT NULL"
        )
    finally:
        await conn.close()
    for (url,) in urls:
        applied.extend((url, v) for v in await migrate_url(url))
    return applied
