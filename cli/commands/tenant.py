"""`engram tenant …`: tenants (by host), aliases, members and per-tenant NIP-11/limits.

Changes are written to the relay's own database (`--database-url` /
`ENGRAM_DATABASE_URL`: where tenants are configured); running relays on that database
pick them up within seconds. A tenant's events may live on a database of their own
(`--tenant-database-url`). The two are easy to mix up, so every change says which
database it was written to, and warns when no relay is connected to that database.

The commands are thin: what they do is `cli.commands.tenantadmin`; the moderation commands are
`cli.commands.tenant_moderation`. A `TenantError` from either ends the command here, once.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from typer.core import TyperGroup

from cli.commands import tenantadmin as admin
from cli.commands.common import DatabaseOpt, DataDirOpt, settings_or_exit
from cli.commands.tenant_moderation import moderation_app
from relay.config import Settings
from relay.tenants import DEFAULT_TENANT, TenantConfig


class _TenantGroup(TyperGroup):
    """`engram tenant`: a refused request prints `engram tenant: …` and exits with its
    code, whichever subcommand (or sub-group) raised it."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except admin.TenantError as exc:
            typer.echo(f"engram tenant: {exc}", err=True)
            raise typer.Exit(exc.exit_code) from exc


tenant_app = typer.Typer(
    cls=_TenantGroup, help="Tenants: one relay, many communities (bound by Host)."
)
tenant_app.add_typer(moderation_app)  # ban, unban, ...: listed after this module's commands
member_app = typer.Typer(help="Members of a tenant (who may publish under --write members).")
tenant_app.add_typer(member_app, name="member")
admin_app = typer.Typer(help="Admins of a tenant: who may call its NIP-86 management API.")
tenant_app.add_typer(admin_app, name="admin")

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
PublicUrlOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--public-url",
        help="A URL clients use for this tenant (wss://HOST on one of its hosts): NIP-42"
        " AUTH, NIP-62 and NIP-98 must name one. Repeatable; `set` replaces the list (`-`"
        " clears it). None: its hosts at the scheme and port of the relay's public URLs.",
    ),
]
ChallengeOpt = Annotated[
    str | None,
    typer.Option(
        "--auth-challenge",
        help="NIP-42 challenge: on-connect, or when-needed (with the first auth-required"
        " answer); `default`: the relay's auth_challenge setting.",
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


def _settings(database_url: str | None, data_dir: str | None) -> Settings:
    return settings_or_exit(database_url=database_url, data_dir=data_dir)


def _change(
    database_url: str | None,
    data_dir: str | None,
    action: admin.Action[T],
    said: Callable[[T], str],
) -> T:
    """Run one change; print what it did and the database it was written to, and warn
    when no relay is connected to that database (the change is then served by nobody)."""
    from cli.commands.ops import mask_url

    result, url, served = admin.session(_settings(database_url, data_dir), action, True)
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
    public_url: PublicUrlOpt = None,
    auth_challenge: ChallengeOpt = None,
    tenant_database_url: OwnDatabaseOpt = None,
    adopt: Annotated[
        bool,
        typer.Option(
            "--adopt",
            help="The first tenant: serve the events the relay stored before it had"
            " tenants (run with the relay stopped).",
        ),
    ] = False,
    leave_default: Annotated[
        bool,
        typer.Option(
            "--leave-default",
            help="The first tenant: start empty and leave the events stored before"
            " unserved (served again once the last tenant is removed).",
        ),
    ] = False,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Add a tenant served on HOST (and its aliases), on its own database if given.

    The first tenant of a relay that holds events is refused unless --adopt or
    --leave-default says what becomes of them: with tenants, only tenants' hosts are
    served."""
    admin.check_write(write)
    cfg = TenantConfig(
        host=admin.host(host),
        name=name,
        description=description,
        pubkey=admin.pubkey(pubkey) if pubkey else None,
        contact=contact,
        icon=icon,
        write_policy=write or "open",
        auth_required=auth_required,
        limits=admin.limits(limit),
        aliases=sorted({admin.host(a) for a in alias or ()} - {admin.host(host)}),
        database_url=tenant_database_url or None,
        public_urls=list(public_url or ()),
        auth_challenge=None if auth_challenge in (None, "default") else auth_challenge,
    )
    admin.check_tenant_identity(cfg)
    action = admin.add_tenant(cfg, adopt, leave_default)
    try:
        added = _change(database_url, data_dir, action, lambda a: _added(cfg.host, a))
    except admin.DefaultEventsHidden as exc:
        raise admin.TenantError(_hidden(exc)) from exc
    if added.first:
        typer.echo(
            f"engram tenant: note: the relay now serves tenants' hosts only: any other host"
            f" (ws://127.0.0.1:PORT included) answers 404. For local tools, serve it under"
            f" {cfg.host} too: engram tenant set {cfg.host} --alias 127.0.0.1 --alias localhost",
            err=True,
        )


def _added(host: str, added: admin.Added) -> str:
    if not added.adopted:
        return f"added tenant {host}"
    return f"added tenant {host}, serving the {added.adopted} events stored before"


def _hidden(exc: admin.DefaultEventsHidden) -> str:
    """The refusal of a first tenant that would hide the relay's events, with the two
    commands that say what becomes of them (this command line, and one flag more)."""
    from cli.commands.ops import mask_url

    words = ["engram", *(a for a in sys.argv[1:] if a not in ("--adopt", "--leave-default"))]
    command = " ".join(shlex.quote(mask_url(w) if "://" in w else w) for w in words)
    return (
        f"the relay holds {exc.held} events stored before it had tenants (the built-in"
        " tenant, which serves every host while no tenant is configured). With a tenant,"
        " only tenants' hosts are served, so they would no longer be read anywhere."
        f" To serve them under {exc.host}: stop the relay, run\n    {command} --adopt\n"
        "and start it again. To start the tenant empty and leave them unserved (served"
        f" again once the last tenant is removed):\n    {command} --leave-default"
    )


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
    public_url: PublicUrlOpt = None,
    auth_challenge: ChallengeOpt = None,
    tenant_database_url: OwnDatabaseOpt = None,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Change a tenant: only the options given are changed (aliases and limits are added).

    --tenant-database-url (or `default`) only re-points a tenant that holds no events
    yet; `engram tenant move` moves one that does."""
    admin.check_write(write)
    key = admin.host(host)
    fields: dict[str, Any] = {
        k: v
        for k, v in {
            "name": name,
            "description": description,
            "pubkey": admin.pubkey(pubkey) if pubkey else None,
            "contact": contact,
            "icon": icon,
            "write_policy": write,
            "auth_required": auth_required,
        }.items()
        if v is not None
    }
    if limit:
        fields["limits"] = admin.limits(limit)
    if alias:
        fields["aliases"] = sorted({admin.host(a) for a in alias})
    if tenant_database_url:
        fields["database_url"] = None if tenant_database_url == "default" else tenant_database_url
    if public_url:
        fields["public_urls"] = [u for u in public_url if u != "-"]
    if auth_challenge:
        fields["auth_challenge"] = None if auth_challenge == "default" else auth_challenge
    _change(
        database_url, data_dir, admin.update_tenant(key, fields), lambda _: f"updated tenant {key}"
    )


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
    key = admin.host(host)

    def say(line: str) -> None:
        typer.echo(line, err=True)

    settings = _settings(database_url, data_dir)
    report = admin.move(settings, key, to, grace, purge_source, merge, say)
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

    for cfg in admin.run(_settings(database_url, data_dir), db.load_tenants):
        aliases = ",".join(cfg.aliases) or "-"
        write = cfg.write_policy
        if cfg.host == DEFAULT_TENANT:  # the built-in tenant's overrides: a limit, if set
            members = cfg.limits.get("restricted_writes")
            write = "(settings)" if members is None else "members" if members else "open"
            aliases = "(built-in)"
        typer.echo(f"{cfg.host}\t{write}\t{len(cfg.members)} members\t{aliases}")


@tenant_app.command("show")
def show(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Everything stored about one tenant, as JSON."""
    key = admin.host(host)
    typer.echo(admin.tenant_json(admin.existing(_settings(database_url, data_dir), key)))


@tenant_app.command("rm")
def rm(
    host: str,
    purge: Annotated[bool, typer.Option(help="Also delete the tenant's events.")] = False,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Remove a tenant; refused while it holds events unless --purge."""
    key = admin.host(host)
    _change(
        database_url,
        data_dir,
        admin.remove_tenant(key, purge),
        lambda n: f"removed tenant {key} ({n} events deleted)",
    )


# --- members and admins -------------------------------------------------------------------


@member_app.command("add")
def member_add(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Make PUBKEY (hex or npub) a member of the tenant on HOST (lifts a ban of it)."""
    key, pk = admin.host(host), admin.pubkey(pubkey)
    _change(
        database_url,
        data_dir,
        admin.change_member(key, pk, add=True),
        lambda changed: f"{'added' if changed else 'already a member:'} {pk} to {key}",
    )


@member_app.command("rm")
def member_rm(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Remove PUBKEY from the tenant's members."""
    key, pk = admin.host(host), admin.pubkey(pubkey)
    action = admin.change_member(key, pk, add=False)

    async def remove(conn: Any) -> bool:
        if not await action(conn):
            raise admin.TenantError(f"{pk} is not a member of {key}")
        return True

    _change(database_url, data_dir, remove, lambda _: f"removed {pk} from {key}")


@member_app.command("ls")
def member_ls(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """List the tenant's members (hex pubkeys)."""
    key = admin.host(host)
    for pk in admin.existing(_settings(database_url, data_dir), key).members:
        typer.echo(pk)


@admin_app.command("add")
def admin_add(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Let PUBKEY (hex or npub) manage the tenant on HOST through NIP-86."""
    key, pk = admin.host(host), admin.pubkey(pubkey)
    changed = admin.run(_settings(database_url, data_dir), admin.change_admin(key, pk, add=True))
    typer.echo(f"{'added' if changed else 'already an admin:'} {pk} to {key}")


@admin_app.command("rm")
def admin_rm(
    host: str, pubkey: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None
) -> None:
    """Remove PUBKEY from the tenant's admins."""
    key, pk = admin.host(host), admin.pubkey(pubkey)
    if not admin.run(_settings(database_url, data_dir), admin.change_admin(key, pk, add=False)):
        raise admin.TenantError(f"{pk} is not an admin of {key}")
    typer.echo(f"removed admin {pk} from {key}")


@admin_app.command("ls")
def admin_ls(host: str, database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """List the tenant's admins (hex pubkeys)."""
    key = admin.host(host)
    for pk in admin.existing(_settings(database_url, data_dir), key).admins:
        typer.echo(pk)
