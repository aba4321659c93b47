"""Moderation state in PostgreSQL, shared by the NIP-86 API (relay.nip86) and `engram tenant`.

The lists live in the relay's database (migration 0020, keyed by tenant; every change
bumps `tenant_config_version`, so every node reloads them within seconds). Acting on
stored events happens on the database holding the tenant's events: the caller passes
that connection as `events` (the same one for a tenant without a database of its own).
"""

from __future__ import annotations

from typing import Any

import msgspec

from engram.nip01 import Event
from engram.nip56 import KIND_REPORT, reported_events
from relay.moderation import Moderation, normalize_ip

Conn = Any  # an asyncpg connection or pool (both have execute/fetch/fetchval)

REPORTS_SCANNED = 1_000  # newest reports read for `listeventsneedingmoderation`
_TABLES = ("banned_pubkeys", "moderated_events", "moderated_kinds", "blocked_ips")


async def load_moderation(conn: Conn) -> dict[str, Moderation]:
    """Every tenant's moderation, by tenant key (tenants with none are absent)."""
    sets: dict[str, dict[str, set[Any]]] = {}

    def put(tenant: str, field: str, value: Any) -> None:
        sets.setdefault(tenant, {}).setdefault(field, set()).add(value)

    for r in await conn.fetch("SELECT tenant, pubkey FROM banned_pubkeys"):
        put(r[0], "banned_pubkeys", r[1])
    for r in await conn.fetch("SELECT tenant, id FROM moderated_events WHERE banned"):
        put(r[0], "banned_events", r[1])
    for r in await conn.fetch("SELECT tenant, kind, allowed FROM moderated_kinds"):
        put(r[0], "allowed_kinds" if r[2] else "disallowed_kinds", r[1])
    for r in await conn.fetch("SELECT tenant, host(ip) FROM blocked_ips"):
        put(r[0], "blocked_ips", normalize_ip(r[1]))
    return {
        tenant: Moderation(**{k: frozenset(v) for k, v in fields.items()})
        for tenant, fields in sets.items()
    }


async def clear_tenant(conn: Conn, tenant: str) -> None:
    """Forget a removed tenant's moderation (admins go with the tenant row)."""
    for table in _TABLES:  # fixed names, never input
        await conn.execute(f"DELETE FROM {table} WHERE tenant = $1", tenant)


def _changed(status: str) -> bool:
    return not status.endswith(" 0")


def _count(status: str) -> int:
    """Rows a DELETE touched, from its command status (`DELETE 3`)."""
    return int(status.split()[-1])


# --- pubkeys ----------------------------------------------------------------------------


async def ban_pubkey(control: Conn, events: Conn, tenant: str, pubkey: str, reason: str) -> int:
    """Ban the author (no longer a member: NIP-86 says a ban leaves the allow list), then
    delete their stored events; returns how many were deleted."""
    await control.execute(
        "DELETE FROM tenant_members WHERE host = $1 AND pubkey = $2", tenant, pubkey
    )
    await control.execute(
        "INSERT INTO banned_pubkeys (tenant, pubkey, reason) VALUES ($1, $2, $3)"
        " ON CONFLICT (tenant, pubkey) DO UPDATE SET reason = excluded.reason",
        tenant,
        pubkey,
        reason,
    )
    status = await events.execute(
        "DELETE FROM events WHERE tenant = $1 AND pubkey = $2", tenant, bytes.fromhex(pubkey)
    )
    return _count(status)


async def allow_pubkey(control: Conn, tenant: str, pubkey: str) -> bool:
    """Make the author a member (NIP-86 `allowpubkey`, `engram tenant member add`); an
    allowed author is no longer banned. True if they were not a member yet."""
    await unban_pubkey(control, tenant, pubkey)
    return _changed(
        await control.execute(
            "INSERT INTO tenant_members (host, pubkey) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            tenant,
            pubkey,
        )
    )


