"""Recall hits as the CLI, the MCP server and the ACP proxy show them."""

from __future__ import annotations

import time
from typing import Any

from cli.memory.recall.index import Hit
from cli.memory.recall.settings import SETTINGS
from cli.memory.recall.text import STOP_WORDS
from cli.memory.search import snippet


def hit_snippet(hit: Hit, query: str, width: int = SETTINGS.snippet) -> str:
    """One line of the value: around the first query word it contains, else its start."""
    lower = hit.value.lower()
    for word in query.lower().split():
        word = word.strip(".,;:!?\"'()")
        if len(word) < 3 or word in STOP_WORDS:
            continue
        at = lower.find(word)
        if at >= 0:
            return snippet(hit.value, at, at + len(word), width)
    return snippet(hit.value, 0, 0, width) if hit.value else ""


def score(hit: Hit) -> float:
    return round(hit.score, 6)


def ended(hit: Hit, now: int | None = None) -> bool:
    """Its validity has ended (marked, not hidden: `--valid-now` hides it)."""
    until = hit.valid_until
    return until is not None and until <= (int(time.time()) if now is None else now)


def hit_json(hit: Hit, query: str) -> dict[str, Any]:
    """The documented `--json` member set, in a fixed order."""
    return {
        "slug": hit.slug,
        "value": hit.value,
        "snippet": hit_snippet(hit, query),
        "score": score(hit),
        "created_at": hit.created_at,
        "event_id": hit.event_id,
        "trust": hit.trust,
        "role": hit.role,
        "valid_from": hit.valid_from,
        "valid_until": hit.valid_until,
        "ended": ended(hit),
    }


def hit_line(hit: Hit, query: str) -> str:
    """slug, score, created_at, snippet, trust, validity (`-`, or `ended` and when)."""
    mark = "-"
    if ended(hit) and hit.valid_until is not None:
        mark = "ended " + time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(hit.valid_until))
    return (
        f"{hit.slug}\t{score(hit):.6f}\t{hit.created_at}\t{hit_snippet(hit, query)}\t"
        f"{hit.trust or '-'}\t{mark}"
    )
