"""`engram mem …`: read and write agent memory (engrams) on a relay.

The command layer only: options, input caps, output formats and the exit-code contract
(0 ok, 1 bad input or not found, 2 relay/network/timeout, 3 authentication, 4 other,
5 conflict). Protocol work lives in `cli.memory`, transport in `cli.client`.
Nothing here prints a key; decrypted text goes only to stdout of `get` (and `patch
--dry-run`, which shows the result it would write).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar

import msgspec
import typer
from typer.core import TyperGroup

from cli.client import AuthError, RelayClient, RelayError, fetch_nip11, max_limit_of, open_relay
from cli.identity import Identity, InputError, load_identity, relay_url
from cli.memory import ConflictError, list_heads, live_text, read_head, sha256_hex, write
from cli.patch import PatchError, apply_patch
from engram import (
    CORE_SLUG,
    Core,
    EngramError,
    Head,
    Lookup,
    Memory,
    Tombstone,
    body_text,
    core_profile,
    encode_body,
    listing,
    normalize_slug,
    reachability,
)

T = TypeVar("T")
STDIN_CAP = 65_535  # the NIP-44 plaintext limit: no value can be longer than this
PATCH_CAP = 1 << 20
DEFAULT_TIMEOUT = 10.0


class NotFoundError(Exception):
    """The slug has no live value (absent or tombstoned): exit code 1."""


EXIT_CODES: tuple[tuple[type[BaseException], int], ...] = (
    (NotFoundError, 1),
    (InputError, 1),
    (PatchError, 1),
    (EngramError, 1),  # invalid slug, body too large: the user's input
    (RelayError, 2),
    (AuthError, 3),
    (ConflictError, 5),
)


def fail(message: str, code: int) -> NoReturn:
    """Errors are exactly one line on stderr, then the exit code."""
    line = " ".join(message.split()) or "error"
    typer.echo(f"engram: {line}", err=True)
    raise typer.Exit(code)


# typer exports BadParameter but not its base, UsageError (click's, or typer's vendored copy).
UsageError: type[Exception] = typer.BadParameter.__mro__[1]


class MemGroup(TyperGroup):
    """Maps exceptions to the exit-code contract in one place, usage errors included.

    click would exit 2 on a usage error and print a multi-line panel; here bad input is
    exit 1 and one line, so 2 keeps meaning "the relay or the network failed".
    """

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, BrokenPipeError):
            raise  # typer's own handling: exit codes, and a quiet exit when stdout is closed
        except UsageError as exc:
            fail(exc.format_message(), 1)  # type: ignore[attr-defined]
        except Exception as exc:
            if isinstance(exc, TimeoutError):  # from asyncio.timeout: its message is empty
                fail("timed out waiting for the relay", 2)
            for kind, code in EXIT_CODES:
                if isinstance(exc, kind):
                    fail(f"conflict: {exc}" if isinstance(exc, ConflictError) else str(exc), code)
            fail(f"unexpected error: {type(exc).__name__}: {exc}", 4)


mem_app = typer.Typer(
    cls=MemGroup,
    help="Read and write agent memory (NIP-AE engrams).",
    no_args_is_help=True,
)

Relay = Annotated[
    str | None,
    typer.Option("--relay", help="Relay URL (env ENGRAM_RELAY; default ws://127.0.0.1:7777)."),
]
Owner = Annotated[
    str | None, typer.Option("--owner", help="Owner public key, hex or npub (env ENGRAM_OWNER).")
]
KeyFile = Annotated[
    Path | None,
    typer.Option("--key-file", help="File holding the secret key (else env ENGRAM_PRIVATE_KEY)."),
]
Agent = Annotated[
    str | None,
    typer.Option(
        "--agent",
        help="Owner-side read: the key held is the owner's; read this agent's memory.",
    ),
]
Timeout = Annotated[
    float, typer.Option("--timeout", min=0.1, help="Seconds before giving up on the relay.")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON instead of text lines.")]


@dataclass(frozen=True)
class Target:
    ident: Identity
    url: str
    timeout: float


def _target(
    relay: str | None, owner: str | None, key_file: Path | None, agent: str | None, timeout: float
) -> Target:
    return Target(load_identity(key_file, owner, agent), relay_url(relay), timeout)


def _run(target: Target, op: Callable[[RelayClient], Awaitable[T]]) -> T:
    """Connect, answer AUTH, run `op`; the whole exchange is bounded by the timeout."""

    async def main() -> T:
        async with asyncio.timeout(target.timeout), open_relay(target.url) as client:
            await client.authenticate(target.ident.seckey)
            return await op(client)

    return asyncio.run(main())


def _slug(raw: str) -> str:
    try:
        return normalize_slug(raw)
    except EngramError as exc:
        raise InputError(str(exc)) from exc


def _found(lookup: Lookup, slug: str) -> str:
    text = live_text(lookup)
    if text is None:
        note = f" ({lookup.rejected} invalid event(s) ignored)" if lookup.rejected else ""
        raise NotFoundError(f"not found: {slug}{note}")
    return text


def _write_stdout(text: str) -> None:
    sys.stdout.buffer.write(text.encode("utf-8"))
    sys.stdout.buffer.flush()


def read_capped(stream: Any, cap: int, what: str) -> str:
    """Read at most `cap` bytes of UTF-8; more is an error, never a silent truncation."""
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise InputError(f"{what} is larger than {cap:,} bytes; nothing was written")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not valid UTF-8") from exc


def _body(slug: str, text: str) -> Core | Memory:
    body = Core(profile=text) if slug == CORE_SLUG else Memory(slug=slug, value=text)
    encode_body(body)  # refuse an oversized body before touching the network
    return body


@mem_app.command()
def get(
    slug: Annotated[str, typer.Argument(help="Slug, e.g. notes/x (mem/ is added) or core.")],
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Print the value's exact bytes (no newline added); `core` prints the profile."""
    slug = _slug(slug)
    target = _target(relay, owner, key_file, agent, timeout)
    read = _run(target, lambda c: read_head(c, target.ident, slug))
    _write_stdout(_found(read, slug))


