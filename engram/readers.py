"""Who may read a private event: its author and its recipient, nobody else.

Engrams (kind 30174, NIP-AE) are private by definition; a relay may make other kinds
private too (direct messages: NIP-04 kind 4, NIP-59 gift wraps 1059). The recipient is
the event's FIRST `p` tag, when it is a public key: NIP-04 and NIP-59 give these events
exactly one, and the relay's store keeps that one key (its `owner` column) so that the
same rule holds in SQL, where a LIMIT must count only readable rows.

Pure: the relay's read policy (`relay.policy`) and store (`relay.store.sqlwrite` keeps the
recipient, `relay.store.sqlread` compares it) apply it.
"""

from __future__ import annotations

from engram.nip01 import is_hex


def recipient(tags: list[list[str]]) -> str | None:
    """The first `p` tag's value if it is a 64-hex public key, else None."""
    for t in tags:
        if len(t) >= 2 and t[0] == "p":
            return t[1] if is_hex(t[1], 64) else None
    return None


def parties(author: str, tags: list[list[str]]) -> frozenset[str]:
    """The only readers of a private event: its author and its recipient."""
    to = recipient(tags)
    return frozenset((author,) if to is None else (author, to))


def asks_only_own(authors: list[str] | None, p: list[str] | None, viewer: str | None) -> bool:
    """A filter for private events is answerable when it asks for the viewer's own only:
    every author it names is the viewer, or every `#p` value it names is."""
    if viewer is None:
        return False
    own_authors = bool(authors) and all(a == viewer for a in authors or ())
    own_p = bool(p) and all(v == viewer for v in p or ())
    return own_authors or own_p
