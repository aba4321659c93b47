"""Local search over decrypted memory: the relay only ever sees ciphertext, so the
query is matched here, after decryption, and never sent anywhere."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engram import Head, Tombstone, body_text

SNIPPET = 80  # characters of context shown around a match


@dataclass(frozen=True)
class Match:
    """One search hit: a one-line snippet around the match; higher `score` ranks first."""

    slug: str
    snippet: str
    created_at: int
    event_id: str
    score: int


def _one_line(text: str) -> str:
    return " ".join(text.split())


def snippet(text: str, start: int, end: int, width: int = SNIPPET) -> str:
    """A one-line excerpt of `text` around `[start, end)`, with … where it was cut."""
    pad = max((width - (end - start)) // 2, 10)
    lo, hi = max(start - pad, 0), min(end + pad, len(text))
    return ("…" if lo else "") + _one_line(text[lo:hi]) + ("…" if hi < len(text) else "")


def search_heads(heads: dict[str, Head], pattern: re.Pattern[str], limit: int) -> list[Match]:
    """Live heads (core included) whose slug or text matches, best first.

    Score: a match in the slug counts 10, each match in the text 1 (up to 10); ties go
    to the newer entry, then the slug.
    """
    found: list[Match] = []
    for slug, head in heads.items():
        if isinstance(head.body, Tombstone):
            continue
        text = body_text(head.body) or ""
        in_slug = pattern.search(slug) is not None
        hits = list(pattern.finditer(text))
        if not in_slug and not hits:
            continue
        score = (10 if in_slug else 0) + min(len(hits), 10)
        if hits:
            shown = snippet(text, hits[0].start(), hits[0].end())
        else:
            shown = _one_line(text[:SNIPPET]) + ("…" if len(text) > SNIPPET else "")
        found.append(Match(slug, shown, head.event.created_at, head.event.id, score))
    found.sort(key=lambda m: (-m.score, -m.created_at, m.slug))
    return found[:limit]
