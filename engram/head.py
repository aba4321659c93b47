"""NIP-AE heads (spec: *Head selection*, *Writing*, *Reading and listing*).

Relays should keep only the newest event per address but may return older ones, so a
reader validates every candidate and picks the head itself. Pure: `now` is an argument.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from engram.body import Body, Core, Tombstone
from engram.envelope import validate_and_decrypt
from engram.errors import ClockConflictError, InvalidEngramError
from engram.nip01 import Event
from engram.slug import CORE_SLUG, d_tag

FUTURE_SKEW_MAX = 600  # seconds a new created_at may run ahead of `now` before we refuse


def select_head(events: Iterable[Event]) -> Event | None:
    """Greatest `created_at`; at equal `created_at` the lowest id (hex string order) wins.

    The result does not depend on input order. Callers pass only events already valid
    for the slug (see `lookup_head`); this function only breaks ties.
    """
    return min(events, key=lambda e: (-e.created_at, e.id), default=None)


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


def _pick(heads: list[Head]) -> Head | None:
    best = select_head(h.event for h in heads)
    return next((h for h in heads if h.event is best), None)


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
    return Lookup(_pick(heads), len(candidates), len(candidates) - len(heads))


def heads_by_slug(
    events: Iterable[Event], agent_pubkey: str, owner_pubkey: str, conversation_key: bytes
) -> dict[str, Head]:
    """Drop invalid events, group by slug (equivalently by `d`), keep each group's head."""
    groups: dict[str, list[Head]] = {}
    for head in valid_heads(events, agent_pubkey, owner_pubkey, conversation_key):
        groups.setdefault(head.body.slug, []).append(head)
    return {slug: h for slug, group in groups.items() if (h := _pick(group)) is not None}


class ListingEntry(msgspec.Struct, frozen=True):
    """One line of a listing (spec: *Reading and listing*)."""

    slug: str
    event_id: str
    created_at: int


def listing(heads: dict[str, Head]) -> list[ListingEntry]:
    """Heads minus tombstones and core, sorted by slug."""
    return [
        ListingEntry(slug=slug, event_id=h.event.id, created_at=h.event.created_at)
        for slug, h in sorted(heads.items())
        if slug != CORE_SLUG and not isinstance(h.body, Tombstone | Core)
    ]


def core_profile(heads: dict[str, Head]) -> str | None:
    """The core head's profile, or None when there is no valid core."""
    head = heads.get(CORE_SLUG)
    return head.body.profile if head is not None and isinstance(head.body, Core) else None
