"""NIP-70 protected events and private kinds (direct messages, gift wraps) end to end:
real relay processes on PostgreSQL, several tenants, two nodes for the live path.

Private kinds are served only to a connection AUTHed as the author or the recipient (the
first `p`), on REQ, COUNT, NIP-77, search and live fan-out, as engrams are; a filter that
names no kind never returns or delivers them to anyone else. No test waits for silence:
a public marker published after the private event shows a live subscription is past it.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
import pytest
from cli_support import tenant_cli
from negentropy_support import neg_reply, reconcile
from nostr_client import Client
from nostr_sdk import (
    ClientBuilder,
    EventBuilder,
    Filter,
    Keys,
    Kind,
    RelayUrl,
    ReqTarget,
    SignerAuthenticator,
    Tag,
    UnwrappedGift,
    nip17_make_private_msg,
    uniffi_set_event_loop,
)
from relay_fixtures import until

from engram.negentropy import Items, Negentropy
from engram.nip01 import Event, pubkey_of, sign_event

AUX = bytes(32)
SENDER, RECIPIENT, THIRD, WRAPPER = ((0x9E1A7000 + i).to_bytes(32, "big") for i in range(4))
S, R, T = pubkey_of(SENDER), pubkey_of(RECIPIENT), pubkey_of(THIRD)
EMPTY = Negentropy(Items.from_pairs([])).initiate().hex()


def ev(sk: bytes, kind: int = 1, tags=(), content: str = "") -> Event:
    return sign_event(sk, int(time.time()), kind, [list(t) for t in tags], content, AUX)


def ids(events: list[dict[str, Any]]) -> set[str]:
    return {e["id"] for e in events}


async def connect(port: int, host: str, key: bytes | None = None) -> Client:
    """A client whose Host header is `host`, AUTHed as `key` if given."""
    sock = socket.create_connection(("127.0.0.1", port))
    c = await Client.connect(f"ws://{host}:{port}", sock=sock)
    if key is not None:
        assert (await c.auth(key, f"ws://{host}:{port}", int(time.time())))[2] is True
    return c


async def count(c: Client, *filters: dict[str, Any]) -> list[Any]:
    await c.send(["COUNT", "n", *filters])
    while True:
        msg = await c.recv()
        if msg[0] in ("COUNT", "CLOSED") and msg[1] == "n":
            return msg
        c.backlog.append(msg)


def nip11_name(port: int, host: str) -> str | None:
    """The tenant's NIP-11 name (None while the relay does not serve `host` yet)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("GET", "/", headers={"Host": host, "Accept": "application/nostr+json"})
    resp = conn.getresponse()
    body = resp.read()
    return str(json.loads(body)["name"]) if resp.status == 200 else None


def wait_for_name(port: int, host: str, name: str, timeout: float = 120.0) -> None:
    """Until the relay has reloaded the tenant configuration that gave `host` `name`."""
    deadline = time.monotonic() + timeout
    while nip11_name(port, host) != name:
        if time.monotonic() > deadline:
            raise AssertionError(f"{host} is not named {name!r} in time")
        time.sleep(0.2)


@pytest.fixture
def tenants(start_relay):
    """a.test keeps the default private kinds (4, 1059, 1060); on b.test only kind 1 is."""
    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    tenant_cli(rp.database_url, "add", "a.test")
    tenant_cli(rp.database_url, "add", "b.test", "--limit", "private_kinds=1", "--name", "B")
    wait_for_name(rp.port, "b.test", "B")  # added last: its reload carries both
    return rp


