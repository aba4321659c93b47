"""A REQ costs what it returns: plans on a store whose statistics are skewed.

The store holds rows where one tag value and one word are on every row (the data of a
bot-heavy relay, and data anyone can publish), so the statistics make every other value
look common. Tag filters and searches for an absent or rare value must still be answered
from an index probe, not a newest-first walk of the table. Nothing here is timed: the
plans are read with EXPLAIN (ANALYZE), counting the rows each plan node touched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import msgspec
import pytest

from engram.nip01 import Event, pubkey_of
from relay.config import Settings
from relay.filters import Filter
from relay.store.postgres import PostgresStore
from relay.store.sqlcount import build_count, build_items
from relay.store.sqlread import SEARCH_WALK, build_query
from relay.store.tagindex import tag_key

ROWS = 20_000
SK = bytes([7]) * 32
PK = pubkey_of(SK)
TENANT = "skewed"


def _walk_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", ()):
        out += _walk_nodes(child)
    return out


_BASE_SCANS = frozenset(
    {"Seq Scan", "Index Scan", "Index Only Scan", "Bitmap Heap Scan", "Bitmap Index Scan"}
)


def rows_touched(plan: dict[str, Any]) -> int:
    """Rows every scan of a table or index returned or threw away, over all its loops
    (scans of a subquery's or CTE's output are not counted again)."""
    total = 0
    for node in _walk_nodes(plan):
        if node["Node Type"] in _BASE_SCANS:
            loops = node.get("Actual Loops", 1)
            total += (node.get("Actual Rows", 0) + node.get("Rows Removed by Filter", 0)) * loops
    return total


async def seed(
    url: str, insert: str, *args: Any, then: str = "ANALYZE events; ANALYZE event_tags"
) -> None:
    """Rows made in SQL (`insert`, an INSERT ... SELECT with `args`), then `then`: the
    statistics autovacuum would gather after such a load."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(insert, *args)
        await conn.execute(then)
    finally:
        await conn.close()


@pytest.fixture
async def skewed(database_url: str) -> AsyncIterator[tuple[PostgresStore, str]]:
    """ROWS rows: `#t common` and the word `spam` on every one; `#t rare` and the word
    `needle` on three; then ANALYZE, as autovacuum would."""
    store = await PostgresStore.open(database_url, Settings())
    await seed(
        database_url,
        """
        INSERT INTO events (tenant, id, pubkey, created_at, kind, d, owner, tagvals,
                            content, sig, raw, words)
        SELECT $1, sha256(int4send(g)), $2, 1700000000 + g, 1, NULL, NULL,
               CASE WHEN g % 7000 = 1 THEN ARRAY['t:common', 't:rare', 'e:' || g]
                    ELSE ARRAY['t:common', 'e:' || g] END,
               CASE WHEN g % 7000 = 1 THEN 'spam needle' ELSE 'spam eggs' END,
               decode(repeat('00', 64), 'hex'), convert_to('{}', 'UTF8'),
               to_tsvector('simple',
                   CASE WHEN g % 7000 = 1 THEN 'spam needle' ELSE 'spam eggs' END)
        FROM generate_series(1, $3) g
        """,
        TENANT,
        bytes.fromhex(PK),
        ROWS,
    )
    yield store, database_url
    await store.close()


async def explain(database_url: str, sql: str, params: list[Any]) -> dict[str, Any]:
    conn = await asyncpg.connect(database_url)
    try:
        text = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, *params)
    finally:
        await conn.close()
    return json.loads(text)[0]["Plan"]  # type: ignore[no-any-return]


def one(f: Filter) -> tuple[str, list[Any]]:
    built = build_query([f], TENANT, None, 1_800_000_000)
    assert built is not None
    return built


@pytest.mark.parametrize("value", ["absent", "rare"])
async def test_tag_filter_is_an_index_probe(skewed: tuple[PostgresStore, str], value: str) -> None:
    store, url = skewed
    f = Filter(tags={"t": [value]}, limit=10)
    plan = await explain(url, *one(f))
    nodes = {n["Node Type"] for n in _walk_nodes(plan)}
    assert "Seq Scan" not in nodes
    assert rows_touched(plan) <= 10, plan  # the value's own entries and their rows
    found = await store.query([f], TENANT)
    assert len(found) == (3 if value == "rare" else 0)


