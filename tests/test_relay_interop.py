"""Interop: a Nostr client nobody here wrote (rust-nostr's nostr-sdk) against our relay."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import msgspec
from nostr_sdk import (
    ClientBuilder,
    EventBuilder,
    Filter,
    Keys,
    Kind,
    RelayUrl,
    ReqTarget,
)

from engram.nip01 import Event, verify_event


async def test_nostr_sdk_publish_query_subscribe(relay):
    keys = Keys.generate()
    url = RelayUrl.parse(relay.url)
    publisher = ClientBuilder().build()
    subscriber = ClientBuilder().build()
    for client in (publisher, subscriber):
        await client.add_relay(url)
        await client.connect()

    note = EventBuilder(Kind(1), "hello from nostr-sdk").finalize(keys)
    out = await publisher.send_event(note)
    assert [u.__str__() for u in out.success] and not out.failed

    mine = Filter().author(keys.public_key()).kind(Kind(1))
    fetched = await publisher.fetch_events(ReqTarget.auto([mine]), timedelta(seconds=60))
    assert [e.content() for e in fetched] == ["hello from nostr-sdk"]
    # what the SDK signed verifies in our core, field for field
    ours = msgspec.json.decode(fetched[0].as_json(), type=Event)
    assert verify_event(ours)

    notifications = subscriber.notifications()  # before the REQ: nothing can be missed
    await subscriber.subscribe(ReqTarget.auto([Filter().author(keys.public_key())]))

    async def events_until(target: str) -> list[str]:
        seen: list[str] = []
        while target not in seen:
            n = await notifications.next()
            if n is not None and n.is_NEW_EVENT():
                seen.append(n.event.id().to_hex())
        return seen

    # the stored note has arrived, so the subscription is open before the live event is
    # published (a fixed sleep could be too short on a loaded machine)
    seen = await asyncio.wait_for(events_until(note.id().to_hex()), 60)
    live = EventBuilder(Kind(1), "live through the relay").finalize(keys)
    await publisher.send_event(live)
    seen += await asyncio.wait_for(events_until(live.id().to_hex()), 60)
    assert seen == [note.id().to_hex(), live.id().to_hex()]  # stored, then live
    for client in (publisher, subscriber):
        await client.disconnect()