async def test_nip70_protected_events(tenants):
    """`["-"]` (built by nostr-sdk's Tag.protected()): only from a connection AUTHed as
    its author; not AUTHed: auth-required (the challenge comes with that answer); AUTHed as
    someone else: restricted. Reading it is not restricted."""
    port = tenants.port
    keys = Keys.parse(SENDER.hex())
    sdk = EventBuilder(Kind(1), "only I publish this").tags([Tag.protected()]).finalize(keys)
    protected = msgspec.json.decode(sdk.as_json(), type=Event)
    assert protected.tags == [["-"]] and protected.pubkey == S
    anon, other, author = (
        await connect(port, "a.test"),
        await connect(port, "a.test", THIRD),
        await connect(port, "a.test", SENDER),
    )
    try:
        ok = await anon.publish(protected)
        assert ok[2] is False and ok[3].startswith("auth-required:") and "NIP-70" in ok[3]
        ok = await other.publish(protected)
        assert ok[2] is False and ok[3].startswith("restricted:") and "NIP-70" in ok[3]
        assert await anon.query({"ids": [protected.id]}) == []  # nothing was stored
        assert await author.publish(protected) == ["OK", protected.id, True, ""]
        assert ids(await anon.query({"ids": [protected.id]})) == {protected.id}
        ok = await other.publish(protected)  # stored already: still not theirs to send
        assert ok[2] is False and ok[3].startswith("restricted:")
        plain = ev(SENDER, content="not protected")
        assert (await anon.publish(plain))[2] is True
    finally:
        for c in (anon, other, author):
            await c.close()
    # AUTH is per tenant: the author's AUTH on a.test does not let b.test take it unAUTHed
    async with await connect(port, "b.test") as b:
        ok = await b.publish(protected)
        assert ok[2] is False and ok[3].startswith("auth-required:")


