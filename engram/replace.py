"""NIP-01 replaceable and addressable events: what a relay answers a version it does not
keep because a version that wins is stored (`engram.head.beats`: the newer created_at,
then the lower id). Pure.

The answer is `OK true` with a `duplicate:` message that says which case it is. Clients
that must tell "not kept: superseded" from "stored" (a republishing memory client) ask
`is_superseded` rather than matching words of their own.
"""

from __future__ import annotations

NEWER_STORED = "duplicate: a newer version of this replaceable event is stored"
TIE_LOST = (
    "duplicate: a version of this replaceable event with the same created_at and a lower id"
    " is stored"
)
SUPERSEDED = (NEWER_STORED, TIE_LOST)


def superseded_message(created_at: int, stored_created_at: int | None) -> str:
    """The answer to a version at `created_at` that lost to the stored one (None: which
    one won is not known any more, e.g. it was deleted meanwhile)."""
    return TIE_LOST if stored_created_at == created_at else NEWER_STORED


def is_superseded(message: str) -> bool:
    """The relay did not keep the event: a version of its address that wins is stored."""
    return message in SUPERSEDED
