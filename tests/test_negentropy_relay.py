"""NIP-77 on the relay: real relay processes, our codec and nostr-sdk (Rust) as peers."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from datetime import timedelta

import msgspec
import pytest
from ae_vectors import SECKEY_A, SECKEY_O, ae_events
from negentropy_support import (
    BASE,
    KEY_A,
    KEY_B,
    KEY_THIRD,
    event,
    items_of,
    neg_reply,
    reconcile,
    same_second_pair,
)
from nostr_client import Client, pub

from engram import KIND_ENGRAM
from engram.negentropy import Items, Negentropy
from engram.nip01 import sign_event


def edge_sets() -> tuple[list, list]:
    """Two sets that differ at the edges: the first and last items, one timestamp shared
    by items on both sides (differing only in id), plus a common middle."""
    common = [event(i, BASE + 10 + i // 3) for i in range(60)]
    x, y = same_second_pair(BASE + 20)
    only_a = [event(1000, BASE), x, event(1001, BASE + 500)]  # first and last items
    only_b = [event(2000, BASE + 1), y, event(2001, BASE + 499)]
    return common + only_a, common + only_b


async def test_nip11_lists_77(relay) -> None:
    req = urllib.request.Request(relay.http_url, headers={"Accept": "application/nostr+json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        assert 77 in json.loads(r.read())["supported_nips"]


async def test_our_initiator_against_the_relay_finds_every_edge_difference(relay) -> None:
    a, b = edge_sets()
    async with await Client.connect(relay.url) as c:
        oks = await c.publish_many(b)
        assert all(ok[2] for ok in oks.values())
        have, need, _ = await reconcile(c, items_of(a), {"kinds": [1]})
    ids_a, ids_b = {e.id for e in a}, {e.id for e in b}
    assert have == ids_a - ids_b and need == ids_b - ids_a


async def test_large_set_is_split_over_rounds_and_frames(start_relay) -> None:
    # a frame of 8 KiB: the relay's answers are cut and the rest fingerprinted
    rp = start_relay(env={"ENGRAM_LIMITS_MAX_MESSAGE_LENGTH": "20000"})
    stored = [event(i, BASE + i // 7) for i in range(1500)]
    async with await Client.connect(rp.url) as c:
        for k in range(0, len(stored), 300):
            await c.publish_many(stored[k : k + 300])
        mine = stored[40:] + [event(5000 + i, BASE + 3 * i) for i in range(25)]
        have, need, rounds = await reconcile(c, items_of(mine), {})
    assert need == {e.id for e in stored[:40]}
    assert have == {e.id for e in mine[-25:]}
    assert rounds > 1


async def test_third_key_learns_nothing_about_engrams(start_relay, make_event) -> None:
    rp = start_relay()
    agent, owner = pub(SECKEY_A), pub(SECKEY_O)
    engrams = ae_events()
    note = make_event(SECKEY_A, kind=1, content="public")
    async with await Client.connect(rp.url) as c:
        for e in [*engrams, note]:
            assert (await c.publish(e))[2]
    heads = {e["id"] for e in engrams_of(await _own_query(rp.url, SECKEY_A, agent))}
    assert heads
    gated = {"kinds": [KIND_ENGRAM], "authors": [agent]}
    empty = Negentropy(Items.from_pairs([])).initiate().hex()
    async with await Client.connect(rp.url) as c:
        # unauthenticated: refused exactly as the REQ is
        _, closed = await c.req("r", gated)
        await c.send(["NEG-OPEN", "n", gated, empty])
        err = await neg_reply(c, "n")
        assert err[0] == "NEG-ERR" and err[2] == closed[2]
        assert err[2].startswith("auth-required:")
        # a third key, authenticated: restricted, for NEG-OPEN as for REQ
        assert (await c.auth(KEY_THIRD, rp.url, int(time.time())))[2]
        for flt in (gated, {"kinds": [KIND_ENGRAM], "#p": [owner]}):
            _, closed = await c.req("r2", flt)
            await c.send(["NEG-OPEN", "n", flt, empty])
            err = await neg_reply(c, "n")
            assert err[0] == "NEG-ERR" and err[2] == closed[2]
            assert err[2].startswith("restricted:")
        # no kind named: the set is what a REQ shows; no engram id is in it
        for flt in ({}, {"authors": [agent]}, {"ids": [e.id for e in engrams]}):
            _, need, _ = await reconcile(c, Items.from_pairs([]), flt)
            assert need == ({note.id} if "ids" not in flt else set())
    async with await Client.connect(rp.url) as c:  # the agent itself sees its engrams
        assert (await c.auth(SECKEY_A, rp.url, int(time.time())))[2]
        _, need, _ = await reconcile(c, Items.from_pairs([]), gated)
        assert need == heads


def engrams_of(events: list[dict]) -> list[dict]:
    return [e for e in events if e["kind"] == KIND_ENGRAM]


async def _own_query(url: str, key: bytes, author: str) -> list[dict]:
    async with await Client.connect(url) as c:
        assert (await c.auth(key, url, int(time.time())))[2]
        return await c.query({"authors": [author], "limit": 100})


async def test_limits_answer_neg_err_with_the_right_prefix(start_relay) -> None:
    rp = start_relay(
        env={
            "ENGRAM_NEGENTROPY_MAX_ITEMS": "5",
            "ENGRAM_NEGENTROPY_MAX_SESSIONS": "1",
            "ENGRAM_NEGENTROPY_IDLE_SECONDS": "1",
        }
    )
    empty = Negentropy(Items.from_pairs([])).initiate().hex()
    async with await Client.connect(rp.url) as c:
        await c.publish_many([event(i, BASE + i) for i in range(6)])
        await c.send(["NEG-OPEN", "big", {}, empty])
        err = await neg_reply(c, "big")
        assert err[0] == "NEG-ERR" and err[2].startswith("blocked: this query is too big")
        await c.send(["NEG-OPEN", "one", {"limit": 1, "since": BASE + 3}, empty])
        assert (await neg_reply(c, "one"))[0] == "NEG-MSG"
        await c.send(["NEG-OPEN", "two", {"since": BASE + 3}, empty])
        err = await neg_reply(c, "two")
        assert err[0] == "NEG-ERR" and err[2].startswith("blocked: too many negentropy sessions")
        # the open session is closed when idle, and says so
        err = await neg_reply(c, "one")
        assert err[0] == "NEG-ERR" and err[2].startswith("closed:")
        await c.send(["NEG-MSG", "one", "61"])
        err = await neg_reply(c, "one")
        assert err[0] == "NEG-ERR" and err[2].startswith("closed:")
        # malformed messages: invalid
        await c.send(["NEG-OPEN", "bad", {"since": BASE + 4}, "zz"])
        err = await neg_reply(c, "bad")
        assert err[0] == "NEG-ERR" and err[2].startswith("invalid:")
        await c.send(["NEG-OPEN", "bad2", {"since": BASE + 4}, "6102"])
        err = await neg_reply(c, "bad2")
        assert err[0] == "NEG-ERR" and err[2].startswith("invalid:")
        # an unsupported version is answered with the version we speak
        await c.send(["NEG-OPEN", "v2", {"since": BASE + 4}, "62"])
        assert await neg_reply(c, "v2") == ["NEG-MSG", "v2", "61"]
        await c.send(["NEG-CLOSE", "v2"])
        # a frame over max_message_length is refused before it is read
        await c.send(["NEG-MSG", "v2", "61" * 300_000])
        notice = await neg_reply(c, "v2")
        assert notice[0] == "NOTICE" and notice[1].startswith("invalid: message too large")


@pytest.mark.parametrize("direction", ["UP", "DOWN", "BOTH"])
async def test_nostr_sdk_sync_against_our_relay(start_relay, tmp_path, direction: str) -> None:
    """nostr-sdk's Client.sync (the Rust negentropy) initiates against our relay."""
    import nostr_sdk as sdk

    relay = start_relay()
    # the SDK's database is called back from Rust threads: they must find this loop
    sdk.uniffi_set_event_loop(asyncio.get_running_loop())
    a, b = edge_sets()  # a: the SDK's local database, b: our relay
    async with await Client.connect(relay.url) as c:
        await c.publish_many(b)
    db = await sdk.NostrLmdb.open(str(tmp_path / "lmdb"))
    for e in a:
        await db.save_event(sdk.Event.from_json(msgspec.json.encode(e).decode()))
    client = sdk.ClientBuilder().database(db).build()
    await client.add_relay(sdk.RelayUrl.parse(relay.url))
    await client.connect()
    opts = (
        sdk.SyncOptions()
        .direction(getattr(sdk.SyncDirection, direction))
        .initial_timeout(timedelta(seconds=30))
    )
    out = await client.sync(sdk.Filter().kind(sdk.Kind(1)), opts=opts)
    await client.disconnect()
    ids_a, ids_b = {e.id for e in a}, {e.id for e in b}
    report = out.report
    assert {i.to_hex() for i in report.local} == ids_a - ids_b  # edges found both ways
    assert {i.to_hex() for i in report.remote} == ids_b - ids_a
    up, down = direction in ("UP", "BOTH"), direction in ("DOWN", "BOTH")
    assert {i.to_hex() for i in report.sent} == (ids_a - ids_b if up else set())
    assert {i.to_hex() for i in report.received} == (ids_b - ids_a if down else set())
    async with await Client.connect(relay.url) as c:
        stored = {e["id"] for e in await c.query({"kinds": [1], "limit": 500})}
    assert stored == (ids_a | ids_b if up else ids_b)
    local = {e.id().to_hex() for e in await db.query(sdk.Filter().kind(sdk.Kind(1)))}
    assert local == (ids_a | ids_b if down else ids_a)