async def test_private_kinds_req_count_search_negentropy(tenants):
    """On a tenant with the default private kinds: refused without AUTH when named,
    restricted for a third key, absent from every filter that names no kind (ids,
    authors, `#p`, search, COUNT, NIP-77, live), served to the author and the recipient.
    Another tenant's private kinds are its own, and changing them applies at once."""
    port = tenants.port
    dm = ev(SENDER, 4, [("p", R)], "meet at the secret rendezvous")
    wrap = ev(WRAPPER, 1059, [("p", R)], "sealed rendezvous")  # a gift wrap: random key
    note = ev(SENDER, 1, [("p", R)], "a public rendezvous note")
    private = {dm.id, wrap.id}
    anon = await connect(port, "a.test")
    third = await connect(port, "a.test", THIRD)
    recipient = await connect(port, "a.test", RECIPIENT)
    sender = await connect(port, "a.test", SENDER)
    try:
        for c in (anon, third):
            _, end = await c.req("live", {})
            assert end[0] == "EOSE"
        for e in (dm, wrap, note):
            assert (await anon.publish(e))[2] is True  # anyone may send them
        for c in (anon, third):  # live: the public note, published last, comes first
            assert (await next_event(c, "live"))["id"] == note.id
            await c.send(["CLOSE", "live"])
        for flt in ({"kinds": [4]}, {"kinds": [1059], "#p": [R]}, {"kinds": [1, 4]}):
            _, end = await anon.req("p", flt)
            assert end[0] == "CLOSED" and end[2].startswith("auth-required:"), end
            assert (await count(anon, flt))[2].startswith("auth-required:")
            await anon.send(["NEG-OPEN", "g", flt, EMPTY])
            err = await neg_reply(anon, "g")
            assert err[0] == "NEG-ERR" and err[2].startswith("auth-required:")
        for flt in ({"kinds": [4], "#p": [R]}, {"kinds": [1059], "#p": [R]}):
            _, end = await third.req("p", flt)
            assert end[0] == "CLOSED" and end[2].startswith("restricted:"), end
        for c in (anon, third):
            everything = [{}, {"ids": sorted(private)}, {"authors": [S]}, {"#p": [R]}]
            for flt in everything:
                assert not private & ids(await c.query(flt)), flt
            assert ids(await c.query({"search": "rendezvous"})) == {note.id}
            assert await count(c, {"ids": sorted(private)}) == ["COUNT", "n", {"count": 0}]
            assert await count(c, {"#p": [R]}) == ["COUNT", "n", {"count": 1}]
            _, need, _ = await reconcile(c, Items.from_pairs([]), {"#p": [R]})
            assert need == {note.id}

        both = {"kinds": [4, 1059], "#p": [R]}
        assert ids(await recipient.query(both)) == private
        assert ids(await recipient.query({"ids": sorted(private)})) == private
        assert ids(await recipient.query({"#p": [R]})) == private | {note.id}
        assert await count(recipient, both) == ["COUNT", "n", {"count": 2}]
        search = {"search": "rendezvous", "kinds": [4], "#p": [R]}
        assert ids(await recipient.query(search)) == {dm.id}
        _, need, _ = await reconcile(recipient, Items.from_pairs([]), both)
        assert need == private
        # the sender wrote the DM (its author); the gift wrap is the wrapper key's
        assert ids(await sender.query({"kinds": [4], "authors": [S]})) == {dm.id}
        assert ids(await sender.query({"ids": sorted(private)})) == {dm.id}
    finally:
        for c in (anon, third, recipient, sender):
            await c.close()

    # b.test: kind 1 is private there, kind 4 is not
    b_anon = await connect(port, "b.test")
    b_third = await connect(port, "b.test", THIRD)
    try:
        _, end = await b_third.req("live", {})
        assert end[0] == "EOSE"
        marker = ev(SENDER, 7, [], "+")
        for e in (dm, note, marker):
            assert (await b_anon.publish(e))[2] is True
        assert (await next_event(b_third, "live"))["id"] == dm.id  # public on b.test
        assert (await next_event(b_third, "live"))["id"] == marker.id  # not the note
        await b_third.send(["CLOSE", "live"])
        assert ids(await b_anon.query({"kinds": [4]})) == {dm.id}
        _, end = await b_anon.req("p", {"kinds": [1]})
        assert end[0] == "CLOSED" and end[2].startswith("auth-required:")
        assert ids(await b_third.query({"authors": [S]})) == {dm.id, marker.id}
    finally:
        for c in (b_anon, b_third):
            await c.close()

    # the operator makes kind 4 private on b.test too: at once, for events stored before
    db = tenants.database_url
    bad = tenant_cli(db, "set", "b.test", "--limit", "private_kinds=4,x", check=False)
    assert bad.returncode == 1 and "comma-separated list of kinds" in bad.stderr
    bad = tenant_cli(db, "set", "b.test", "--limit", "private_kinds=70000", check=False)
    assert bad.returncode == 1 and "between 0 and 65535" in bad.stderr
    tenant_cli(db, "set", "b.test", "--limit", "private_kinds=1,4", "--name", "B2")
    shown = json.loads(tenant_cli(db, "show", "b.test").stdout)
    assert shown["limits"]["private_kinds"] == [1, 4]

    await asyncio.to_thread(wait_for_name, port, "b.test", "B2")
    b_anon = await connect(port, "b.test")
    b_recipient = await connect(port, "b.test", RECIPIENT)
    try:
        _, end = await b_anon.req("p", {"kinds": [4]})
        assert end[0] == "CLOSED" and end[2].startswith("auth-required:")
        assert ids(await b_anon.query({"authors": [S]})) == {marker.id}
        assert ids(await b_recipient.query({"kinds": [1, 4], "#p": [R]})) == {dm.id, note.id}
    finally:
        for c in (b_anon, b_recipient):
            await c.close()


async def next_event(c: Client, sub_id: str) -> dict[str, Any]:
    while True:
        msg = await c.recv()
        if msg[0] == "EVENT" and msg[1] == sub_id:
            return dict(msg[2])


