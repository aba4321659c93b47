"""`engram export`, `engram import`, `engram prune`: moving and ageing stored events.

Export writes JSON lines (one event each, exactly as stored, oldest first). Import feeds
every line through the relay's own ingest path (`Relay.admit`): the same validation,
replace and deletion rules as a live EVENT, so importing is safe to repeat. Prune deletes
old events in bounded batches; the relay can do the same in the background (`[retention]`
in the configuration, see relay/retention.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, TYPE_CHECKING, Annotated, Any

import typer

from cli.commands.common import (
    ConfigOpt,
    DatabaseOpt,
    DataDirOpt,
    resolve_database_url,
    settings_or_exit,
)
from cli.nostr.files import open_private
from cli.nostr.timeparse import parse_time
from engram.kinds import KIND_DELETION
from relay.store import DEFAULT_TENANT

if TYPE_CHECKING:
    from relay.pipeline import Relay
    from relay.tenants import Tenant, TenantRegistry

READ_CHUNK = 1 << 20  # bytes of lines read at a time (in a thread: stdin may block)
PROGRESS_EVERY = 256  # lines between two progress-bar updates

TenantOpt = Annotated[
    str | None,
    typer.Option(
        "--tenant", help="Tenant host (or an alias); default: the default tenant ('default')."
    ),
]


def _fail(command: str, message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"engram {command}: {message}", err=True)
    return typer.Exit(code)


def _time_opt(command: str, name: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return parse_time(text)
    except ValueError as exc:
        raise _fail(command, f"{name}: not unix seconds or an ISO date: {text!r}", 2) from exc


def _registry(settings: Any, configs: list[Any], version: int) -> TenantRegistry:
    from relay.tenants import TenantRegistry

    registry = TenantRegistry(settings)
    registry.load(configs, version)
    return registry


def _tenant(command: str, registry: TenantRegistry, host: str | None) -> Tenant:
    """The tenant a --tenant value names, as the relay resolves a Host header."""
    if host is None or host.strip().lower() == DEFAULT_TENANT:
        return registry.default
    tenant = registry.resolve(host.strip().lower())
    if tenant is None:
        raise _fail(command, f"no tenant serves {host!r} (see `engram tenant ls`)")
    return tenant


def _is_tty(stream: IO[Any]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


# --- export -----------------------------------------------------------------------------


def export(
    tenant: TenantOpt = None,
    since: Annotated[
        str | None, typer.Option(help="Only created_at >= SINCE (unix seconds or ISO date).")
    ] = None,
    until: Annotated[
        str | None, typer.Option(help="Only created_at <= UNTIL (unix seconds or ISO date).")
    ] = None,
    output: Annotated[
        str | None, typer.Option("--output", "-o", help="Write to this file, not stdout.")
    ] = None,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Write a tenant's stored events as JSON lines, oldest first: `engram export > events.jsonl`.

    Each line is one event exactly as stored; content is exported as is
    (engrams stay encrypted). The database is read in pages, so any size
    streams in constant memory. `engram import` restores the file.
    """
    from relay.store import StoreError
    from relay.store import maintenance as m
    from relay.store import tenants as db
    from relay.store.tenants import run_admin

    lo, hi = _time_opt("export", "--since", since), _time_opt("export", "--until", until)
    settings = settings_or_exit(config_file=config, database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)

    async def action(conn: Any) -> tuple[str, int]:
        registry = _registry(settings, await db.load_tenants(conn), 0)
        key = _tenant("export", registry, tenant).key

        async def write(events_db: Any) -> int:  # the tenant's own database, if it has one
            n = 0
            async for raw in m.export_raw(events_db, key, lo, hi):
                if b"\n" in raw:  # stored JSON is compact; a newline could only be whitespace
                    raw = raw.replace(b"\n", b" ")
                out.write(raw + b"\n")
                n += 1
            return n

        n = await db.on_events_database(conn, key, write)
        out.flush()
        return key, n

    out: IO[bytes]
    with contextlib.ExitStack() as stack:
        if output is None or output == "-":
            out = sys.stdout.buffer
        else:
            try:
                out = stack.enter_context(open_private(output))  # private events: 0600
            except OSError as exc:
                raise _fail("export", f"cannot write {output}: {exc}", 2) from exc
        try:
            key, n = asyncio.run(run_admin(url, action))
        except StoreError as exc:
            raise _fail("export", str(exc), 2) from exc
        except BrokenPipeError:  # `engram export | head`: the reader has gone, stop quietly
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            raise typer.Exit(1) from None
    typer.echo(f"exported {n} events (tenant {key})", err=True)


