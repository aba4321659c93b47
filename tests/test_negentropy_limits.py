"""NIP-77 sessions may not starve REQs nor exhaust the relay: their set reads run off the
REQ read slots, and the memory their sets hold is bounded relay-wide. Real relay
processes on real PostgreSQL databases."""

from __future__ import annotations

import asyncpg
from negentropy_support import BASE, event, neg_reply
from nostr_client import Client
from relay_fixtures import until

from engram.negentropy import Items, Negentropy

EMPTY = Negentropy(Items.from_pairs([])).initiate().hex()
WHOLE_SET = ({}, {"kinds": [1]}, {"since": BASE}, {"until": BASE + 1000})
NEG_READ = "%string_agg%"  # the statement of a NEG-OPEN's set read (relay.store.sql)


async def lock_waiters(conn: asyncpg.Connection, negentropy: bool) -> int:
    """The relay's statements waiting for a table lock: set reads, or the others."""
    return int(
        await conn.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND wait_event_type = 'Lock'"
            " AND (query LIKE $1) = $2",
            NEG_READ,
            negentropy,
        )
    )


async def test_reqs_are_answered_while_four_neg_opens_wait(start_relay) -> None:
    # no statement times out while the test holds the lock; nothing else reads `events`
    rp = start_relay(
        env={
            "ENGRAM_QUERY_TIMEOUT_SECONDS": "600",
            "ENGRAM_BUS_POLL_SECONDS": "600",
            "ENGRAM_EXPIRED_PURGE_SECONDS": "600",
        }
    )
    stored = [event(i, BASE + i) for i in range(30)]
    async with await Client.connect(rp.url) as c:
        assert all(ok[2] for ok in (await c.publish_many(stored)).values())
    lock = await asyncpg.connect(rp.database_url)
    watch = await asyncpg.connect(rp.database_url)  # outside the lock's transaction, whose
    try:  # view of pg_stat_activity would stay the one it first took
        async with await Client.connect(rp.url) as neg, await Client.connect(rp.url) as c:
            # every read of `events` waits while the test holds this lock: the NEG-OPENs'
            # set reads hold whatever slots they take until it is released
            held = lock.transaction()
            await held.start()
            await lock.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            # four anonymous NEG-OPENs over everything (four statements: REQs of one
            # shape would share one)
            for k, flt in enumerate(WHOLE_SET):
                await neg.send(["NEG-OPEN", f"n{k}", flt, EMPTY])
            await until(lambda: _at_least(watch, True, 2), "the NEG-OPENs' reads wait for the lock")
            await c.send(["REQ", "r", {"kinds": [1], "limit": 10}])
            # the REQ's statement reaches PostgreSQL: no NEG-OPEN holds its read slot
            await until(
                lambda: _at_least(watch, False, 1),
                "the REQ is read while four NEG-OPENs wait",
                timeout=60,
            )
            # the set reads run on their own bounded slots (negentropy_read_concurrency)
            assert await lock_waiters(watch, True) == 2
            await held.rollback()
            got = []
            while (msg := await c.recv())[0] == "EVENT":
                got.append(msg[2]["id"])
            assert msg == ["EOSE", "r"]
            assert got == [e.id for e in sorted(stored, key=lambda e: -e.created_at)[:10]]
            for k in range(4):
                assert (await neg_reply(neg, f"n{k}"))[0] == "NEG-MSG"
    finally:
        await lock.close()
        await watch.close()


async def _at_least(conn: asyncpg.Connection, negentropy: bool, n: int) -> bool:
    return await lock_waiters(conn, negentropy) >= n