async def test_private_kinds_live_on_two_nodes(start_relay):
    """Live fan-out, on the node that stored the DM and on another node (the bus): the
    recipient gets it, with or without naming a kind; the third key and an anonymous
    `{}` subscription get the public marker published after it, and never the DM."""
    env = {"ENGRAM_BUS_POLL_SECONDS": "0.2"}
    one = start_relay(env=env)
    two = start_relay(env=env, database_url=one.database_url)
    subs: list[tuple[Client, str, dict[str, Any], bool]] = []
    for rp in (one, two):
        url = rp.url
        host = url.removeprefix("ws://").split(":")[0]
        for key, flt, sees in (
            (None, {}, False),
            (THIRD, {}, False),
            (THIRD, {"authors": [S]}, False),
            (RECIPIENT, {"#p": [R]}, True),
            (RECIPIENT, {"kinds": [4], "#p": [R]}, True),
        ):
            c = await connect(rp.port, host, key)
            _, end = await c.req("live", flt)
            assert end[0] == "EOSE"
            subs.append((c, "live", flt, sees))
    try:
        async with await connect(one.port, "127.0.0.1") as w:
            dm = ev(SENDER, 4, [("p", R)], "live secret")
            marker = ev(SENDER, 1, [("p", R)], "public marker")
            assert (await w.publish(dm))[2] is True
            assert (await w.publish(marker))[2] is True
        for c, sub_id, flt, sees in subs:
            first = await next_event(c, sub_id)
            if sees and "kinds" in flt:
                assert first["id"] == dm.id, flt
            elif sees:
                assert [first["id"], (await next_event(c, sub_id))["id"]] == [dm.id, marker.id]
            else:
                assert first["id"] == marker.id, flt  # the DM went before it, not to them
    finally:
        for c, *_ in subs:
            await c.close()


async def test_migration_fills_the_recipient_of_stored_private_events(start_relay):
    """0025: rows of the default private kinds stored before it get their recipient."""
    rp = start_relay()
    dm = ev(SENDER, 4, [("e", "00" * 32), ("p", R), ("p", T)], "before the upgrade")
    odd = ev(SENDER, 1059, [("p", "not a key"), ("p", R)], "first p is no key")
    async with await Client.connect(rp.url) as c:
        for e in (dm, odd):
            assert (await c.publish(e))[2] is True
    sql = Path(__file__).parent.parent / "migrations" / "0025_private_kinds_owner.sql"
    conn = await asyncpg.connect(rp.database_url)
    try:
        await conn.execute("UPDATE events SET owner = NULL")  # as stored before 0025
        await conn.execute(sql.read_text())
        rows = dict(await conn.fetch("SELECT id, owner FROM events"))
    finally:
        await conn.close()
    assert rows == {bytes.fromhex(dm.id): bytes.fromhex(R), bytes.fromhex(odd.id): None}


@pytest.fixture
async def sdk_loop() -> AsyncIterator[None]:
    """nostr-sdk calls back into Python (its AUTH signer) on the loop set here; unset after,
    as every later nostr-sdk call of this process would use that loop otherwise."""
    uniffi_set_event_loop(asyncio.get_running_loop())
    yield
    uniffi_set_event_loop(None)  # type: ignore[arg-type]


class SdkClient:
    """A nostr-sdk Client (AUTHing on its own when given keys) and every relay message it
    received, as JSON, collected from its notifications."""

    def __init__(self, client: Any, keys: Keys | None) -> None:
        self.client, self.keys = client, keys
        self.messages: list[list[Any]] = []
        self.events: list[str] = []  # ids delivered to its subscriptions
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, url: str, keys: Keys | None = None) -> SdkClient:
        builder = ClientBuilder()
        if keys is not None:  # NIP-42: the SDK answers the relay's challenge itself
            builder = builder.authenticator(SignerAuthenticator(keys))
        c = cls(builder.build(), keys)
        notifications = c.client.notifications()
        c._task = asyncio.create_task(c._collect(notifications))
        await c.client.add_relay(RelayUrl.parse(url))
        await c.client.connect()
        return c

    async def _collect(self, notifications: Any) -> None:
        while True:
            n = await notifications.next()
            if n is None:
                return
            if n.is_MESSAGE():
                self.messages.append(json.loads(n.message.as_json()))
            elif n.is_NEW_EVENT():
                self.events.append(n.event.id().to_hex())

    async def fetch(self, flt: Filter) -> list[str]:
        got = await self.client.fetch_events(ReqTarget.auto([flt]), timedelta(seconds=60))
        return [e.id().to_hex() for e in got]

    def closed(self) -> list[str]:
        return [m[2] for m in self.messages if m[0] == "CLOSED"]

    async def close(self) -> None:
        await self.client.disconnect()
        if self._task is not None:
            self._task.cancel()


