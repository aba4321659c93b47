"""The `engram` command: root typer app. Subcommand groups live in their own modules."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from cli.commands.common import (
    ConfigOpt,
    DatabaseOpt,
    DataDirOpt,
    resolve_database_url,
    settings_or_exit,
)
from cli.commands.lazy import lazy_group

# Each subcommand below is imported only when it runs, or when help lists them all
# (cli.commands.lazy says why). Each registers itself as an eager `app.command(...)` /
# `app.add_typer(...)` would.


def _acp(app: typer.Typer) -> None:
    from cli.commands.acp import ACP_CONTEXT_SETTINGS, acp_command

    app.command("acp", context_settings=ACP_CONTEXT_SETTINGS)(acp_command)


def _keygen(app: typer.Typer) -> None:
    from cli.commands.ops import keygen

    app.command("keygen")(keygen)


def _mcp(app: typer.Typer) -> None:
    from cli.commands.mcp import mcp_command

    app.command("mcp")(mcp_command)


def _review(app: typer.Typer) -> None:
    from cli.commands.review import review_command

    app.command("review")(review_command)


def _export(app: typer.Typer) -> None:
    from cli.commands import data

    app.command("export")(data.export)


def _import(app: typer.Typer) -> None:
    from cli.commands import data

    app.command("import")(data.import_)


def _prune(app: typer.Typer) -> None:
    from cli.commands import data

    app.command("prune")(data.prune)


def _sync(app: typer.Typer) -> None:
    from cli.commands.sync import sync_command

    app.command("sync")(sync_command)


def _mem(app: typer.Typer) -> None:
    from cli.commands import mem, mem_history  # noqa: F401  (their commands register on mem_app)
    from cli.commands.mem_common import mem_app

    app.add_typer(mem_app, name="mem")


def _tenant(app: typer.Typer) -> None:
    from cli.commands.tenant import tenant_app

    app.add_typer(tenant_app, name="tenant")


def _config(app: typer.Typer) -> None:
    from cli.commands.ops import config_app

    app.add_typer(config_app, name="config")


LAZY = {
    "acp": _acp,
    "keygen": _keygen,
    "mcp": _mcp,
    "review": _review,
    "export": _export,
    "import": _import,
    "prune": _prune,
    "sync": _sync,
    "mem": _mem,
    "tenant": _tenant,
    "config": _config,
}
# The order `engram --help` lists them in: serve, bench, migrate and db are this module's.
ORDER = (
    *("acp", "keygen", "mcp", "review", "export", "import", "prune", "sync"),
    *("serve", "bench", "migrate", "mem", "db", "tenant", "config"),
)

app = typer.Typer(
    name="engram",
    help="engram-relay: a Nostr relay for encrypted agent memory, and its client tools.",
    no_args_is_help=True,
    add_completion=False,
    cls=lazy_group(ORDER, LAZY),
)
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 7777).")] = None,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
    config: ConfigOpt = None,
    tls_cert: Annotated[str | None, typer.Option(help="PEM certificate: serve wss://.")] = None,
    tls_key: Annotated[str | None, typer.Option(help="PEM private key for --tls-cert.")] = None,
    log_format: Annotated[str | None, typer.Option(help="text (default) or json lines.")] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="Relay processes on this port (live events shared).")
    ] = 1,
    replica_url: Annotated[
        list[str] | None,
        typer.Option(
            "--replica-url",
            help="Read replica (streaming standby) URL for REQ/COUNT; repeatable"
            " (env: ENGRAM_REPLICA_URLS, comma-separated).",
        ),
    ] = None,
    public_url: Annotated[
        list[str] | None,
        typer.Option(
            "--public-url",
            help="A URL clients use for this relay, e.g. wss://relay.example.com: NIP-42"
            " AUTH, NIP-62 and NIP-98 must name one. Repeatable (env: ENGRAM_PUBLIC_URLS,"
            " comma-separated). Behind a proxy, set it. Default: only the URL it listens on.",
        ),
    ] = None,
) -> None:
    """Run the relay (uvicorn + uvloop) on PostgreSQL; embedded PostgreSQL if no URL is set."""
    import logging

    from relay.config import unknown_variables
    from relay.identity import listen_urls, parse_public_urls, startup_note
    from relay.logs import setup_logging
    from relay.server import BindError, bind_listener, run_one, run_workers, uvicorn_options

    settings = settings_or_exit(
        config_file=config,
        host=host,
        port=port,
        database_url=database_url,
        data_dir=data_dir,
        tls_cert=tls_cert,
        tls_key=tls_key,
        log_format=log_format,
        replica_urls=replica_url or None,
        public_urls=public_url or None,
    )
    if bool(settings.tls_cert) != bool(settings.tls_key):
        typer.echo("engram: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    setup_logging(settings.log_level, settings.log_format)
    for misspelt in unknown_variables(os.environ):  # else silently ignored
        logging.getLogger("engram").warning("%s", misspelt)
    try:  # first: a port in use fails at once, before a database is started for nothing
        sock = bind_listener(settings.host, settings.port)
    except BindError as exc:
        typer.echo(f"engram serve: {exc}", err=True)
        raise typer.Exit(1) from exc
    bound_port = sock.getsockname()[1]
    url, _embedded = resolve_database_url(settings)
    secure = bool(settings.tls_cert)
    where = f"[{settings.host}]" if ":" in settings.host else settings.host
    serving = f"engram-relay serving {'wss' if secure else 'ws'}://{where}:{bound_port}"
    note = startup_note(
        parse_public_urls(settings.public_urls, "public_urls"),
        listen_urls(secure, settings.host, bound_port),
    )
    if note:  # once, by the process that was started (not by each worker)
        exposed = settings.host not in ("127.0.0.1", "localhost", "::1")
        logging.getLogger("engram").log(logging.WARNING if exposed else logging.INFO, "%s", note)
    options = uvicorn_options(settings, bound_port)
    if workers == 1:
        if not run_one(settings, url, options, sock, serving):
            raise typer.Exit(1)  # the lifespan failed (database, migrations): logged above
        return
    os.environ.update(  # each worker rebuilds the same settings from the environment
        {
            "ENGRAM_DATABASE_URL": url,
            **({"ENGRAM_CONFIG": config} if config else {}),
            **({"ENGRAM_LOG_FORMAT": settings.log_format} if log_format else {}),
            **({"ENGRAM_REPLICA_URLS": ",".join(replica_url)} if replica_url else {}),
            **({"ENGRAM_PUBLIC_URLS": ",".join(public_url)} if public_url else {}),
        }
    )
    run_workers(workers, options, sock, serving)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    add_help_option=False,
)
def bench(ctx: typer.Context) -> None:
    """The benchmark suite: `engram bench micro|load|compare|crossnode|soak …`.

    Runs `python -m bench` in its own process: bench builds on cli, never the reverse.
    """
    import subprocess
    import sys

    raise typer.Exit(subprocess.call([sys.executable, "-m", "bench", *ctx.args]))


@app.command()
def migrate(database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Apply pending migrations, on tenant databases too (the relay also does this)."""
    import asyncio

    from cli.commands.ops import mask_url
    from relay.store.tenants import migrate_everywhere

    settings = settings_or_exit(database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)
    for where, name in asyncio.run(migrate_everywhere(url)):
        typer.echo(f"applied {name}" + (f" on {mask_url(where)}" if where else ""))


@db_app.command("status")
def db_status(database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Show each migration and whether it is applied."""
    import asyncio

    from relay.store.migrate import status_url

    settings = settings_or_exit(database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)
    for name, applied in asyncio.run(status_url(url)):
        typer.echo(f"{name}\t{'applied' if applied else 'pending'}")


@db_app.command("migrate")
def db_migrate(database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Same as `engram migrate`."""
    migrate(database_url=database_url, data_dir=data_dir)


if __name__ == "__main__":  # pragma: no cover
    app()
