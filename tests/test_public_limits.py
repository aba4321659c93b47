"""Default rate limits fit for a public relay, and the loopback exemption.

Behind a proxy (`trust_forwarded_for` on) the forwarded address is the client: a burst
from one connection is refused in part (`rate-limited: …`) and the connection keeps
working. From loopback with the proxy setting off (a local benchmark, an importer, `engram
mem`), the same bursts pass. Real relay processes with their default limits.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from nostr_client import Client

from engram.nip01 import Event, pubkey_of, sign_event
from relay.ratelimit import RateLimits

AUX = bytes(32)
PUBLIC = {"X-Forwarded-For": "203.0.113.7"}  # a public address (TEST-NET-3), not loopback
# enough subscriptions per connection that only a rate limit can refuse a REQ of the burst
ENV = {"ENGRAM_LIMITS_MAX_SUBSCRIPTIONS": "3000"}
WAIT = 120.0
# EVENTs sent at once: twice the largest default event bucket (an address's), so a burst
# past every event bucket is refused in part from a public address and passes from loopback
EVENTS = 2 * max(RateLimits().ip_event_burst, RateLimits().event_burst)


def key(n: int) -> bytes:
    return (0x9B11C000 + n).to_bytes(32, "big")


def burst(sk: bytes, n: int) -> list[Event]:
    now = int(time.time())
    return [sign_event(sk, now, 1, [], f"burst {i}", AUX) for i in range(n)]


async def event_burst(c: Client, events: list[Event]) -> list[list]:
    """Every EVENT at once, then every OK."""
    return list((await c.publish_many(events)).values())


async def req_burst(c: Client, n: int) -> dict[str, list]:
    """`n` REQs at once; returns each subscription's EOSE or CLOSED."""
    flt = {"ids": ["f" * 64]}
    for i in range(n):
        await c.send(["REQ", f"r{i}", flt])
    ends: dict[str, list] = {}
    deadline = time.monotonic() + WAIT
    while len(ends) < n:
        msg = await c.recv(timeout=max(0.1, deadline - time.monotonic()))
        if msg[0] in ("EOSE", "CLOSED"):
            ends[msg[1]] = msg
    return ends


async def keeps_working(c: Client, sk: bytes) -> None:
    """The connection was not closed: a new EVENT is accepted once the bucket refills."""
    deadline = time.monotonic() + WAIT
    i = 0
    while True:
        ok = await c.publish(sign_event(sk, int(time.time()), 1, [], f"after {i}", AUX))
        if ok[2] is True:
            return
        assert ok[3].startswith("rate-limited:"), ok
        assert time.monotonic() < deadline, "the connection never accepted an EVENT again"
        i += 1
        await asyncio.sleep(0.5)


@pytest.fixture
def proxied(start_relay):
    return start_relay(env={**ENV, "ENGRAM_RATE_TRUST_FORWARDED_FOR": "true"})


async def test_forwarded_public_address_is_rate_limited(proxied):
    sk = key(1)
    async with await Client.connect(proxied.url, additional_headers=PUBLIC) as c:
        oks = await event_burst(c, burst(sk, EVENTS))
        refused = [ok for ok in oks if ok[2] is False]
        assert len(oks) == EVENTS
        assert refused and len(refused) < EVENTS
        assert all(ok[3].startswith("rate-limited:") for ok in refused), refused[:3]
        await keeps_working(c, sk)

        ends = await req_burst(c, 3_000)
        closed = [m for m in ends.values() if m[0] == "CLOSED"]
        assert closed and len(closed) < 3_000
        assert all(m[2].startswith("rate-limited:") for m in closed), closed[:3]
        await keeps_working(c, sk)
        assert await c.query({"authors": [pubkey_of(sk)], "limit": 1})  # reads work too


async def test_loopback_is_exempt_without_a_proxy(start_relay):
    rp = start_relay(env=ENV)  # trust_forwarded_for off: loopback is the operator's host
    sk = key(2)
    async with await Client.connect(rp.url) as c:
        oks = await event_burst(c, burst(sk, EVENTS))
        assert len(oks) == EVENTS and all(ok[2] is True for ok in oks), [
            ok for ok in oks if not ok[2]
        ][:3]
        ends = await req_burst(c, 3_000)
        assert all(m[0] == "EOSE" for m in ends.values()), [
            m for m in ends.values() if m[0] != "EOSE"
        ][:3]


async def test_nip11_omits_limits_that_are_not_enforced(start_relay):
    """`created_at_lower_limit: 0` would read as "nothing older than now" while events of
    any age are accepted: by default it is absent; configured, it is shown and enforced."""
    import json
    import urllib.request

    def limitation(rp) -> dict:
        req = urllib.request.Request(rp.http_url, headers={"Accept": "application/nostr+json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())["limitation"]

    rp = start_relay()
    lim = limitation(rp)
    assert "created_at_lower_limit" not in lim
    assert lim["created_at_upper_limit"] == 900 and lim["max_limit"] == 500
    sk = key(3)
    async with await Client.connect(rp.url) as c:  # and indeed any age is accepted
        old = sign_event(sk, 1_000_000, 1, [], "from 1970", AUX)
        assert (await c.publish(old))[2] is True
    rp2 = start_relay(env={"ENGRAM_LIMITS_CREATED_AT_LOWER_LIMIT": "3600"})
    assert limitation(rp2)["created_at_lower_limit"] == 3600
