"""NIP-62 request to vanish, against real relay processes: two nodes on one PostgreSQL,
two tenants. The request is built and signed by nostr-sdk."""

from __future__ import annotations

import json
import time

import msgspec
import pytest
from cli_support import tenant_cli
from nostr_client import Client
from nostr_sdk import EventBuilder, Keys, Kind, Tag, Timestamp
from test_nip86 import published, query
from test_tenants import connect, ev, http_get, nip11_name, wait_for

from engram.nip01 import Event, pubkey_of

LEAVER, FRIEND, WRAPPER = ((0x62A0 + i).to_bytes(32, "big") for i in range(3))


def vanish_request(sk: bytes, relays: list[str], created_at: int) -> Event:
    builder = (
        EventBuilder(Kind(62), "leaving")
        .tags([Tag.parse(["relay", r]) for r in relays])
        .custom_created_at(Timestamp.from_secs(created_at))
    )
    signed = builder.finalize(Keys.parse(sk.hex()))
    return msgspec.json.decode(signed.as_json(), type=Event)


@pytest.fixture
def nodes(start_relay):
    env = {"ENGRAM_TENANT_REFRESH_SECONDS": "0.5", "ENGRAM_BUS_POLL_SECONDS": "0.5"}
    first = start_relay(env=env)
    tenant_cli(first.database_url, "add", "a.test")
    tenant_cli(first.database_url, "add", "b.test", "--name", "ready")
    second = start_relay(database_url=first.database_url, env=env)
    for node in (first, second):
        wait_for(lambda n=node: http_get(n.port, "b.test")[0] == 200)
    return first, second


async def authed(port: int, host: str, sk: bytes) -> Client:
    c = await connect(port, host)
    assert (await c.auth(sk, f"ws://{host}:{port}", int(time.time())))[2] is True
    return c


async def test_request_to_vanish(nodes, start_relay):
    n1, n2 = nodes
    now = int(time.time())
    leaver = pubkey_of(LEAVER)
    notes = [ev(LEAVER, content=f"note {i}", created_at=now - 10 + i) for i in range(3)]
    profile = ev(LEAVER, 0, content='{"name":"leaver"}', created_at=now - 5)
    wrap = ev(WRAPPER, 1059, [("p", leaver)], "sealed", created_at=now - 3600)
    friend = ev(FRIEND, content="stays", created_at=now - 5)
    reply = ev(FRIEND, content="reply", created_at=now - 4)
    for ok in await published(n2.port, "a.test", *notes, profile, wrap, friend, reply):
        assert ok[2] is True, ok
    in_b = ev(LEAVER, content="in b", created_at=now - 5)
    assert (await published(n2.port, "b.test", in_b))[0][2] is True

    # naming another relay: refused, nothing removed
    other = vanish_request(LEAVER, ["wss://b.test"], now)
    ok = (await published(n1.port, "a.test", other))[0]
    assert ok[2] is False and ok[3].startswith("invalid:") and "name this relay" in ok[3]
    assert len(await query(n1.port, "a.test", {"authors": [leaver]})) == 4

    # its URL on this relay's scheme and port (with no public URL configured: the port it
    # listens on); the same host on another scheme or port is another relay
    for elsewhere in (f"wss://a.test:{n1.port}", "ws://a.test", "wss://a.test"):
        ok = (await published(n1.port, "a.test", vanish_request(LEAVER, [elsewhere], now)))[0]
        assert ok[2] is False and "name this relay" in ok[3], (elsewhere, ok)
    request = vanish_request(LEAVER, [f"ws://a.test:{n1.port}/", "wss://elsewhere.test"], now)
    assert (await published(n1.port, "a.test", request))[0] == ["OK", request.id, True, ""]

    for node in (n1, n2):
        got = await query(node.port, "a.test", {"authors": [leaver]})
        assert [e["id"] for e in got] == [request.id], "only the request itself is kept"
        got = await query(node.port, "a.test", {"authors": [pubkey_of(FRIEND)]})
        assert {e["id"] for e in got} == {friend.id, reply.id}
        # the recipient's gift wraps are gone too (asked as the recipient, AUTHed)
        c = await authed(node.port, "a.test", LEAVER)
        try:
            assert await c.query({"kinds": [1059], "#p": [leaver]}) == []
        finally:
            await c.close()
    # another tenant keeps its copy
    assert [e["id"] for e in await query(n2.port, "b.test", {"authors": [leaver]})] == [in_b.id]

    # deleted events cannot come back, through either node
    for node in (n1, n2):
        for e in (notes[0], profile, wrap):
            ok = (await published(node.port, "a.test", e))[0]
            assert ok[2] is False and ok[3].startswith("blocked:"), ok
    older = ev(LEAVER, content="backdated", created_at=now - 100)
    ok = (await published(n2.port, "a.test", older))[0]
    assert ok[2] is False and ok[3].startswith("blocked:")
    # what comes after the request is new: accepted
    later = ev(LEAVER, content="back again", created_at=now + 1)
    new_wrap = ev(WRAPPER, 1059, [("p", leaver)], "new", created_at=now + 1)
    for ok in await published(n2.port, "a.test", later, new_wrap):
        assert ok[2] is True, ok

    # NIP-09 cannot undo the request, and keeps working for everything else
    undo = ev(LEAVER, 5, [("e", request.id), ("e", later.id)], created_at=now + 2)
    assert (await published(n1.port, "a.test", undo))[0][2] is True
    got = {e["id"] for e in await query(n1.port, "a.test", {"authors": [leaver]})}
    assert request.id in got and later.id not in got and undo.id in got

    # ALL_RELAYS is every relay, here b.test
    everywhere = vanish_request(LEAVER, ["ALL_RELAYS"], now)
    assert (await published(n2.port, "b.test", everywhere))[0][2] is True
    got = [e["id"] for e in await query(n1.port, "b.test", {"authors": [leaver]})]
    assert got == [everywhere.id]

    # durable: a relay process started afterwards on the same database refuses them too
    n1.stop()
    n3 = start_relay(database_url=n1.database_url)
    wait_for(lambda: http_get(n3.port, "a.test")[0] == 200)
    ok = (await published(n3.port, "a.test", notes[1]))[0]
    assert ok[2] is False and ok[3].startswith("blocked:")
    got = {e["id"] for e in await query(n3.port, "a.test", {"authors": [leaver]})}
    assert got == {request.id, undo.id}
    assert tenant_cli(n3.database_url, "show", "a.test").returncode == 0


