"""What is live: the one rule every read of agent memory goes through (docs/NIP-AE-HISTORY.md,
*What is live*), and the rules a write must pass.

Input is the versions of ONE slug, whatever a reader fetched (heads, revisions, owner
verdicts, in any order, duplicates allowed); output says what that slug reads as:
- A **forget** (`forget: true`) is a barrier: every version older than the newest one is
  forgotten, for every read, history included.
- The **newest** remaining version (head rule: greatest created_at, then lowest id) wins,
  whoever wrote it. No value (a removal, a denial, a forget) reads as absent.
- A value the **owner denied** (a verdict's `rejected` hash, not lifted by a later owner
  value with that hash) is withheld wherever it appears in the agent's versions, in
  history too: a newest version carrying one reads as denied.
- Validity (`valid_from`, `valid_until`) never changes what is live: readers mark an
  ended fact and filter on request (`valid_at`).

Pure: `now` and `as_of` are arguments.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from engram.errors import EngramError
from engram.head import head_key, monotonic_created_at
from engram.nip01 import is_hex
from engram.versions import (
    AGENT,
    AGENT_TRUST,
    CONFIRMED,
    DEFAULT_TRUST,
    OWNER,
    Meta,
    Version,
    sha256_text,
)

LIVE, REMOVED, DENIED, FORGOTTEN, ABSENT = "live", "removed", "denied", "forgotten", "absent"
VERSION_PREFIX_MIN = 8  # hex characters of a version id a user may type


class VersionRefError(EngramError, ValueError):
    """A version reference that is too short, not hex, or names several versions."""


class TrustError(EngramError, ValueError):
    """A trust state the writer may not use."""


def _key(v: Version) -> tuple[int, str | bytes]:
    """The head rule's sort key (engram.head.head_key) over versions, by version id."""
    return head_key(v.created_at, v.id)


def dedupe(versions: Iterable[Version]) -> list[Version]:
    """One entry per version id: a revision or verdict over a head that copies it."""
    out: dict[str, Version] = {}
    for v in versions:
        have = out.get(v.id)
        if have is None or (have.head and not v.head):
            out[v.id] = v
    return list(out.values())


def newest(versions: Iterable[Version]) -> Version | None:
    """The head rule over versions: greatest created_at, then the lowest id."""
    return min(versions, key=_key, default=None)


def older(v: Version, than: Version) -> bool:
    """True when `v` comes before `than` in head order."""
    return _key(v) > _key(than)


def barrier(versions: Iterable[Version]) -> Version | None:
    """The newest forget, if any: everything older is forgotten."""
    return newest(v for v in versions if v.meta.forget)


def visible(versions: Iterable[Version]) -> list[Version]:
    """The versions any read may show, newest first: deduplicated, none older than the
    newest forget (the forget itself stays: it is what the slug now reads as)."""
    vs = dedupe(versions)
    mark = barrier(vs)
    return sorted((v for v in vs if mark is None or not older(v, mark)), key=_key)


def _oldest_first(versions: Iterable[Version]) -> list[Version]:
    return sorted(dedupe(versions), key=_key, reverse=True)


def _rejected(versions: Iterable[Version], owner_only: bool) -> dict[str, Version]:
    """value sha256 -> the newest removal that rejects it, oldest first: a later value
    with that hash lifts it (`owner_only`: only owner versions count, either way)."""
    out: dict[str, Version] = {}
    for v in _oldest_first(versions):
        if owner_only and v.role != OWNER:
            continue
        if v.text is None:
            out.update(dict.fromkeys(v.meta.rejected, v))
        else:
            out.pop(sha256_text(v.text) or "", None)
    return out


def denials(versions: Iterable[Version]) -> dict[str, Version]:
    """value sha256 -> the owner verdict that denies it. An owner's later value with the
    same hash (a confirmation or a correction) lifts the denial; nothing else does."""
    return _rejected(versions, owner_only=True)


def rejections(versions: Iterable[Version]) -> dict[str, Version]:
    """value sha256 -> the newest removal (tombstone, denial, forget) that rejects it, unless
    a later version asserted that value again (with force, or by the owner)."""
    return _rejected(versions, owner_only=False)


def withheld(version: Version, versions: Iterable[Version]) -> Version | None:
    """The owner verdict that denies `version`'s value, if the agent wrote it; else None."""
    if version.role != AGENT or version.text is None:
        return None
    return denials(versions).get(sha256_text(version.text) or "")


class Live(NamedTuple):
    """What one slug reads as. `version` is the newest visible version at the time asked
    (the live one when `state` is LIVE; else the removal, denial or forget, or the
    withheld version); `denial` is the verdict that withholds it, when one does."""

    slug: str
    state: str
    version: Version | None
    denial: Version | None = None

    @property
    def text(self) -> str | None:
        return self.version.text if self.state == LIVE and self.version is not None else None

    @property
    def live(self) -> bool:
        return self.state == LIVE


def live_view(slug: str, versions: Iterable[Version], as_of: int | None = None) -> Live:
    """What `slug` reads as now, or at `as_of` (the newest version with created_at <= it).

    Forgotten and owner-denied values never come back, whatever `as_of` says.
    """
    every = dedupe(versions)
    shown = visible(every)
    if as_of is not None:
        shown = [v for v in shown if v.created_at <= as_of]
    if not shown:
        return Live(slug, ABSENT, None)
    return classify(slug, shown[0], every)


