"""`cli.nostr.paging.fetch_all` handing pages to a reader (`take`) instead of keeping them: the
same events, each once, whatever the page boundaries (a relay pages with an inclusive
`until`, so a boundary second comes back again)."""

from __future__ import annotations

from typing import Any

import pytest

from cli.nostr.paging import fetch_all
from engram.nip01 import Event


class Relay:
    """Answers REQ newest first, at most `limit` (and its own max_limit), honouring until."""

    def __init__(self, events: list[Event], max_limit: int) -> None:
        self.events = sorted(events, key=lambda e: (-e.created_at, e.id))
        self.max_limit = max_limit

    async def query(self, flt: dict[str, Any]) -> list[Event]:
        until = flt.get("until")
        rows = [e for e in self.events if until is None or e.created_at <= until]
        return rows[: min(flt["limit"], self.max_limit)]


def event(i: int, created_at: int) -> Event:
    return Event(
        id=f"{i:064x}",
        pubkey="ab" * 32,
        created_at=created_at,
        kind=30174,
        tags=[],
        content="",
        sig="cd" * 64,
    )


@pytest.mark.parametrize("max_limit", [4, 7, 50])
async def test_take_gets_every_event_once_and_nothing_is_kept(max_limit: int) -> None:
    # several events share seconds, across page boundaries
    events = [event(i, 1_000 + i // 3) for i in range(40)]
    relay = Relay(events, max_limit)
    kept = await fetch_all(relay, {"kinds": [30174]}, max_limit)
    taken: list[Event] = []
    streamed = await fetch_all(relay, {"kinds": [30174]}, max_limit, take=taken.extend)
    assert sorted(e.id for e in taken) == sorted(kept.events) == sorted(e.id for e in events)
    assert len(taken) == len({e.id for e in taken})  # each once
    assert streamed.events == {} and streamed.complete and streamed.pages == kept.pages