async def unban_pubkey(control: Conn, tenant: str, pubkey: str) -> bool:
    return _changed(
        await control.execute(
            "DELETE FROM banned_pubkeys WHERE tenant = $1 AND pubkey = $2", tenant, pubkey
        )
    )


async def banned_pubkeys(control: Conn, tenant: str) -> list[tuple[str, str]]:
    rows = await control.fetch(
        "SELECT pubkey, reason FROM banned_pubkeys WHERE tenant = $1 ORDER BY added_at, pubkey",
        tenant,
    )
    return [(r[0], r[1]) for r in rows]


# --- events -----------------------------------------------------------------------------


async def ban_event(control: Conn, events: Conn, tenant: str, event_id: str, reason: str) -> int:
    """Ban an event id (refused from now on), then delete it; returns rows deleted."""
    await _moderate_event(control, tenant, event_id, True, reason)
    status = await events.execute(
        "DELETE FROM events WHERE tenant = $1 AND id = $2", tenant, bytes.fromhex(event_id)
    )
    return _count(status)


async def allow_event(control: Conn, tenant: str, event_id: str, reason: str) -> None:
    """Approve a reported event (off the moderation queue); lifts a ban of the id."""
    await _moderate_event(control, tenant, event_id, False, reason)


async def _moderate_event(
    control: Conn, tenant: str, event_id: str, banned: bool, reason: str
) -> None:
    await control.execute(
        "INSERT INTO moderated_events (tenant, id, banned, reason) VALUES ($1, $2, $3, $4)"
        " ON CONFLICT (tenant, id) DO UPDATE SET banned = excluded.banned,"
        " reason = excluded.reason, added_at = now()",
        tenant,
        event_id,
        banned,
        reason,
    )


async def unmoderate_event(control: Conn, tenant: str, event_id: str, banned: bool) -> bool:
    """Forget a ban (`unbanevent`) or an approval (`unallowevent`) of an event id: a
    reported event that is no longer allowed is back on the queue."""
    return _changed(
        await control.execute(
            "DELETE FROM moderated_events WHERE tenant = $1 AND id = $2 AND banned = $3",
            tenant,
            event_id,
            banned,
        )
    )


async def moderated_events(control: Conn, tenant: str, banned: bool) -> list[tuple[str, str]]:
    """Banned (or allowed) event ids with their reasons, oldest decision first."""
    rows = await control.fetch(
        "SELECT id, reason FROM moderated_events WHERE tenant = $1 AND banned = $2"
        " ORDER BY added_at, id",
        tenant,
        banned,
    )
    return [(r[0], r[1]) for r in rows]


async def banned_events(control: Conn, tenant: str) -> list[tuple[str, str]]:
    return await moderated_events(control, tenant, True)


async def events_needing_moderation(
    control: Conn, events: Conn, tenant: str
) -> list[tuple[str, str]]:
    """Events of this tenant reported with NIP-56, still stored and not yet banned or
    allowed: (id, reason), most recently reported first."""
    rows = await events.fetch(
        "SELECT raw FROM events WHERE tenant = $1 AND kind = $2 ORDER BY created_at DESC LIMIT $3",
        tenant,
        KIND_REPORT,
        REPORTS_SCANNED,
    )
    reported: dict[str, str] = {}
    for (raw,) in rows:
        try:
            report = msgspec.json.decode(bytes(raw), type=Event)
        except (msgspec.DecodeError, msgspec.ValidationError):
            continue
        for event_id, reason in reported_events(report):
            reported.setdefault(event_id, reason)
    if not reported:
        return []
    stored = await events.fetch(
        "SELECT encode(id, 'hex') FROM events WHERE tenant = $1 AND id = ANY($2::bytea[])",
        tenant,
        [bytes.fromhex(i) for i in reported],
    )
    moderated = await control.fetch(
        "SELECT id FROM moderated_events WHERE tenant = $1 AND id = ANY($2::text[])",
        tenant,
        list(reported),
    )
    keep = {r[0] for r in stored} - {r[0] for r in moderated}
    return [(i, why) for i, why in reported.items() if i in keep]


