"""`engram sync`: the command over `cli.nostr.reconcile` (options, progress bar, summary, exit
codes). The library (peers, reconciliation, copying) lives in `cli.nostr.peer` and
`cli.nostr.reconcile`; its names are re-exported here for existing callers."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Annotated

import msgspec
import typer

from cli.nostr.errors import AuthError, BadInputError, RelayError
from cli.nostr.identity import ENV_KEY, read_secret_key
from cli.nostr.reconcile import (
    DEFAULT_STEP_TIMEOUT,
    DEFAULT_TIMEOUT,
    DIRECTIONS,
    Peer,
    SyncSummary,
    reconcile,
    sync_relays,
)
from engram.nip01 import pubkey_of

__all__ = ["Peer", "reconcile", "sync_command", "sync_relays"]


class _Bar:
    """A one-line progress display on a terminal (stderr), nothing otherwise."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.shown = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        if total:
            width = 30
            filled = width * done // total
            text = f"{phase} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}"
        else:
            text = f"{phase} … {done}"
        sys.stderr.write("\r\x1b[2K" + text)
        sys.stderr.flush()
        self.shown = True

    def close(self) -> None:
        if self.shown:
            sys.stderr.write("\r\x1b[2K")
            sys.stderr.flush()


def _print_summary(s: SyncSummary, from_url: str, to_url: str) -> None:
    typer.echo(f"method: {s.method} ({s.rounds} rounds)" if s.rounds else f"method: {s.method}")
    for url, why in s.fallback_reasons.items():
        typer.echo(f"fallback: {url}: {why}")
    for url, why in s.incomplete.items():
        typer.echo(f"incomplete: {url}: {why}")
    typer.echo(f"have: {s.have} (only on {from_url})")
    typer.echo(f"need: {s.need} (only on {to_url})")
    typer.echo(f"copied: {s.copied_up} up, {s.copied_down} down")
    refused = ", ".join(f"{k}: {v}" for k, v in sorted(s.refused.items())) or "none"
    typer.echo(f"refused: {refused}")


def _gate_hint(refusal: str, flt: dict, seckey: bytes | None) -> str:
    """What to add when the relay's read gate refused a filter that names no reader.

    Agent memory (30174 and its history kinds) and the relay's private kinds (direct
    messages, gift wraps) are served only to a connection AUTHed as their author or
    recipient, and only for a filter that asks for that key's own (`authors` or `#p`): the
    relay's `restricted:` answer says who may read, this says what the filter lacks."""
    if "restricted:" not in refusal or seckey is None or "authors" in flt or "#p" in flt:
        return ""
    me = pubkey_of(seckey)
    return (
        "; name the authors (your own key) in the filter: agent memory and private kinds"
        f' are served only to their author or recipient: add "authors": ["{me}"] (what this'
        f' key wrote) or "#p": ["{me}"] (what was addressed to it)'
    )


def _fail(message: str, code: int, bar: _Bar | None = None) -> typer.Exit:
    if bar is not None:
        bar.close()
    typer.echo(f"engram: {' '.join(message.split())}", err=True)
    return typer.Exit(code)


def sync_command(
    from_url: Annotated[str, typer.Option("--from", help="Relay URL to copy from (ws:// wss://).")],
    to_url: Annotated[str, typer.Option("--to", help="Relay URL to copy to.")],
    filter_json: Annotated[
        str, typer.Option("--filter", help="NIP-01 filter as JSON (default {}: everything).")
    ] = "{}",
    direction: Annotated[
        str,
        typer.Option(
            "--direction", help="up: --from to --to (default); down: --to to --from; both."
        ),
    ] = "up",
    key_file: Annotated[
        Path | None,
        typer.Option("--key-file", help=f"Key for AUTH when a relay asks (else env {ENV_KEY})."),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option("--timeout", help="Seconds for the whole run; past it, exit code 2."),
    ] = DEFAULT_TIMEOUT,
    step_timeout: Annotated[
        float,
        typer.Option(
            "--step-timeout",
            help="Seconds for any one answer (connecting, a negentropy message, EOSE, OKs);"
            " a relay silent on NIP-77 that long is paged with REQ instead.",
        ),
    ] = DEFAULT_STEP_TIMEOUT,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Copy the events two relays do not share (NIP-77 negentropy, else REQ paging).

    Exit codes: 0 done, 1 bad input, 2 a relay failed or stalled (named), 3 AUTH refused."""
    try:
        flt = json.loads(filter_json)
    except ValueError as exc:
        raise _fail(f"--filter must be a JSON object: {exc}", 1) from exc
    if not isinstance(flt, dict):
        raise _fail(f"--filter must be a JSON object, not {type(flt).__name__}", 1)
    if direction not in DIRECTIONS:
        raise _fail(f"--direction must be one of {', '.join(DIRECTIONS)}, not {direction!r}", 1)
    seckey: bytes | None = None
    try:
        if key_file is not None or os.environ.get(ENV_KEY):
            seckey = read_secret_key(key_file)
        for url in (from_url, to_url):
            if not url.startswith(("ws://", "wss://")):
                raise BadInputError(f"relay URL must start with ws:// or wss://: {url!r}")
    except BadInputError as exc:
        raise _fail(str(exc), 1) from exc
    bar = _Bar(sys.stderr.isatty() and not as_json)
    try:
        summary = asyncio.run(
            sync_relays(
                from_url, to_url, flt, direction, seckey, timeout, bar, step_timeout=step_timeout
            )
        )
    except BadInputError as exc:
        raise _fail(str(exc), 1, bar) from exc
    except AuthError as exc:
        raise _fail(str(exc) + _gate_hint(str(exc), flt, seckey), 3, bar) from exc
    except (RelayError, TimeoutError, OSError) as exc:
        raise _fail(str(exc) or "timed out waiting for a relay", 2, bar) from exc
    bar.close()
    if as_json:
        typer.echo(msgspec.json.encode(summary.as_dict()).decode())
    else:
        _print_summary(summary, from_url, to_url)
    for url, why in summary.incomplete.items():
        typer.echo(f"engram: warning: {url}: listing may be incomplete: {why}", err=True)
