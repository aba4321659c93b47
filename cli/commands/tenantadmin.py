"""What `engram tenant …` does, without the command line: input checks, one admin
session on the relay's database, and each change as an action run in it.

Tenants, members, admins and moderation live in the relay's own database (the one
`--database-url` names: where tenants are configured); a tenant's events may live on a
database of its own. Every failure is a `TenantError` carrying the CLI's exit code (1:
bad input or refused, 2: the database); `cli.commands.tenant` prints it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from engram.errors import KeyFormatError
from engram.kinds import KIND_MAX
from engram.nip01 import is_hex, parse_public_key
from relay.config import Limits
from relay.hosts import host_of
from relay.tenants import (
    DEFAULT_TENANT,
    WRITE_POLICIES,
    TenantConfig,
    check_identity,
    merged_limits,
)

if TYPE_CHECKING:
    from cli.commands.move import MoveReport
    from relay.config import Settings

T = TypeVar("T")
Action = Callable[[Any], Awaitable[T]]  # run with one connection to the relay's database


class TenantError(Exception):
    """A refused `engram tenant` request; str() is the message, `exit_code` the status."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# --- input -----------------------------------------------------------------------------


def host(raw: str) -> str:
    value = host_of(raw.strip())
    if not value:
        raise TenantError(f"not a host name: {raw!r}")
    return value


def pubkey(raw: str) -> str:
    try:
        return parse_public_key(raw)
    except KeyFormatError as exc:
        raise TenantError(str(exc)) from exc


def event_id(raw: str) -> str:
    value = raw.strip().lower()
    if not is_hex(value, 64):
        raise TenantError(f"not an event id (64 hex characters): {raw!r}")
    return value


def ip(raw: str) -> str:
    from relay.moderation import normalize_ip

    value = normalize_ip(raw)
    if not value:
        raise TenantError(f"not an IP address: {raw!r}")
    return value


def kind(value: int) -> int:
    if not 0 <= value <= KIND_MAX:
        raise TenantError(f"kind must be 0-{KIND_MAX}, got {value}")
    return value


def check_write(write: str | None) -> None:
    if write is not None and write not in WRITE_POLICIES:
        raise TenantError(f"--write must be one of: {', '.join(WRITE_POLICIES)}")


def check_tenant_identity(cfg: TenantConfig) -> None:
    """Its public URLs on its own hosts, a known AUTH challenge mode (relay.tenants)."""
    try:
        check_identity(cfg)
    except ValueError as exc:
        raise TenantError(str(exc)) from exc


def limits(pairs: list[str] | None) -> dict[str, Any]:
    """`--limit KEY=VALUE` overrides, checked against `Limits` (lists of kinds as
    `4,1059,1060`, numbers and true/false as JSON, text as given)."""
    fields = msgspec.to_builtins(Limits())
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise TenantError(f"--limit takes KEY=VALUE with KEY one of: {', '.join(fields)}")
        if isinstance(fields[key], list):  # private_kinds=4,1059,1060 (empty: none)
            try:
                out[key] = [int(v) for v in value.strip("[] ").split(",") if v.strip()]
            except ValueError as exc:
                raise TenantError(
                    f"--limit {key}: {value!r} is not a comma-separated list of kinds"
                ) from exc
            continue
        try:
            out[key] = json.loads(value) if isinstance(fields[key], bool | int) else value
        except json.JSONDecodeError as exc:
            raise TenantError(f"--limit {key}: {value!r} is not a number or true/false") from exc
    try:
        merged_limits(Limits(), out)
    except ValueError as exc:
        raise TenantError(str(exc)) from exc
    return out


# --- one admin session on the relay's database --------------------------------------------

# Sessions on this database besides ours: every running relay node holds a pool and a
# LISTEN connection on its database, so none at all means no relay serves it.
_OTHER_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)


def run(settings: Settings, action: Action[T]) -> T:
    """Run one admin action against the configured (or embedded) database."""
    return session(settings, action)[0]


