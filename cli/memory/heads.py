"""Checking the events a relay set returned for one agent's memory: each distinct event is
validated (and decrypted) at most once, invalid ones are counted by reason, and the
head rule is `engram.head`'s (`first_valid_heads`, `merge_heads`), never restated here."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgspec

from cli.identity import Identity
from cli.memory.results import SKIP_REASONS
from engram import Head, InvalidEngramError, first_valid_heads, validate_and_decrypt
from engram.nip01 import Event


class HeadChecker:
    """Validates each distinct event once (a tampered copy is a distinct event) and
    counts the invalid ones by reason."""

    def __init__(self, ident: Identity) -> None:
        self._ident = ident
        self._seen: dict[bytes, Head | None] = {}
        self.skipped: Counter[str] = Counter()

    def head(self, event: Event) -> Head | None:
        key = msgspec.json.encode(event)
        if key in self._seen:
            return self._seen[key]
        ident = self._ident
        try:
            body = validate_and_decrypt(event, ident.agent, ident.owner, ident.conversation_key)
        except InvalidEngramError as exc:
            self.skipped[SKIP_REASONS.get(exc.rule, "invalid")] += 1
            result = None
        else:
            result = Head(event, body)
        self._seen[key] = result
        return result

    def heads(self, events: Iterable[Event]) -> dict[str, Head]:
        """slug -> head among `events` (spec: *Head selection*), older versions of a slug
        never decrypted once a newer valid one is found (`engram.first_valid_heads`)."""
        return first_valid_heads(events, self.head)


def behind(views: dict[str, dict[str, Head]], merged: dict[str, Head]) -> dict[str, int]:
    """relay -> how many slugs it holds an older head for (or none), against `merged`."""
    out: dict[str, int] = {}
    for url, view in views.items():
        n = sum(
            1
            for slug, h in merged.items()
            if (v := view.get(slug)) is None or v.event.id != h.event.id
        )
        if n:
            out[url] = n
    return out
