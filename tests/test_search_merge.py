"""The search index's pending list is merged by the writer's own statement (issue 47).

PostgreSQL's GIN `fastupdate` appends new entries to a pending list and merges it into
the index in bulk; left alone, the insert that grows the list past its limit merges it
inside its batch, whose events then wait for that. The writer merges it itself after
`search_clean_bytes` of searched content (relay.store.pgwriter), and its sessions let an
insert merge it only past 16 MB. What is checked here is
what a database shows: after the writer's merge nothing is left pending
(`gin_clean_pending_list` merges no page), without it the entries are still pending, and
either way the same rows are found by search.
"""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import msgspec

from engram.nip01 import Event
from relay.config import Settings
from relay.filters import Filter
from relay.store import SaveStatus
from relay.store.postgres import PostgresStore

SK = [bytes([i + 1]) * 32 for i in range(3)]
MakeEvent = Callable[..., Event]


async def pending_pages_merged(database_url: str) -> int:
    """Merge what is pending now; returns the pages that were (0: nothing was)."""
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT gin_clean_pending_list('events_words'::regclass)"))
    finally:
        await conn.close()


def notes(make_event: MakeEvent) -> list[Event]:
    return [
        make_event(SK[i % 3], content=f"lighthouse keeper number {i} on the shore", created_at=i)
        for i in range(1, 31)
    ]


async def store_each(store: PostgresStore, events: list[Event]) -> None:
    """One at a time: each its own batch."""
    for ev in events:
        result = await store.save(ev, msgspec.json.encode(ev))
        assert result.status is SaveStatus.STORED


async def found(store: PostgresStore, word: str) -> set[str]:
    raws = await store.query([Filter(search=word, limit=100)])
    return {msgspec.json.decode(r)["id"] for r in raws}


async def test_the_writer_merges_the_pending_list_after_enough_content(
    database_url: str, make_event: MakeEvent
) -> None:
    events = notes(make_event)
    content = sum(len(e.content) for e in events)  # the merge starts after the last one
    store = await PostgresStore.open(database_url, Settings(search_clean_bytes=content))
    try:
        # an insert merges the list only past 16 MB: the writer's merges are the cadence
        assert await store._pool.fetchval("SHOW gin_pending_list_limit") == "16MB"
        await store_each(store, events[:-1])
        assert store._cleaning is None  # not enough content yet
        await store_each(store, events[-1:])
        assert store._cleaning is not None
        await store._cleaning
        assert await found(store, "lighthouse") == {e.id for e in events}
        assert await found(store, "absent") == set()
    finally:
        await store.close()
    assert await pending_pages_merged(database_url) == 0  # the writer merged them all


async def test_without_the_setting_the_entries_stay_pending(
    database_url: str, make_event: MakeEvent
) -> None:
    events = notes(make_event)
    store = await PostgresStore.open(database_url, Settings(search_clean_bytes=0))
    try:
        assert await store._pool.fetchval("SHOW gin_pending_list_limit") == "4MB"
        await store_each(store, events)
        assert store._cleaning is None
        assert await found(store, "lighthouse") == {e.id for e in events}
        assert await found(store, "absent") == set()
    finally:
        await store.close()
    assert await pending_pages_merged(database_url) >= 1  # still pending
