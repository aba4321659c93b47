"""The tag index's encoding: one home for both sides of it.

The write side (an event's `tagvals` and its `d` column, relay.store.sqlwrite) and the
read side (`#x` filters, relay.store.sqlread and sqlcount; the reference store,
relay.store.memory) must encode a value identically, or queries miss. Pure: no I/O.
"""

from __future__ import annotations

import hashlib

from engram.kinds import is_addressable, is_replaceable

# A tag value longer than this (UTF-8 bytes) is indexed by its hash: a btree/GIN entry
# must fit in a third of a page (~2.7 KB), and another Postgres relay crashed on inserts
# of long tag values for exactly this reason.
INDEX_VALUE_MAX = 200
# Marks the hashed form. A genuine value starting with it is hashed too, so the two
# forms can never collide. NUL (which Postgres text rejects) also forces the hash.
_HASHED = "\x01"


def index_value(value: str) -> str:
    """The indexable form of a tag value: itself, or a marked SHA-256 when too long.

    Injective (up to SHA-256 collisions): values that are long, contain NUL, or start
    with the marker are hashed; everything else is stored verbatim.
    """
    if (len(value) > INDEX_VALUE_MAX // 4 and len(value.encode()) > INDEX_VALUE_MAX) or (
        "\x00" in value or value.startswith(_HASHED)
    ):
        return _HASHED + hashlib.sha256(value.encode()).hexdigest()
    return value


def tag_key(name: str, value: str) -> str:
    """One `tagvals` element: single-character tag name, ':', indexable value."""
    return name + ":" + index_value(value)


def event_tagvals(tags: list[list[str]]) -> list[str]:
    """Index keys of every tag with a one-character name and a value (what `#x` reads)."""
    keys = [tag_key(t[0], t[1]) for t in tags if len(t) >= 2 and len(t[0]) == 1]
    return list(dict.fromkeys(keys)) if len(keys) > 1 else keys


def address_d(kind: int, tags: list[list[str]]) -> str | None:
    """The `d` column: NULL for regular events, '' for replaceable kinds, the indexable
    form of the first `d` tag value (or '') for addressable kinds."""
    if is_replaceable(kind):
        return ""
    if is_addressable(kind):
        for t in tags:
            if t and t[0] == "d":
                return index_value(t[1]) if len(t) >= 2 else ""
        return ""
    return None