def session(
    settings: Settings, action: Action[T], check_served: bool = False
) -> tuple[T, str, bool]:
    """(the action's result, the database URL, whether another session is connected to
    it: checked only with `check_served`, else True)."""
    from cli.commands.common import resolve_database_url
    from relay.store import StoreError
    from relay.store.tenants import run_admin

    url, _embedded = resolve_database_url(settings)

    async def with_check(conn: Any) -> tuple[T, bool]:
        result = await action(conn)
        return result, (not check_served) or bool(await conn.fetchval(_OTHER_SESSIONS))

    try:
        result, served = asyncio.run(run_admin(url, with_check))
    except StoreError as exc:
        raise TenantError(str(exc), 2) from exc
    return result, url, served


def existing(settings: Settings, key: str) -> TenantConfig:
    """The tenant on `key`, or a TenantError saying there is none."""
    from relay.store import tenants as db

    cfg = run(settings, lambda conn: db.get_tenant(conn, key))
    if cfg is None:
        raise TenantError(f"no tenant {key}")
    return cfg


def moderate(settings: Settings, key: str, action: Callable[[Any, Any, str], Awaitable[T]]) -> T:
    """Run `action(control, events, tenant key)`: `key` is a tenant, or `default` (the
    built-in tenant of a relay without tenants)."""
    from relay.store import DEFAULT_TENANT
    from relay.store import tenants as db

    async def in_session(conn: Any) -> T:
        if key != DEFAULT_TENANT and await db.get_tenant(conn, key) is None:
            raise TenantError(f"no tenant {key} (`default` is the relay without tenants)")
        return await db.on_events_database(conn, key, lambda events: action(conn, events, key))

    return run(settings, in_session)


def move(
    settings: Settings,
    key: str,
    to: str,
    grace: float | None,
    purge_source: bool,
    merge: bool,
    say: Callable[[str], None],
) -> MoveReport:
    """Move the tenant's events to the database `to` (or `default`) while relays keep
    serving it (cli.commands.move); late writes are carried over for `grace` seconds (default:
    3 x tenant_refresh_seconds, at least 10)."""
    from cli.commands.common import resolve_database_url
    from cli.commands.move import move_tenant
    from relay.store import StoreError

    url, _embedded = resolve_database_url(settings)
    wait = grace if grace is not None else max(10.0, 3 * settings.tenant_refresh_seconds)
    try:
        return asyncio.run(move_tenant(settings, url, key, to, wait, purge_source, merge, say))
    except StoreError as exc:
        raise TenantError(str(exc).removeprefix("error: "), 2) from exc


def tenant_json(cfg: TenantConfig) -> str:
    """Everything stored about a tenant, its database URL's password masked."""
    from cli.commands.ops import mask_url

    data = msgspec.to_builtins(cfg)
    if data.get("database_url"):
        data["database_url"] = mask_url(data["database_url"])
    return json.dumps(data, indent=2, sort_keys=True)


# --- the changes -----------------------------------------------------------------------------


async def _prepare(url: str) -> None:
    """A tenant database must be reachable and migrated before any tenant points at it."""
    from relay.store.migrate import migrate_url

    try:
        await migrate_url(url)
    except Exception as exc:
        raise TenantError(
            f"cannot prepare the tenant database: {type(exc).__name__}: {exc}", 2
        ) from exc


async def _hosts_free(conn: Any, hosts: tuple[str, ...] | list[str]) -> None:
    from relay.store import tenants as db

    for h in hosts:
        if await db.host_taken(conn, h):
            raise TenantError(f"{h} is already served by a tenant")


class DefaultEventsHidden(TenantError):
    """The first tenant would hide the events the relay stored without tenants: the
    command says what to run (`cli.commands.tenant.add`, which knows the command line)."""

    def __init__(self, host: str, held: int) -> None:
        super().__init__(f"{held} events stored before the relay had tenants")
        self.host = host
        self.held = held


class Added(msgspec.Struct, frozen=True):
    """What `add_tenant` did: the events it adopted, and whether the relay had no
    tenant before (it then serves tenants' hosts only)."""

    adopted: int
    first: bool


