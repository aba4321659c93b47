"""The owner's actions, each a call to `AgentMemory`, and what the page says of it.

An outcome carries the relays' own words: who accepted the write, who refused it and
with which message, or the newer version a correction ran into. The page that shows an
outcome then reads the memory back from the relays; nothing here is the page's copy.

Verdicts (confirm, deny, restore, forget) belong to the trusted-memory extension (issue
39): their routes and forms exist, and they answer "not available" until `AgentMemory`
has the methods.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cli.errors import (
    AgentMemoryError,
    AuthError,
    BadInputError,
    ConflictError,
    NotFoundError,
    RelayError,
)
from cli.memory.api import AgentMemory, Entry, WriteResult
from cli.memory.review.diffs import normalize_newlines

EXTENSION = "the trusted-memory extension (issue 39)"


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
    newer: Entry | None = None  # a correction's conflict: the version it ran into
    typed: str | None = None  # the text the owner typed, kept when it was not saved


@dataclass(frozen=True)
class Abilities:
    """Which actions this session can take, and why not where it cannot."""

    write: bool  # correct and remove
    verdicts: bool  # confirm and deny
    history: bool  # versions and restore
    forget: bool
    why_not_write: str
    why_not_verdicts: str


def abilities(memory: AgentMemory) -> Abilities:
    """What the API offers this session: owner sessions write verdicts only where the
    trusted-memory extension is there (`memory.role`); before it they only read."""
    owner = memory.identity.as_owner
    has = {n: callable(getattr(memory, n, None)) for n in ("confirm", "deny", "log", "revert")}
    extension = hasattr(memory, "role")
    verdicts = owner and has["confirm"] and has["deny"]
    if not owner:
        no_verdicts = "confirm and deny are the owner's verdicts: run with the owner's key"
    elif not verdicts:
        no_verdicts = f"confirm and deny arrive with {EXTENSION}"
    else:
        no_verdicts = ""
    write = not owner or extension
    return Abilities(
        write=write,
        verdicts=verdicts,
        history=has["log"] and has["revert"],
        forget=callable(getattr(memory, "forget", None)),
        why_not_write=(
            ""
            if write
            else f"with the owner's key this page reads; owner corrections arrive with "
            f"{EXTENSION}. Run engram review with the agent's key to correct or remove "
            "as the agent."
        ),
        why_not_verdicts=no_verdicts,
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


async def correct(memory: AgentMemory, slug: str, typed: str, base: str) -> Outcome:
    """Write `typed` (line endings made LF) over the version whose sha256 is `base`.

    When the memory has changed since the page showed it (another sha256, or removed),
    nothing is written: the outcome carries the newer version and the text typed."""
    value = normalize_newlines(typed)
    try:
        current = await memory.get(slug)
    except NotFoundError:
        return Outcome(
            False,
            409,
            "Conflict: not saved",
            f"{slug} was removed after this page showed it; nothing was written",
            typed=value,
        )
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc, value)
    if current.sha256 != base:
        return Outcome(
            False,
            409,
            "Conflict: not saved",
            f"{slug} changed after this page showed it (now event {current.event_id}); "
            "nothing was written. Compare, then save again over the newer version.",
            newer=current,
            typed=value,
        )
    try:
        return _written("Saved", await memory.set(slug, value))
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc, value)


async def remove(memory: AgentMemory, slug: str) -> Outcome:
    """Publish a tombstone (`engram mem rm`)."""
    try:
        return _written("Removed", await memory.rm(slug))
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)


def _unavailable(what: str) -> Outcome:
    return Outcome(False, 501, f"{what}: not available yet", f"{what} arrives with {EXTENSION}")


VERDICTS = {"confirm": "Confirmed", "deny": "Denied", "restore": "Restored", "forget": "Forgotten"}
API_NAMES = {"restore": "revert"}  # the page says restore; the API (and CLI) say revert


async def verdict(memory: AgentMemory, name: str, slug: str, *args: str, **kw: str) -> Outcome:
    """confirm / deny / restore / forget, when `AgentMemory` has them (issue 39)."""
    method = getattr(memory, API_NAMES.get(name, name), None)
    if not callable(method):
        return _unavailable(name.capitalize())
    try:
        result = await method(slug, *args, **kw)
    except (AgentMemoryError, TimeoutError) as exc:
        return failed(exc)
    if isinstance(result, WriteResult):
        return _written(VERDICTS[name], result)
    return Outcome(True, 200, VERDICTS[name])
