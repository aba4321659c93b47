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
    from relay.store import tenants as db

    async def action(conn: Any) -> bool:
        if await db.get_tenant(conn, host) is None:
            raise _fail(f"no tenant {host}")
        change = db.add_member if add else db.remove_member
        return await change(conn, host, pubkey)

    return action


@member_app.command("add")
def member_add(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Make PUBKEY (hex or npub) a member of the tenant on HOST."""
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
