"""A search the newest rows did not answer reads the newest window's matches first
(migration 0027, relay.store.sqlread._search_walk_first): a word on a small share of the rows
costs the window, not all its matches; a rarer one falls back to its whole posting list.
Nothing here is timed: answers are checked against the rows, plans read with EXPLAIN."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import msgspec
import pytest
from test_read_plans import _walk_nodes, seed

from engram.nip01 import pubkey_of
from relay.config import Settings
from relay.filters import Filter
from relay.store.postgres import PostgresStore
from relay.store.sqlread import build_query

ROWS = 20_000
WINDOW = 2_000
TENANT = "window"
PK = pubkey_of(bytes([9]) * 32)


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[tuple[PostgresStore, str]]:
    """ROWS notes one second apart: `mid` on every 50th (40 in the newest WINDOW),
    `sparse` on every 1,000th (2 in the window, 20 in all), `filler` on the rest."""
    settings = Settings(search_walk=100, search_window=WINDOW)
    store = await PostgresStore.open(database_url, settings)
    await seed(
        database_url,
        """
        INSERT INTO events (tenant, id, pubkey, created_at, kind, d, owner, tagvals,
                            content, sig, raw, words)
        SELECT $1, sha256(int4send(g)), $2, 1700000000 + g, 1, NULL, NULL, '{}', '',
               NULL, convert_to('{"n":' || g || '}', 'UTF8'),
               to_tsvector('simple', concat_ws(' ', 'filler',
                   CASE WHEN g % 50 = 0 THEN 'mid' END,
                   CASE WHEN g % 1000 = 0 THEN 'sparse' END))
        FROM generate_series(1, $3) g
        """,
        TENANT,
        bytes.fromhex(PK),
        ROWS,
        then="VACUUM ANALYZE events",
    )
    yield store, database_url
    await store.close()


def numbers(rows: list[bytes]) -> list[int]:
    return [msgspec.json.decode(r)["n"] for r in rows]


@pytest.mark.parametrize(
    ("word", "since", "until", "expected"),
    [
        # 40 matches in the window: its newest 10 are the answer
        ("mid", None, None, list(range(20_000, 19_500, -50))),
        # 2 in the window: the whole posting list (20 matches) decides
        ("sparse", None, None, list(range(20_000, 10_000, -1000))),
        # an `until` before the window: the window is skipped
        ("mid", None, 1_700_010_000, list(range(10_000, 9_500, -50))),
        # a `since` inside the window: the window's matches after `since`
        ("mid", 1_700_019_800, None, [20_000, 19_950, 19_900, 19_850, 19_800]),
        ("absent", None, None, []),
    ],
)
async def test_the_newest_matches_whatever_path_answers(
    store: tuple[PostgresStore, str],
    word: str,
    since: int | None,
    until: int | None,
    expected: list[int],
) -> None:
    s, _ = store
    f = Filter(search=word, since=since, until=until, limit=10)
    assert numbers(await s.query([f], TENANT)) == expected


async def test_a_window_read_ands_the_posting_list_with_the_time_index(
    store: tuple[PostgresStore, str],
) -> None:
    """search_matches's own statement with the window's lower bound (what search_newest
    runs): the word's posting list ANDed with a range of events_time, so the rows read
    from the table are the window's matches, not every match of the word."""
    _, url = store
    conn = await asyncpg.connect(url)
    try:
        start = await conn.fetchval(
            "SELECT created_at FROM events WHERE tenant = $1"
            " ORDER BY created_at DESC OFFSET $2 LIMIT 1",
            TENANT,
            WINDOW,
        )
        async with conn.transaction():
            await conn.execute(
                "SET LOCAL enable_seqscan = off; SET LOCAL enable_indexscan = off;"
                " SET LOCAL enable_indexonlyscan = off"
            )
            text = await conn.fetchval(
                "EXPLAIN (ANALYZE, FORMAT JSON) SELECT id FROM events WHERE tenant = $1"
                " AND kind <> 30174 AND coalesce(words, to_tsvector('simple', content))"
                " @@ websearch_to_tsquery('simple', 'mid') AND created_at >= $2"
                " ORDER BY created_at DESC, id LIMIT 10",
                TENANT,
                start,
            )
    finally:
        await conn.close()
    plan: dict[str, Any] = json.loads(text)[0]["Plan"]
    nodes = _walk_nodes(plan)
    assert any(n["Node Type"] == "BitmapAnd" for n in nodes), plan
    heap = [n for n in nodes if n["Node Type"] == "Bitmap Heap Scan"]
    assert heap and heap[0]["Actual Rows"] <= 41, plan  # the window's matches only


async def test_a_mid_frequency_word_reads_the_window_not_all_its_matches(
    store: tuple[PostgresStore, str],
) -> None:
    """The REQ's statement as the store builds it, with every nested statement's plan
    (auto_explain): the rows read from `events` are the walk's and the window's matches,
    where reading the whole posting list returns all 400 of `mid`."""
    _, url = store
    built = build_query(
        [Filter(search="mid", limit=10)],
        TENANT,
        None,
        1_800_000_000,
        search_walk=100,
        search_window=WINDOW,
    )
    assert built is not None
    plans: list[dict[str, Any]] = []
    conn = await asyncpg.connect(url)
    try:
        conn.add_log_listener(
            lambda _c, msg: (
                plans.append(json.loads(msg.message.split("\n", 1)[1])["Plan"])
                if "auto_explain" in msg.message or msg.message.startswith("duration")
                else None
            )
        )
        await conn.execute(
            "LOAD 'auto_explain'; SET auto_explain.log_min_duration = 0;"
            " SET auto_explain.log_analyze = on; SET auto_explain.log_nested_statements = on;"
            " SET auto_explain.log_format = json; SET client_min_messages = log"
        )
        rows = await conn.fetch(built[0], *built[1])
    finally:
        await conn.close()
    assert len(rows) == 10
    scans = [n for p in plans for n in _walk_nodes(p) if n.get("Relation Name") == "events"]
    assert plans and scans, plans
    bound = {"Bitmap Heap Scan": 41, "Index Scan": 100, "Index Only Scan": WINDOW + 1}
    read = [(n["Node Type"], n.get("Index Name"), n["Actual Rows"]) for n in scans]
    # the window's matches from the heap; the walk (search_walk); the window's bound
    assert all(rows <= bound[kind] for kind, _, rows in read), read