def classify(slug: str, version: Version, versions: Iterable[Version]) -> Live:
    """What one version reads as (`version` must be visible among `versions`): its value,
    or why there is none (removed, denied, forgotten, or withheld as denied)."""
    if version.text is None:
        meta, role = version.meta, version.role
        state = FORGOTTEN if meta.forget else DENIED if role == OWNER else REMOVED
        return Live(slug, state, version, version if state == DENIED else None)
    if (denial := withheld(version, versions)) is not None:
        return Live(slug, DENIED, version, denial)
    return Live(slug, LIVE, version)


# --- validity ---------------------------------------------------------------------------


def valid_at(meta: Meta, t: int) -> bool:
    """The fact holds at `t`: valid_from <= t < valid_until (a missing bound is open)."""
    return (meta.valid_from is None or meta.valid_from <= t) and (
        meta.valid_until is None or t < meta.valid_until
    )


def ended(meta: Meta, now: int) -> bool:
    """Its validity has ended (marked by readers, hidden only when asked)."""
    return meta.valid_until is not None and meta.valid_until <= now


# --- versions by name -------------------------------------------------------------------


def resolve(versions: Iterable[Version], ref: str) -> Version | None:
    """The visible version named by `ref`: its id, or a unique prefix of at least 8 hex
    characters. None when none matches; VersionRefError when `ref` is unusable."""
    ref = ref.strip().lower()
    if len(ref) < VERSION_PREFIX_MIN or not is_hex(ref, len(ref)) or len(ref) > 64:
        raise VersionRefError(
            f"a version is its event id or a prefix of at least {VERSION_PREFIX_MIN} hex characters"
        )
    found = [v for v in visible(versions) if v.id.startswith(ref)]
    if len(found) > 1:
        raise VersionRefError(f"{ref} names {len(found)} versions; give more characters")
    return found[0] if found else None


# --- writing ----------------------------------------------------------------------------


def chain_link(versions: Iterable[Version]) -> tuple[str | None, str | None]:
    """(prev, prev_sha256) for the next version: the newest visible version that is a
    revision, a verdict or a head copying one. A plain head is never a link: history
    starts at the first version written with the extension."""
    tip = next((v for v in visible(versions) if not v.plain), None)
    return (tip.id, tip.value_sha256) if tip is not None else (None, None)


def next_created_at(versions: Iterable[Version], now: int, max_skew: int | None) -> int:
    """NIP-AE's `max(now, T + 1)` over every version and head read, forgotten ones too."""
    top = newest(dedupe(versions))
    return monotonic_created_at(now, top.created_at if top else None, max_skew=max_skew)


def write_trust(role: str, requested: str | None) -> str:
    """The trust a new version carries: the owner's values are `confirmed`; the agent's
    are `guess` (the default) or `stated`."""
    if role == OWNER:
        if requested not in (None, CONFIRMED):
            raise TrustError("the owner's values are 'confirmed' (deny with a verdict)")
        return CONFIRMED
    if requested is None:
        return DEFAULT_TRUST
    if requested not in AGENT_TRUST:
        raise TrustError(
            f"the agent writes trust {' or '.join(AGENT_TRUST)}; "
            "'confirmed' and 'denied' are the owner's verdicts"
        )
    return requested


class Refusal(NamedTuple):
    """Why a write may not go ahead. `kind`: `rejected` (a tombstone rejected the value),
    `denied` (the owner denied it: force does not help), `corrected` (the newest version
    is the owner's value: force writes over it)."""

    kind: str
    version: Version

    @property
    def overridable(self) -> bool:
        return self.kind != "denied"

    @property
    def reason(self) -> str | None:
        return self.version.meta.reason

    def message(self, slug: str) -> str:
        why = f" ({self.reason})" if self.reason else " (no reason given)"
        vid = self.version.id
        if self.kind == "denied":
            return (
                f"{slug}: the owner denied this value in verdict {vid}{why}; only the owner can "
                "restore it"
            )
        if self.kind == "rejected":
            return (
                f"{slug}: this value was rejected by tombstone {vid}{why}; write it anyway "
                "with --force"
            )
        return (
            f"{slug}: the owner confirmed or corrected this value in version {vid}; write "
            "over the owner's value with --force"
        )


def check_write(
    versions: Iterable[Version], role: str, text: str | None, *, force: bool = False
) -> Refusal | None:
    """The refusal rules for a new version of `text` (None: a removal) by `role`.

    The owner outranks: its writes are never refused. The agent may not re-assert a value
    the owner denied; may not re-assert a value a tombstone rejected, nor write over the
    owner's value, unless `force`.
    """
    if role == OWNER:
        return None
    every = dedupe(versions)
    if text is not None:
        digest = sha256_text(text) or ""
        if (denial := denials(every).get(digest)) is not None:
            return Refusal("denied", denial)
        if not force and (tomb := rejections(every).get(digest)) is not None:
            return Refusal("rejected", tomb)
    shown = visible(every)
    if not force and shown and shown[0].role == OWNER and shown[0].text is not None:
        return Refusal("corrected", shown[0])
    return None
