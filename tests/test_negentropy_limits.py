"""NIP-77 sessions may not starve REQs nor exhaust the relay: their set reads run off the
REQ read slots, and the memory their sets hold is bounded relay-wide. Real relay
processes on real PostgreSQL databases."""

from __future__ import annotations

import urllib.request

import asyncpg
import pytest
from negentropy_support import BASE, event, neg_reply
from nostr_client import Client
from relay_fixtures import until

from engram.negentropy import Items, Negentropy
from relay.config import ConfigError, load_settings
from relay.negentropy import ITEM_BYTES

EMPTY = Negentropy(Items.from_pairs([])).initiate().hex()
WHOLE_SET = ({}, {"kinds": [1]}, {"since": BASE}, {"until": BASE + 1000})
NEG_READ = "%string_agg%"  # the statement of a NEG-OPEN's set read (relay.store.sqlcount)


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
            replies = [await neg.recv() for _ in WHOLE_SET]  # in the order the reads end
            assert sorted(r[:2] for r in replies) == [["NEG-MSG", f"n{k}"] for k in range(4)]
    finally:
        await lock.close()
        await watch.close()


async def _at_least(conn: asyncpg.Connection, negentropy: bool, n: int) -> bool:
    return await lock_waiters(conn, negentropy) >= n


def scrape(rp) -> dict[str, float]:
    """The relay's /metrics samples without labels, by name."""
    with urllib.request.urlopen(rp.http_url + "/metrics", timeout=30) as r:
        lines = r.read().decode().splitlines()
    return {
        name: float(value)
        for name, _, value in (line.partition(" ") for line in lines)
        if name and not name.startswith("#") and "{" not in name
    }


async def test_negentropy_sets_have_a_relay_wide_budget(start_relay) -> None:
    # a NEG-OPEN reserves (max_items + 1) items while its set is read: 6 x 40 = 240 bytes
    budget = 6 * ITEM_BYTES + 2 * ITEM_BYTES
    rp = start_relay(
        env={
            "ENGRAM_NEGENTROPY_MAX_ITEMS": "5",
            "ENGRAM_NEGENTROPY_BUDGET_BYTES": str(budget),
        }
    )
    three = [event(i, BASE + i) for i in range(3)]
    async with await Client.connect(rp.url) as c:
        assert all(ok[2] for ok in (await c.publish_many(three)).values())
    async with await Client.connect(rp.url) as a, await Client.connect(rp.url) as b:
        await a.send(["NEG-OPEN", "a", {}, EMPTY])
        assert (await neg_reply(a, "a"))[0] == "NEG-MSG"
        m = scrape(rp)
        assert m["engram_negentropy_bytes"] == 3 * ITEM_BYTES  # the set, no longer 240
        assert m["engram_negentropy_budget_bytes"] == budget
        # another connection's NEG-OPEN would take the relay past the budget
        await b.send(["NEG-OPEN", "b", {}, EMPTY])
        err = await neg_reply(b, "b")
        assert err[0] == "NEG-ERR" and err[2].startswith("blocked: ")
        assert scrape(rp)["engram_negentropy_refused_total"] == 1
        # the first session ends (a's later answer marks that its NEG-CLOSE was handled)
        await a.send(["NEG-CLOSE", "a"])
        await a.send(["NEG-MSG", "a", "61"])
        assert (await neg_reply(a, "a"))[2].startswith("closed:")
        assert scrape(rp)["engram_negentropy_bytes"] == 0
        await b.send(["NEG-OPEN", "b", {}, EMPTY])
        assert (await neg_reply(b, "b"))[0] == "NEG-MSG"
        assert scrape(rp)["engram_negentropy_bytes"] == 3 * ITEM_BYTES
    # a connection that leaves returns its sets to the budget
    await until(
        lambda: scrape(rp)["engram_negentropy_bytes"] == 0, "the closed connection's set is freed"
    )
    assert scrape(rp)["engram_negentropy_bytes_peak"] == 6 * ITEM_BYTES


async def test_one_address_cannot_take_the_whole_negentropy_budget(start_relay) -> None:
    """Two client addresses share the relay's NIP-77 budget: one that fills its share is
    refused with a reason naming its address, and the other is still served though the
    relay-wide budget would have room for the first one's next set."""
    reserve = 6 * ITEM_BYTES  # (max_items + 1) items while a set is read
    rp = start_relay(
        env={
            "ENGRAM_RATE_EXEMPT_LOOPBACK": "false",  # 127.0.0.1 and 127.0.0.2: two clients
            "ENGRAM_NEGENTROPY_MAX_ITEMS": "5",
            "ENGRAM_NEGENTROPY_BUDGET_BYTES": str(10 * reserve),
            "ENGRAM_NEGENTROPY_BUDGET_PER_IP_BYTES": str(reserve),  # one read at a time
        }
    )
    three = [event(i, BASE + i) for i in range(3)]
    async with await Client.connect(rp.url) as c:
        assert all(ok[2] for ok in (await c.publish_many(three)).values())
    first = {"local_addr": ("127.0.0.1", 0)}
    other = {"local_addr": ("127.0.0.2", 0)}
    async with (
        await Client.connect(rp.url, **first) as a1,
        await Client.connect(rp.url, **first) as a2,
        await Client.connect(rp.url, **other) as b,
    ):
        await a1.send(["NEG-OPEN", "a1", {}, EMPTY])
        assert (await neg_reply(a1, "a1"))[0] == "NEG-MSG"
        assert scrape(rp)["engram_negentropy_bytes"] == 3 * ITEM_BYTES
        # the same address, another connection: its share holds a1's set, and a second
        # reservation would pass it (the relay-wide budget has room for eight)
        await a2.send(["NEG-OPEN", "a2", {}, EMPTY])
        err = await neg_reply(a2, "a2")
        assert err[0] == "NEG-ERR"
        assert err[2].startswith("blocked: your address holds too many negentropy sets"), err
        assert scrape(rp)["engram_negentropy_refused_total"] == 0  # not the relay's budget
        # another address is served meanwhile
        await b.send(["NEG-OPEN", "b", {}, EMPTY])
        assert (await neg_reply(b, "b"))[0] == "NEG-MSG"
        assert scrape(rp)["engram_negentropy_bytes"] == 6 * ITEM_BYTES
        # the first address's session ends (a1's later answer marks its NEG-CLOSE handled):
        # its share is free again
        await a1.send(["NEG-CLOSE", "a1"])
        await a1.send(["NEG-MSG", "a1", "61"])
        assert (await neg_reply(a1, "a1"))[2].startswith("closed:")
        await a2.send(["NEG-OPEN", "a2", {}, EMPTY])
        assert (await neg_reply(a2, "a2"))[0] == "NEG-MSG"


def test_a_per_address_share_below_one_reservation_is_refused_at_start() -> None:
    """A share below one NEG-OPEN's reservation would refuse every limited address's
    NEG-OPEN: the settings are refused, naming the setting; 0 turns the share off."""
    fits = {"ENGRAM_NEGENTROPY_MAX_ITEMS": "1000", "ENGRAM_NEGENTROPY_BUDGET_BYTES": "80080"}
    share = "ENGRAM_NEGENTROPY_BUDGET_PER_IP_BYTES"
    assert load_settings(env={**fits, share: "40040"}).negentropy_budget_per_ip_bytes == 40040
    with pytest.raises(ConfigError, match=r"negentropy_budget_per_ip_bytes \(40039\) is below"):
        load_settings(env={**fits, share: "40039"})
    assert load_settings(env={**fits, share: "0"}).negentropy_budget_per_ip_bytes == 0
