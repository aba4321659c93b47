"""`engram mem get|set|hash|patch|ls|rm|refs|search|recall|sync|migrate|export|import`:
read and write agent memory (engrams) on a relay set. The group, its options and the
exit-code contract are `cli.commands.mem_common`; history, audit and owner verdicts are
`cli.commands.mem_history`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec
import typer

from cli.commands.mem_common import (
    DEFAULT_TIMEOUT,
    LIST_TIMEOUT,
    PATCH_CAP,
    STDIN_CAP,
    Agent,
    Correct,
    Force,
    InputError,
    JsonFlag,
    KeyFile,
    Owner,
    Relay,
    SlugArg,
    SourceOpt,
    Timeout,
    TrustOpt,
    ValidFrom,
    ValidNow,
    ValidUntil,
    fail,
    mem_app,
    memory,
    parse_slug,
    print_written,
    read_capped,
    report,
    run,
    then_close,
    trust_col,
    validity_col,
    warn,
    when,
    write_stdout,
)
from cli.memory.api import RelaySync, SetReport
from engram import CORE_SLUG


@mem_app.command()
def get(
    slug: SlugArg,
    as_of: Annotated[
        str | None,
        typer.Option("--as-of", metavar="TIME", help="The value at TIME (newest version then)."),
    ] = None,
    rev: Annotated[
        str | None,
        typer.Option("--rev", metavar="ID", help="That version (id or 8+ hex prefix, see log)."),
    ] = None,
    valid_at: Annotated[
        str | None,
        typer.Option("--valid-at", metavar="TIME", help="Exit 1 unless the fact holds at TIME."),
    ] = None,
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Print the value's exact bytes (no newline added); `core` prints the profile.

    `--json` prints the value with its version: id, created_at, author, role, trust,
    source, valid_from, valid_until, ended, value_sha256. A fact whose validity has ended
    is still printed (exit 0); `--valid-at` outside its window is exit 1.
    """
    slug = parse_slug(slug)
    at, valid = when(as_of, "--as-of"), when(valid_at, "--valid-at")
    mem = memory(relay, owner, key_file, agent, timeout)
    entry = run(mem.get(slug, as_of=at, rev=rev, valid_at=valid))
    report(entry.report, json_out)
    if json_out:
        typer.echo(json.dumps(entry.as_json(), ensure_ascii=False))
        return
    write_stdout(entry.value)


