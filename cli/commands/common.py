"""What several `engram` commands share: settings, the database URL, common options."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:  # imported when used: `engram mem …` does not need the relay's settings
    from relay.config import Settings

ConfigOpt = Annotated[
    str | None, typer.Option("--config", help="TOML settings file (env: ENGRAM_CONFIG).")
]
DatabaseOpt = Annotated[
    str | None,
    typer.Option("--database-url", help="PostgreSQL URL (env: ENGRAM_DATABASE_URL)."),
]
DataDirOpt = Annotated[
    str | None,
    typer.Option("--data-dir", help="Embedded PostgreSQL data directory (env: ENGRAM_DATA_DIR)."),
]


def settings_or_exit(**overrides: object) -> Settings:
    """Effective settings; a configuration error ends the command naming the setting."""
    from relay.config import ConfigError, load_settings

    try:
        return load_settings(**overrides)  # type: ignore[arg-type]
    except ConfigError as exc:
        typer.echo(f"engram: configuration error: {exc}", err=True)
        raise typer.Exit(2) from exc


def resolve_database_url(settings: Settings) -> tuple[str, object | None]:
    """The configured URL, or an embedded PostgreSQL started in the data directory.

    The second item keeps the embedded server's handle alive for the caller's lifetime.
    """
    if settings.database_url:
        return settings.database_url, None
    from relay.store.embedded import MissingDataDir, start_embedded

    try:
        return start_embedded(settings.data_dir)
    except MissingDataDir as exc:  # a mistyped --data-dir: nothing is created
        typer.echo(f"engram: {exc}", err=True)
        raise typer.Exit(2) from exc