async def test_sets_keep_tenants_apart_and_leave_out_deleted_and_expired(start_relay) -> None:
    from cli_support import tenant_cli
    from test_tenants import connect, http_get, wait_for

    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    tenant_cli(rp.database_url, "add", "a.test")
    tenant_cli(rp.database_url, "add", "b.test", "--name", "Beta")

    def served() -> bool:
        status, body = http_get(rp.port, "b.test")
        return status == 200 and json.loads(body).get("name") == "Beta"

    wait_for(served)
    now = int(time.time())
    kept, gone = event(1, now - 10), event(2, now - 9)
    deletion = sign_event(KEY_A, now - 5, 5, [["e", gone.id]], "", bytes(32))
    # expires 12 s ahead: still live when published, even if a loaded machine is slow
    expiring = sign_event(KEY_A, now - 8, 1, [["expiration", str(now + 12)]], "soon", bytes(32))
    elsewhere = event(3, now - 7, KEY_B)
    async with await connect(rp.port, "a.test") as c:
        for e in (kept, gone, expiring, deletion):
            assert (await c.publish(e))[2]
    async with await connect(rp.port, "b.test") as c:
        assert (await c.publish(elsewhere))[2]
    wait_for(lambda: time.time() > now + 13)  # the expiration has passed
    async with await connect(rp.port, "a.test") as c:
        _, need, _ = await reconcile(c, Items.from_pairs([]), {})
        assert need == {kept.id, deletion.id}
    async with await connect(rp.port, "b.test") as c:
        _, need, _ = await reconcile(c, Items.from_pairs([]), {})
        assert need == {elsewhere.id}


async def test_sessions_off_means_not_served_and_not_advertised(start_relay) -> None:
    rp = start_relay(env={"ENGRAM_NEGENTROPY_MAX_SESSIONS": "0"})
    request = urllib.request.Request(rp.http_url, headers={"Accept": "application/nostr+json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        assert 77 not in json.loads(r.read())["supported_nips"]
    empty = Negentropy(Items.from_pairs([])).initiate().hex()
    async with await Client.connect(rp.url) as c:
        await c.send(["NEG-OPEN", "off", {}, empty])
        err = await neg_reply(c, "off")
        assert err[0] == "NEG-ERR" and err[2] == "blocked: NIP-77 is off here"
