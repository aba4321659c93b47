"""Local search over decrypted memory: the relay only ever sees ciphertext, so the
query is matched here, after decryption, and never sent anywhere.

A caller's regular expression can backtrack catastrophically (`(a|aa)+$`), and a
match in CPython's `re` cannot be interrupted. Patterns are compiled with the `regex`
module instead, whose matches take a timeout: the whole search gets `MATCH_SECONDS`
and releases the GIL while matching (`concurrent=True`), so it can run in a worker
thread while the event loop goes on; past its time it is a BadInputError.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import regex

from cli.nostr.errors import BadInputError

SNIPPET = 80  # characters of context shown around a match
MATCH_SECONDS = 2.0  # for matching one query against every memory


@dataclass(frozen=True)
class Match:
    """One search hit: a one-line snippet around the match; higher `score` ranks first;
    the version's trust and validity, as `ls` shows them."""

    slug: str
    snippet: str
    created_at: int
    event_id: str
    score: int
    trust: str | None = None
    role: str = "agent"
    valid_until: int | None = None
    ended: bool = False


class Searchable(Protocol):
    """A live memory as `AgentMemory.live` gives it (cli.memory.results.LiveView)."""

    value: str
    created_at: int
    event_id: str
    trust: str | None
    role: str
    valid_until: int | None
    ended: bool


def _one_line(text: str) -> str:
    return " ".join(text.split())


def snippet(text: str, start: int, end: int, width: int = SNIPPET) -> str:
    """A one-line excerpt of `text` around `[start, end)`, with … where it was cut."""
    pad = max((width - (end - start)) // 2, 10)
    lo, hi = max(start - pad, 0), min(end + pad, len(text))
    return ("…" if lo else "") + _one_line(text[lo:hi]) + ("…" if hi < len(text) else "")


def compile_query(query: str, is_regex: bool) -> regex.Pattern[str]:
    """The case-insensitive pattern for `query` (a literal text unless `is_regex`)."""
    if not query:
        raise BadInputError("the search query is empty")
    try:
        return regex.compile(query if is_regex else regex.escape(query), regex.IGNORECASE)
    except regex.error as exc:
        raise BadInputError(f"invalid regular expression: {exc}") from exc


def search_views(
    views: Mapping[str, Searchable],
    pattern: regex.Pattern[str],
    limit: int,
    seconds: float = MATCH_SECONDS,
) -> list[Match]:
    """Live memories (core included) whose slug or text matches, best first.

    Score: a match in the slug counts 10, each match in the text 1 (up to 10); ties go
    to the newer entry, then the slug. Matching stops after `seconds` (BadInputError).
    """
    end = time.monotonic() + seconds

    def left() -> float:
        return max(end - time.monotonic(), 0.001)

    try:
        return _search(views, pattern, limit, left)
    except TimeoutError as exc:
        raise BadInputError(
            f"the regular expression did not finish matching within {seconds:g} s "
            "(it backtracks too much): simplify it"
        ) from exc


def _search(
    views: Mapping[str, Searchable],
    pattern: regex.Pattern[str],
    limit: int,
    left: Callable[[], float],
) -> list[Match]:
    found: list[Match] = []
    for slug, view in views.items():
        text = view.value
        in_slug = pattern.search(slug, timeout=left(), concurrent=True) is not None
        hits = []
        for hit in pattern.finditer(text, timeout=left(), concurrent=True):
            hits.append(hit)
            if len(hits) > 10:
                break  # the score counts at most 10
        if not in_slug and not hits:
            continue
        score = (10 if in_slug else 0) + min(len(hits), 10)
        if hits:
            shown = snippet(text, hits[0].start(), hits[0].end())
        else:
            shown = _one_line(text[:SNIPPET]) + ("…" if len(text) > SNIPPET else "")
        found.append(
            Match(
                slug,
                shown,
                view.created_at,
                view.event_id,
                score,
                view.trust,
                view.role,
                view.valid_until,
                view.ended,
            )
        )
    found.sort(key=lambda m: (-m.score, -m.created_at, m.slug))
    return found[:limit]
