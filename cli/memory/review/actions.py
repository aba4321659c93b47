"""The actions of the page, each a call to `AgentMemory`, and what the page says of it.

Held with the owner's key (`--agent`), every action is an owner verdict (issue 39): a
correction, a confirmation, a denial, a restore (a correction to an earlier version's
value), or a forget of the owner's verdicts. Held with the agent's key, the page writes
as the agent, under the agent's rules: a value a tombstone rejected, or a write over the
owner's value, is refused unless done anyway (force); a value the owner denied is
refused whatever is done.

An outcome carries the relays' own words (who accepted the write, who refused it and
with which message), the rule that refused it, or the newer version it ran into. The
page that shows an outcome then reads the memory back from the relays; nothing here is
the page's copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cli.memory.api import AgentMemory, Entry, ForgetReport, WriteResult, sha256_hex
from cli.memory.review.diffs import normalize_newlines
from cli.nostr.errors import (
    AgentMemoryError,
    AuthError,
    BadInputError,
    BaseChangedError,
    ConflictError,
    NotFoundError,
    RefusedError,
    RelayError,
)
from engram.versions import OWNER


@dataclass(frozen=True)
class Outcome:
    """What an action did; `status` is the HTTP status of the page that reports it."""

    ok: bool
    status: int
    title: str
    message: str = ""
    event_id: str | None = None
    accepted: tuple[str, ...] = ()
    refused: dict[str, str] = field(default_factory=dict)
    newer: Entry | None = None  # a conflict: the version it ran into
    typed: str | None = None  # the text the owner typed, kept when it was not saved
    overridable: bool = False  # refused by a rule that force overrides (agent only)
    still_serving: dict[str, list[str]] = field(default_factory=dict)  # forget: relay -> ids


@dataclass(frozen=True)
class Abilities:
    """Which actions this session takes, and why not where it cannot."""

    owner: bool
    remove: bool  # the agent's tombstone (the owner denies instead)
    verdicts: bool  # the owner's confirm and deny
    why_not_verdicts: str
    correct: bool = True  # the agent's write, or the owner's correction
    restore: bool = True
    forget: bool = True


def abilities(memory: AgentMemory) -> Abilities:
    """Per `memory.role`: the owner corrects, confirms, denies, restores and forgets; the
    agent corrects, removes, restores and forgets."""
    owner = memory.role == OWNER
    return Abilities(
        owner=owner,
        remove=not owner,
        verdicts=owner,
        why_not_verdicts=(
            ""
            if owner
            else "confirm and deny are the owner's verdicts: run engram review with the "
            "owner's key and --agent NPUB"
        ),
    )


def _written(title: str, result: WriteResult, status: int = 200) -> Outcome:
    return Outcome(
        True,
        status,
        title,
        event_id=result.event_id,
        accepted=result.accepted,
        refused=dict(result.refused),
    )


def failed(exc: Exception, typed: str | None = None) -> Outcome:
    """An error of the API as the page says it, with the status that fits."""
    if isinstance(exc, RefusedError):
        title = "Refused: the memory's rules do not allow this write"
        return Outcome(False, 409, title, str(exc), typed=typed, overridable=exc.overridable)
    if isinstance(exc, ConflictError):
        return Outcome(False, 409, "Conflict: not saved", str(exc), typed=typed)
    if isinstance(exc, AuthError):
        return Outcome(False, 502, "Refused by the relays (authentication)", str(exc), typed=typed)
    if isinstance(exc, RelayError):
        return Outcome(False, 502, "Refused by the relays", str(exc), typed=typed)
    if isinstance(exc, NotFoundError):
        return Outcome(False, 404, "Not found", str(exc), typed=typed)
    if isinstance(exc, BadInputError):
        return Outcome(False, 422, "Not accepted", str(exc), typed=typed)
    if isinstance(exc, TimeoutError):
        return Outcome(False, 504, "No answer from the relays in time", typed=typed)
    if isinstance(exc, AgentMemoryError):
        return Outcome(False, 500, "Failed", str(exc), typed=typed)
    raise exc


async def _newer(memory: AgentMemory, slug: str, typed: str | None, what: str) -> Outcome:
    """The conflict page's outcome: what the relays serve now, read back."""
    try:
        current = await memory.get(slug)
    except NotFoundError as exc:
        return Outcome(
            False,
            409,
            "Conflict: not saved",
            f"{slug} no longer reads as live ({exc}) since this page showed it; nothing was {what}",
            typed=typed,
        )
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc, typed)
    return Outcome(
        False,
        409,
        "Conflict: not saved",
        f"{slug} changed after this page showed it (now version {current.event_id}); nothing "
        f"was {what}. Compare, then do it again over the newer version.",
        newer=current,
        typed=typed,
    )


async def correct(
    memory: AgentMemory, slug: str, typed: str, base: str, *, force: bool = False
) -> Outcome:
    """Write `typed` (line endings made LF, nothing else touched) over the value whose
    sha256 is `base` (the one the page showed). Another value on the relays, or none, is
    a conflict: nothing is written, and the outcome carries the newer version and the
    text typed."""
    value = normalize_newlines(typed)
    try:
        return _written("Saved", await memory.set(slug, value, base_hash=base, force=force))
    except BaseChangedError:
        return await _newer(memory, slug, value, "written")
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc, value)


async def remove(memory: AgentMemory, slug: str, reason: str | None) -> Outcome:
    """The agent's tombstone (`engram mem rm --reason`)."""
    try:
        return _written("Removed", await memory.rm(slug, reason=reason or None))
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)


async def confirm(memory: AgentMemory, slug: str, base: str) -> Outcome:
    """The owner's confirmation of the value the page showed (sha256 `base`)."""
    try:
        return _written("Confirmed", await memory.confirm(slug, base_hash=base))
    except BaseChangedError:
        return await _newer(memory, slug, None, "confirmed")
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)


async def deny(memory: AgentMemory, slug: str, base: str, reason: str) -> Outcome:
    """The owner's denial of the value the page showed (sha256 `base`), with a reason."""
    try:
        return _written("Denied", await memory.deny(slug, reason=reason, base_hash=base))
    except BaseChangedError:
        return await _newer(memory, slug, None, "denied")
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)


async def restore(memory: AgentMemory, slug: str, rev: str, *, force: bool = False) -> Outcome:
    """A new version with version `rev`'s value (`engram mem revert`): the owner's
    correction, or the agent's write under the agent's rules."""
    try:
        return _written("Restored", await memory.revert(slug, rev, force=force))
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)


async def forget(memory: AgentMemory, slug: str, reason: str | None) -> Outcome:
    """A forget, NIP-09 deletion of what this key signed, and what every relay still
    serves of it (named on the page: only the other key can delete its own events)."""
    try:
        report: ForgetReport = await memory.forget(slug, reason=reason or None)
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)
    still = {url: ids for url, ids in report.still_serving.items() if ids}
    written = report.forget
    message = (
        f"asked every relay to delete {report.deleted} event(s) this key signed"
        + (f" (request {report.deletion_id})" if report.deletion_id else "")
        + "."
    )
    return Outcome(
        True,
        200,
        "Forgotten",
        message,
        event_id=written.event_id,
        accepted=written.accepted,
        refused=dict(written.refused),
        still_serving=still,
    )


def base_of(value: str | None) -> str:
    """The `base` a form carries: the sha256 of the value the page showed."""
    return sha256_hex(value or "")