# --- kinds ------------------------------------------------------------------------------


async def set_kind(control: Conn, tenant: str, kind: int, allowed: bool) -> None:
    await control.execute(
        "INSERT INTO moderated_kinds (tenant, kind, allowed) VALUES ($1, $2, $3)"
        " ON CONFLICT (tenant, kind) DO UPDATE SET allowed = excluded.allowed",
        tenant,
        kind,
        allowed,
    )


async def kinds(control: Conn, tenant: str, allowed: bool) -> list[int]:
    rows = await control.fetch(
        "SELECT kind FROM moderated_kinds WHERE tenant = $1 AND allowed = $2 ORDER BY kind",
        tenant,
        allowed,
    )
    return [r[0] for r in rows]


# --- addresses --------------------------------------------------------------------------


async def block_ip(control: Conn, tenant: str, ip: str, reason: str) -> None:
    await control.execute(
        "INSERT INTO blocked_ips (tenant, ip, reason) VALUES ($1, $2::inet, $3)"
        " ON CONFLICT (tenant, ip) DO UPDATE SET reason = excluded.reason",
        tenant,
        ip,
        reason,
    )


async def unblock_ip(control: Conn, tenant: str, ip: str) -> bool:
    return _changed(
        await control.execute(
            "DELETE FROM blocked_ips WHERE tenant = $1 AND ip = $2::inet", tenant, ip
        )
    )


async def blocked_ips(control: Conn, tenant: str) -> list[tuple[str, str]]:
    rows = await control.fetch(
        "SELECT host(ip), reason FROM blocked_ips WHERE tenant = $1 ORDER BY added_at, ip",
        tenant,
    )
    return [(r[0], r[1]) for r in rows]


# --- admins -----------------------------------------------------------------------------


async def add_admin(control: Conn, host: str, pubkey: str) -> bool:
    return _changed(
        await control.execute(
            "INSERT INTO tenant_admins (host, pubkey) VALUES ($1, $2) ON CONFLICT DO NOTHING",
            host,
            pubkey,
        )
    )


async def remove_admin(control: Conn, host: str, pubkey: str) -> bool:
    return _changed(
        await control.execute(
            "DELETE FROM tenant_admins WHERE host = $1 AND pubkey = $2", host, pubkey
        )
    )


async def clear_kind(control: Conn, tenant: str, kind: int) -> bool:
    """Neither allowed nor disallowed: back to the default (`engram tenant clear-kind`)."""
    return _changed(
        await control.execute(
            "DELETE FROM moderated_kinds WHERE tenant = $1 AND kind = $2", tenant, kind
        )
    )


async def sweep(events: Conn, tenant: str, pubkeys: list[str], event_ids: list[str]) -> int:
    """Delete what newly banned authors and ids left behind: events another node stored
    before it had loaded the ban. Each node runs this when a reload brings new bans."""
    deleted = 0
    if pubkeys:
        status = await events.execute(
            "DELETE FROM events WHERE tenant = $1 AND pubkey = ANY($2::bytea[])",
            tenant,
            [bytes.fromhex(p) for p in pubkeys],
        )
        deleted += _count(status)
    if event_ids:
        status = await events.execute(
            "DELETE FROM events WHERE tenant = $1 AND id = ANY($2::bytea[])",
            tenant,
            [bytes.fromhex(i) for i in event_ids],
        )
        deleted += _count(status)
    return deleted


async def use_token(control: Conn, event_id: str, expires_at: int, now: int) -> bool:
    """NIP-98: spend a management token (its event id) until `expires_at`; False when it
    was already used. Expired ones are forgotten on the way, so the table holds only the
    tokens of the last window, whichever node took them."""
    async with control.transaction():
        await control.execute("DELETE FROM nip98_used WHERE expires_at < $1", now)
        return bool(
            await control.fetchval(
                "INSERT INTO nip98_used VALUES ($1, $2) ON CONFLICT (id) DO NOTHING RETURNING true",
                event_id,
                expires_at,
            )
        )
