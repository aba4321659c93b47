"""`engram mem …`: read and write agent memory (engrams) on a relay."""

from __future__ import annotations

import typer

mem_app = typer.Typer(help="Read and write agent memory (NIP-AE engrams).", no_args_is_help=True)