async def test_nostr_sdk_private_message_reaches_only_its_recipient(start_relay, sdk_loop):
    """NIP-17 through a real relay process, every side a nostr-sdk client: the sender's
    gift wrap (`nip17_make_private_msg`) is published without AUTH; the recipient's
    client, AUTHing on its own when the relay asks, receives it live and stored and
    unwraps the message; a third key's client, AUTHed or not, gets nothing, by id or by
    kind and `#p`."""
    rp = start_relay()
    sender, recipient, third = (Keys.parse(k.hex()) for k in (SENDER, RECIPIENT, THIRD))
    inbox = Filter().kind(Kind(1059)).pubkey(recipient.public_key())
    bob = await SdkClient.open(rp.url, recipient)
    alice = await SdkClient.open(rp.url)
    strangers = [await SdkClient.open(rp.url, third), await SdkClient.open(rp.url)]
    try:
        await bob.client.subscribe(ReqTarget.auto([inbox]))
        # its first REQ met "auth-required:"; it AUTHed and subscribed again: EOSE
        await until(lambda: any(m[0] == "EOSE" for m in bob.messages), "bob's EOSE")
        assert any(c.startswith("auth-required:") for c in bob.closed())
        wrap = nip17_make_private_msg(sender, recipient.public_key(), "meet me at noon")
        assert wrap.kind().as_u16() == 1059
        out = await alice.client.send_event(wrap)
        assert [str(u) for u in out.success] and not out.failed
        wrap_id = wrap.id().to_hex()
        await until(lambda: wrap_id in bob.events, "bob got the gift wrap live")
        assert await bob.fetch(inbox) == [wrap_id]
        gift = UnwrappedGift.from_gift_wrap(recipient, wrap)
        assert gift.rumor().content() == "meet me at noon"
        assert gift.sender().to_hex() == sender.public_key().to_hex()

        for who in strangers:
            assert await who.fetch(Filter().id(wrap.id())) == []
            assert await who.fetch(inbox) == []
            assert await who.fetch(Filter().pubkey(recipient.public_key())) == []
            assert wrap_id not in who.events
        authed, anon = strangers
        # the third key did AUTH (refused as someone else); the other never could
        assert any(c.startswith("restricted:") for c in authed.closed())
        assert not any(c.startswith("restricted:") for c in anon.closed())
        assert any(c.startswith("auth-required:") for c in anon.closed())
    finally:
        for c in (bob, alice, *strangers):
            await c.close()


async def test_nostr_sdk_publishes_only_its_own_protected_event(start_relay, sdk_loop):
    """NIP-70 with nostr-sdk on both sides: the author's client (AUTHing on its own at the
    relay's challenge, which comes with the first `auth-required:`) publishes its
    `Tag.protected()` event; another key's AUTHed client is refused `restricted:`; a
    client without keys `auth-required:`."""
    rp = start_relay()
    author_keys = Keys.parse(SENDER.hex())
    author, other = (
        await SdkClient.open(rp.url, author_keys),
        await SdkClient.open(rp.url, Keys.parse(THIRD.hex())),
    )
    anon = await SdkClient.open(rp.url)
    try:
        note = EventBuilder(Kind(1), "mine to share").tags([Tag.protected()]).finalize(author_keys)
        for client, prefix in ((anon, "auth-required:"), (other, "restricted:")):
            out = await client.client.send_event(note)
            (why,) = out.failed.values()
            assert not out.success and why.startswith(prefix), why
        out = await author.client.send_event(note)
        assert [str(u) for u in out.success] and not out.failed
        assert await anon.fetch(Filter().id(note.id())) == [note.id().to_hex()]
    finally:
        for c in (author, other, anon):
            await c.close()