@mem_app.command("set")
def set_(
    slug: SlugArg,
    value: Annotated[str, typer.Argument(help="The value, or - to read stdin.")],
    allow_empty: Annotated[
        bool, typer.Option("--allow-empty", help="Accept an empty stdin as the value.")
    ] = False,
    trust: TrustOpt = None,
    source: SourceOpt = None,
    valid_from: ValidFrom = None,
    valid_until: ValidUntil = None,
    force: Force = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Correct = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Write a new version to every relay of the set. Prints its id.

    With the agent's key: trust guess (default) or stated. With the owner's key and
    --agent: an owner correction (confirmed), which the agent needs --force to write
    over. A value a tombstone rejected is refused (exit 1) unless --force; a value the
    owner denied is always refused for the agent.
    """
    slug = parse_slug(slug)
    if value == "-":
        value = read_capped(sys.stdin.buffer, STDIN_CAP, "stdin")
        if not value and not allow_empty:
            raise InputError(
                "stdin is empty; pass --allow-empty to store an empty value, "
                f"or use `engram mem rm {slug}` to delete it"
            )
    mem = memory(relay, owner, key_file, agent, timeout)
    window = when(valid_from, "--valid-from"), when(valid_until, "--valid-until")
    write = mem.set(
        slug,
        value,
        trust=trust,
        source=source,
        valid_from=window[0],
        valid_until=window[1],
        force=force,
    )
    result = run(then_close(mem, write))
    print_written(result)
    for near in result.similar:  # write-time hints: stderr, so stdout stays the event id
        warn(
            f"similar memory: {near.slug} ({near.score:.2f}); patch or merge it rather "
            "than keep a near-duplicate"
        )


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
    slug = parse_slug(slug)
    entry = run(memory(relay, owner, key_file, agent, timeout).get(slug))
    report(entry.report)
    typer.echo(entry.sha256)


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
    trust: TrustOpt = None,
    source: SourceOpt = None,
    valid_from: ValidFrom = None,
    valid_until: ValidUntil = None,
    force: Force = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Correct = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Apply a one-file unified diff exactly (no fuzz, no offset) to the current value.

    An absent or removed slug patches as the empty value. Trust, source and validity
    carry over unless given; the refusals of `set` apply. With --agent (owner key): a
    correction.
    """
    slug = parse_slug(slug)
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
    mem = memory(relay, owner, key_file, agent, timeout)
    result = run(
        mem.patch(
            slug,
            diff,
            expected,
            dry_run=dry_run,
            trust=trust,
            source=source,
            valid_from=when(valid_from, "--valid-from"),
            valid_until=when(valid_until, "--valid-until"),
            force=force,
        )
    )
    if dry_run:
        report(result.report)
        write_stdout(result.value or "")
        typer.echo(f"sha256 {result.sha256} (dry run: nothing published)", err=True)
    else:
        print_written(result)


@mem_app.command()
def ls(
    valid_now: ValidNow = False,
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = LIST_TIMEOUT,
) -> None:
    """List live memories: slug, version id, created_at, trust, validity.

    Core, removed, denied and forgotten memories are omitted; a fact whose validity has
    ended is marked (`ended …`), hidden only with --valid-now. Complete: every relay is
    paged past its max_limit. `--json` prints the array of entries (slug, event_id,
    created_at, trust, role, author, source, valid_from, valid_until, ended, sha256), and
    skipped events and lagging relays as one JSON object on stderr.
    """
    listing = run(memory(relay, owner, key_file, agent, timeout).ls(valid_now=valid_now))
    report(listing.report, json_out)
    if json_out:
        typer.echo(msgspec.json.encode(listing.entries).decode())
        return
    for row in listing.entries:
        validity = validity_col(row.valid_from, row.valid_until, row.ended)
        typer.echo(
            f"{row.slug}\t{row.event_id}\t{row.created_at}\t{trust_col(row.trust)}\t{validity}"
        )


@mem_app.command()
def rm(
    slug: Annotated[str, typer.Argument(help="Slug to remove (publishes a tombstone).")],
    reason: Annotated[
        str | None, typer.Option("--reason", help="Why: recorded in the tombstone.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Remove over the owner's correction.")
    ] = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    timeout: Timeout = DEFAULT_TIMEOUT,
) -> None:
    """Publish a tombstone for a memory. Prints the tombstone's id.

    The tombstone records the reason and the sha256 of the removed value (not the
    value): a later `set` or `patch` to that value is refused unless --force.
    """
    slug = parse_slug(slug)
    if slug == CORE_SLUG:
        raise InputError("core cannot be removed; to clear it run: engram mem set core ''")
    print_written(
        run(memory(relay, owner, key_file, None, timeout).rm(slug, reason=reason, force=force))
    )


@mem_app.command()
def refs(
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = LIST_TIMEOUT,
) -> None:
    """Reachability from core through its slug links: reachable, orphans, dangling.

    A link is a slug in double square brackets inside a value or the profile; a link to a
    memory that does not read as live (absent, removed, denied, forgotten) dangles.
    Nothing is deleted: orphans are shown so you can decide. Reachable and orphan lines
    end with the memory's trust and validity, as `ls` shows them.
    """
    graph = run(memory(relay, owner, key_file, agent, timeout).refs())
    report(graph.report, json_out)
    if not graph.has_core:
        warn("no core profile; every memory is an orphan")
    if json_out:
        dangling = [{"from": source, "to": target} for source, target in graph.dangling]
        out: dict[str, Any] = {
            "reachable": graph.reachable,
            "orphans": graph.orphans,
            "dangling": dangling,
            "trust": graph.trust,
            "ended": graph.ended,
        }
        if graph.report.skipped_total:
            out["skipped"] = _skipped(graph.report)
        typer.echo(json.dumps(out))
        return
    ended = set(graph.ended)
    for kind, slugs in (("reachable", graph.reachable), ("orphan", graph.orphans)):
        for slug in slugs:
            mark = "ended" if slug in ended else "-"
            typer.echo(f"{kind}\t{slug}\t{trust_col(graph.trust.get(slug))}\t{mark}")
    for source, target in graph.dangling:
        typer.echo(f"dangling\t{target}\t(referenced by {source})")


def _skipped(rep: SetReport) -> dict[str, int]:
    return {"total": rep.skipped_total, **rep.skipped}


@mem_app.command()
def search(
    query: Annotated[str, typer.Argument(help="Text to find (case-insensitive).")],
    regex: Annotated[bool, typer.Option("--regex", help="QUERY is a regular expression.")] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most N results.")] = 20,
    valid_now: ValidNow = False,
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = LIST_TIMEOUT,
) -> None:
    """Search slugs and values after local decryption; the query never leaves this machine.

    Prints slug, a one-line snippet around the match, created_at, trust and validity,
    best matches first. Only live memories are searched; --valid-now also hides facts
    not valid now.
    """
    mem = memory(relay, owner, key_file, agent, timeout)
    matches = run(mem.search(query, regex=regex, limit=limit, valid_now=valid_now))
    report(matches.report, json_out)
    if json_out:
        rows = [
            {
                "slug": m.slug,
                "snippet": m.snippet,
                "created_at": m.created_at,
                "event_id": m.event_id,
                "score": m.score,
                "trust": m.trust,
                "role": m.role,
                "valid_until": m.valid_until,
                "ended": m.ended,
            }
            for m in matches
        ]
        typer.echo(json.dumps({"matches": rows, "skipped": _skipped(matches.report)}))
        return
    for m in matches:
        validity = validity_col(None, m.valid_until, m.ended) if m.ended else "-"
        typer.echo(f"{m.slug}\t{m.snippet}\t{m.created_at}\t{trust_col(m.trust)}\t{validity}")


@mem_app.command()
def recall(
    query: Annotated[str, typer.Argument(help="A question or a few words, in plain language.")],
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000, help="At most N.")] = 10,
    valid_now: ValidNow = False,
    json_out: Annotated[
        bool,
        typer.Option(
            "--json",
            help="Print a JSON array of {slug, value, snippet, score, created_at, event_id, "
            "trust, role, valid_from, valid_until, ended}.",
        ),
    ] = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = LIST_TIMEOUT,
) -> None:
    """The memories most relevant to QUERY, best first: slug, score, created_at, snippet.

    Each line ends with the memory's trust and validity, as `ls` shows them; removed,
    denied and forgotten memories are never returned, --valid-now also hides facts not
    valid now. Ranked on this machine after decryption (words and a packaged embedding
    model, fused); the query never leaves it. The index is cached, encrypted, in the
    user's data directory and brought up to date from the relays on each run.

    The score only orders this query's answers: it is relative to the query's other
    candidates (the best match scores near 1), not a probability, not comparable across
    queries, and the best of unrelated memories still gets one.
    """
    from cli.memory.recall.present import hit_json, hit_line

    mem = memory(relay, owner, key_file, agent, timeout)
    found = run(then_close(mem, mem.recall(query, limit, valid_now=valid_now)))
    report(found.report, json_out)
    if json_out:
        typer.echo(json.dumps([hit_json(h, query) for h in found.hits], ensure_ascii=False))
        return
    for h in found.hits:
        typer.echo(hit_line(h, query))


