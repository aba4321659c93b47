"""Cheap requests that cost the relay dearly (issue 37, items 2, 3 and 5), over real
websockets against one real relay process on real PostgreSQL.

The relay trusts X-Forwarded-For, so each test is a client at its own public address
with the default per-address limits (loopback would be exempt). Nothing is timed: each
attack is refused with a NIP-01 reason before it costs anything, and the relay keeps
serving everyone else correctly.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from nostr_client import Client
from relay_fixtures import RelayProcess

from bench.wsclient import client_frame
from engram.nip01 import Event, sign_event
from relay.config import Limits
from relay.ratelimit import RateLimits

AUX = bytes(32)
SK = (0x37C057).to_bytes(32, "big")
LIM = Limits()
SEARCH_BUDGET = 64  # the default RateLimits.search_subscriptions_per_ip (checked below)
SUBSCRIPTIONS_PER_IP = 100  # lowered from 2,000 so the race needs few REQs


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    from relay_fixtures import create_database_sync, launch_relay

    env = {
        "ENGRAM_RATE_TRUST_FORWARDED_FOR": "true",
        "ENGRAM_RATE_SUBSCRIPTIONS_PER_IP": str(SUBSCRIPTIONS_PER_IP),
    }
    rp = launch_relay(
        create_database_sync(pg_server_url), str(tmp_path_factory.mktemp("costly")), env
    )
    yield rp
    rp.stop()


def at(address: str) -> dict[str, Any]:
    """Connection options for a client at `address` (as the trusted proxy reports it)."""
    return {"additional_headers": {"X-Forwarded-For": address}}


def note(content: str, tags: list[list[str]] | None = None) -> Event:
    return sign_event(SK, int(time.time()), 1, tags or [], content, AUX)


async def pipelined(c: Client, messages: list[list[Any]]) -> None:
    """Every message in ONE write, so the relay reads them together (as a client that
    pipelines its REQs does; each its own websocket frame)."""
    data = b"".join(client_frame(msgspec.json.encode(m)) for m in messages)
    c.ws.transport.write(data)


async def ends(c: Client, sub_ids: set[str]) -> dict[str, list[Any]]:
    """The EOSE or CLOSED answering each of `sub_ids`."""
    out: dict[str, list[Any]] = {}
    while len(out) < len(sub_ids):
        msg = await c.recv()
        if msg[0] in ("EOSE", "CLOSED") and msg[1] in sub_ids:
            out[msg[1]] = msg
    return out


async def next_event(c: Client) -> list[Any]:
    """The next EVENT, whether it came before another answer (kept aside) or after."""
    while True:
        msg = await c.recv()
        if msg[0] == "EVENT":
            return msg


def limitation(rp: RelayProcess) -> dict[str, Any]:
    req = urllib.request.Request(rp.http_url, headers={"Accept": "application/nostr+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["limitation"]  # type: ignore[no-any-return]


_CLOSED = re.compile(r'^engram_reads_closed_total\{[^}]*reason="([^"]*)"[^}]*\} (\S+)', re.M)


def reads_closed(rp: RelayProcess) -> dict[str, float]:
    with urllib.request.urlopen(rp.http_url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for m in _CLOSED.finditer(text):
        out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
    return out


def test_the_bounds_are_advertised(relay: RelayProcess) -> None:
    assert RateLimits().search_subscriptions_per_ip == SEARCH_BUDGET
    lim = limitation(relay)
    assert lim["max_req_values"] == LIM.max_req_values
    assert lim["max_search_length"] == LIM.max_search_length
    assert lim["max_search_words"] == LIM.max_search_words


async def test_a_search_flood_is_refused_and_everyone_else_is_served(relay: RelayProcess) -> None:
    """Item 2: one address, within the default limits, subscribes searches of 400 KB of
    distinct words (each matched against every published event before): each is refused
    `invalid:`. Searches within the bounds fill the address's search budget and no more,
    across its connections; the address's other REQs and everyone else's events go on,
    and a live search still gets what it matches."""
    flood = at("203.0.113.21")
    huge = " ".join(f"w{i:06x}" for i in range(50_000))[:400_000]
    async with await Client.connect(relay.url, **flood) as a:
        await pipelined(a, [["REQ", f"big{i}", {"search": huge, "limit": 0}] for i in range(8)])
        got = await ends(a, {f"big{i}" for i in range(8)})
        for msg in got.values():
            assert msg[0] == "CLOSED" and msg[2].startswith("invalid: search longer than"), msg

    # the longest searches allowed, no word shared with the event below but one
    def query(i: int) -> str:
        words = [f"q{i:03d}{j:02d}" + "x" * 3 for j in range(LIM.max_search_words)]
        return " ".join(words)[: LIM.max_search_length]

    assert len(query(0)) == LIM.max_search_length
    conns = [await Client.connect(relay.url, **flood) for _ in range(3)]
    try:
        half = SEARCH_BUDGET // 2
        batches = [
            [["REQ", f"s{i}", {"search": query(i), "limit": 0}] for i in range(half - 1)]
            + [["REQ", "needle", {"search": "needle", "limit": 0}]],
            [["REQ", f"s{i}", {"search": query(i), "limit": 0}] for i in range(half, 2 * half)],
        ]
        for c, batch in zip(conns, batches, strict=False):
            await pipelined(c, batch)
            got = await ends(c, {m[1] for m in batch})
            assert all(m[0] == "EOSE" for m in got.values()), got
        over = conns[2]
        _, end = await over.req("one-more", {"search": "anything", "limit": 0})
        assert end[0] == "CLOSED" and end[2].startswith("rate-limited:"), end
        assert "search" in end[2]
        _, end = await over.req("plain", {"kinds": [1], "limit": 0})  # not a search
        assert end[0] == "EOSE", end

        async with await Client.connect(relay.url, **at("203.0.113.22")) as other:
            _, end = await other.req("mine", {"search": "haystack needle", "limit": 0})
            assert end[0] == "EOSE", end  # another address has its own budget
            event = note("a Needle in the haystack")
            ok = await other.publish(event)
            assert ok[2] is True, ok
            msg = await next_event(other)
            assert msg[1] == "mine" and msg[2]["id"] == event.id
        msg = await next_event(conns[0])
        assert msg[1] == "needle" and msg[2]["id"] == event.id

        await conns[0].send(["CLOSE", "needle"])  # closing one frees the budget
        _, end = await over.req("one-more", {"search": "anything", "limit": 0})
        assert end[0] == "EOSE", end
    finally:
        await asyncio.gather(*(c.close() for c in conns))


async def test_the_41kb_tag_req_is_refused_before_the_database(relay: RelayProcess) -> None:
    """Item 3: 16 filters x 256 `#t` values (41 KB) was 2 MB of SQL with 4,161
    parameters, seconds of planning: refused `invalid:` as a REQ and as a COUNT. A REQ
    at the cap is one statement with the values as arrays, and answers exactly."""
    client = at("203.0.113.31")
    values = [[f"tv{f:02d}{i:03d}" for i in range(256)] for f in range(LIM.max_filters)]
    frame = ["REQ", "big", *({"#t": v} for v in values)]
    assert len(msgspec.json.encode(frame)) > 40_000
    stored = [
        note("one", [["t", values[0][5]]]),
        note("two", [["t", values[1][200]], ["t", values[2][7]]]),  # two values, once
        note("three", [["t", values[3][255]]]),
        note("not asked", [["t", values[9][0]]]),
    ]
    async with await Client.connect(relay.url, **client) as c:
        for e in stored:
            assert (await c.publish(e))[2] is True
        await c.send(frame)
        msg = (await ends(c, {"big"}))["big"]
        want = f"invalid: too many values in one REQ (4096 > {LIM.max_req_values})"
        assert msg[2] == want, msg
        await c.send(["COUNT", "big", *({"#t": v} for v in values)])
        msg = await c.recv()
        assert msg == ["CLOSED", "big", want], msg
        at_cap = [{"#t": v, "limit": 10} for v in values[: LIM.max_req_values // 256]]
        found = await c.query(*at_cap)
        assert sorted(e["id"] for e in found) == sorted(e.id for e in stored[:3])
        await c.send(["COUNT", "n", *at_cap])
        msg = await c.expect("COUNT")
        assert msg[2]["count"] == 3, msg


async def test_search_with_nul_or_too_many_words_is_invalid_before_the_database(
    relay: RelayProcess,
) -> None:
    """Item 5: a NUL in a search reached PostgreSQL (CLOSED `error:`, an ERROR in the
    log, reads_closed{reason="unavailable"}: any client could page an operator), and
    50,000 words overflowed its stack: both are `invalid:` now, REQ and COUNT alike."""
    before = reads_closed(relay)
    async with await Client.connect(relay.url, **at("203.0.113.41")) as c:

        async def refused(name: str, search: str, why: str) -> None:
            for verb in ("REQ", "COUNT"):
                await c.send([verb, name, {"search": search}])
                msg = await c.expect("CLOSED")
                assert msg[1] == name and msg[2].startswith(why), msg

        await refused("nul", "a\x00b", "invalid: search must not contain NUL")
        await refused("50k", " ".join(["w"] * 50_000), "invalid: search longer than")
        most = " ".join(["w"] * LIM.max_search_words)
        assert len(most) < LIM.max_search_length
        why = f"invalid: search has more than {LIM.max_search_words} words"
        await refused("words", most + " w", why)
        assert (await c.req("most", {"search": most}))[1][0] == "EOSE"
    assert reads_closed(relay) == before
    assert " ERROR " not in relay.log() and "query failed" not in relay.log()


async def test_the_address_subscription_cap_holds_for_concurrent_reqs(
    relay: RelayProcess,
) -> None:
    """Item 5: REQs sent together from many connections of one address were all checked
    against `subscriptions_per_ip` before any of them registered (2,223 open against a
    cap of 2,000). Counted and registered at once, the cap holds exactly."""
    address = at("203.0.113.51")
    per_conn = 30
    conns = [await Client.connect(relay.url, **address) for _ in range(5)]
    try:
        batches = [
            [["REQ", f"c{n}r{i}", {"ids": ["f" * 64]}] for i in range(per_conn)] for n in range(5)
        ]
        for c, batch in zip(conns, batches, strict=True):
            await pipelined(c, batch)
        got = await asyncio.gather(
            *(ends(c, {m[1] for m in batch}) for c, batch in zip(conns, batches, strict=True))
        )
        answers = [m for g in got for m in g.values()]
        opened = [m for m in answers if m[0] == "EOSE"]
        refused = [m for m in answers if m[0] == "CLOSED"]
        assert len(opened) == SUBSCRIPTIONS_PER_IP, (len(opened), refused[:2])
        assert all(m[2].startswith("rate-limited:") for m in refused), refused[:3]
        sub = opened[0][1]
        owner = conns[int(sub[1 : sub.index("r")])]
        _, end = await owner.req("again", {"ids": ["f" * 64]})
        assert end[0] == "CLOSED" and end[2].startswith("rate-limited:"), end
        await owner.send(["CLOSE", sub])  # one closed: one may open
        _, end = await owner.req("again", {"ids": ["f" * 64]})
        assert end[0] == "EOSE", end
    finally:
        await asyncio.gather(*(c.close() for c in conns))
