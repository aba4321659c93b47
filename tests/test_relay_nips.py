"""NIP-09 deletion, NIP-40 expiration, NIP-45 COUNT, NIP-50 search, NIP-13 proof of work,
abuse limits, statement timeouts and pings: end to end on real relays and PostgreSQL."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest
from nostr_client import Client, raw_ws

from engram.nip01 import event_id, pubkey_of, sign_event
from relay.validate import pow_difficulty

AUX = bytes(32)


def key(n: int) -> bytes:
    return (0xD00D0000 + n).to_bytes(32, "big")


def ev(sk: bytes, kind: int = 1, tags=(), content: str = "", created_at: int | None = None):
    ts = int(time.time()) if created_at is None else created_at
    return sign_event(sk, ts, kind, [list(t) for t in tags], content, AUX)


def ids(events: list[dict]) -> set[str]:
    return {e["id"] for e in events}


# -- NIP-09 ----------------------------------------------------------------------------


async def test_deletion_by_id_and_address(relay):
    alice, mallory = key(1), key(2)
    pa = pubkey_of(alice)
    now = int(time.time())
    async with await Client.connect(relay.url) as c:
        e1, e2 = ev(alice, content="one"), ev(alice, content="two")
        art = ev(alice, 30023, [("d", "post")], "v1", now - 10)
        for e in (e1, e2, art):
            assert (await c.publish(e))[2] is True
        # someone else's deletion request does nothing to alice's events
        theirs = ev(mallory, 5, [("e", e2.id), ("a", f"30023:{pa}:post")])
        assert (await c.publish(theirs))[2] is True
        assert ids(await c.query({"authors": [pa]})) == {e1.id, e2.id, art.id}

        deletion = ev(alice, 5, [("e", e1.id), ("a", f"30023:{pa}:post")], "", now - 5)
        assert (await c.publish(deletion))[2] is True
        assert ids(await c.query({"authors": [pa], "kinds": [1, 30023]})) == {e2.id}
        assert ids(await c.query({"kinds": [5], "authors": [pa]})) == {deletion.id}  # served

        ok = await c.publish(e1)  # a deleted event cannot come back
        assert ok[2] is False and ok[3].startswith("blocked:")
        ok = await c.publish(ev(alice, 30023, [("d", "post")], "old", now - 6))
        assert ok[2] is False and ok[3].startswith("blocked:")
        newer = ev(alice, 30023, [("d", "post")], "v2", now)  # after the request: fine
        assert (await c.publish(newer))[2] is True
        assert ids(await c.query({"kinds": [30023], "authors": [pa]})) == {newer.id}
        # a deletion request cannot delete a deletion request
        assert (await c.publish(ev(alice, 5, [("e", deletion.id)])))[2] is True
        assert deletion.id in ids(await c.query({"kinds": [5], "authors": [pa]}))


# -- NIP-40 ----------------------------------------------------------------------------


async def test_expiration(start_relay):
    rp = start_relay(env={"ENGRAM_EXPIRED_PURGE_SECONDS": "0.5"})
    sk = key(3)
    now = int(time.time())
    async with await Client.connect(rp.url) as c:
        ok = await c.publish(ev(sk, tags=[("expiration", str(now - 1))], content="stale"))
        assert ok[2] is False and ok[3].startswith("invalid:") and "expired" in ok[3]
        # far enough ahead that it is still live when queried below on a loaded machine
        expires = int(time.time()) + 10
        soon = ev(sk, tags=[("expiration", str(expires))], content="soon gone")
        keep = ev(sk, content="stays")
        assert (await c.publish(soon))[2] is True and (await c.publish(keep))[2] is True
        assert ids(await c.query({"authors": [pubkey_of(sk)]})) == {soon.id, keep.id}
        await asyncio.sleep(max(0.0, expires + 1 - time.time()))  # past the expiration
        assert ids(await c.query({"authors": [pubkey_of(sk)]})) == {keep.id}
    conn = await asyncpg.connect(rp.database_url)
    try:  # and the background purge removed the row itself
        for _ in range(300):  # up to a minute on a loaded machine; the purge runs every 0.5 s
            if not await conn.fetchval("SELECT count(*) FROM events WHERE expires_at IS NOT NULL"):
                break
            await asyncio.sleep(0.2)
        assert await conn.fetchval("SELECT count(*) FROM events WHERE expires_at IS NOT NULL") == 0
    finally:
        await conn.close()


# -- NIP-45 ----------------------------------------------------------------------------


async def test_count_and_its_gate(relay):
    sk, agent, owner = key(4), key(5), key(6)
    async with await Client.connect(relay.url) as c:
        for i in range(7):
            assert (await c.publish(ev(sk, content=f"n{i}", tags=[("t", "count")])))[2]
        engram = ev(agent, 30174, [("d", "a" * 64), ("p", pubkey_of(owner))], "Ag" + "A" * 130)
        assert (await c.publish(engram))[2]
        await c.send(["COUNT", "c1", {"authors": [pubkey_of(sk)]}, {"#t": ["count"]}])
        assert await c.expect("COUNT") == ["COUNT", "c1", {"count": 7}]
        await c.send(["COUNT", "c2", {"authors": [pubkey_of(sk)], "limit": 2}])
        assert await c.expect("COUNT") == ["COUNT", "c2", {"count": 7}]  # limit ignored
        await c.send(["COUNT", "g", {"kinds": [30174], "authors": [pubkey_of(agent)]}])
        msg = await c.expect("CLOSED")
        assert msg[1] == "g" and msg[2].startswith("auth-required:")
        await c.send(["COUNT", "all", {"authors": [pubkey_of(agent)]}])
        assert await c.expect("COUNT") == ["COUNT", "all", {"count": 0}]  # gate in SQL
        assert (await c.auth(agent, relay.url, int(time.time())))[2]
        await c.send(["COUNT", "mine", {"kinds": [30174], "authors": [pubkey_of(agent)]}])
        assert await c.expect("COUNT") == ["COUNT", "mine", {"count": 1}]


async def test_count_of_reactions_to_a_note(relay):
    """The COUNT a client sends for a note's reactions and replies (read from the tag
    index, migration 0026): each event once, deleted ones gone."""
    sk, fan = key(50), key(51)
    async with await Client.connect(relay.url) as c:
        note = ev(sk, content="count my reactions")
        assert (await c.publish(note))[2]
        reactions = [ev(fan, 7, [("e", note.id), ("p", pubkey_of(sk))], f"+{i}") for i in range(4)]
        reply = ev(fan, 1, [("e", note.id), ("p", pubkey_of(sk))], "a reply")
        for e in (*reactions, reply):
            assert (await c.publish(e))[2]
        assert (await c.publish(ev(fan, 5, [("e", reactions[0].id)])))[2]  # NIP-09
        shapes = [
            ([{"kinds": [7], "#e": [note.id]}], 3),
            ([{"#e": [note.id]}], 4),
            ([{"kinds": [7], "#e": [note.id]}, {"kinds": [1, 7], "#p": [pubkey_of(sk)]}], 4),
            ([{"kinds": [7], "#e": [note.id, reply.id], "since": note.created_at}], 3),
        ]
        for i, (filters, n) in enumerate(shapes):
            await c.send(["COUNT", f"c{i}", *filters])
            assert await c.expect("COUNT") == ["COUNT", f"c{i}", {"count": n}], filters


# -- NIP-50 ----------------------------------------------------------------------------


async def test_search_stored_and_live_and_gate(relay):
    sk, agent, owner = key(7), key(8), key(9)
    pk = pubkey_of(sk)
    async with await Client.connect(relay.url) as c, await Client.connect(relay.url) as live:
        hit = ev(sk, content="The quick brown Fox jumps")
        miss = ev(sk, content="a lazy dog sleeps")
        for e in (hit, miss):
            assert (await c.publish(e))[2]
        engram = ev(agent, 30174, [("d", "b" * 64), ("p", pubkey_of(owner))], "Ag" + "A" * 130)
        assert (await c.publish(engram))[2]
        assert ids(await c.query({"search": "quick fox"})) == {hit.id}
        assert ids(await c.query({"search": "fox", "authors": [pk], "kinds": [1]})) == {hit.id}
        assert await c.query({"search": "fox", "kinds": [7]}) == []
        assert await c.query({"search": "A" * 130}) == []  # ciphertext is never searchable
        _, end = await c.req("s", {"search": "anything", "kinds": [30174]})
        assert end[0] == "CLOSED" and end[2].startswith("auth-required:")  # gate first
        _, end = await live.req("live", {"search": "brown fox", "authors": [pk]})
        assert end[0] == "EOSE"
        later_miss = ev(sk, content="brown bear")
        later_hit = ev(sk, content="a brown fox again")
        for e in (later_miss, later_hit):
            assert (await c.publish(e))[2]
        assert (await live.recv())[2]["id"] == later_hit.id
        probe = ev(sk, content="brown fox, the probe")  # matches: nothing may come before it
        assert (await c.publish(probe))[2]
        assert await live.until_probe(probe.id) == []


# -- NIP-13 ----------------------------------------------------------------------------


def mined(sk: bytes, difficulty: int) -> object:
    pk, now = pubkey_of(sk), int(time.time())
    nonce = 0
    while True:
        tags = [["nonce", str(nonce), str(difficulty)]]
        if pow_difficulty(event_id(pk, now, 1, tags, "work")) >= difficulty:
            return sign_event(sk, now, 1, tags, "work", AUX)
        nonce += 1


async def test_proof_of_work_minimum(start_relay):
    rp = start_relay(env={"ENGRAM_LIMITS_MIN_POW_DIFFICULTY": "8"})
    sk = key(10)
    async with await Client.connect(rp.url) as c:
        weak = ev(sk, content="no work")
        while pow_difficulty(weak.id) >= 8:
            weak = ev(sk, content=weak.content + ".")
        ok = await c.publish(weak)
        assert ok[2] is False and ok[3].startswith("pow:")
        assert (await c.publish(mined(sk, 8)))[2] is True


# -- abuse limits ----------------------------------------------------------------------


async def test_event_and_message_rates(start_relay):
    rp = start_relay(
        env={
            # slow refills (one token per 4 s): the counts below cannot change even if a
            # loaded machine spreads the bursts over a few seconds
            "ENGRAM_RATE_EVENTS_PER_SECOND": "0.25",
            "ENGRAM_RATE_EVENT_BURST": "3",
            "ENGRAM_RATE_MESSAGES_PER_SECOND": "0.25",
            "ENGRAM_RATE_MESSAGE_BURST": "10",
            "ENGRAM_RATE_EXEMPT_LOOPBACK": "false",  # the test client is on loopback
        }
    )
    sk = key(11)
    async with await Client.connect(rp.url) as c:
        oks = await c.publish_many([ev(sk, content=f"r{i}") for i in range(6)])
        refused = [ok for ok in oks.values() if ok[2] is False]
        assert len(refused) == 3
        assert all(ok[3].startswith("rate-limited:") for ok in refused)
        for i in range(8):  # spend the rest of the message burst
            await c.send(["CLOSE", f"x{i}"])
        await c.send(["REQ", "over", {"kinds": [1]}])
        msg = await c.expect("CLOSED")
        assert msg[1] == "over" and msg[2].startswith("rate-limited:")
        await c.send(["CLOSE", "again"])
        assert (await c.expect("NOTICE"))[1].startswith("rate-limited:")
        await asyncio.sleep(4.5)  # the buckets refill; the connection kept working
        assert (await c.publish(ev(sk, content="later")))[2] is True


async def connect_when_admitted(url: str, bound: float = 60.0) -> Client:
    """Connect, retrying while the relay still counts connections that were just closed
    (it learns of a disconnect asynchronously; how soon depends on the machine's load)."""
    deadline = time.monotonic() + bound
    while True:
        try:
            return await Client.connect(url)
        except Exception as exc:
            if "429" not in str(exc) or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def test_connections_and_subscriptions_per_ip(start_relay):
    rp = start_relay(
        env={
            "ENGRAM_RATE_CONNECTIONS_PER_IP": "3",
            "ENGRAM_RATE_SUBSCRIPTIONS_PER_IP": "2",
            "ENGRAM_RATE_EXEMPT_LOOPBACK": "false",  # the test client is on loopback
        }
    )
    clients = [await Client.connect(rp.url) for _ in range(3)]
    try:
        with pytest.raises(Exception) as exc:
            await Client.connect(rp.url)
        assert "429" in str(exc.value)
        for i, c in enumerate(clients[:2]):
            _, end = await c.req(f"s{i}", {"kinds": [1]})
            assert end[0] == "EOSE"
        _, end = await clients[2].req("s2", {"kinds": [1]})
        assert end[0] == "CLOSED" and end[2].startswith("rate-limited:")
        _, end = await clients[0].req("s0", {"kinds": [2]})  # replacing one is fine
        assert end[0] == "EOSE"
    finally:
        for c in clients:
            await c.close()
    again = await connect_when_admitted(rp.url)  # slots come back on disconnect
    try:
        _, end = await again.req("s", {"kinds": [1]})
        assert end[0] == "EOSE"
    finally:
        await again.close()


async def test_statement_timeout_closes_the_req_not_the_connection(start_relay):
    rp = start_relay(env={"ENGRAM_QUERY_TIMEOUT_SECONDS": "0.001"})
    sk = key(12)
    async with await Client.connect(rp.url) as c:
        for chunk in range(0, 2000, 250):
            events = [
                ev(sk, tags=[("t", str(i % 7))], content=f"{i}") for i in range(chunk, chunk + 250)
            ]
            assert all(ok[2] for ok in (await c.publish_many(events)).values())
        heavy = [{"#t": [str(i)], "limit": 500} for i in range(7)]
        _, end = await c.req("heavy", *heavy)
        assert end[0] == "CLOSED" and end[2].startswith("error:") and "timed out" in end[2]
        assert (await c.publish(ev(sk, content="still usable")))[2] is True


async def test_dead_connections_are_closed_by_ping(start_relay):
    rp = start_relay(
        env={"ENGRAM_PING_INTERVAL_SECONDS": "0.5", "ENGRAM_PING_TIMEOUT_SECONDS": "0.5"}
    )
    sock = raw_ws(rp.port)  # reads nothing and never answers a ping
    sock.settimeout(60)  # an outer bound: the relay hangs up after about one second
    await asyncio.sleep(2.5)
    received = b""
    while chunk := await asyncio.to_thread(sock.recv, 65536):  # EOF: the relay hung up
        received += chunk
    assert received.startswith(b"\x89")  # the relay's unanswered ping, then it hung up
    sock.close()


async def test_address_wide_event_rate_spans_connections(start_relay):
    rp = start_relay(
        env={
            # one token per 20 s: no refill while the two bursts are sent, however slowly
            "ENGRAM_RATE_IP_EVENTS_PER_SECOND": "0.05",
            "ENGRAM_RATE_IP_EVENT_BURST": "4",
            "ENGRAM_RATE_EXEMPT_LOOPBACK": "false",  # the test client is on loopback
        }
    )
    sk = key(13)
    async with await Client.connect(rp.url) as a, await Client.connect(rp.url) as b:
        first = await a.publish_many([ev(sk, content=f"a{i}") for i in range(3)])
        assert all(ok[2] for ok in first.values())  # each connection alone is under...
        second = await b.publish_many([ev(sk, content=f"b{i}") for i in range(3)])
        refused = [ok for ok in second.values() if ok[2] is False]
        assert len(refused) == 2  # ...but the address is not
        assert all(ok[3].startswith("rate-limited:") and "address" in ok[3] for ok in refused)


async def test_values_per_filter_cap(start_relay):
    rp = start_relay(env={"ENGRAM_LIMITS_MAX_FILTER_VALUES": "3"})
    async with await Client.connect(rp.url) as c:
        four = ["a" * 63 + str(i) for i in range(4)]
        _, end = await c.req("v", {"ids": four})
        assert end == ["CLOSED", "v", "invalid: too many ids (max 3)"]
        _, end = await c.req("v", {"#t": ["1", "2", "3", "4"]})
        assert end == ["CLOSED", "v", "invalid: too many #t values (max 3)"]
        _, end = await c.req("v", {"ids": four[:3]})
        assert end[0] == "EOSE"  # at the cap is fine, and the connection kept working


async def test_auth_required_is_enforced(start_relay):
    rp = start_relay(env={"ENGRAM_LIMITS_AUTH_REQUIRED": "true"})
    sk = key(14)
    async with await Client.connect(rp.url) as c:
        ok = await c.publish(ev(sk, content="before auth"))
        assert ok[2] is False and ok[3].startswith("auth-required:")
        _, end = await c.req("r", {"kinds": [1]})
        assert end[0] == "CLOSED" and end[2].startswith("auth-required:")
        await c.send(["COUNT", "n", {"kinds": [1]}])
        assert (await c.expect("CLOSED"))[2].startswith("auth-required:")
        assert (await c.auth(sk, rp.url, int(time.time())))[2] is True
        assert (await c.publish(ev(sk, content="after auth")))[2] is True
        assert len(await c.query({"authors": [pubkey_of(sk)]})) == 1


async def test_search_only_in_searchable_kinds(start_relay, tmp_path):
    """`search_kinds`: other kinds are neither indexed nor matched, stored or live."""
    config = tmp_path / "search.toml"
    config.write_text("search_kinds = [30023]\n")
    rp = start_relay(args=("--config", str(config)))
    sk = key(40)
    async with await Client.connect(rp.url) as c, await Client.connect(rp.url) as live:
        note = ev(sk, content="searchable words here")
        article = ev(sk, 30023, [("d", "a")], "searchable words here")
        for e in (note, article):
            assert (await c.publish(e))[2]
        assert ids(await c.query({"search": "words"})) == {article.id}
        assert await c.query({"search": "words", "kinds": [1]}) == []
        assert ids(await c.query({"ids": [note.id]})) == {note.id}  # stored all the same
        _, end = await live.req("live", {"search": "fresh"})
        assert end[0] == "EOSE"
        later_note = ev(sk, content="fresh words")
        later_article = ev(sk, 30023, [("d", "b")], "fresh words")
        for e in (later_note, later_article):
            assert (await c.publish(e))[2]
        assert (await live.recv())[2]["id"] == later_article.id
