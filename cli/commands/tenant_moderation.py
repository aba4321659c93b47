"""`engram tenant ban|unban|ban-event|allow-event|…|moderation`: a tenant's moderation,
the same state the NIP-86 management API reads and writes (relay.store.moderation).

HOST is a tenant's host, or `default` for a relay without tenants. The commands are
merged into `engram tenant` (cli.commands.tenant), which prints a refused request's message.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer

from cli.commands import tenantadmin as admin
from cli.commands.common import DatabaseOpt, DataDirOpt, settings_or_exit

moderation_app = typer.Typer()

T = TypeVar("T")
ReasonOpt = Annotated[str, typer.Option(help="Why (shown by the list methods).")]


def _moderate(
    host: str,
    database_url: str | None,
    data_dir: str | None,
    action: Callable[[Any, Any, str], Awaitable[T]],
) -> T:
    """Run `action(control, events, tenant key)` on HOST's moderation state."""
    key = admin.host(host)
    settings = settings_or_exit(database_url=database_url, data_dir=data_dir)
    return admin.moderate(settings, key, action)


@moderation_app.command("ban")
def ban(
    host: str,
    pubkey: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Ban PUBKEY on HOST: its stored events are deleted, new ones refused `blocked:`."""
    from relay.store import moderation as mod

    pk = admin.pubkey(pubkey)
    n = _moderate(host, database_url, data_dir, lambda c, e, k: mod.ban_pubkey(c, e, k, pk, reason))
    typer.echo(f"banned {pk} ({n} events deleted)")


@moderation_app.command("unban")
def unban(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Lift a ban of PUBKEY (its deleted events stay deleted)."""
    from relay.store import moderation as mod

    pk = admin.pubkey(pubkey)
    if not _moderate(host, database_url, data_dir, lambda c, e, k: mod.unban_pubkey(c, k, pk)):
        raise admin.TenantError(f"{pk} is not banned")
    typer.echo(f"unbanned {pk}")


@moderation_app.command("ban-event")
def ban_event(
    host: str,
    event_id: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Ban an event: deleted now, refused if sent again."""
    from relay.store import moderation as mod

    eid = admin.event_id(event_id)
    n = _moderate(host, database_url, data_dir, lambda c, e, k: mod.ban_event(c, e, k, eid, reason))
    typer.echo(f"banned event {eid} ({n} deleted)")


@moderation_app.command("allow-event")
def allow_event(
    host: str,
    event_id: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Approve a reported event (off the moderation queue); lifts a ban of it."""
    from relay.store import moderation as mod

    eid = admin.event_id(event_id)
    _moderate(host, database_url, data_dir, lambda c, e, k: mod.allow_event(c, k, eid, reason))
    typer.echo(f"allowed event {eid}")


def _forget_event(
    host: str, event_id: str, banned: bool, db_url: str | None, d: str | None
) -> None:
    from relay.store import moderation as mod

    eid = admin.event_id(event_id)
    if not _moderate(host, db_url, d, lambda c, e, k: mod.unmoderate_event(c, k, eid, banned)):
        raise admin.TenantError(f"event {eid} is not {'banned' if banned else 'allowed'}")
    typer.echo(f"{'unbanned' if banned else 'unallowed'} event {eid}")


@moderation_app.command("unban-event")
def unban_event(
    host: str, event_id: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Lift a ban of an event id (it may be sent again; what was deleted stays deleted)."""
    _forget_event(host, event_id, True, database_url, data_dir)


@moderation_app.command("unallow-event")
def unallow_event(
    host: str, event_id: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Forget an approval: a reported event is back on the moderation queue."""
    _forget_event(host, event_id, False, database_url, data_dir)


def _kind_command(host: str, kind: int, how: str, db_url: str | None, d: str | None) -> None:
    from relay.store import moderation as mod

    admin.kind(kind)
    if how == "clear":
        _moderate(host, db_url, d, lambda c, e, k: mod.clear_kind(c, k, kind))
    else:
        _moderate(host, db_url, d, lambda c, e, k: mod.set_kind(c, k, kind, how == "allow"))
    typer.echo(f"kind {kind}: {how}ed" if how != "clear" else f"kind {kind}: cleared")


@moderation_app.command("allow-kind")
def allow_kind(
    host: str, kind: int, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Allow KIND; once any kind is allowed, only allowed kinds are accepted."""
    _kind_command(host, kind, "allow", database_url, data_dir)


@moderation_app.command("disallow-kind")
def disallow_kind(
    host: str, kind: int, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Refuse new events of KIND (`blocked:`)."""
    _kind_command(host, kind, "disallow", database_url, data_dir)


@moderation_app.command("clear-kind")
def clear_kind(
    host: str, kind: int, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Forget an allow-kind or disallow-kind of KIND."""
    _kind_command(host, kind, "clear", database_url, data_dir)


@moderation_app.command("block-ip")
def block_ip(
    host: str,
    ip: str,
    reason: ReasonOpt = "",
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Refuse websocket connections from IP (HTTP 403)."""
    from relay.store import moderation as mod

    addr = admin.ip(ip)
    _moderate(host, database_url, data_dir, lambda c, e, k: mod.block_ip(c, k, addr, reason))
    typer.echo(f"blocked {addr}")


@moderation_app.command("unblock-ip")
def unblock_ip(
    host: str, ip: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Let IP connect again."""
    from relay.store import moderation as mod

    addr = admin.ip(ip)
    if not _moderate(host, database_url, data_dir, lambda c, e, k: mod.unblock_ip(c, k, addr)):
        raise admin.TenantError(f"{addr} is not blocked")
    typer.echo(f"unblocked {addr}")


@moderation_app.command("moderation")
def moderation(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """The tenant's moderation as JSON: bans, kinds, blocked addresses and the reported
    events still waiting for a decision (what the NIP-86 list methods answer)."""
    state = _moderate(host, database_url, data_dir, admin.moderation_state)
    typer.echo(json.dumps(state, indent=2))