async def test_common_tag_reads_about_limit_entries(skewed: tuple[PostgresStore, str]) -> None:
    store, url = skewed
    f = Filter(tags={"t": ["common"]}, limit=10)
    plan = await explain(url, *one(f))
    assert rows_touched(plan) <= 3 * 10, plan
    assert len(await store.query([f], TENANT)) == 10


async def test_several_values_are_merged_without_repeats(
    skewed: tuple[PostgresStore, str],
) -> None:
    """An event carrying two of the values is returned once, newest first."""
    store, _ = skewed
    f = Filter(tags={"t": ["rare", "common"]}, limit=5)
    rows = [msgspec.json.decode(r) for r in await store.query([f], TENANT)]
    assert len(rows) == 5
    n = await store.count([Filter(tags={"t": ["rare", "absent"]})], TENANT)
    assert n == 3


@pytest.mark.parametrize("word", ["absent", "needle"])
async def test_search_for_a_rare_word_reads_its_posting_list(
    skewed: tuple[PostgresStore, str], word: str
) -> None:
    """The newest SEARCH_WALK rows are tested (bounded), then the word's matches come from
    the GIN index: never a walk of the table."""
    store, url = skewed
    f = Filter(search=word, limit=10)
    plan = await explain(url, *one(f))
    assert rows_touched(plan) <= SEARCH_WALK + 10, plan
    assert "Seq Scan" not in {n["Node Type"] for n in _walk_nodes(plan)}
    # and the function's own query is the bitmap scan of the posting list
    conn = await asyncpg.connect(url)
    try:
        async with conn.transaction():
            await conn.execute(
                "SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off;"
                " SET LOCAL enable_indexonlyscan = off"
            )
            text = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM events WHERE tenant = $1"
                " AND kind <> 30174 AND coalesce(words, to_tsvector('simple', content))"
                " @@ websearch_to_tsquery('simple', $2) ORDER BY created_at DESC, id LIMIT 50000",
                TENANT,
                word,
            )
    finally:
        await conn.close()
    inner = json.loads(text)[0]["Plan"]
    scans = [n for n in _walk_nodes(inner) if "Scan" in n["Node Type"]]
    assert any(n.get("Index Name") == "events_words" for n in scans), inner
    assert rows_touched(inner) <= 2 * 3, inner
    assert len(await store.query([f], TENANT)) == (3 if word == "needle" else 0)


async def test_search_for_a_common_word_walks_a_few_rows(
    skewed: tuple[PostgresStore, str],
) -> None:
    store, url = skewed
    f = Filter(search="spam", limit=10)
    plan = await explain(url, *one(f))
    assert rows_touched(plan) <= 3 * 10, plan
    assert len(await store.query([f], TENANT)) == 10


async def test_count_of_an_absent_tag_is_an_index_probe(
    skewed: tuple[PostgresStore, str],
) -> None:
    _, url = skewed
    built = build_count([Filter(tags={"t": ["absent"]})], TENANT)
    assert built is not None
    plan = await explain(url, *built)
    assert rows_touched(plan) <= 5, plan


@pytest.mark.parametrize("viewer", [None, PK])
async def test_count_of_a_tag_reads_its_index_entries_only(
    skewed: tuple[PostgresStore, str], viewer: str | None
) -> None:
    """NIP-45 COUNT of a value on every row (a popular note's reactions): an index-only
    scan of the value's entries in event_tags_time (migration 0026: the kind is in the
    index), never a row of `events` per match. `events` is read only through
    events_expires (its expired rows: none here) and, for a viewer, for the entries of
    the private kinds it may read (none here: that scan never runs)."""
    store, url = skewed
    conn = await asyncpg.connect(url)
    try:  # as autovacuum does: index-only scans skip the heap of all-visible pages
        await conn.execute("VACUUM (ANALYZE) event_tags")
    finally:
        await conn.close()
    for f in (Filter(kinds=[1], tags={"t": ["common"]}), Filter(tags={"t": ["common", "rare"]})):
        built = build_count([f], TENANT, viewer, 1_800_000_000)
        assert built is not None
        plan = await explain(url, *built)
        scans = [n for n in _walk_nodes(plan) if n["Node Type"] in _BASE_SCANS]
        tags = [n for n in scans if n["Relation Name"] == "event_tags"]
        assert tags and sum(n["Actual Rows"] * n["Actual Loops"] for n in tags) >= ROWS, plan
        for n in tags:
            assert n["Node Type"] == "Index Only Scan", plan
            assert n["Index Name"] == "event_tags_time" and n["Heap Fetches"] == 0, plan
        rows = [n for n in scans if n["Relation Name"] != "event_tags"]
        assert all(n["Relation Name"] == "events" for n in rows), plan
        assert any(n.get("Index Name") == "events_expires" for n in rows), plan
        assert all(
            n.get("Index Name") == "events_expires" or n["Actual Loops"] == 0 for n in rows
        ), plan
        assert rows_touched({"Node Type": "", "Plans": rows}) == 0, plan
        assert await store.count([f], TENANT, viewer) == ROWS


