"""The read batcher's SQL rewriting (pure) and the order it gives out its slots in; its
batching against PostgreSQL is covered by
test_store_postgres.py::test_concurrent_reads_share_statements."""

from __future__ import annotations

import asyncio

import asyncpg

from relay.store.readbatch import READ_CLIENT, ReadBatcher, batchable, batched_sql


def test_only_scalar_parameters_are_batched() -> None:
    assert batchable("SELECT 1 WHERE a = $1 AND b = $2", ["t", b"x"])
    assert batchable("SELECT 1 WHERE a = $1 LIMIT $2", ["t", 10])
    assert not batchable("SELECT 1 WHERE a = ANY($1)", [[1, 2]])  # an array cannot be a column
    assert not batchable("SELECT 1 WHERE a = $1", [True])  # bool is not a batched type
    assert not batchable("... websearch_to_tsquery('simple', $2::text)", ["t", "w"])


def test_parameters_become_columns_of_one_unnest() -> None:
    sql = "SELECT raw FROM events WHERE tenant = $1 AND pubkey = $2::bytea LIMIT $10::int8"
    out = batched_sql(sql, (str, bytes, int, int, int, int, int, int, int, int))
    assert out.startswith("SELECT b.i, s.* FROM unnest($1::int4[], $2::text[], $3::bytea[],")
    assert "$11::int8[]) AS b(i, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10)" in out
    # $1 and $10 are distinct parameters: $10 must not be read as $1 followed by "0"
    assert "tenant = b.p1 AND pubkey = b.p2::bytea LIMIT b.p10::int8" in out
    assert out.endswith(") s")


async def test_free_slots_go_round_robin_over_clients(database_url: str) -> None:
    """One client with many reads queued and another with one: the second client's read
    takes the next free slot instead of waiting behind the first client's queue (the
    order statements end in, on one slot; nothing timed)."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=2)
    assert pool is not None
    ended: list[str] = []
    try:
        batcher = ReadBatcher(pool, timeout=30.0, concurrency=1)

        def read(client: str, n: int) -> asyncio.Future[list[object]]:
            token = READ_CLIENT.set(client)
            try:  # distinct texts: each read is a statement of its own
                fut = batcher.fetch(f"SELECT {n}, '{client}'", [])
            finally:
                READ_CLIENT.reset(token)
            fut.add_done_callback(lambda _f: ended.append(f"{client}{n}"))
            return fut

        flood = [read("flood", n) for n in range(6)]
        other = read("other", 0)
        await asyncio.gather(*flood, other)
    finally:
        await pool.close()
    # one slot: the flood's first read, then the other client's, then the rest
    assert ended[:2] == ["flood0", "other0"], ended
    assert sorted(ended) == sorted([f"flood{n}" for n in range(6)] + ["other0"])


async def test_one_client_never_holds_every_slot(database_url: str) -> None:
    """A client whose reads are all stuck (here: waiting for a lock the test holds) keeps
    one slot free: another client's read, arriving after them, runs and answers while they
    still wait."""
    pool = await asyncpg.create_pool(database_url, min_size=1, max_size=4)
    holder = await asyncpg.connect(database_url)
    assert pool is not None
    try:
        await holder.execute("SELECT pg_advisory_lock(4242)")
        batcher = ReadBatcher(pool, timeout=60.0, concurrency=2)
        token = READ_CLIENT.set("flood")
        try:
            stuck = [
                batcher.fetch(f"SELECT {n}, pg_advisory_lock_shared(4242)", []) for n in range(3)
            ]
        finally:
            READ_CLIENT.reset(token)
        while not await holder.fetchval(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        ):
            await asyncio.sleep(0.01)  # the flood's first read is running and waits
        token = READ_CLIENT.set("other")
        try:
            other = batcher.fetch("SELECT 'other'", [])
        finally:
            READ_CLIENT.reset(token)
        rows = await asyncio.wait_for(other, 30)
        assert rows[0][0] == "other"
        assert not any(f.done() for f in stuck)
        await holder.execute("SELECT pg_advisory_unlock(4242)")
        await asyncio.wait_for(asyncio.gather(*stuck), 30)
    finally:
        await holder.close()
        await pool.close()
