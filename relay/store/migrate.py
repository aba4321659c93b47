"""Forward-only schema migrations: `migrations/NNNN_what.sql`, applied in name order.

Touches the database through the asyncpg connection it is given, nothing else. Each
file runs in its own transaction and is recorded in `schema_migrations`; the whole run
holds a session advisory lock, so two relays starting at once apply each file once.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncpg

# pg_advisory_lock key: sha256(b"engram-relay/migrate")[:8] as a signed big-endian int8.
LOCK_KEY = -32916885686703430

_CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    " version text PRIMARY KEY,"
    " applied_at timestamptz NOT NULL DEFAULT now())"
)


def migration_files() -> list[tuple[str, str]]:
    """(version, sql) of every `migrations/*.sql`, in order; version is the file stem."""
    files = [f for f in resources.files("migrations").iterdir() if f.name.endswith(".sql")]
    return [(f.name[: -len(".sql")], f.read_text("utf-8")) for f in sorted(files, key=_name)]


def _name(f: object) -> str:
    return str(getattr(f, "name", ""))


async def _applied(conn: asyncpg.Connection) -> set[str]:
    if await conn.fetchval("SELECT to_regclass('schema_migrations')") is None:
        return set()
    return {r["version"] for r in await conn.fetch("SELECT version FROM schema_migrations")}


async def apply_migrations(conn: asyncpg.Connection) -> list[str]:
    """Apply the pending migrations; returns the versions applied by this call.

    Raises whatever the failing migration raised; the files before it stay applied.
    The connection must not be inside a transaction.
    """
    await conn.execute("SELECT pg_advisory_lock($1)", LOCK_KEY)
    try:
        await conn.execute(_CREATE_TABLE)
        done = await _applied(conn)
        applied: list[str] = []
        for version, sql in migration_files():
            if version in done:
                continue
            async with conn.transaction():
                await conn.execute(sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, now())",
                    version,
                )
            applied.append(version)
        return applied
    finally:
        if not conn.is_closed():
            await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_KEY)


async def migration_status(conn: asyncpg.Connection) -> list[tuple[str, bool]]:
    """(version, applied) for every migration file, in order. Read-only."""
    done = await _applied(conn)
    return [(version, version in done) for version, _ in migration_files()]


async def migrate_url(dsn: str) -> list[str]:
    """apply_migrations on a connection of its own (for `engram migrate`)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return await apply_migrations(conn)
    finally:
        await conn.close()


async def status_url(dsn: str) -> list[tuple[str, bool]]:
    """migration_status on a connection of its own (for `engram db status`)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        return await migration_status(conn)
    finally:
        await conn.close()
