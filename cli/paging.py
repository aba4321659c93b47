"""Complete reads over REQ: page back through a relay's history with `until`.

A relay returns at most its `max_limit` events per filter, newest first, and counts
every stored version and tombstone against it. Paging asks again with `until` set to the
oldest `created_at` of the last page (inclusive, so events sharing that second are asked
for again and recognised by id: the `(created_at, id)` tie-break) until a page comes back
short. Paging makes no progress only on a relay that ignores `until`, or when more
events share one second than fit in a page; those are reported, never hidden.

`fetch_all` is how reads learn what a relay holds; sync and migration use it for one
relay and for relays without NIP-77, and reconcile the others with negentropy
(`AgentMemory._reconciled`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from cli.client import RelayClient
from engram.nip01 import Event

DEFAULT_PAGE = 500  # asked for when the relay does not publish max_limit (NIP-11)


@dataclass
class Fetched:
    """Everything one relay returned for a filter, by id, and how paging went."""

    events: dict[str, Event] = field(default_factory=dict)
    pages: int = 0
    stuck_at: list[int] = field(default_factory=list)  # seconds paging could not get past
    ignores_until: bool = False

    @property
    def complete(self) -> bool:
        return not self.stuck_at and not self.ignores_until


async def fetch_all(
    client: RelayClient, nostr_filter: dict[str, Any], max_limit: int | None
) -> Fetched:
    """Page through every event matching `nostr_filter` (which must not set limit/until).

    With a known `max_limit`, a page shorter than it is the last. Without one the relay
    may clamp silently, so paging continues until a page brings no new event.
    """
    page_size = max_limit or DEFAULT_PAGE
    out = Fetched()
    until: int | None = None
    while True:
        query = {**nostr_filter, "limit": page_size}
        if until is not None:
            query["until"] = until
        page = await client.query(query)
        out.pages += 1
        if not page:
            return out
        if until is not None and any(e.created_at > until for e in page):
            out.ignores_until = True  # the same newest events again: no way further back
            for e in page:
                out.events.setdefault(e.id, e)
            return out
        new = [e for e in page if e.id not in out.events]
        for e in new:
            out.events[e.id] = e
        short = len(page) < page_size
        oldest = min(e.created_at for e in page)
        if short and (max_limit is not None or not new):
            return out
        if not new:
            # A full page of events already seen: more than a page share second `oldest`.
            out.stuck_at.append(oldest)
            if oldest <= 0:
                return out
            until = oldest - 1
            continue
        until = oldest