@mem_app.command("set")
def set_(
    slug: Annotated[str, typer.Argument(help="Slug, e.g. notes/x (mem/ is added) or core.")],
    value: Annotated[str, typer.Argument(help="The value, or - to read stdin.")],
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Accept an empty stdin as the value.")
    ] = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Write a value (agent key only). Prints the new event id."""
    slug = _slug(slug)
    if value == "-":
        value = read_capped(sys.stdin.buffer, STDIN_CAP, "stdin")
        if not value and not allow_empty:
            raise InputError(
                "stdin is empty; pass --allow-empty to store an empty value, "
                f"or use `engram mem rm {slug}` to delete it"
            )
    body = _body(slug, value)
    target = _target(relay, owner, key_file, None, timeout)

    async def op(client: RelayClient) -> str:
        base = await read_head(client, target.ident, slug)
        return (await write(client, target.ident, body, base)).id

    typer.echo(_run(target, op))


@mem_app.command("hash")
def hash_(
    slug: Annotated[str, typer.Argument(help="Slug, e.g. notes/x or core.")],
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Print the sha256 (hex) of the current value's bytes: the base for `patch`."""
    slug = _slug(slug)
    target = _target(relay, owner, key_file, agent, timeout)
    read = _run(target, lambda c: read_head(c, target.ident, slug))
    typer.echo(sha256_hex(_found(read, slug)))


