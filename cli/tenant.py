"""`engram tenant …`: tenants (by host), aliases, members and per-tenant NIP-11/limits.

Changes are written to the relay's own database (`--database-url` /
`ENGRAM_DATABASE_URL`: where tenants are configured); running relays on that database
pick them up within seconds. A tenant's events may live on a database of their own
(`--tenant-database-url`). The two are easy to mix up, so every change says which
database it was written to, and warns when no relay is connected to that database.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import msgspec
import typer

from cli.common import DatabaseOpt, DataDirOpt, resolve_database_url, settings_or_exit
from engram.errors import KeyFormatError
from engram.nip01 import parse_public_key
from relay.config import Limits
from relay.hosts import host_of
from relay.tenants import WRITE_POLICIES, TenantConfig, merged_limits

tenant_app = typer.Typer(help="Tenants: one relay, many communities (bound by Host).")
member_app = typer.Typer(help="Members of a tenant (who may publish under --write members).")
tenant_app.add_typer(member_app, name="member")

T = TypeVar("T")

NameOpt = Annotated[str | None, typer.Option(help="Name shown in NIP-11.")]
DescOpt = Annotated[str | None, typer.Option(help="Description shown in NIP-11.")]
PubkeyOpt = Annotated[str | None, typer.Option(help="Operator pubkey for NIP-11 (hex or npub).")]
ContactOpt = Annotated[str | None, typer.Option(help="Contact for NIP-11.")]
IconOpt = Annotated[str | None, typer.Option(help="Icon URL for NIP-11.")]
AliasOpt = Annotated[list[str] | None, typer.Option("--alias", help="Another host served.")]
WriteOpt = Annotated[str | None, typer.Option("--write", help="Write policy: open | members.")]
OwnDatabaseOpt = Annotated[
    str | None,
    typer.Option(
        "--tenant-database-url",
        help="Keep this tenant's events on their own PostgreSQL database (URL; migrated"
        " here). --database-url stays the relay's database, where tenants are configured.",
    ),
]
LimitOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--limit",
        help="Limit override KEY=VALUE (e.g. max_limit=100, private_kinds=4,1059,1060);"
        " repeatable.",
    ),
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"engram tenant: {message}", err=True)
    return typer.Exit(code)


def _host(raw: str) -> str:
    host = host_of(raw.strip())
    if not host:
        raise _fail(f"not a host name: {raw!r}")
    return host


def _pubkey(raw: str) -> str:
    try:
        return parse_public_key(raw)
    except KeyFormatError as exc:
        raise _fail(str(exc)) from exc


def _limits(pairs: list[str] | None) -> dict[str, Any]:
    fields = msgspec.to_builtins(Limits())
    out: dict[str, Any] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in fields:
            raise _fail(f"--limit takes KEY=VALUE with KEY one of: {', '.join(fields)}")
        if isinstance(fields[key], list):  # private_kinds=4,1059,1060 (empty: none)
            try:
                out[key] = [int(v) for v in value.strip("[] ").split(",") if v.strip()]
            except ValueError as exc:
                raise _fail(
                    f"--limit {key}: {value!r} is not a comma-separated list of kinds"
                ) from exc
            continue
        try:
            out[key] = json.loads(value) if isinstance(fields[key], bool | int) else value
        except json.JSONDecodeError as exc:
            raise _fail(f"--limit {key}: {value!r} is not a number or true/false") from exc
    try:
        merged_limits(Limits(), out)
    except ValueError as exc:
        raise _fail(str(exc)) from exc
    return out


def _run(
    database_url: str | None,
    data_dir: str | None,
    action: Callable[[Any], Awaitable[T]],
) -> T:
    """Run one admin action against the configured (or embedded) database."""
    return _admin(database_url, data_dir, action)[0]


# Sessions on this database besides ours: every running relay node holds a pool and a
# LISTEN connection on its database, so none at all means no relay serves it.
_OTHER_SESSIONS = (
    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
    " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)


def _admin(
    database_url: str | None,
    data_dir: str | None,
    action: Callable[[Any], Awaitable[T]],
    check_served: bool = False,
) -> tuple[T, str, bool]:
    """(the action's result, the database URL, whether another session is connected to
    it: checked only with `check_served`, else True)."""
    from relay.store import StoreError
    from relay.store.tenants import run_admin

    settings = settings_or_exit(database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)

    async def with_check(conn: Any) -> tuple[T, bool]:
        result = await action(conn)
        return result, (not check_served) or bool(await conn.fetchval(_OTHER_SESSIONS))

    try:
        result, served = asyncio.run(run_admin(url, with_check))
    except StoreError as exc:
        raise _fail(str(exc), 2) from exc
    return result, url, served


def _change(
    database_url: str | None,
    data_dir: str | None,
    action: Callable[[Any], Awaitable[T]],
    said: Callable[[T], str],
) -> T:
    """Run one change; print what it did and the database it was written to, and warn
    when no relay is connected to that database (the change is then served by nobody)."""
    from cli.ops import mask_url

    result, url, served = _admin(database_url, data_dir, action, check_served=True)
    where = mask_url(url)
    typer.echo(f"{said(result)} (written to the relay database {where})")
    if not served:
        typer.echo(
            f"engram tenant: warning: no relay is connected to {where}, so no running relay"
            " serves this change. --database-url names the relay's own database (where"
            " tenants are configured); a tenant's events go to --tenant-database-url.",
            err=True,
        )
    return result


def _existing(host: str, database_url: str | None, data_dir: str | None) -> TenantConfig:
    """The tenant on HOST, or exit 1 saying there is none."""
    from relay.store import tenants as db

    key = _host(host)
    cfg = _run(database_url, data_dir, lambda conn: db.get_tenant(conn, key))
    if cfg is None:
        raise _fail(f"no tenant {key}")
    return cfg


def _show(cfg: TenantConfig) -> None:
    from cli.ops import mask_url

    data = msgspec.to_builtins(cfg)
    if data.get("database_url"):
        data["database_url"] = mask_url(data["database_url"])
    typer.echo(json.dumps(data, indent=2, sort_keys=True))


async def _prepare(url: str) -> None:
    """A tenant database must be reachable and migrated before any tenant points at it."""
    from relay.store.migrate import migrate_url

    try:
        await migrate_url(url)
    except Exception as exc:
        raise _fail(f"cannot prepare the tenant database: {type(exc).__name__}: {exc}", 2) from exc


def _check_write(write: str | None) -> None:
    if write is not None and write not in WRITE_POLICIES:
        raise _fail(f"--write must be one of: {', '.join(WRITE_POLICIES)}")


@tenant_app.command("add")
def add(
    host: str,
    name: NameOpt = None,
    description: DescOpt = None,
    pubkey: PubkeyOpt = None,
    contact: ContactOpt = None,
    icon: IconOpt = None,
    alias: AliasOpt = None,
    write: WriteOpt = "open",
    auth_required: Annotated[bool, typer.Option(help="Require NIP-42 AUTH first.")] = False,
    limit: LimitOpt = None,
    tenant_database_url: OwnDatabaseOpt = None,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Add a tenant served on HOST (and its aliases), on its own database if given."""
    from relay.store import tenants as db

    _check_write(write)
    cfg = TenantConfig(
        host=_host(host),
        name=name,
        description=description,
        pubkey=_pubkey(pubkey) if pubkey else None,
        contact=contact,
        icon=icon,
        write_policy=write or "open",
        auth_required=auth_required,
        limits=_limits(limit),
        aliases=sorted({_host(a) for a in alias or ()} - {_host(host)}),
        database_url=tenant_database_url or None,
    )

    async def action(conn: Any) -> None:
        for h in (cfg.host, *cfg.aliases):
            if await db.host_taken(conn, h):
                raise _fail(f"{h} is already served by a tenant")
        if cfg.database_url:
            await _prepare(cfg.database_url)
        await db.add_tenant(conn, cfg)

    _change(database_url, data_dir, action, lambda _: f"added tenant {cfg.host}")


