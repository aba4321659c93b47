"""End to end over real websockets: a real `engram serve` process on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
import urllib.request

import msgspec
import pytest
from ae_vectors import SECKEY_A, SECKEY_O, ae_events
from nostr_client import Client, raw_ws, raw_ws_send
from relay_fixtures import create_database_sync, launch_relay

from engram.nip01 import pubkey_of, sign_event

AUX = bytes(32)


def key(n: int) -> bytes:
    return (0xC0FFEE00 + n).to_bytes(32, "big")


def ev(sk: bytes, kind: int = 1, tags=(), content: str = "", created_at: int | None = None):
    return sign_event(
        sk,
        int(time.time()) if created_at is None else created_at,
        kind,
        [list(t) for t in tags],
        content,
        AUX,
    )


@pytest.fixture(scope="module")
def shared_relay(pg_server_url, tmp_path_factory):
    url = create_database_sync(pg_server_url)
    rp = launch_relay(url, str(tmp_path_factory.mktemp("relay")))
    yield rp
    rp.stop()


@pytest.fixture(scope="module")
def small_relay(pg_server_url, tmp_path_factory):
    """A relay with small, test-sized limits, to prove each advertised number is enforced."""
    url = create_database_sync(pg_server_url)
    env = {
        "ENGRAM_LIMITS_MAX_LIMIT": "5",
        "ENGRAM_LIMITS_DEFAULT_LIMIT": "3",
        "ENGRAM_LIMITS_MAX_SUBSCRIPTIONS": "3",
        "ENGRAM_LIMITS_MAX_FILTERS": "2",
        "ENGRAM_LIMITS_MAX_SUBID_LENGTH": "8",
        "ENGRAM_LIMITS_MAX_EVENT_TAGS": "4",
        "ENGRAM_LIMITS_MAX_CONTENT_LENGTH": "50",
        "ENGRAM_LIMITS_MAX_MESSAGE_LENGTH": "4000",
        "ENGRAM_LIMITS_CREATED_AT_LOWER_LIMIT": "3600",
        "ENGRAM_LIMITS_CREATED_AT_UPPER_LIMIT": "60",
    }
    rp = launch_relay(url, str(tmp_path_factory.mktemp("small")), env)
    yield rp
    rp.stop()


def nip11(rp) -> dict:
    req = urllib.request.Request(rp.http_url + "/", headers={"Accept": "application/nostr+json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert r.headers["Content-Type"].startswith("application/nostr+json")
        return json.load(r)


# -- EVENT ------------------------------------------------------------------------------


async def test_publish_duplicate_and_invalid(shared_relay):
    sk = key(1)
    async with await Client.connect(shared_relay.url) as c:
        e = ev(sk, content="hello")
        assert await c.publish(e) == ["OK", e.id, True, ""]
        ok = await c.publish(e)
        assert ok[2] is True and ok[3].startswith("duplicate:")

        bad_id = msgspec.structs.replace(ev(sk, content="x"), id="0" * 64)
        ok = await c.publish(bad_id)
        assert ok[2] is False and ok[3].startswith("invalid:") and "id" in ok[3]

        good = ev(sk, content="y")
        other = ev(key(2), content="y")
        bad_sig = msgspec.structs.replace(good, sig=other.sig)
        ok = await c.publish(bad_sig)
        assert ok[2] is False and ok[3] == "invalid: signature verification failed"

        future = ev(sk, content="later", created_at=int(time.time()) + 3600)
        ok = await c.publish(future)
        assert ok[2] is False and ok[3].startswith("invalid: created_at")

        old = ev(sk, content="2023", created_at=1_700_000_000)  # old events are normal
        assert (await c.publish(old))[2] is True

        assert await c.query({"ids": [bad_id.id, bad_sig.id, future.id]}) == []
        got = await c.query({"ids": [e.id, old.id]})
        assert [x["id"] for x in got] == [e.id, old.id]
        assert got[0] == msgspec.to_builtins(e)


async def test_oversized_and_malformed_frames_keep_the_connection(small_relay):
    async with await Client.connect(small_relay.url) as c:
        await c.send_raw("x" * 5000)
        msg = await c.recv()
        assert msg[0] == "NOTICE" and msg[1].startswith("invalid: message too large")
        await c.send_raw("[")
        assert await c.recv() == ["NOTICE", "invalid: message is not valid JSON"]
        await c.send_raw('["EVENT",{"id":"' + "a" * 64 + '"}]')
        msg = await c.recv()
        assert msg[:3] == ["OK", "a" * 64, False] and msg[3].startswith("invalid:")
        e = ev(key(3), content="still here")
        assert (await c.publish(e))[2] is True


# -- REQ ---------------------------------------------------------------------------------


async def test_req_each_filter_field(shared_relay):
    a, b = key(10), key(11)
    pa, pb = pubkey_of(a), pubkey_of(b)
    base = 1_750_000_000
    e1 = ev(a, 1, [("t", "alpha")], "one", base + 1)
    e2 = ev(a, 7, [("e", "f" * 64)], "two", base + 2)
    e3 = ev(b, 1, [("t", "beta"), ("p", pa)], "three", base + 3)
    e4 = ev(b, 30023, [("d", "article")], "four", base + 4)
    async with await Client.connect(shared_relay.url) as c:
        for e in (e1, e2, e3, e4):
            assert (await c.publish(e))[2] is True

        def ids(events):
            return [x["id"] for x in events]

        mine = {"authors": [pa, pb]}
        assert ids(await c.query(mine)) == [e4.id, e3.id, e2.id, e1.id]
        assert ids(await c.query({"ids": [e1.id, e3.id]})) == [e3.id, e1.id]
        assert ids(await c.query({"authors": [pa]})) == [e2.id, e1.id]
        assert ids(await c.query({**mine, "kinds": [1]})) == [e3.id, e1.id]
        assert ids(await c.query({"#t": ["alpha", "beta"]})) == [e3.id, e1.id]
        assert ids(await c.query({"#e": ["f" * 64]})) == [e2.id]
        assert ids(await c.query({"#p": [pa]})) == [e3.id]
        assert ids(await c.query({"#d": ["article"], "authors": [pb]})) == [e4.id]
        assert ids(await c.query({**mine, "since": base + 2})) == [e4.id, e3.id, e2.id]
        assert ids(await c.query({**mine, "until": base + 2})) == [e2.id, e1.id]
        assert ids(await c.query({**mine, "since": base + 2, "until": base + 3})) == [
            e3.id,
            e2.id,
        ]
        assert ids(await c.query({**mine, "limit": 2})) == [e4.id, e3.id]
        assert ids(await c.query({"ids": [e1.id]}, {"ids": [e4.id]})) == [e4.id, e1.id]
        assert await c.query({"authors": []}) == []


async def test_invalid_filters_are_closed(shared_relay):
    async with await Client.connect(shared_relay.url) as c:
        for bad, why in [
            ({"ids": ["xyz"]}, "invalid: ids must be 64-character lower-case hex strings"),
            ({"kinds": "1"}, "invalid: kinds must be an array"),
            ({"limit": -1}, "invalid: limit must be a non-negative integer"),
            ({"#e": [1]}, "invalid: #e must be an array of strings"),
            ({"bogus": 1}, "invalid: unknown filter field 'bogus'"),
        ]:
            _, end = await c.req("bad", bad)
            assert end == ["CLOSED", "bad", why]
        _, end = await c.req("bad", "not an object")
        assert end[0] == "CLOSED" and end[2].startswith("invalid:")


async def test_limit_clamped_and_default_limit(small_relay):
    sk = key(20)
    async with await Client.connect(small_relay.url) as c:
        now = int(time.time())
        for i in range(8):
            assert (await c.publish(ev(sk, content=str(i), created_at=now - i)))[2] is True
        authors = [pubkey_of(sk)]
        got = await c.query({"authors": authors, "limit": 50})  # 10x max_limit
        assert len(got) == 5
        assert [x["content"] for x in got] == ["0", "1", "2", "3", "4"]
        assert len(await c.query({"authors": authors})) == 3  # default_limit
        assert len(await c.query({"authors": authors, "limit": 2})) == 2


async def test_nip11_numbers_are_the_enforced_ones(small_relay):
    doc = nip11(small_relay)
    lim = doc["limitation"]
    assert doc["supported_nips"] == [1, 9, 11, 13, 40, 42, 45, 50, 62, 70, 77, 86]
    for name in [
        "max_message_length",
        "max_subscriptions",
        "max_filters",
        "max_limit",
        "default_limit",
        "max_subid_length",
        "max_event_tags",
        "max_content_length",
        "created_at_lower_limit",
        "created_at_upper_limit",
        "auth_required",
        "restricted_writes",
    ]:
        assert name in lim, name
    assert lim["max_limit"] == 5 and lim["default_limit"] == 3
    sk = key(21)
    now = int(time.time())
    async with await Client.connect(small_relay.url) as c:
        # max_subscriptions: the (n+1)th distinct REQ is refused; replacing one is not
        for i in range(lim["max_subscriptions"]):
            _, end = await c.req(f"s{i}", {"kinds": [1], "authors": [pubkey_of(sk)]})
            assert end[0] == "EOSE"
        _, end = await c.req("s0", {"kinds": [2], "authors": [pubkey_of(sk)]})
        assert end[0] == "EOSE"
        _, end = await c.req("extra", {"kinds": [1]})
        assert end[0] == "CLOSED" and "too many subscriptions" in end[2]
        for i in range(lim["max_subscriptions"]):
            await c.send(["CLOSE", f"s{i}"])
        # max_filters
        _, end = await c.req("f", *([{"kinds": [1]}] * (lim["max_filters"] + 1)))
        assert end == ["CLOSED", "f", f"invalid: too many filters (max {lim['max_filters']})"]
        _, end = await c.req("f", *([{"kinds": [1]}] * lim["max_filters"]))
        assert end[0] == "EOSE"
        await c.send(["CLOSE", "f"])
        # max_subid_length
        long_id = "x" * (lim["max_subid_length"] + 1)
        _, end = await c.req(long_id, {"kinds": [1]})
        assert end[0] == "CLOSED" and end[2].startswith("invalid: subscription id longer")
        _, end = await c.req("x" * lim["max_subid_length"], {"kinds": [1]})
        assert end[0] == "EOSE"
        # max_event_tags
        n = lim["max_event_tags"]
        ok = await c.publish(ev(sk, tags=[("t", str(i)) for i in range(n + 1)]))
        assert ok[2] is False and ok[3].startswith("invalid: too many tags")
        assert (await c.publish(ev(sk, tags=[("t", str(i)) for i in range(n)])))[2] is True
        # max_content_length
        n = lim["max_content_length"]
        ok = await c.publish(ev(sk, content="é" * (n + 1)))
        assert ok[2] is False and ok[3].startswith("invalid: content too long")
        assert (await c.publish(ev(sk, content="é" * n)))[2] is True
        # created_at bounds
        up, low = lim["created_at_upper_limit"], lim["created_at_lower_limit"]
        ok = await c.publish(ev(sk, content="f", created_at=now + up + 30))
        assert ok[2] is False and "future" in ok[3]
        assert (await c.publish(ev(sk, content="f", created_at=now + up - 30)))[2] is True
        ok = await c.publish(ev(sk, content="p", created_at=now - low - 30))
        assert ok[2] is False and "past" in ok[3]
        assert (await c.publish(ev(sk, content="p", created_at=now - low + 30)))[2] is True
        # max_message_length
        big = ev(sk, content="a" * 40)
        frame = msgspec.json.encode(["EVENT", big]).decode()
        await c.send_raw(frame + " " * (lim["max_message_length"] - len(frame) + 1))
        msg = await c.expect("NOTICE")
        assert msg[1].startswith("invalid: message too large")
        await c.send_raw(frame + " " * (lim["max_message_length"] - len(frame)))
        assert (await c.expect("OK"))[2] is True


async def test_eose_then_live_then_close(shared_relay):
    sk = key(30)
    pk = pubkey_of(sk)
    async with (
        await Client.connect(shared_relay.url) as sub,
        await Client.connect(shared_relay.url) as pubr,
    ):
        stored = ev(sk, content="before")
        assert (await pubr.publish(stored))[2]
        events, end = await sub.req("live", {"authors": [pk]})
        assert [x["id"] for x in events] == [stored.id] and end == ["EOSE", "live"]
        fresh = ev(sk, content="after")
        assert (await pubr.publish(fresh))[2]
        msg = await sub.recv()
        assert msg == ["EVENT", "live", msgspec.to_builtins(fresh)]
        await sub.send(["CLOSE", "live"])
        # the relay handles a connection's frames in order: once a later REQ has its EOSE,
        # the CLOSE has been applied (a fixed sleep may be too short on a loaded machine)
        closed, probe = ev(sk, content="closed"), ev(sk, kind=7, content="probe")
        _, end = await sub.req("probe", {"ids": [probe.id]})
        assert end == ["EOSE", "probe"]
        assert (await pubr.publish(closed))[2]
        assert (await pubr.publish(probe))[2]
        assert await sub.until_probe(probe.id) == []  # the probe alone: nothing on "live"


async def test_stored_results_past_every_send_window_arrive_whole(shared_relay):
    """A REQ's stored events go out in one hand-over while the socket takes them, the
    rest through the connection's queue and its backpressure: with 2.4 MB of results
    (past the 64 KiB direct window and the 1 MiB backpressure mark) every event arrives
    once, newest first, then EOSE, then live events as usual."""
    sk = key(32)
    pk = pubkey_of(sk)
    now = int(time.time())
    stored = [
        ev(sk, content=f"{i:04d}" + "x" * 8_000, created_at=now - 300 + i) for i in range(300)
    ]
    async with (
        await Client.connect(shared_relay.url) as sub,
        await Client.connect(shared_relay.url) as pubr,
    ):
        oks = await pubr.publish_many(stored)
        assert all(ok[2] for ok in oks.values())
        events, end = await sub.req("big", {"authors": [pk], "limit": 300})
        assert end == ["EOSE", "big"]
        assert [x["id"] for x in events] == [e.id for e in reversed(stored)]
        fresh = ev(sk, content="after")
        assert (await pubr.publish(fresh))[2]
        assert await sub.recv() == ["EVENT", "big", msgspec.to_builtins(fresh)]


async def test_ephemeral_delivered_not_stored(shared_relay):
    sk = key(31)
    async with (
        await Client.connect(shared_relay.url) as sub,
        await Client.connect(shared_relay.url) as pubr,
    ):
        _, end = await sub.req("eph", {"kinds": [20001], "authors": [pubkey_of(sk)]})
        assert end[0] == "EOSE"
        e = ev(sk, kind=20001, content="now or never")
        assert (await pubr.publish(e)) == ["OK", e.id, True, ""]
        assert (await sub.recv())[2]["id"] == e.id
        assert await pubr.query({"ids": [e.id]}) == []


@pytest.mark.parametrize("kind,tags", [(0, []), (10002, []), (30023, [("d", "slug")])])
async def test_replaceable_races_leave_one_head(shared_relay, kind, tags):
    sk = key(40 + kind % 7)
    now = int(time.time())
    for round_ in range(3):
        # many versions, several sharing the newest created_at: lowest id must win
        versions = [
            ev(sk, kind, tags, f"r{round_}v{i}", now - 100 + round_ * 10 + (i % 5))
            for i in range(40)
        ]
        newest = max(v.created_at for v in versions)
        expected = min(v.id for v in versions if v.created_at == newest)
        random.shuffle(versions)
        clients = [await Client.connect(shared_relay.url) for _ in range(4)]
        try:
            shares = await asyncio.gather(
                *(clients[i].publish_many(versions[i::4]) for i in range(4))
            )
            oks = [ok for share in shares for ok in share.values()]
            assert len(oks) == len(versions)
            assert all(ok[2] is True for ok in oks)
            stored_ok = [ok for ok in oks if ok[3] == ""]
            assert any(ok[1] == expected for ok in stored_ok)
            flt = {"authors": [pubkey_of(sk)], "kinds": [kind]}
            got = await clients[0].query(flt)
            assert [x["id"] for x in got] == [expected]
        finally:
            for c in clients:
                await c.close()


# -- NIP-42 and the engram read gate -------------------------------------------------------


def rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))


async def test_auth_rules(shared_relay):
    sk = key(50)
    async with await Client.connect(shared_relay.url) as c:
        now = int(time.time())

        async def try_auth(tags, created_at=now, kind=22242, signer=sk):
            e = sign_event(signer, created_at, kind, tags, "", AUX)
            await c.send(["AUTH", e])
            return await c.expect("OK")

        # not challenged yet (auth_challenge "when-needed"): the refusal brings the challenge
        assert c.challenge is None
        ok = await try_auth([["relay", shared_relay.url], ["challenge", "nope"]])
        assert ok[2] is False and ok[3].startswith("auth-required:") and "challenge" in ok[3]
        assert c.challenge is not None and c.challenges == 1
        good_tags = [["relay", shared_relay.url], ["challenge", c.challenge]]
        ok = await try_auth([["relay", "wss://elsewhere.example"], ["challenge", c.challenge]])
        assert ok[2] is False and ok[3].startswith("auth-required:") and "relay" in ok[3]
        ok = await try_auth(good_tags, created_at=now - 3600)
        assert ok[2] is False and ok[3].startswith("auth-required:")
        ok = await try_auth(good_tags, kind=1)
        assert ok[2] is False and ok[3].startswith("invalid:")
        forged = msgspec.structs.replace(
            sign_event(sk, now, 22242, good_tags, "", AUX), pubkey=pubkey_of(key(51))
        )
        await c.send(["AUTH", forged])
        ok = await c.expect("OK")
        assert ok[2] is False and ok[3].startswith("invalid:")
        assert (await c.auth(sk, shared_relay.url, now))[2] is True
        # AUTH events are not accepted as EVENTs
        ok = await c.publish(sign_event(sk, now, 22242, good_tags, "", AUX))
        assert ok[2] is False and ok[3].startswith("invalid:")
        assert c.challenges == 1  # the challenge comes once per connection


async def test_engram_vectors_and_read_gate(shared_relay):
    events, sk_a, sk_o = ae_events(), SECKEY_A, SECKEY_O
    agent, owner = pubkey_of(sk_a), pubkey_of(sk_o)
    url = shared_relay.url
    now = int(time.time())
    async with (
        await Client.connect(url) as stranger,
        await Client.connect(url) as anon,
    ):
        assert (await stranger.auth(key(60), url, now))[2] is True
        _, end = await stranger.req("live", {})
        assert end[0] == "EOSE"
        async with await Client.connect(url) as w:
            for e in events:
                ok = await w.publish(e)
                assert ok[2] is True, ok
        heads = {events[1].id, events[2].id, events[3].id}  # notes, tombstone, core

        async with await Client.connect(url) as a:
            _, end = await a.req("g", {"kinds": [30174], "authors": [agent]})
            assert end[0] == "CLOSED" and end[2].startswith("auth-required:")
            assert (await a.auth(sk_a, url, now))[2] is True
            got = await a.query({"kinds": [30174], "authors": [agent]})
            assert {x["id"] for x in got} == heads and len(got) == 3
        async with await Client.connect(url) as o:
            assert (await o.auth(sk_o, url, now))[2] is True
            got = await o.query({"kinds": [30174], "#p": [owner]})
            assert {x["id"] for x in got} == heads and len(got) == 3
            _, end = await o.req("x", {"kinds": [30174], "authors": [agent]})
            assert end[0] == "CLOSED" and end[2].startswith("restricted:")

        _, end = await stranger.req("g", {"kinds": [30174], "authors": [agent]})
        assert end[0] == "CLOSED" and end[2].startswith("restricted:")
        _, end = await stranger.req("g", {"kinds": [30174], "#p": [owner]})
        assert end[0] == "CLOSED" and end[2].startswith("restricted:")
        _, end = await anon.req("g", {"kinds": [30174], "#p": [owner]})
        assert end[0] == "CLOSED" and end[2].startswith("auth-required:")
        for flt in ({}, {"authors": [agent]}, {"ids": [e.id for e in events]}, {"#p": [owner]}):
            assert all(x["kind"] != 30174 for x in await stranger.query(flt))
            assert all(x["kind"] != 30174 for x in await anon.query(flt))
        assert await stranger.query({"ids": [e.id for e in events]}) == []
        # the live {} subscription of the third key saw none of them: a probe published
        # after them arrives, and no engram before it
        probe = ev(key(99), content="probe after the engrams")
        assert (await anon.publish(probe))[2]
        before = await stranger.until_probe(probe.id)
        assert not [m for m in before if m[0] == "EVENT" and m[2]["kind"] == 30174], before


async def test_engram_envelope_rejected_on_ingest(shared_relay):
    sk = key(70)
    async with await Client.connect(shared_relay.url) as c:
        e = ev(sk, 30174, [("d", "0" * 64), ("p", pubkey_of(key(71)))], "x")
        ok = await c.publish(e)
        assert ok[2] is False and ok[3].startswith("invalid: agent-engram")
        good = ev(sk, 30174, [("d", "0" * 64), ("p", pubkey_of(key(71)))], "Ag" + "A" * 130)
        assert (await c.publish(good))[2] is True


async def test_nip11_document(shared_relay):
    doc = nip11(shared_relay)
    assert doc["name"] and doc["software"] and doc["version"]
    # the distribution's name: engram-relay is on no package index (issue 46), so no URL of one
    assert doc["software"] == "engram-relay"
    assert doc["limitation"]["max_limit"] >= doc["limitation"]["default_limit"]
    with urllib.request.urlopen(shared_relay.http_url + "/", timeout=5) as r:
        assert r.status == 200 and "relay" in r.read().decode()


async def test_slow_consumer_is_disconnected_others_unaffected(start_relay):
    relay = start_relay(env={"ENGRAM_SLOW_CONSUMER_SECONDS": "5"})
    sk = key(80)
    flt = {"authors": [pubkey_of(sk)]}
    slow = raw_ws(relay.port)
    raw_ws_send(slow, json.dumps(["REQ", "s", flt]))
    async with await Client.connect(relay.url) as fast, await Client.connect(relay.url) as w:
        _, end = await fast.req("f", flt)
        assert end[0] == "EOSE"
        # ~12 MB: three times what the kernel's socket buffers can hold (a send buffer
        # grows to 4 MiB at most, net.ipv4.tcp_wmem; the stalled one receives 4 KiB), as
        # test_slow_consumers' stopped readers
        n_events, size = 600, 20_000

        async def keep_reading() -> int:
            """The healthy subscriber reads all along, as a real client does (not only
            between batches: while a batch is published, its socket must keep draining)."""
            got = 0
            while got < n_events:
                msg = await fast.recv()
                assert msg[0] == "EVENT"
                got += 1
            return got

        reading = asyncio.create_task(keep_reading())
        for chunk in range(0, n_events, 100):
            batch = [ev(sk, content=f"{i:05d}" + "z" * size) for i in range(chunk, chunk + 100)]
            await w.publish_many(batch)
        assert await reading == n_events  # the healthy subscriber got everything
        # the stalled one is dropped once its queue has not shrunk for 5 s...
        deadline = time.monotonic() + 120
        while metric(relay.port, "engram_slow_consumers_total") < 1:
            assert time.monotonic() < deadline, "the stalled subscriber was never dropped"
            await asyncio.sleep(0.2)
        # ...and cut off: draining its socket ends well short of the 12 MB
        slow.settimeout(30)
        received = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk_ := await asyncio.to_thread(slow.recv, 1 << 20):
                received += len(chunk_)
        assert received < n_events * size // 2
        # memory is bounded by the queue accounting, not by what was published: no
        # connection ever held more than its cap, and the dropped queue was released
        peak = metric(relay.port, "engram_send_queue_connection_bytes_peak")
        print(f"\nlargest queue {peak:.0f} B with a stalled subscriber (12 MB published)")
        assert 0 < peak <= 32 * 1024 * 1024
        assert metric(relay.port, "engram_send_queue_bytes") == 0
        assert (await w.publish(ev(sk, content="after")))[2] is True
        assert (await fast.recv())[2]["content"] == "after"
    slow.close()


def metric(port: int, name: str) -> float:
    """One unlabelled sample of the relay's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0
