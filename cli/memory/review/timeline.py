"""A memory's history as the page draws it: each version (who wrote it, how sure, what it
did) with the difference from the version before it, and any two versions compared.

Pure, over a `Log` (`AgentMemory.log`): the texts are `Log.values`, which never hold a
withheld (owner-denied) or forgotten value; such a version is listed without its text,
and no difference is drawn against it.

Bounded, since the agent writes as many versions as it likes, each up to NIP-44's 64 KB:
the timeline is drawn a page of `PAGE` versions at a time, each with at most
`EXCERPT_CHARS` of its value (the page links to the whole value of one version) and a
difference cut at `DIFF_CHARS`; two versions compared show up to `COMPARE_CHARS`.
"""

from __future__ import annotations

from dataclasses import dataclass

from cli.memory.api import Log, VersionInfo
from cli.memory.review.diffs import DiffLine, diff_lines
from cli.memory.review.pages import Paged
from engram.versions import OWNER

NO_VALUE = ("removed", "denied", "forgotten")  # a removal diffs as the empty text
PAGE = 20  # versions a page of the timeline draws
EXCERPT_CHARS = 2_000  # of each version's value on the timeline
DIFF_CHARS = 4_000  # of each version's difference from the one before
COMPARE_CHARS = 200_000  # of the difference between two versions picked


@dataclass(frozen=True)
class Item:
    """One version on the timeline."""

    version: VersionInfo
    what: str  # what it did, in words
    text: str | None  # its value (at most EXCERPT_CHARS of it), when one may be shown
    folded: bool  # `text` is the start of a longer value
    diff: list[DiffLine] | None  # from the version before it; None: not drawn (`why_no_diff`)
    why_no_diff: str
    restorable: bool  # a value the page may write again as the newest version
    withheld: bool  # a value the owner denied: listed, never shown


def text_of(log: Log, version: VersionInfo) -> str | None:
    """The text a difference uses: the value, "" for a removal, None when withheld."""
    if version.state == "value":
        return log.values.get(version.id)
    return "" if version.state in NO_VALUE else None


def _what(version: VersionInfo, before: VersionInfo | None) -> str:
    state, who = version.state, version.role
    same = before is not None and before.value_sha256 == version.value_sha256
    if state == "withheld":
        return f"written by the {who}; the owner denied this value (it is not shown)"
    if state == "removed":
        return f"removed by the {who}"
    if state == "denied":
        return "denied by the owner"
    if state == "forgotten":
        return f"forgotten by the {who} (nothing older is kept or shown)"
    if version.source and version.source.startswith("revert of "):
        return f"restored by the {who} (an earlier version's value)"
    if who == OWNER:
        return "confirmed by the owner" if same else "corrected by the owner"
    return "written by the agent"


@dataclass(frozen=True)
class Timeline:
    """One page of the timeline: its items, and where the page is among the versions."""

    items: list[Item]
    paged: Paged[VersionInfo]


def build(
    log: Log, *, live_sha256: str | None, owner: bool, page: int = 1, size: int = PAGE
) -> Timeline:
    """Page `page` (1-based; clamped) of the timeline, newest first. `live_sha256`: the
    value the memory reads as now (its versions are not offered for restore); `owner`:
    the owner may restore a value it denied (that lifts the denial); the agent may not.
    Only the page's differences are computed."""
    versions = log.versions
    paged = Paged.of(versions, page, size)
    items = []
    for i in range(paged.start, paged.start + len(paged.rows)):
        v = versions[i]
        before = versions[i + 1] if i + 1 < len(versions) else None
        new = text_of(log, v)
        withheld = v.state == "withheld"
        if before is None:
            diff, why = None, "the first version recorded"
        else:
            old = text_of(log, before)
            if new is None or old is None:
                diff, why = None, "not drawn: a value the owner denied is never shown"
            else:
                diff, why = diff_lines(old, new, budget=DIFF_CHARS), ""
        has_value = v.state == "value" or (withheld and owner)
        restorable = has_value and v.value_sha256 != live_sha256
        folded = new is not None and len(new) > EXCERPT_CHARS
        shown = new[:EXCERPT_CHARS] if new is not None and folded else new
        items.append(Item(v, _what(v, before), shown, folded, diff, why, restorable, withheld))
    return Timeline(items, paged)


def full_value(log: Log, version_id: str) -> tuple[VersionInfo, str] | None:
    """One version and its whole value, when it has one that may be shown."""
    for v in log.versions:
        if v.id == version_id and v.state == "value" and v.id in log.values:
            return v, log.values[v.id]
    return None


@dataclass(frozen=True)
class Comparison:
    old: VersionInfo
    new: VersionInfo
    diff: list[DiffLine] | None  # None: one of them is withheld
    note: str


def compare(log: Log, old_id: str, new_id: str) -> Comparison | None:
    """Two versions of the log, by id (None when either is not in it)."""
    found = {v.id: v for v in log.versions}
    old, new = found.get(old_id), found.get(new_id)
    if old is None or new is None:
        return None
    a, b = text_of(log, old), text_of(log, new)
    if a is None or b is None:
        return Comparison(old, new, None, "a value the owner denied is never shown")
    diff = diff_lines(a, b, budget=COMPARE_CHARS)
    return Comparison(old, new, diff, "" if a != b else "the same value")