@mem_app.command()
def patch(
    slug: Annotated[str, typer.Argument(help="Slug, e.g. notes/x or core.")],
    file: Annotated[str, typer.Argument(help="Unified diff file, or - for stdin.")] = "-",
    base_hash: Annotated[
        str | None,
        typer.Option("--base-hash", help="sha256 of the value the diff was made against."),
    ] = None,
    no_base_hash: Annotated[
        bool, typer.Option("--no-base-hash", help="Apply without checking the base hash.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the result (stdout) and its hash (stderr).")
    ] = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Apply a one-file unified diff exactly (no fuzz, no offset) to the current value.

    An absent or removed slug patches as the empty value.
    """
    slug = _slug(slug)
    if (base_hash is None) == (not no_base_hash):
        raise InputError("pass exactly one of --base-hash HEX and --no-base-hash")
    expected = base_hash.lower() if base_hash else None
    if expected is not None and (len(expected) != 64 or set(expected) - set("0123456789abcdef")):
        raise InputError("--base-hash must be 64 hex characters (see `engram mem hash`)")
    if file == "-":
        diff = read_capped(sys.stdin.buffer, PATCH_CAP, "patch")
    else:
        try:
            with open(file, "rb") as fh:
                diff = read_capped(fh, PATCH_CAP, "patch")
        except OSError as exc:
            raise InputError(f"cannot read {file}: {exc.strerror or exc}") from exc
    target = _target(relay, owner, key_file, None, timeout)

    async def op(client: RelayClient) -> tuple[str, str | None]:
        base = await read_head(client, target.ident, slug)
        current = live_text(base) or ""
        if expected is not None and sha256_hex(current) != expected:
            raise ConflictError(
                f"{slug}: base hash mismatch: the current value hashes to {sha256_hex(current)}"
            )
        result = apply_patch(current, diff)
        if dry_run:
            return result, None
        event = await write(client, target.ident, _body(slug, result), base)
        return result, event.id

    result, event_id = _run(target, op)
    if event_id is None:
        _write_stdout(result)
        typer.echo(f"sha256 {sha256_hex(result)} (dry run: nothing published)", err=True)
    else:
        typer.echo(event_id)


async def _list(client: RelayClient, target: Target) -> dict[str, Head]:
    """All heads; warns on stderr when the listing may be cut by the relay's max_limit."""
    try:
        max_limit = max_limit_of(await fetch_nip11(target.url, target.timeout))
    except RelayError as exc:
        typer.echo(f"engram: warning: {exc}", err=True)
        max_limit = None
    heads, returned = await list_heads(client, target.ident, max_limit)
    if max_limit is None:
        typer.echo("engram: warning: no max_limit known; the listing may be partial", err=True)
    elif returned >= max_limit:
        typer.echo(
            f"engram: warning: the relay returned its max_limit ({max_limit}) events; "
            "the listing may be truncated",
            err=True,
        )
    return heads


@mem_app.command()
def ls(
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """List live memories: slug, event id, created_at (core and tombstones omitted)."""
    target = _target(relay, owner, key_file, agent, timeout)
    rows = listing(_run(target, lambda c: _list(c, target)))
    if json_out:
        typer.echo(msgspec.json.encode(rows).decode())
        return
    for row in rows:
        typer.echo(f"{row.slug}\t{row.event_id}\t{row.created_at}")


@mem_app.command()
def rm(
    slug: Annotated[str, typer.Argument(help="Slug to remove (publishes a tombstone).")],
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Publish a tombstone for a memory. Prints the tombstone's event id."""
    slug = _slug(slug)
    if slug == CORE_SLUG:
        raise InputError("core cannot be removed; to clear it run: engram mem set core ''")
    target = _target(relay, owner, key_file, None, timeout)

    async def op(client: RelayClient) -> str:
        base = await read_head(client, target.ident, slug)
        _found(base, slug)
        return (await write(client, target.ident, Tombstone(slug=slug), base)).id

    typer.echo(_run(target, op))


@mem_app.command()
def refs(
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Reachability from core through its slug links: reachable, orphans, dangling.

    A link is a slug in double square brackets inside a value or the profile. Nothing is
    deleted: orphans are shown so you can decide.
    """
    target = _target(relay, owner, key_file, agent, timeout)
    heads = _run(target, lambda c: _list(c, target))
    profile = core_profile(heads)
    values = {slug: body_text(h.body) for slug, h in heads.items()}
    graph = reachability(profile, values)
    if profile is None:
        typer.echo("engram: warning: no core profile; every memory is an orphan", err=True)
    if json_out:
        dangling = [{"from": source, "to": target} for source, target in graph.dangling]
        report = {"reachable": graph.reachable, "orphans": graph.orphans, "dangling": dangling}
        typer.echo(json.dumps(report))
        return
    for slug in graph.reachable:
        typer.echo(f"reachable\t{slug}")
    for slug in graph.orphans:
        typer.echo(f"orphan\t{slug}")
    for source, target in graph.dangling:
        typer.echo(f"dangling\t{target}\t(referenced by {source})")