def _per_relay(rows: dict[str, RelaySync], json_out: bool, extra: dict[str, Any]) -> None:
    if json_out:
        relays = {
            url: {
                "published": r.published,
                "up_to_date": r.up_to_date,
                "refused": r.refused,
                "error": r.error,
                **({"method": r.method} if r.method else {}),
            }
            for url, r in rows.items()
        }
        typer.echo(json.dumps({**extra, "relays": relays}))
        return
    for url, r in rows.items():
        typer.echo(f"{url}\t{r.line()}")


@mem_app.command()
def sync(
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = 60.0,
) -> None:
    """Give each relay of the set every head and version it lacks, exactly as signed.

    Heads are memories, tombstones and core; versions are revisions and owner verdicts
    (never a forgotten one). Idempotent; one summary line per relay; exit 2
    if a relay could not be brought up to date.
    """
    result = run(memory(relay, owner, key_file, agent, timeout).sync())
    rep = result.report
    report(rep, json_out, drop_sync_hint=True)
    _per_relay(result.relays, json_out, {"heads": result.heads, "skipped": _skipped(rep)})
    if not result.ok:
        raise typer.Exit(2)


@mem_app.command()
def migrate(
    to: Annotated[str, typer.Option("--to", help="New relay URL(s), comma-separated.")],
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = 60.0,
) -> None:
    """Copy every head and version to the --to relays, then read each back there.

    Exit 2, naming the slugs, if any head is missing on a new relay. Idempotent.
    """
    result = run(memory(relay, owner, key_file, agent, timeout).migrate(to))
    report(result.report, json_out)
    extra = {"heads": result.heads, "missing": result.missing, "skipped": _skipped(result.report)}
    _per_relay(result.targets, json_out, extra)
    if not result.ok:
        for url, slugs in result.missing.items():
            if slugs:
                shown = ", ".join(slugs[:20]) + (", …" if len(slugs) > 20 else "")
                warn(f"{url}: {len(slugs)} head(s) missing after the copy: {shown}")
        fail("migration incomplete: some heads are missing on the new relays", 2)


@mem_app.command("export")
def export_(
    file: Annotated[Path, typer.Argument(help="JSON-lines file to write (signed head events).")],
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = 60.0,
) -> None:
    """Back up every head and version (ciphertext, as signed) to FILE, one event a line.

    The file is 0600; forgotten versions are never exported."""
    result = run(memory(relay, owner, key_file, agent, timeout).export(file))
    report(result.report)
    typer.echo(f"exported {result.heads} event(s) to {result.path}", err=True)


@mem_app.command("import")
def import_(
    file: Annotated[Path, typer.Argument(help="A file written by `engram mem export`.")],
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = 60.0,
) -> None:
    """Republish the events of an export, unchanged, to every relay of the set."""
    result = run(memory(relay, owner, key_file, agent, timeout).import_(file))
    report(result.report, json_out, drop_sync_hint=True)
    _per_relay(
        result.relays, json_out, {"events": result.events, "skipped": _skipped(result.report)}
    )
    if any(r.error is not None or r.refused for r in result.relays.values()):
        raise typer.Exit(2)