# --- import -----------------------------------------------------------------------------


@dataclass
class ImportSummary:
    """Outcome of an import, by line."""

    lines: int = 0  # non-blank lines read
    imported: int = 0
    duplicates: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # reason prefix -> count
    examples: dict[str, str] = field(default_factory=dict)  # reason prefix -> first case

    @property
    def done(self) -> int:
        return self.imported + self.duplicates + sum(self.rejected.values())

    @property
    def errors(self) -> int:
        """Lines the database failed on (`error:`): worth a re-run, unlike rejections."""
        return self.rejected["error"]

    def record(self, lineno: int, accepted: bool, message: str) -> None:
        if accepted and message.startswith("duplicate"):
            self.duplicates += 1
        elif accepted:
            self.imported += 1
        else:
            prefix = message.split(":", 1)[0].strip() if ":" in message else "error"
            self.rejected[prefix] += 1
            self.examples.setdefault(prefix, f"line {lineno}: {message or 'error'}")

    def report(self) -> list[str]:
        rejected = sum(self.rejected.values())
        out = [f"imported {self.imported}, duplicates {self.duplicates}, rejected {rejected}"]
        for prefix, n in sorted(self.rejected.items(), key=lambda kv: (-kv[1], kv[0])):
            out.append(f"  {prefix}: {n}  (first: {self.examples[prefix]})")
        return out

    def as_json(self) -> dict[str, Any]:
        return {
            "lines": self.lines,
            "imported": self.imported,
            "duplicates": self.duplicates,
            "rejected": dict(sorted(self.rejected.items())),
            "examples": dict(sorted(self.examples.items())),
        }


async def read_chunks(fh: IO[bytes]) -> AsyncIterator[list[bytes]]:
    """Lines in chunks of about READ_CHUNK bytes; reading happens in a thread."""
    while True:
        lines = await asyncio.to_thread(fh.readlines, READ_CHUNK)
        if not lines:
            return
        yield lines


async def import_lines(
    relay: Relay,
    tenant: Tenant,
    chunks: AsyncIterator[list[bytes]],
    concurrency: int = 500,
    summary: ImportSummary | None = None,
    progress: Callable[[int, ImportSummary], None] | None = None,
) -> ImportSummary:
    """Admit every line's event through `relay.admit`, up to `concurrency` at once.

    Concurrency lets group commit batch the writes. Order still matters for deletions:
    at every switch between deletion requests (kind 5) and other events, the events in
    flight finish first, so a deletion acts on everything before it in the file, and
    nothing after it overtakes it. `progress(bytes read, summary)` is called now and then.
    """
    import msgspec

    from engram.nip01 import Event

    decode = msgspec.json.Decoder(Event).decode
    summary = summary if summary is not None else ImportSummary()
    slots = asyncio.Semaphore(max(1, concurrency))
    in_flight: set[asyncio.Task[None]] = set()
    deleting = False  # the kind of the events in flight: deletion requests or others
    lineno = nbytes = 0

    async def admit(n: int, event: Event) -> None:
        try:
            accepted, message = await relay.admit(tenant, event)
        except Exception as exc:  # a bug must not lose the count or stall the import
            accepted, message = False, f"error: {type(exc).__name__}: {exc}"
        finally:
            slots.release()
        summary.record(n, accepted, message)

    async for lines in chunks:
        for line in lines:
            lineno += 1
            nbytes += len(line)
            line = line.strip()
            if not line:
                continue
            summary.lines += 1
            if progress is not None and lineno % PROGRESS_EVERY == 0:
                progress(nbytes, summary)
            try:
                event = decode(line)
            except msgspec.ValidationError as exc:
                summary.record(lineno, False, f"invalid: malformed event: {exc}")
                continue
            except msgspec.DecodeError:
                summary.record(lineno, False, "invalid: event is not valid JSON")
                continue
            if (event.kind == KIND_DELETION) != deleting:
                if in_flight:
                    await asyncio.wait(in_flight)
                deleting = not deleting
            await slots.acquire()
            task = asyncio.create_task(admit(lineno, event))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
        if progress is not None:
            progress(nbytes, summary)
    if in_flight:
        await asyncio.wait(in_flight)
    if progress is not None:
        progress(nbytes, summary)
    return summary


