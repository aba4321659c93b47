"""Complete reads over REQ: page back through a relay's history with `until`.

A relay returns at most its `max_limit` events per filter, newest first, and counts
every stored version and tombstone against it. Paging asks again with `until` set to the
oldest `created_at` of the last page (inclusive, so events sharing that second are asked
for again and recognised by id: the `(created_at, id)` tie-break) until a page comes back
short. Paging makes no progress only on a relay that ignores `until`, or when more
events share one second than fit in a page; those are reported, never hidden, and never
loop. A relay that keeps inventing new events is cut off after `MAX_PAGES` pages.

`fetch_all` is the one paging routine: agent-memory reads, `engram mem sync|migrate`
and `engram sync` (`cli.nostr.peer.Peer.page`) all page through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from engram.nip01 import Event

DEFAULT_PAGE = 500  # asked for when the relay does not publish max_limit (NIP-11)
MAX_PAGES = 20_000  # a bound on rounds: 10 million events at 500 per page


class Queryable(Protocol):
    """Anything that answers one REQ up to EOSE: a `RelayClient`, or a `Peer` (which
    bounds each REQ with its step deadline)."""

    async def query(self, nostr_filter: dict[str, Any]) -> list[Event]: ...


@dataclass
class Fetched:
    """Everything one relay returned for a filter, by id, and how paging went."""

    events: dict[str, Event] = field(default_factory=dict)
    pages: int = 0
    stuck_at: list[int] = field(default_factory=list)  # seconds paging could not get past
    ignores_until: bool = False
    cut_off: bool = False  # stopped at MAX_PAGES

    @property
    def complete(self) -> bool:
        return not self.stuck_at and not self.ignores_until and not self.cut_off

    def why_incomplete(self, max_limit_known: bool) -> str | None:
        """Why this listing may be partial, in words for the user; None if it is whole."""
        if self.ignores_until:
            return "the relay ignores `until`, so paging cannot go further back"
        if self.stuck_at:
            seconds = ", ".join(str(s) for s in self.stuck_at[:3])
            return f"more events share one second ({seconds}) than the relay returns per page"
        if self.cut_off:
            return f"paging stopped after {self.pages} pages"
        if not max_limit_known:
            return "no max_limit known; paged until nothing new came back (may be partial)"
        return None


async def fetch_all(
    client: Queryable,
    nostr_filter: dict[str, Any],
    max_limit: int | None,
    *,
    max_pages: int = MAX_PAGES,
    on_page: Callable[[Fetched], None] | None = None,
    take: Callable[[list[Event]], None] | None = None,
) -> Fetched:
    """Page through every event matching `nostr_filter` (its limit is ignored; its
    `until`, if any, is where paging starts).

    With a known `max_limit`, a page shorter than it is the last. Without one the relay
    may clamp silently, so paging continues until a page brings no new event.

    `take`, for a reader that cannot hold every event at once: each page's new events go
    to it as they arrive and are not kept (`events` stays empty; their ids are kept, to
    tell new events from those seen).
    """
    page_size = max_limit or DEFAULT_PAGE
    out = Fetched()
    known: dict[str, Event] | set[str] = out.events if take is None else set()
    base = {k: v for k, v in nostr_filter.items() if k not in ("limit", "until")}
    until: int | None = nostr_filter.get("until")
    while True:
        if out.pages >= max_pages:
            out.cut_off = True
            return out
        query = {**base, "limit": page_size}
        if until is not None:
            query["until"] = until
        page = await client.query(query)
        out.pages += 1
        if not page:
            return out
        if until is not None and any(e.created_at > until for e in page):
            out.ignores_until = True  # the same newest events again: no way further back
            _keep(out, known, _unseen(page, known), take)
            return out
        new = _unseen(page, known)
        _keep(out, known, new, take)
        if on_page is not None:
            on_page(out)
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


def _unseen(page: list[Event], known: dict[str, Event] | set[str]) -> list[Event]:
    return list({e.id: e for e in page if e.id not in known}.values())


def _keep(
    out: Fetched,
    known: dict[str, Event] | set[str],
    new: list[Event],
    take: Callable[[list[Event]], None] | None,
) -> None:
    if take is None:
        for e in new:
            out.events[e.id] = e
        return
    assert isinstance(known, set)
    known.update(e.id for e in new)
    if new:
        take(new)
