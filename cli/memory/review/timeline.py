"""A memory's history as the page draws it: each version (who wrote it, how sure, what it
did) with the difference from the version before it, and any two versions compared.

Pure, over a `Log` (`AgentMemory.log`): the texts are `Log.values`, which never hold a
withheld (owner-denied) or forgotten value; such a version is listed without its text,
and no difference is drawn against it.
"""

from __future__ import annotations

from dataclasses import dataclass

from cli.memory.api import Log, VersionInfo
from cli.memory.review.diffs import DiffLine, diff_lines
from engram.versions import OWNER

NO_VALUE = ("removed", "denied", "forgotten")  # a removal diffs as the empty text


@dataclass(frozen=True)
class Item:
    """One version on the timeline."""

    version: VersionInfo
    what: str  # what it did, in words
    text: str | None  # its value, when one may be shown
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


def build(log: Log, *, live_sha256: str | None, owner: bool) -> list[Item]:
    """The timeline, newest first. `live_sha256`: the value the memory reads as now (its
    versions are not offered for restore); `owner`: the owner may restore a value it
    denied (that lifts the denial); the agent may not."""
    versions = log.versions
    items = []
    for i, v in enumerate(versions):
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
                diff, why = diff_lines(old, new), ""
        has_value = v.state == "value" or (withheld and owner)
        restorable = has_value and v.value_sha256 != live_sha256
        items.append(Item(v, _what(v, before), new, diff, why, restorable, withheld))
    return items


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
    return Comparison(old, new, diff_lines(a, b), "" if a != b else "the same value")
