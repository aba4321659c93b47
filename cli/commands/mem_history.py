"""`engram mem log|diff|revert|audit|forget|confirm|deny`: a memory's history, its audit,
forgetting, and the owner's verdicts (docs/NIP-AE-HISTORY.md).

Thin commands over `AgentMemory` (cli.memory.history, audit, verdicts), registered on
`cli.commands.mem.mem_app`, with its options, error handling and exit codes (plus 6: the audit
found a problem).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import msgspec
import typer

from cli.commands.mem_common import (
    DEFAULT_TIMEOUT as DEFAULT,
)
from cli.commands.mem_common import (
    LIST_TIMEOUT as LONG,
)
from cli.commands.mem_common import (
    Agent,
    Force,
    JsonFlag,
    KeyFile,
    Owner,
    Relay,
    SlugArg,
    SourceOpt,
    Timeout,
    TrustOpt,
    fail,
    mem_app,
    memory,
    parse_slug,
    print_written,
    report,
    run,
    trust_col,
    validity_col,
    warn,
    write_stdout,
)

AUDIT_EXIT = 6  # the audit found a problem
RevArg = Annotated[str, typer.Argument(help="A version: its id or a prefix of 8+ hex (see log).")]
OwnerAgent = Annotated[
    str,
    typer.Option("--agent", help="The agent whose memory this is (the key held is the owner's)."),
]


@mem_app.command()
def log(
    slug: SlugArg,
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT,
) -> None:
    """List a memory's versions, newest first.

    Columns: id, created_at, role (agent or owner), trust, state, validity, source.
    `state` is value, removed, denied, forgotten or withheld (a value the owner denied:
    listed by hash, never shown). `--json`: id, created_at, author, role, trust, source,
    valid_from, valid_until, value_sha256 (and prev, state, reason, plain) per version.
    """
    history = run(memory(relay, owner, key_file, agent, timeout).log(parse_slug(slug)))
    report(history.report, json_out)
    if json_out:
        typer.echo(msgspec.json.encode(history.versions).decode())
        return
    for v in history.versions:
        validity = validity_col(v.valid_from, v.valid_until, False)
        source = v.source or "-"
        typer.echo(
            f"{v.id}\t{v.created_at}\t{v.role}\t{trust_col(v.trust)}\t{v.state}\t{validity}\t"
            f"{' '.join(source.split())}"
        )


@mem_app.command()
def diff(
    slug: SlugArg,
    rev1: Annotated[str | None, typer.Argument(help="From this version.")] = None,
    rev2: Annotated[str | None, typer.Argument(help="To this version (default: newest).")] = None,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = DEFAULT,
) -> None:
    """Unified diff between two versions (`engram mem patch` applies it).

    No REV: the previous version to the newest; REV1: it to the newest; REV1 REV2: the
    two. A removal diffs as the empty text."""
    result = run(memory(relay, owner, key_file, agent, timeout).diff(parse_slug(slug), rev1, rev2))
    report(result.report)
    write_stdout(result.text)


@mem_app.command()
def revert(
    slug: SlugArg,
    rev: RevArg,
    force: Force = False,
    trust: TrustOpt = None,
    source: SourceOpt = None,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Annotated[
        str | None,
        typer.Option("--agent", help="Owner correction: the key held is the owner's."),
    ] = None,
    timeout: Timeout = DEFAULT,
) -> None:
    """Write a new version with REV's value and validity; the past is never rewritten.

    Prints the new version's id; the refusals of `set` apply. With --agent (owner key):
    a correction."""
    mem = memory(relay, owner, key_file, agent, timeout)
    print_written(run(mem.revert(parse_slug(slug), rev, force=force, trust=trust, source=source)))


@mem_app.command()
def audit(
    slug: Annotated[str | None, typer.Argument(help="One slug (default: every memory).")] = None,
    json_out: JsonFlag = False,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Agent = None,
    timeout: Timeout = LONG,
) -> None:
    """Verify every version chain across the relay set; exit 6 on a problem.

    Finds missing versions (naming the relay that lacks one), forks (two writers from one
    base), broken links, stale heads and heads written out of chain, and forgotten
    versions still served. One line per finding: kind, slug, version, relay, detail.
    Exit 0 when clean, 6 when it finds a problem, 2 if a relay could not be audited."""
    mem = memory(relay, owner, key_file, agent, timeout)
    result = run(mem.audit(parse_slug(slug) if slug is not None else None))
    report(result.report, json_out, drop_sync_hint=True)
    if json_out:
        findings = [f._asdict() for f in result.findings]
        out: dict[str, Any] = {
            "clean": result.clean,
            "slugs": result.slugs,
            "versions": result.versions,
            "findings": findings,
        }
        typer.echo(json.dumps(out))
    else:
        for f in result.findings:
            typer.echo(f"{f.kind}\t{f.slug}\t{f.version or '-'}\t{f.relay or '-'}\t{f.detail}")
        if result.clean:
            typer.echo(f"clean: {result.versions} version(s) of {result.slugs} slug(s)", err=True)
    if not result.clean:
        raise typer.Exit(AUDIT_EXIT)
    if result.report.failed:
        fail("audit incomplete: some relays could not be read", 2)


@mem_app.command()
def forget(
    slug: SlugArg,
    reason: Annotated[str | None, typer.Option("--reason", help="Why (recorded).")] = None,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    agent: Annotated[
        str | None,
        typer.Option("--agent", help="The key held is the owner's: forget as the owner."),
    ] = None,
    timeout: Timeout = LONG,
) -> None:
    """Forget a memory everywhere: hide its history, then delete it from every relay.

    A forget hides every earlier version from every read (log and get --as-of included)
    and keeps rejecting its value; every relay is asked to delete the versions (NIP-09),
    then checked. Prints the forget's id; exit 2 naming each relay that still serves a
    forgotten version."""
    mem = memory(relay, owner, key_file, agent, timeout)
    result = run(mem.forget(parse_slug(slug), reason=reason))
    print_written(result.forget)
    if not result.ok:
        for url, ids in result.still_serving.items():
            if ids:
                warn(f"{url}: still serves {len(ids)} forgotten version(s)")
        names = ", ".join(u for u, ids in result.still_serving.items() if ids)
        hint = (
            " (versions signed by the agent's key are deleted only by the agent: "
            "run `engram mem forget` as the agent too)"
            if agent is not None
            else ""
        )
        fail(f"{result.slug}: forgotten, but still served by {names}{hint}", 2)


@mem_app.command()
def confirm(
    slug: SlugArg,
    agent: OwnerAgent,
    source: SourceOpt = None,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    timeout: Timeout = DEFAULT,
) -> None:
    """Owner verdict (owner key): confirm the memory's value. Prints the verdict's id."""
    mem = memory(relay, owner, key_file, agent, timeout)
    print_written(run(mem.confirm(parse_slug(slug), source=source)))


@mem_app.command()
def deny(
    slug: SlugArg,
    agent: OwnerAgent,
    reason: Annotated[str | None, typer.Option("--reason", help="Why it is wrong.")] = None,
    relay: Relay = None,
    owner: Owner = None,
    key_file: KeyFile = None,
    timeout: Timeout = DEFAULT,
) -> None:
    """Owner verdict (owner key): deny the memory's value.

    It then reads as absent, and the agent can never write that value again (the owner
    can, by correcting to it). Prints the verdict's id."""
    mem = memory(relay, owner, key_file, agent, timeout)
    print_written(run(mem.deny(parse_slug(slug), reason=reason)))