@tenant_app.command("set")
def set_(
    host: str,
    name: NameOpt = None,
    description: DescOpt = None,
    pubkey: PubkeyOpt = None,
    contact: ContactOpt = None,
    icon: IconOpt = None,
    alias: AliasOpt = None,
    write: WriteOpt = None,
    auth_required: Annotated[
        bool | None, typer.Option("--auth-required/--no-auth-required", help="AUTH first.")
    ] = None,
    limit: LimitOpt = None,
    tenant_database_url: OwnDatabaseOpt = None,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Change a tenant: only the options given are changed (aliases and limits are added).

    --tenant-database-url (or `default`) only re-points a tenant that holds no events
    yet; `engram tenant move` moves one that does."""
    from relay.store import tenants as db

    _check_write(write)
    key = _host(host)
    fields: dict[str, Any] = {
        k: v
        for k, v in {
            "name": name,
            "description": description,
            "pubkey": _pubkey(pubkey) if pubkey else None,
            "contact": contact,
            "icon": icon,
            "write_policy": write,
            "auth_required": auth_required,
        }.items()
        if v is not None
    }
    if limit:
        fields["limits"] = _limits(limit)
    if alias:
        fields["aliases"] = sorted({_host(a) for a in alias})
    if tenant_database_url:
        fields["database_url"] = None if tenant_database_url == "default" else tenant_database_url

    async def action(conn: Any) -> None:
        if await db.get_tenant(conn, key) is None:
            raise _fail(f"no tenant {key}")
        if "database_url" in fields:
            held = await db.on_events_database(conn, key, lambda c: db.event_count(c, key))
            if held:
                raise _fail(f"{key} holds {held} events; use `engram tenant move {key} --to URL`")
            if fields["database_url"]:
                await _prepare(fields["database_url"])
        for h in fields.get("aliases", ()):
            if await db.host_taken(conn, h):
                raise _fail(f"{h} is already served by a tenant")
        await db.update_tenant(conn, key, **fields)

    _change(database_url, data_dir, action, lambda _: f"updated tenant {key}")


@tenant_app.command("move")
def move(
    host: str,
    to: Annotated[
        str, typer.Option("--to", help="PostgreSQL URL of the new database, or `default`.")
    ],
    grace: Annotated[
        float | None,
        typer.Option(
            help="Seconds to keep carrying late writes over after the switch"
            " (default: 3 x tenant_refresh_seconds, at least 10).",
        ),
    ] = None,
    purge_source: Annotated[
        bool, typer.Option(help="Delete the tenant's rows from the old database afterwards.")
    ] = False,
    merge: Annotated[
        bool, typer.Option(help="Copy even if the target already holds events of HOST.")
    ] = False,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Move a tenant's events to another database while the relay keeps serving it."""
    from cli.move import move_tenant
    from relay.store import StoreError

    key = _host(host)
    settings = settings_or_exit(database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)
    wait = grace if grace is not None else max(10.0, 3 * settings.tenant_refresh_seconds)

    def say(line: str) -> None:
        typer.echo(line, err=True)

    try:
        report = asyncio.run(move_tenant(settings, url, key, to, wait, purge_source, merge, say))
    except StoreError as exc:
        raise _fail(str(exc).removeprefix("error: "), 2) from exc
    typer.echo(
        f"moved {key}: copied {report.copied}, caught up {report.caught_up},"
        f" rejected {report.rejected}; target holds {report.target_events},"
        f" source holds {report.source_events}"
        + (f" (purged {report.purged})" if purge_source else "")
    )


@tenant_app.command("ls")
def ls(database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """List tenants: host, write policy, members, aliases."""
    from relay.store import tenants as db

    for cfg in _run(database_url, data_dir, db.load_tenants):
        aliases = ",".join(cfg.aliases) or "-"
        typer.echo(f"{cfg.host}\t{cfg.write_policy}\t{len(cfg.members)} members\t{aliases}")


@tenant_app.command("show")
def show(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Everything stored about one tenant, as JSON."""

    _show(_existing(host, database_url, data_dir))


@tenant_app.command("rm")
def rm(
    host: str,
    purge: Annotated[bool, typer.Option(help="Also delete the tenant's events.")] = False,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Remove a tenant; refused while it holds events unless --purge."""
    from relay.store import tenants as db

    key = _host(host)

    async def action(conn: Any) -> int:
        from relay.store.move import purge_tenant_events

        if await db.get_tenant(conn, key) is None:
            raise _fail(f"no tenant {key}")
        held = await db.on_events_database(conn, key, lambda c: db.event_count(c, key))
        if held and not purge:
            raise _fail(f"{key} holds {held} events; use --purge to delete them too")
        if await db.events_database(conn, key):  # events on the tenant's own database
            deleted = await db.on_events_database(conn, key, lambda c: purge_tenant_events(c, key))
            return deleted + await db.remove_tenant(conn, key, False)
        return await db.remove_tenant(conn, key, purge)

    _change(database_url, data_dir, action, lambda n: f"removed tenant {key} ({n} events deleted)")


def _member_action(host: str, pubkey: str, add: bool) -> Callable[[Any], Awaitable[bool]]:
    from relay.store import moderation as mod
    from relay.store import tenants as db

    async def action(conn: Any) -> bool:
        if await db.get_tenant(conn, host) is None:
            raise _fail(f"no tenant {host}")
        # adding is NIP-86 `allowpubkey`: an allowed author is no longer banned
        change = mod.allow_pubkey if add else db.remove_member
        return await change(conn, host, pubkey)

    return action


@member_app.command("add")
def member_add(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Make PUBKEY (hex or npub) a member of the tenant on HOST (lifts a ban of it)."""
    key, pk = _host(host), _pubkey(pubkey)
    _change(
        database_url,
        data_dir,
        _member_action(key, pk, add=True),
        lambda changed: f"{'added' if changed else 'already a member:'} {pk} to {key}",
    )


@member_app.command("rm")
def member_rm(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Remove PUBKEY from the tenant's members."""
    key, pk = _host(host), _pubkey(pubkey)
    action = _member_action(key, pk, add=False)

    async def remove(conn: Any) -> bool:
        if not await action(conn):
            raise _fail(f"{pk} is not a member of {key}")
        return True

    _change(database_url, data_dir, remove, lambda _: f"removed {pk} from {key}")


@member_app.command("ls")
def member_ls(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """List the tenant's members (hex pubkeys)."""

    for pk in _existing(host, database_url, data_dir).members:
        typer.echo(pk)


# --- admins and moderation (the state the NIP-86 management API reads and writes) -------

admin_app = typer.Typer(help="Admins of a tenant: who may call its NIP-86 management API.")
tenant_app.add_typer(admin_app, name="admin")
ReasonOpt = Annotated[str, typer.Option(help="Why (shown by the list methods).")]


def _admin_action(host: str, pubkey: str, add: bool) -> Callable[[Any], Awaitable[bool]]:
    from relay.store import moderation as mod
    from relay.store import tenants as db

    async def action(conn: Any) -> bool:
        if await db.get_tenant(conn, host) is None:
            raise _fail(f"no tenant {host}")
        return await (mod.add_admin if add else mod.remove_admin)(conn, host, pubkey)

    return action


@admin_app.command("add")
def admin_add(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Let PUBKEY (hex or npub) manage the tenant on HOST through NIP-86."""
    key, pk = _host(host), _pubkey(pubkey)
    changed = _run(database_url, data_dir, _admin_action(key, pk, add=True))
    typer.echo(f"{'added' if changed else 'already an admin:'} {pk} to {key}")


@admin_app.command("rm")
def admin_rm(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Remove PUBKEY from the tenant's admins."""
    key, pk = _host(host), _pubkey(pubkey)
    if not _run(database_url, data_dir, _admin_action(key, pk, add=False)):
        raise _fail(f"{pk} is not an admin of {key}")
    typer.echo(f"removed admin {pk} from {key}")


@admin_app.command("ls")
def admin_ls(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """List the tenant's admins (hex pubkeys)."""
    for pk in _existing(host, database_url, data_dir).admins:
        typer.echo(pk)


def _moderate(
    host: str,
    database_url: str | None,
    data_dir: str | None,
    action: Callable[[Any, Any, str], Awaitable[T]],
) -> T:
    """Run `action(control, events, tenant key)`: HOST is a tenant, or `default` (the
    built-in tenant of a relay without tenants)."""
    from relay.store import DEFAULT_TENANT
    from relay.store import tenants as db

    key = _host(host)

    async def run(conn: Any) -> T:
        if key != DEFAULT_TENANT and await db.get_tenant(conn, key) is None:
            raise _fail(f"no tenant {key} (`default` is the relay without tenants)")
        return await db.on_events_database(conn, key, lambda events: action(conn, events, key))

    return _run(database_url, data_dir, run)


def _event_id(raw: str) -> str:
    from engram.nip01 import is_hex

    value = raw.strip().lower()
    if not is_hex(value, 64):
        raise _fail(f"not an event id (64 hex characters): {raw!r}")
    return value


def _ip(raw: str) -> str:
    from relay.moderation import normalize_ip

    value = normalize_ip(raw)
    if not value:
        raise _fail(f"not an IP address: {raw!r}")
    return value


@tenant_app.command("ban")
def ban(
    host: str,
    pubkey: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Ban PUBKEY on HOST: its stored events are deleted, new ones refused `blocked:`."""
    from relay.store import moderation as mod

    pk = _pubkey(pubkey)
    n = _moderate(host, database_url, data_dir, lambda c, e, k: mod.ban_pubkey(c, e, k, pk, reason))
    typer.echo(f"banned {pk} ({n} events deleted)")


@tenant_app.command("unban")
def unban(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Lift a ban of PUBKEY (its deleted events stay deleted)."""
    from relay.store import moderation as mod

    pk = _pubkey(pubkey)
    if not _moderate(host, database_url, data_dir, lambda c, e, k: mod.unban_pubkey(c, k, pk)):
        raise _fail(f"{pk} is not banned")
    typer.echo(f"unbanned {pk}")


@tenant_app.command("ban-event")
def ban_event(
    host: str,
    event_id: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Ban an event: deleted now, refused if sent again."""
    from relay.store import moderation as mod

    eid = _event_id(event_id)
    n = _moderate(host, database_url, data_dir, lambda c, e, k: mod.ban_event(c, e, k, eid, reason))
    typer.echo(f"banned event {eid} ({n} deleted)")


@tenant_app.command("allow-event")
def allow_event(
    host: str,
    event_id: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Approve a reported event (off the moderation queue); lifts a ban of it."""
    from relay.store import moderation as mod

    eid = _event_id(event_id)
    _moderate(host, database_url, data_dir, lambda c, e, k: mod.allow_event(c, k, eid, reason))
    typer.echo(f"allowed event {eid}")


def _forget_event(
    host: str, event_id: str, banned: bool, db_url: str | None, d: str | None
) -> None:
    from relay.store import moderation as mod

    eid = _event_id(event_id)
    if not _moderate(host, db_url, d, lambda c, e, k: mod.unmoderate_event(c, k, eid, banned)):
        raise _fail(f"event {eid} is not {'banned' if banned else 'allowed'}")
    typer.echo(f"{'unbanned' if banned else 'unallowed'} event {eid}")


@tenant_app.command("unban-event")
def unban_event(
    host: str, event_id: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Lift a ban of an event id (it may be sent again; what was deleted stays deleted)."""
    _forget_event(host, event_id, True, database_url, data_dir)


@tenant_app.command("unallow-event")
def unallow_event(
    host: str, event_id: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Forget an approval: a reported event is back on the moderation queue."""
    _forget_event(host, event_id, False, database_url, data_dir)


def _kind_command(host: str, kind: int, how: str, db_url: str | None, d: str | None) -> None:
    from relay.store import moderation as mod

    if not 0 <= kind <= 65535:
        raise _fail(f"kind must be 0-65535, got {kind}")
    if how == "clear":
        _moderate(host, db_url, d, lambda c, e, k: mod.clear_kind(c, k, kind))
    else:
        _moderate(host, db_url, d, lambda c, e, k: mod.set_kind(c, k, kind, how == "allow"))
    typer.echo(f"kind {kind}: {how}ed" if how != "clear" else f"kind {kind}: cleared")


@tenant_app.command("allow-kind")
def allow_kind(
    host: str, kind: int, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Allow KIND; once any kind is allowed, only allowed kinds are accepted."""
    _kind_command(host, kind, "allow", database_url, data_dir)


@tenant_app.command("disallow-kind")
def disallow_kind(
    host: str, kind: int, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Refuse new events of KIND (`blocked:`)."""
    _kind_command(host, kind, "disallow", database_url, data_dir)


@tenant_app.command("clear-kind")
def clear_kind(
    host: str, kind: int, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Forget an allow-kind or disallow-kind of KIND."""
    _kind_command(host, kind, "clear", database_url, data_dir)


@tenant_app.command("block-ip")
def block_ip(
    host: str,
    ip: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Refuse websocket connections from IP (HTTP 403)."""
    from relay.store import moderation as mod

    addr = _ip(ip)
    _moderate(host, database_url, data_dir, lambda c, e, k: mod.block_ip(c, k, addr, reason))
    typer.echo(f"blocked {addr}")


@tenant_app.command("unblock-ip")
def unblock_ip(
    host: str, ip: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Let IP connect again."""
    from relay.store import moderation as mod

    addr = _ip(ip)
    if not _moderate(host, database_url, data_dir, lambda c, e, k: mod.unblock_ip(c, k, addr)):
        raise _fail(f"{addr} is not blocked")
    typer.echo(f"unblocked {addr}")


@tenant_app.command("moderation")
def moderation(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """The tenant's moderation as JSON: bans, kinds, blocked addresses and the reported
    events still waiting for a decision (what the NIP-86 list methods answer)."""
    from relay.nip86 import reasoned
    from relay.store import moderation as mod

    async def gather(c: Any, e: Any, k: str) -> dict[str, Any]:
        return {
            "banned_pubkeys": reasoned(await mod.banned_pubkeys(c, k), "pubkey"),
            "banned_events": reasoned(await mod.banned_events(c, k), "id"),
            "allowed_events": reasoned(await mod.moderated_events(c, k, False), "id"),
            "allowed_kinds": await mod.kinds(c, k, True),
            "disallowed_kinds": await mod.kinds(c, k, False),
            "blocked_ips": reasoned(await mod.blocked_ips(c, k), "ip"),
            "events_needing_moderation": reasoned(
                await mod.events_needing_moderation(c, e, k), "id"
            ),
        }

    typer.echo(json.dumps(_moderate(host, database_url, data_dir, gather), indent=2))