def add_tenant(
    cfg: TenantConfig, adopt: bool = False, leave_default: bool = False
) -> Action[Added]:
    """Add `cfg`: its hosts must be free; its own database, if any, is migrated first.

    The first tenant of a relay whose built-in tenant holds events would hide them
    (with tenants, only tenants' hosts are served): refused (DefaultEventsHidden) unless
    `adopt` (the tenant takes them over, while no relay is connected: see
    `_adopt_default`) or `leave_default` (they stay the built-in tenant's, unserved until
    the last tenant is removed)."""
    from relay.store import tenants as db

    if cfg.host == DEFAULT_TENANT:
        raise TenantError(
            f"{DEFAULT_TENANT} is the built-in tenant (the relay's own settings): change it"
            f" with `engram tenant set {DEFAULT_TENANT} …`"
        )
    if adopt and leave_default:
        raise TenantError("--adopt and --leave-default exclude each other")
    if adopt and cfg.database_url:
        raise TenantError(
            "--adopt keeps the events on the relay's database: add the tenant without"
            " --tenant-database-url, then `engram tenant move HOST --to URL`"
        )

    async def action(conn: Any) -> Added:
        await _hosts_free(conn, (cfg.host, *cfg.aliases))
        first = not await db.has_tenants(conn)
        if adopt:
            return Added(await _adopt_default(conn, cfg), first)
        if first and not leave_default:
            held = await db.event_count(conn, DEFAULT_TENANT)
            if held:
                raise DefaultEventsHidden(cfg.host, held)
        if cfg.database_url:
            await _prepare(cfg.database_url)
        await db.add_tenant(conn, cfg)
        return Added(0, first)

    return action


async def _adopt_default(conn: Any, cfg: TenantConfig) -> int:
    """Add the tenant and give it the built-in tenant's rows, in one transaction.

    Only while no relay is connected to the database: a running relay keeps serving
    its open connections as the built-in tenant's, so what they wrote after the change
    would stay behind (and reads on them would miss what moved)."""
    from relay.store import tenants as db

    if await conn.fetchval(_OTHER_SESSIONS):
        raise TenantError(
            "--adopt runs while no relay is connected to this database: stop the relay,"
            " run this again, then start it"
        )
    async with conn.transaction():
        await db.add_tenant(conn, cfg)
        try:
            return await db.adopt_default(conn, cfg.host)
        except ValueError as exc:
            raise TenantError(str(exc)) from exc


async def _row(conn: Any, key: str) -> TenantConfig:
    """The stored tenant on `key`; the built-in tenant's row is made on its first change
    (it holds only overrides of the relay's settings)."""
    from relay.store import tenants as db

    current = await db.get_tenant(conn, key)
    if current is None and key == DEFAULT_TENANT:
        await db.add_tenant(conn, TenantConfig(host=DEFAULT_TENANT))
        current = await db.get_tenant(conn, key)
    if current is None:
        raise TenantError(f"no tenant {key}")
    return current


_NOT_FOR_DEFAULT = {
    "aliases": "--alias (the built-in tenant serves every host while there is no tenant)",
    "database_url": "--tenant-database-url (its events are on the relay's database)",
    "public_urls": "--public-url (its URLs are the relay's: the public_urls setting)",
}


def default_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """`engram tenant set default …`: its write policy and AUTH requirement are stored
    as limits (`restricted_writes`, `auth_required`), which override the relay's
    settings only when given (relay.tenants.default_tenant); hosts, a database and public
    URLs of its own it cannot have."""
    for name, option in _NOT_FOR_DEFAULT.items():
        if name in fields:
            raise TenantError(f"the built-in tenant takes no {option}")
    out = dict(fields)
    limits = dict(out.pop("limits", {}))
    if "write_policy" in out:
        limits["restricted_writes"] = out.pop("write_policy") == "members"
    if "auth_required" in out:
        limits["auth_required"] = out.pop("auth_required")
    if limits:
        out["limits"] = limits
    return out


