"""The batch insert's parameters (relay.store.sqlwrite.insert_parameters): the batch's
columns travel as a few values (array literals, concatenated bytes), not an array element
per row and column (issue 47). Whatever the content holds (quotes, backslashes, braces,
commas, the word NULL, non-ASCII, nothing at all), each row comes out as `encode_row` made
it, in its own tenant, and the replace rule still holds inside one batch."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import asyncpg
import msgspec

from engram.nip01 import Event
from relay.config import Settings
from relay.store import SaveStatus
from relay.store.postgres import PostgresStore
from relay.store.sqlwrite import encode_row

SK = [bytes([i + 1]) * 32 for i in range(4)]
MakeEvent = Callable[..., Event]
TENANTS = ["default", 'odd "tenant", {x}', "back\\slash"]
CONTENTS = [
    'say "hi", {friends}',
    "a back\\slash and \\\\ two",
    "NULL",
    "",
    "héllo wörld ✓ 𝄞",
    "{}",
    '"',
    "comma, separated, words",
]


def events(make_event: MakeEvent) -> list[Event]:
    out = []
    for i, content in enumerate(CONTENTS):
        tags = [["t", content or "empty"], ["e", "ab" * 32], ["p", "cd" * 32, '"relay"']]
        out.append(make_event(SK[i % 4], content=content, tags=tags, created_at=1_000 + i))
    out.append(make_event(SK[0], kind=30000, tags=[["d", 'list "a"']], created_at=5))
    out.append(make_event(SK[0], kind=30000, tags=[["d", 'list "a"']], created_at=6))
    out.append(make_event(SK[1], kind=3, content="contacts", created_at=7))
    return out


async def test_one_batch_of_awkward_rows_is_stored_as_encoded(
    database_url: str, make_event: MakeEvent
) -> None:
    evs = events(make_event)
    store = await PostgresStore.open(
        database_url, Settings(write_concurrency=1, write_batch_max=500)
    )
    try:
        saves = [
            store.save(e, msgspec.json.encode(e), t) for t in TENANTS for e in evs
        ]  # queued in one loop iteration: one batch per writer turn
        results = await asyncio.gather(*saves)
    finally:
        await store.close()
    statuses = [r.status for r in results]
    # per tenant: every note, the newer of the two list versions (the older is STALE), the
    # contacts
    want = [SaveStatus.STORED] * len(CONTENTS) + [SaveStatus.STALE] + [SaveStatus.STORED] * 2
    assert statuses == want * len(TENANTS)
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch(
            "SELECT tenant, id, pubkey, created_at, kind, d, owner, tagvals, raw, expires_at,"
            " words::text AS words FROM events"
        )
        words = {
            c: await conn.fetchval("SELECT to_tsvector('simple', $1::text)::text", c)
            for c in {e.content for e in evs}
        }
    finally:
        await conn.close()
    got = {(r["tenant"], bytes(r["id"])): r for r in rows}
    stored = [e for e in evs if e.created_at != 5]
    assert len(got) == len(stored) * len(TENANTS)
    for tenant in TENANTS:
        for e in stored:
            raw = msgspec.json.encode(e)
            row = encode_row(e, raw)
            r = got[(tenant, row[0])]
            assert (bytes(r["pubkey"]), r["created_at"], r["kind"], r["d"]) == row[1:5]
            assert (r["owner"] and bytes(r["owner"])) == row[5]
            assert bytes(r["raw"]) == raw  # byte for byte
            assert r["expires_at"] == row[9]
            assert r["words"] == words[e.content]
            tagged = [f"{t[0]}:{t[1]}" for t in e.tags if len(t[0]) == 1]
            assert r["tagvals"] == list(dict.fromkeys(tagged))