class _Bar:
    """A rich progress bar on stderr (bytes of the file, events and events/s)."""

    def __init__(self, total: int | None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        self.started = time.monotonic()
        self.progress = Progress(
            TextColumn("importing"),
            BarColumn(),
            TextColumn("{task.percentage:>3.0f}%" if total else ""),
            TextColumn("{task.fields[events]} events, {task.fields[rate]} ev/s"),
            TimeElapsedColumn(),
            console=Console(stderr=True),
        )
        self.task = self.progress.add_task("import", total=total, events=0, rate=0)

    def __enter__(self) -> _Bar:
        self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.progress.stop()

    def __call__(self, nbytes: int, summary: ImportSummary) -> None:
        elapsed = max(time.monotonic() - self.started, 1e-6)
        done = summary.done
        self.progress.update(self.task, completed=nbytes, events=done, rate=int(done / elapsed))


async def _run_import(
    settings: Any,
    url: str,
    host: str | None,
    fh: IO[bytes],
    concurrency: int,
    summary: ImportSummary,
    bar: _Bar | None,
) -> str:
    import asyncpg

    from relay.app import refresh_tenants
    from relay.pipeline import Relay
    from relay.store import StoreError
    from relay.store.router import StoreRouter
    from relay.tenants import TenantRegistry

    try:  # the router: a tenant with its own database is imported there
        store = await StoreRouter.open(url, settings)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        raise StoreError(f"error: cannot reach the database: {exc}") from exc
    try:
        registry = TenantRegistry(settings)
        await refresh_tenants(store, registry)
        tenant = _tenant("import", registry, host)
        if tenant.key == DEFAULT_TENANT and registry.multi:
            typer.echo(
                "engram import: note: tenants are configured and no host serves the default"
                " tenant; use --tenant HOST to import into one of them",
                err=True,
            )
        relay = Relay(settings, store, tenants=registry)
        await import_lines(relay, tenant, read_chunks(fh), concurrency, summary, bar)
        if summary.imported:  # fresh statistics now, not at autovacuum's next pass
            await store.analyze(tenant.key)
        return tenant.key
    finally:
        await store.close()


def import_(
    file: Annotated[
        str, typer.Argument(help="JSON lines file from `engram export`, or - (stdin).")
    ],
    tenant: TenantOpt = None,
    concurrency: Annotated[
        int, typer.Option(min=1, help="Events in flight at once (batched into transactions).")
    ] = 500,
    json_summary: Annotated[
        bool, typer.Option("--json", help="Print the summary as one JSON object.")
    ] = False,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Import events (JSON lines) through the relay's ingest rules: `engram import events.jsonl`.

    Every event is validated exactly like a live EVENT (id, signature,
    limits, engram envelope, created_at not too far in the future) and
    stored with the same replace and deletion rules. Re-importing is
    harmless (stored events count as duplicates), so an interrupted import
    is simply run again. Ends with a summary: imported, duplicates, and
    rejected lines by reason. Exit code 1 if the database failed on any
    event (`error:`); rejected events alone do not fail the command.
    """
    from relay.store import StoreError

    settings = settings_or_exit(config_file=config, database_url=database_url, data_dir=data_dir)
    with contextlib.ExitStack() as stack:
        if file == "-":
            fh: IO[bytes] = sys.stdin.buffer
            total = None
        else:
            try:
                fh = stack.enter_context(open(file, "rb"))
            except OSError as exc:
                raise _fail("import", f"cannot read {file}: {exc}", 2) from exc
            total = os.fstat(fh.fileno()).st_size or None
        url, _embedded = resolve_database_url(settings)
        summary = ImportSummary()
        bar = stack.enter_context(_Bar(total)) if _is_tty(sys.stderr) else None
        try:
            key = asyncio.run(_run_import(settings, url, tenant, fh, concurrency, summary, bar))
        except KeyboardInterrupt:
            if bar is not None:
                bar.progress.stop()
            for line in summary.report():
                typer.echo(line, err=True)
            raise _fail(
                "import", "interrupted: run it again to finish (stored events are skipped)", 130
            ) from None
        except StoreError as exc:
            raise _fail("import", str(exc), 2) from exc
    if json_summary:
        typer.echo(json.dumps({"tenant": key, **summary.as_json()}))
    else:
        for line in summary.report():
            typer.echo(line)
    if summary.errors:
        raise _fail("import", f"{summary.errors} events could not be stored (database errors)")


# --- prune ------------------------------------------------------------------------------


def prune(
    older_than: Annotated[
        str,
        typer.Option(help="Age: delete events whose created_at is older (90s, 15m, 12h, 30d, 4w)."),
    ],
    kind: Annotated[
        list[int] | None,
        typer.Option("--kind", help="Only this kind (repeatable); named kinds are always pruned."),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option("--tenant", help="Only this tenant (host or 'default'); default: all."),
    ] = None,
    include_replaceable: Annotated[
        bool,
        typer.Option(
            "--include-replaceable",
            help="Also prune old replaceable/addressable heads: profiles (0), contacts (3),"
            " engrams (30174, agent memory), ...",
        ),
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count what would be deleted.")
    ] = False,
    batch: Annotated[int, typer.Option(min=1, help="Rows deleted per transaction.")] = 5_000,
    database_url: DatabaseOpt = None,
    data_dir: DataDirOpt = None,
    config: ConfigOpt = None,
) -> None:
    """Delete events older than --older-than, in batches: `engram prune --older-than 30d`.

    Without --kind only regular events go (notes, reactions, deletion
    requests, ...). Replaceable and addressable events are the current state
    of something (a profile, a contact list, an engram: an agent's memory);
    their age is only the time since the last update, so they are kept
    unless --include-replaceable is given or their kind is named with --kind
    (`--kind 30174` prunes old engram heads, i.e. agent memory, too).

    Every tenant unless --tenant. At most --batch rows are deleted per
    transaction, so a running relay keeps serving. The relay can prune by
    itself: see the `retention` table of the configuration.
    """
    from relay.durations import parse_duration
    from relay.store import StoreError
    from relay.store import maintenance as m
    from relay.store import tenants as db
    from relay.store.tenants import run_admin

    try:
        age = parse_duration(older_than)
    except ValueError as exc:
        raise _fail("prune", f"--older-than: {exc}", 2) from exc
    selection = m.Selection(tuple(dict.fromkeys(kind)) if kind else None, include_replaceable)
    settings = settings_or_exit(config_file=config, database_url=database_url, data_dir=data_dir)
    url, _embedded = resolve_database_url(settings)
    cutoff = int(time.time()) - age
    tty = _is_tty(sys.stderr)

    async def between(deleted: int) -> None:
        if tty:
            typer.echo(f"\rdeleted {deleted}…", err=True, nl=False)

    async def action(conn: Any) -> dict[str, tuple[int, int]]:
        configs = await db.load_tenants(conn)
        own = {c.host for c in configs if c.database_url}  # on databases of their own
        if tenant is None:
            keys = [k for k in await m.list_tenants(conn) if k not in own] + sorted(own)
        else:
            keys = [_tenant("prune", _registry(settings, configs, 0), tenant).key]

        async def one(key: str) -> tuple[int, int]:
            async def run(c: Any) -> tuple[int, int]:
                if dry_run:
                    return await m.count_prunable(c, key, cutoff, selection), 0
                return await m.prune(c, key, cutoff, selection, batch, between)

            return await db.on_events_database(conn, key, run)

        return {k: await one(k) for k in keys}

    try:
        done = asyncio.run(run_admin(url, action))
    except StoreError as exc:
        raise _fail("prune", str(exc), 2) from exc
    if tty and not dry_run:
        typer.echo("\r\x1b[2K", err=True, nl=False)  # clear the progress line
    total = sum(n for n, _ in done.values())
    when = datetime.fromtimestamp(cutoff, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    scope = f"{selection.describe()}, created before {when}"
    if dry_run:
        typer.echo(f"would delete {total} events ({scope})")
    else:
        batches = sum(b for _, b in done.values())
        typer.echo(f"deleted {total} events in {batches} batches ({scope})")
    if len(done) > 1:
        for key, (n, _) in sorted(done.items()):
            typer.echo(f"  {key}: {n}")
