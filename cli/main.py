"""The `engram` command: root typer app. Subcommand groups live in their own modules."""

from __future__ import annotations

import typer

from cli.mem import mem_app

app = typer.Typer(
    name="engram",
    help="engram-relay: a Nostr relay for encrypted agent memory, and its client tools.",
    no_args_is_help=True,
    add_completion=False,
)
app.add_typer(mem_app, name="mem")


@app.command()
def serve() -> None:
    """Run the relay (not built yet)."""
    typer.echo("engram serve: the relay is not built yet", err=True)
    raise typer.Exit(1)


if __name__ == "__main__":  # pragma: no cover
    app()