async def test_a_relay_without_tenants_is_named_by_the_host_it_is_reached_on(relay):
    now = int(time.time())
    note = ev(LEAVER, content="bye", created_at=now - 1)
    async with await Client.connect(relay.url) as c:
        assert (await c.publish(note))[2] is True
        elsewhere = vanish_request(LEAVER, ["wss://relay.elsewhere.example"], now)
        ok = await c.publish(elsewhere)
        assert ok[2] is False and ok[3].startswith("invalid:")
        request = vanish_request(LEAVER, [relay.url], now)  # ws://127.0.0.1:PORT
        assert (await c.publish(request))[2] is True
        got = await c.query({"authors": [pubkey_of(LEAVER)]})
        assert [e["id"] for e in got] == [request.id]
        ok = await c.publish(note)
        assert ok[2] is False and ok[3].startswith("blocked:")


async def test_a_restricted_tenant_takes_the_request_from_anyone(relay):
    """NIP-62: relays restricting who may post follow the request whatever the author's
    status: here a members-only tenant requiring AUTH, and an author who is neither a
    member nor AUTHed (nor allowed to publish anything else)."""
    db = relay.database_url
    tenant_cli(db, "add", "closed.test", "--write", "members", "--name", "closed")
    tenant_cli(db, "member", "add", "closed.test", pubkey_of(WRAPPER))
    tenant_cli(db, "set", "closed.test", "--name", "ready")  # loaded with the member
    wait_for(lambda: nip11_name(relay.port, "closed.test") == "ready")
    now = int(time.time())
    leaver = pubkey_of(LEAVER)
    wrap = ev(WRAPPER, 1059, [("p", leaver)], "sealed", created_at=now - 600)
    c = await authed(relay.port, "closed.test", WRAPPER)
    try:
        assert (await c.publish(wrap))[2] is True
    finally:
        await c.close()
    tenant_cli(db, "set", "closed.test", "--auth-required")
    wait_for(
        lambda: json.loads(http_get(relay.port, "closed.test")[1])["limitation"]["auth_required"]
    )
    c = await connect(relay.port, "closed.test")
    try:
        ok = await c.publish(ev(LEAVER, content="not a member"))
        assert ok[2] is False and ok[3].startswith("auth-required:")
        request = vanish_request(LEAVER, [f"ws://closed.test:{relay.port}"], now)
        assert (await c.publish(request))[2] is True
    finally:
        await c.close()
    c = await authed(relay.port, "closed.test", WRAPPER)
    try:
        # kind 1059 is private (NIP-17): its author asks for its own
        assert await c.query({"kinds": [1059], "authors": [pubkey_of(WRAPPER)]}) == []
        ok = await c.publish(wrap)
        assert ok[2] is False and ok[3].startswith("blocked:")
    finally:
        await c.close()