@pytest.mark.parametrize("joins", ["the planner's choice", "nested loops only"])
@pytest.mark.parametrize("authors", [True, False])
async def test_negentropy_set_of_new_engrams_reads_each_row_once(
    database_url: str, joins: str, authors: bool
) -> None:
    """NIP-77's whole-set read for an agent's engrams (kinds 30174, the author, `#p` the
    owner; and the same without the author) right after they were written, before any
    ANALYZE (autovacuum lags a bulk write): whatever join the planner may pick, each
    engram costs its row and an entry of event_tags, never a range of the owner's
    entries per row (that plan read 50M entries for 10,000 engrams and timed out)."""
    n = 3_000
    agent, owner = "cd" * 32, "ef" * 32
    store = await PostgresStore.open(database_url, Settings())
    try:
        conn = await asyncpg.connect(database_url)
        try:
            for table in ("events", "event_tags"):
                await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
        finally:
            await conn.close()
        await seed(
            database_url,
            """
            INSERT INTO events (tenant, id, pubkey, created_at, kind, d, owner, tagvals,
                                content, sig, raw)
            SELECT $1, sha256(int4send(g)), $2, 1700000000 + g / 3, 30174, 'slug-' || g,
                   decode($3, 'hex'), ARRAY['d:slug-' || g, 'p:' || $3], '', NULL,
                   convert_to('{}', 'UTF8')
            FROM generate_series(1, $4) g
            """,
            TENANT,
            bytes.fromhex(agent),
            owner,
            n,
            then="SELECT 1",  # no statistics yet
        )
        f = Filter(kinds=[30174], authors=[agent] if authors else None, tags={"p": [owner]})
        built = build_items(f, TENANT, agent, 1_800_000_000, 500_001)
        assert built is not None
        conn = await asyncpg.connect(database_url)
        try:
            async with conn.transaction():
                if joins == "nested loops only":
                    await conn.execute("SET LOCAL enable_hashjoin = off")
                    await conn.execute("SET LOCAL enable_mergejoin = off")
                text = await conn.fetchval("EXPLAIN (ANALYZE, FORMAT JSON) " + built[0], *built[1])
        finally:
            await conn.close()
        plan = json.loads(text)[0]["Plan"]
        assert rows_touched(plan) <= 3 * n, plan
        stamps, ids = await store.negentropy_items(f, TENANT, agent)
        assert len(stamps) == n and len(ids) == 32 * n
        assert stamps == sorted(stamps)
    finally:
        await store.close()


# --- event_tags follows every write ---------------------------------------------------


