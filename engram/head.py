"""NIP-AE heads (spec: *Head selection*, *Writing*, *Reading and listing*).

Relays should keep only the newest event per address but may return older ones, so a
reader validates every candidate and picks the head itself. Pure: `now` is an argument.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import msgspec

from engram.body import Body, Core, Tombstone
from engram.envelope import validate_and_decrypt
from engram.errors import ClockConflictError, InvalidEngramError
from engram.nip01 import Event
from engram.slug import CORE_SLUG, d_tag

FUTURE_SKEW_MAX = 600  # seconds a new created_at may run ahead of `now` before we refuse


def head_key(created_at: int, event_id: str | bytes) -> tuple[int, str | bytes]:
    """The head rule as a sort key, smallest first: the greatest `created_at`, then the
    lowest id. Raw 32-byte ids order exactly as their lower-case hex, so the relay's
    store (bytes) and readers (hex) break ties alike."""
    return (-created_at, event_id)


def beats(created_at: int, event_id: str | bytes, other_at: int, other_id: str | bytes) -> bool:
    """True when (created_at, event_id) is the head over (other_at, other_id)."""
    return head_key(created_at, event_id) < head_key(other_at, other_id)


def select_head(events: Iterable[Event]) -> Event | None:
    """Greatest `created_at`; at equal `created_at` the lowest id (hex string order) wins.

    The result does not depend on input order. Callers pass only events already valid
    for the slug (see `lookup_head`); this function only breaks ties.
    """
    return min(events, key=lambda e: head_key(e.created_at, e.id), default=None)


def monotonic_created_at(
    now: int, prior_head_created_at: int | None, *, max_skew: int | None = None
) -> int:
    """`max(now, T + 1)` where T is the current head's created_at (None or 0: no head).

    With ids depending on a random nonce, only a strictly greater timestamp guarantees
    that a new write supersedes the head it read. If `max_skew` is given and the result
    runs more than `max_skew` seconds ahead of `now` (a clock-poisoned head), raise
    `ClockConflictError` so the caller reports a conflict instead of publishing.
    """
    created_at = max(now, prior_head_created_at + 1) if prior_head_created_at else now
    if max_skew is not None and created_at - now > max_skew:
        raise ClockConflictError(
            f"current head is {created_at - 1 - now} s in the future; refusing to write after it"
        )
    return created_at


class Head(NamedTuple):
    """A valid event and its decrypted body."""

    event: Event
    body: Body


class Lookup(NamedTuple):
    """The result of reading one slug.

    `candidates == 0`: nothing carries the slug's `d` (a confirmed absence, if the query
    succeeded). `head is None` with `candidates > 0`: every candidate failed validation,
    which is not an absence (spec: the fetch hook injects nothing then).
    """

    head: Head | None
    candidates: int
    rejected: int


def valid_heads(
    events: Iterable[Event], agent_pubkey: str, owner_pubkey: str, conversation_key: bytes
) -> list[Head]:
    """Every event that passes the five validity rules, with its body; invalid ones dropped."""
    out: list[Head] = []
    for event in events:
        try:
            body = validate_and_decrypt(event, agent_pubkey, owner_pubkey, conversation_key)
        except InvalidEngramError:
            continue
        out.append(Head(event, body))
    return out


def pick_head(heads: Iterable[Head]) -> Head | None:
    """The head among valid `heads` by `select_head`'s rule; None when there are none."""
    return min(heads, key=lambda h: head_key(h.event.created_at, h.event.id), default=None)


def merge_heads(views: Iterable[dict[str, Head]]) -> dict[str, Head]:
    """slug -> the head across several readers' views (e.g. one per relay)."""
    groups: dict[str, list[Head]] = {}
    for view in views:
        for slug, head in view.items():
            groups.setdefault(slug, []).append(head)
    return {slug: h for slug, group in groups.items() if (h := pick_head(group)) is not None}


def first_valid_heads(
    events: Iterable[Event], check: Callable[[Event], Head | None]
) -> dict[str, Head]:
    """slug -> head among `events`, validating as few events as possible.

    `check` is the five validity rules (`validate_and_decrypt`, or a caching wrapper):
    a Head, or None for an invalid event. A valid event's slug re-derives to its `d`
    (rule 4), so grouping by `d` is grouping by slug: each group is tried in head order
    and its first valid event is the head. Older versions are never decrypted, which
    keeps a relay that returns every historical version as cheap as one that keeps only
    heads. Events without exactly one `d` can never be valid; they are all tried (and
    counted invalid by `check`).
    """
    groups: dict[str, list[Event]] = {}
    for event in events:
        ds = [t[1] for t in event.tags if len(t) >= 2 and t[0] == "d"]
        groups.setdefault(ds[0] if len(ds) == 1 else "", []).append(event)
    out: dict[str, Head] = {}
    for d, group in groups.items():
        group.sort(key=lambda e: head_key(e.created_at, e.id))
        for event in group:
            if (h := check(event)) is not None:
                if (prior := out.get(h.body.slug)) is None or beats(
                    h.event.created_at, h.event.id, prior.event.created_at, prior.event.id
                ):
                    out[h.body.slug] = h
                if d:
                    break
    return out


def lookup_head(
    events: Iterable[Event],
    agent_pubkey: str,
    owner_pubkey: str,
    conversation_key: bytes,
    slug: str,
) -> Lookup:
    """The head of `slug` among `events` (spec: *Head selection*); events for other
    addresses are not candidates. A Tombstone head means the slug reads as absent."""
    d = d_tag(conversation_key, slug)
    candidates = [e for e in events if any(t[:2] == ["d", d] for t in e.tags)]
    heads = valid_heads(candidates, agent_pubkey, owner_pubkey, conversation_key)
    return Lookup(pick_head(heads), len(candidates), len(candidates) - len(heads))


def heads_by_slug(
    events: Iterable[Event], agent_pubkey: str, owner_pubkey: str, conversation_key: bytes
) -> dict[str, Head]:
    """Drop invalid events, group by slug (equivalently by `d`), keep each group's head."""

    def check(event: Event) -> Head | None:
        try:
            body = validate_and_decrypt(event, agent_pubkey, owner_pubkey, conversation_key)
        except InvalidEngramError:
            return None
        return Head(event, body)

    return first_valid_heads(events, check)


class ListingEntry(msgspec.Struct, frozen=True):
    """One line of a listing (spec: *Reading and listing*)."""

    slug: str
    event_id: str
    created_at: int


def is_live(body: Body) -> bool:
    """Whether a head's body reads as a live memory (spec: *Reading and listing*): not a
    tombstone and not core. The one rule for every read path that returns memories:
    `listing` (ls) and the recall index."""
    return body.slug != CORE_SLUG and not isinstance(body, Tombstone | Core)


def listing(heads: dict[str, Head]) -> list[ListingEntry]:
    """Live heads (`is_live`), sorted by slug."""
    return [
        ListingEntry(slug=slug, event_id=h.event.id, created_at=h.event.created_at)
        for slug, h in sorted(heads.items())
        if is_live(h.body)
    ]


def core_profile(heads: dict[str, Head]) -> str | None:
    """The core head's profile, or None when there is no valid core."""
    head = heads.get(CORE_SLUG)
    return head.body.profile if head is not None and isinstance(head.body, Core) else None
