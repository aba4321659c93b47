"""NIP-56 reports (kind 1984): which events a report points at, and why (pure)."""

from __future__ import annotations

from engram.nip01 import Event, is_hex

KIND_REPORT = 1984


def reported_events(event: Event) -> list[tuple[str, str]]:
    """(event id, reason) for each `e` tag of a report; the reason is the tag's report
    type (`spam`, `illegal`, …) or, without one, the report's content."""
    if event.kind != KIND_REPORT:
        return []
    out: list[tuple[str, str]] = []
    for tag in event.tags:
        if len(tag) >= 2 and tag[0] == "e" and is_hex(tag[1], 64):
            reason = tag[2] if len(tag) >= 3 and tag[2] else event.content
            out.append((tag[1], reason[:200]))
    return out