async def _tag_rows(url: str) -> int:
    conn = await asyncpg.connect(url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM event_tags"))
    finally:
        await conn.close()


async def test_event_tags_follow_replace_delete_and_truncate(
    database_url: str, make_event: Any
) -> None:
    store = await PostgresStore.open(database_url, Settings())
    try:

        async def put(ev: Event) -> None:
            await store.save(ev, msgspec.json.encode(ev), TENANT)

        old = make_event(SK, kind=3, tags=[["p", "a" * 64]], created_at=100)
        new = make_event(SK, kind=3, tags=[["p", "b" * 64], ["t", "x"]], created_at=200)
        await put(old)
        await put(new)  # replaces: the old version's entries go, the new one's come
        assert await _tag_rows(database_url) == 2
        assert await store.query([Filter(tags={"p": ["a" * 64]}, limit=5)], TENANT) == []
        assert len(await store.query([Filter(tags={"p": ["b" * 64]}, limit=5)], TENANT)) == 1
        note = make_event(SK, kind=1, tags=[["t", "x"]], created_at=300)
        await put(note)
        await put(make_event(SK, kind=5, tags=[["e", note.id]], created_at=400))  # NIP-09
        rows = await store.query([Filter(tags={"t": ["x"]}, limit=5)], TENANT)
        assert [msgspec.json.decode(r)["id"] for r in rows] == [new.id]
        conn = await asyncpg.connect(database_url)
        try:
            await conn.execute("TRUNCATE events")
        finally:
            await conn.close()
        assert await _tag_rows(database_url) == 0
    finally:
        await store.close()


def test_tag_key_is_what_the_index_hashes() -> None:
    """The query hashes the same key the trigger hashes: `tag_key` (see relay.store.tagindex)."""
    f = Filter(tags={"t": ["x"]}, limit=1)
    _, params = build_query([f], TENANT)  # type: ignore[misc]
    assert tag_key("t", "x") in params


async def test_a_tag_in_a_kind_it_is_not_on_reads_no_event_row(
    skewed: tuple[PostgresStore, str],
) -> None:
    """`#t` a value on every row, in a kind none of them has: the entries' kinds (0026)
    turn them all down before any event row is read, and the entries read stay within
    scan_max."""
    store, url = skewed
    f = Filter(tags={"t": ["common"]}, kinds=[5], limit=10)
    plan = await explain(url, *one(f))
    on_events = [
        n
        for n in _walk_nodes(plan)
        if n.get("Relation Name") == "events" and n.get("Actual Loops", 0) > 0
    ]
    assert not on_events, on_events
    assert await store.query([f], TENANT) == []


async def test_the_engram_head_fetch_never_reads_event_tags(
    skewed: tuple[PostgresStore, str], database_url: str
) -> None:
    """The CLI's head fetch (kinds 30174, one author, `#p` the agent, `#d` the slug) is
    one probe of the address index: its `#p` rechecks that row. With `#p` read through
    event_tags, the planner could hash every entry of the agent's key (each of its
    engrams carries it) on every fetch."""
    store, url = skewed
    agent = "ab" * 32
    await seed(
        url,
        """
        INSERT INTO events (tenant, id, pubkey, created_at, kind, d, owner, tagvals,
                            content, sig, raw)
        SELECT $1, sha256(int4send(-g)), $2, 1700000000 + g, 30174, 'slug-' || g,
               decode($3, 'hex'), ARRAY['d:slug-' || g, 'p:' || $3], '', NULL,
               convert_to('{}', 'UTF8')
        FROM generate_series(1, 5000) g
        """,
        TENANT,
        bytes.fromhex(PK),
        agent,
    )
    f = Filter(kinds=[30174], authors=[PK], tags={"p": [agent], "d": ["slug-77"]})
    built = build_query([f], TENANT, PK, 1_800_000_000)
    assert built is not None
    plan = await explain(url, *built)
    assert not [n for n in _walk_nodes(plan) if n.get("Relation Name") == "event_tags"], plan
    assert rows_touched(plan) <= 2, plan
    assert len(await store.query([f], TENANT, PK)) == 1


async def test_many_tag_values_are_one_statement_shape(skewed: tuple[PostgresStore, str]) -> None:
    """Several values of a tag are one array parameter read through LATERAL ranges: the
    statement, and so the plan PostgreSQL makes of it, are the same for 2 values as for
    256 (a UNION ALL branch per value cost seconds of planning at 16 x 256, issue 37).
    Each absent value is one probe; the values present are all found, each event once."""
    store, url = skewed
    absent = [f"absent-{i}" for i in range(256)]
    few = Filter(tags={"t": absent[:2]}, limit=10)
    many = Filter(tags={"t": absent}, limit=10)
    (text_few, params_few), (text_many, params_many) = one(few), one(many)
    assert text_few == text_many and len(params_few) == len(params_many)
    plan_few, plan_many = (
        await explain(url, text_few, params_few),
        await explain(url, text_many, params_many),
    )
    assert len(_walk_nodes(plan_few)) == len(_walk_nodes(plan_many))
    assert rows_touched(plan_many) == 0, plan_many
    loops = [n["Actual Loops"] for n in _walk_nodes(plan_many) if n.get("Relation Name")]
    assert max(loops) == 256, plan_many  # one probe of event_tags per value
    mixed = Filter(tags={"t": [*absent[:100], "rare", *absent[100:200], "common"]}, limit=5)
    text, params = one(mixed)
    conn = await asyncpg.connect(url)
    try:  # the rows' ids (their `raw` is a placeholder here): five, each once, newest first
        rows = await conn.fetch(text, *params)
    finally:
        await conn.close()
    assert len({r["id"] for r in rows}) == len(rows) == 5
    assert [r["created_at"] for r in rows] == sorted((r["created_at"] for r in rows), reverse=True)
    assert len(await store.query([Filter(tags={"t": [*absent, "rare"]}, limit=10)], TENANT)) == 3