def update_tenant(key: str, fields: dict[str, Any]) -> Action[None]:
    """Change `fields` of the tenant on `key` (`default`: the built-in tenant, live);
    its database is re-pointed only while it holds no events (`engram tenant move`
    moves one that does)."""
    from relay.store import tenants as db

    if key == DEFAULT_TENANT:
        fields = default_fields(fields)

    async def action(conn: Any) -> None:
        current = await _row(conn, key)
        check_tenant_identity(
            msgspec.structs.replace(
                current,
                public_urls=fields.get("public_urls", current.public_urls),
                auth_challenge=fields.get("auth_challenge", current.auth_challenge),
                aliases=[*current.aliases, *fields.get("aliases", ())],
            )
        )
        if "database_url" in fields:
            held = await db.on_events_database(conn, key, lambda c: db.event_count(c, key))
            if held:
                raise TenantError(
                    f"{key} holds {held} events; use `engram tenant move {key} --to URL`"
                )
            if fields["database_url"]:
                await _prepare(fields["database_url"])
        await _hosts_free(conn, fields.get("aliases", ()))
        await db.update_tenant(conn, key, **fields)

    return action


def remove_tenant(key: str, purge: bool) -> Action[int]:
    """Remove the tenant; refused while it holds events unless `purge`. Returns the
    events deleted (on its own database too)."""
    from relay.store import tenants as db
    from relay.store.move import purge_tenant_events

    if key == DEFAULT_TENANT:
        raise TenantError(
            f"the built-in tenant cannot be removed; `engram tenant set {DEFAULT_TENANT}"
            " --limit KEY=VALUE` changes what it overrides"
        )

    async def action(conn: Any) -> int:
        if await db.get_tenant(conn, key) is None:
            raise TenantError(f"no tenant {key}")
        held = await db.on_events_database(conn, key, lambda c: db.event_count(c, key))
        if held and not purge:
            raise TenantError(f"{key} holds {held} events; use --purge to delete them too")
        if await db.events_database(conn, key):  # events on the tenant's own database
            deleted = await db.on_events_database(conn, key, lambda c: purge_tenant_events(c, key))
            return deleted + await db.remove_tenant(conn, key, False)
        return await db.remove_tenant(conn, key, purge)

    return action


def change_member(key: str, pk: str, add: bool) -> Action[bool]:
    """Add or remove a member; True when it changed anything."""
    from relay.store import moderation as mod
    from relay.store import tenants as db

    async def action(conn: Any) -> bool:
        await _row(conn, key)
        # adding is NIP-86 `allowpubkey`: an allowed author is no longer banned
        change = mod.allow_pubkey if add else db.remove_member
        return await change(conn, key, pk)

    return action


def change_admin(key: str, pk: str, add: bool) -> Action[bool]:
    """Add or remove an admin (who may call the tenant's NIP-86 API); True when changed."""
    from relay.store import moderation as mod

    async def action(conn: Any) -> bool:
        await _row(conn, key)
        return await (mod.add_admin if add else mod.remove_admin)(conn, key, pk)

    return action


async def moderation_state(control: Any, events: Any, key: str) -> dict[str, Any]:
    """The tenant's moderation: bans, kinds, blocked addresses and the reported events
    still waiting for a decision (what the NIP-86 list methods answer)."""
    from relay.nip86 import reasoned
    from relay.store import moderation as mod

    c, e, k = control, events, key
    return {
        "banned_pubkeys": reasoned(await mod.banned_pubkeys(c, k), "pubkey"),
        "banned_events": reasoned(await mod.banned_events(c, k), "id"),
        "allowed_events": reasoned(await mod.moderated_events(c, k, False), "id"),
        "allowed_kinds": await mod.kinds(c, k, True),
        "disallowed_kinds": await mod.kinds(c, k, False),
        "blocked_ips": reasoned(await mod.blocked_ips(c, k), "ip"),
        "events_needing_moderation": reasoned(await mod.events_needing_moderation(c, e, k), "id"),
    }
