"""Migration 0029 on a store with data: events' uniqueness moves from the primary key
(tenant, id) to the unique time index (tenant, created_at DESC, id), and ids are found
through a hash index. A store that had the old layout keeps every row, answers the same
reads, and still refuses a second copy of an event."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
import msgspec
import pytest

from engram.nip01 import Event
from relay.config import Settings
from relay.filters import Filter
from relay.store import SaveStatus
from relay.store.migrate import apply_migrations
from relay.store.postgres import PostgresStore

SK = [bytes([i + 1]) * 32 for i in range(3)]
VERSION = "0029_unique_time_hash_id"

MakeEvent = Callable[..., Event]

# The layout before 0029, exactly as 0001 and 0005 made it.
_BEFORE = [
    "DROP INDEX events_id",
    "DROP INDEX events_time",
    "ALTER TABLE events ADD CONSTRAINT events_pkey PRIMARY KEY (tenant, id)",
    "CREATE INDEX events_time ON events (tenant, created_at DESC, id)",
    f"DELETE FROM schema_migrations WHERE version = '{VERSION}'",
]

_INDEXES = (
    "SELECT c.relname, a.amname, i.indisunique, i.indisprimary FROM pg_index i"
    " JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam"
    " WHERE i.indrelid = 'events'::regclass AND c.relname IN"
    " ('events_pkey', 'events_time', 'events_id')"
)


def raw(ev: Event) -> bytes:
    return msgspec.json.encode(ev)


def _events(make_event: MakeEvent) -> list[Event]:
    notes = [
        make_event(SK[i % 3], 1, [("t", f"w{i % 4}")], f"note {i}", 1000 + i) for i in range(30)
    ]
    replies = [make_event(SK[0], 1, [("e", n.id)], "re", 2000) for n in notes[:5]]
    return [*notes, *replies, make_event(SK[1], 0, [], "{}", 1500)]


async def _indexes(dsn: str) -> dict[str, tuple[str, bool, bool]]:
    conn = await asyncpg.connect(dsn)
    try:
        return {r[0]: (r[1], r[2], r[3]) for r in await conn.fetch(_INDEXES)}
    finally:
        await conn.close()


async def test_0029_upgrades_a_store_with_data(database_url: str, make_event: MakeEvent) -> None:
    events = _events(make_event)
    store = await PostgresStore.open(database_url, Settings())
    try:
        for e in events:
            assert (await store.save(e, raw(e))).status is SaveStatus.STORED
    finally:
        await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        for sql in _BEFORE:  # as a store written before 0029 has it
            await conn.execute(sql)
        assert "events_pkey" in {r[0] for r in await conn.fetch(_INDEXES)}
        assert await apply_migrations(conn) == [VERSION]  # what a relay's start runs
        rows = await conn.fetchval("SELECT count(*) FROM events")
        # the order every read asks for (created_at DESC, id), now unique
        assert (
            await conn.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = 'events_time'")
        ).endswith("(tenant, created_at DESC, id)")
        # the rule is the unique time index's now: a second copy of a row is refused
        with pytest.raises(asyncpg.UniqueViolationError):
            await conn.execute("INSERT INTO events SELECT * FROM events WHERE kind = 1 LIMIT 1")
    finally:
        await conn.close()
    assert rows == len(events)
    assert await _indexes(database_url) == {
        "events_time": ("btree", True, False),
        "events_id": ("hash", False, False),
    }

    store = await PostgresStore.open(database_url, Settings())
    try:
        # every stored event again: DUPLICATE, none stored twice
        for e in events:
            assert (await store.save(e, raw(e))).status is SaveStatus.DUPLICATE, e
        fresh = make_event(SK[2], 1, [("t", "w1")], "after the upgrade", 3000)
        assert (await store.save(fresh, raw(fresh))).status is SaveStatus.STORED
        # reads by id (the hash index), by tag (event_tags joined back by id), by time
        ids = [events[3].id, fresh.id, "ab" * 32]
        got = await store.query([Filter(ids=ids, limit=10)])
        assert {msgspec.json.decode(r)["id"] for r in got} == {events[3].id, fresh.id}
        tagged = await store.query([Filter(tags={"t": ["w1"]}, limit=100)])
        want = {e.id for e in events if ["t", "w1"] in e.tags} | {fresh.id}
        assert {msgspec.json.decode(r)["id"] for r in tagged} == want
        replies = await store.query([Filter(tags={"e": [events[0].id]}, limit=10)])
        assert [msgspec.json.decode(r)["id"] for r in replies] == [events[30].id]
        newest = await store.query([Filter(limit=3)])
        first_replies = sorted(e.id for e in events[30:35])[:2]  # created_at ties: lower id
        assert [msgspec.json.decode(r)["id"] for r in newest] == [fresh.id, *first_replies]
    finally:
        await store.close()
    conn = await asyncpg.connect(database_url)
    try:
        assert await conn.fetchval("SELECT count(*) FROM events") == len(events) + 1
    finally:
        await conn.close()
