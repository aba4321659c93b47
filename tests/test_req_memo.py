"""REQ filters kept by their text (relay.reqmemo): a REQ that repeats a filter text is
answered as the first was, live included, from a real relay process on PostgreSQL; and
what a kept text was allowed for one viewer stays refused to another (the private read
gate runs per viewer), a refused REQ is never kept, the subscription id's rules hold on
every REQ, and the memo keeps to its bound."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from typing import Any

import msgspec
from nostr_client import Client

from engram.nip01 import pubkey_of, sign_event
from relay.config import Settings
from relay.filters import Filter, SharedFilters
from relay.reqmemo import REQ_MEMO_TEXT_MAX, ReqMemo, split_req
from relay.tenants import TenantRegistry

SK = [(0x3E30000 + i).to_bytes(32, "big") for i in range(3)]
PK = [pubkey_of(k) for k in SK]
AUX = bytes(32)


async def memo_hits(rp: Any) -> float:
    def scrape() -> str:
        with urllib.request.urlopen(rp.http_url + "/metrics", timeout=10) as r:
            return r.read().decode()

    text = await asyncio.to_thread(scrape)
    return sum(
        float(x.split()[1]) for x in text.splitlines() if x.startswith("engram_req_memo_hits ")
    )


def note(sk: bytes, content: str, ago: int = 0, kind: int = 1, tags: Any = ()) -> Any:
    return sign_event(sk, int(time.time()) - ago, kind, [list(t) for t in tags], content, AUX)


async def test_a_repeated_req_is_answered_as_the_first_and_goes_live(relay: Any) -> None:
    old = [note(SK[0], f"kept {i}", ago=30 - i) for i in range(3)]
    async with await Client.connect(relay.url) as c:
        for e in old:
            assert (await c.publish(e))[2] is True
        flt = {"authors": [PK[0]], "limit": 2}
        first, end = await c.req("a", flt)
        assert end == ["EOSE", "a"] and [e["id"] for e in first] == [old[2].id, old[1].id]
        hits = await memo_hits(relay)
        # the same text under other ids (longer, shorter): the kept filters, the same answer
        for sub in ("second-subscription", "b"):
            again, end = await c.req(sub, flt)
            assert end == ["EOSE", sub] and again == first
        assert await memo_hits(relay) == hits + 2  # not the full path: the memo answered
        # an event written since is in the next answer (the memo keeps filters, not rows)
        fresh = note(SK[0], "written after")
        assert (await c.publish(fresh))[2] is True
        latest, _ = await c.req("c", flt)
        assert [e["id"] for e in latest] == [fresh.id, old[2].id]
        # kept subscriptions went live: `fresh` reached the three open then, and the
        # author's next note reaches all four, each once; another author's, published
        # before it, reaches none (it would have come first)
        live, other = note(SK[0], "live"), note(SK[1], "someone else")
        for e in (other, live):
            assert (await c.publish(e))[2] is True
        subs = ["a", "b", "c", "second-subscription"]
        got = []
        while sum(i == live.id for _, i in got) < len(subs):
            msg = await c.recv()
            if msg[0] == "EVENT":
                got.append((msg[1], msg[2]["id"]))
        then = sorted(s for s in subs if s != "c")
        assert sorted(got) == sorted([(s, fresh.id) for s in then] + [(s, live.id) for s in subs])


async def test_what_one_viewer_was_allowed_stays_refused_to_others(relay: Any) -> None:
    """A direct message (kind 4, private): its sender AUTHed reads it with a filter text
    that is then kept; the same text from an unauthenticated connection and from a third
    party's is refused as ever (auth-required / restricted), never answered from the memo;
    the sender's next REQ of the text is answered (the positive twin)."""
    dm = note(SK[0], "ciphertext", kind=4, tags=[("p", PK[1])])
    flt = {"authors": [PK[0]], "kinds": [4], "limit": 5}
    async with await Client.connect(relay.url) as sender:
        assert (await sender.auth(SK[0], relay.url, int(time.time())))[2] is True
        assert (await sender.publish(dm))[2] is True
        mine, end = await sender.req("dm", flt)
        assert end[0] == "EOSE" and [e["id"] for e in mine] == [dm.id]
        async with await Client.connect(relay.url) as anon:
            for _ in range(2):  # refused each time: a refusal is not kept either
                got, end = await anon.req("dm", flt)
                assert not got and end[0] == "CLOSED" and end[2].startswith("auth-required:"), end
        async with await Client.connect(relay.url) as third:
            assert (await third.auth(SK[2], relay.url, int(time.time())))[2] is True
            got, end = await third.req("dm", flt)
            assert not got and end[0] == "CLOSED" and end[2].startswith("restricted:"), end
        again, end = await sender.req("dm2", flt)
        assert end[0] == "EOSE" and [e["id"] for e in again] == [dm.id]


async def test_subscription_ids_are_checked_on_every_req(relay: Any) -> None:
    """An id too long is refused even for a kept text; ids written with escapes (whose
    end is not where their length says) are answered under their own id."""
    e = note(SK[2], "for the ids")
    flt = {"authors": [PK[2]], "limit": 1}
    async with await Client.connect(relay.url) as c:
        assert (await c.publish(e))[2] is True
        _, end = await c.req("ok", flt)  # kept now
        long_id = "x" * 65
        got, end = await c.req(long_id, flt)
        assert not got and end[0] == "CLOSED" and "subscription id longer than" in end[2], end
        text = msgspec.json.encode(flt).decode()
        for written, sub in (('"a\\"b"', 'a"b'), ('"\\u0061b"', "ab"), ('"\\\\"', "\\")):
            await c.send_raw(f'["REQ",{written},{text}]')
            while True:
                msg = await c.recv()
                if msg[0] in ("EOSE", "CLOSED"):
                    break
                assert msg[:2] == ["EVENT", sub] and msg[2]["id"] == e.id, msg
            assert msg == ["EOSE", sub], msg


async def test_a_kept_text_with_tags_and_a_frame_that_is_not_json(relay: Any) -> None:
    """Filters with tags (the engram head fetch's shape) are kept too; a frame ending in a
    kept text whose id holds a control character is not JSON, and is refused as ever."""
    tagged = note(SK[1], "tagged", tags=[("t", "memo-test")])
    flt = {"kinds": [1], "#t": ["memo-test"], "limit": 5}
    async with await Client.connect(relay.url) as c:
        assert (await c.publish(tagged))[2] is True
        first, end = await c.req("t1", flt)
        assert end[0] == "EOSE" and [e["id"] for e in first] == [tagged.id]
        hits = await memo_hits(relay)
        again, end = await c.req("t2", flt)
        assert end == ["EOSE", "t2"] and again == first
        assert await memo_hits(relay) == hits + 1
        text = msgspec.json.encode(flt).decode()
        await c.send_raw('["REQ","bad\x01id",' + text + "]")
        msg = await c.recv()
        assert msg[0] == "NOTICE" and msg[1].startswith("invalid:"), msg
        assert await memo_hits(relay) == hits + 1


def test_split_req_takes_only_a_plainly_written_id() -> None:
    text = '{"authors":["' + "a" * 64 + '"],"limit":10}]'
    assert split_req('["REQ","r1",' + text) == ("r1", text)
    assert split_req('["REQ","sub 1 é",' + text) == ("sub 1 é", text)
    # escapes, a quote, a control character or nothing in the id; spaces; another verb
    for frame in (
        '["REQ","a\\"b",' + text,
        '["REQ","\\u0061b",' + text,
        '["REQ","a"b",' + text,
        '["REQ","a\x01b",' + text,
        '["REQ","",' + text,
        '["REQ", "r1",' + text,
        '["REQ","r1" ,' + text,
        '["COUNT","r1",' + text,
        '["REQ","r1"]',
    ):
        assert split_req(frame) is None, frame
    long = '{"ids":["' + "b" * REQ_MEMO_TEXT_MAX + '"]}]'
    assert split_req('["REQ","r1",' + long) is None


def test_kept_per_tenant_and_viewer_and_bounded() -> None:
    settings = Settings()
    tenant = TenantRegistry(settings).default
    other = TenantRegistry(settings).default  # an equal tenant, another object (a reload)
    assert other == tenant and other is not tenant
    memo = ReqMemo(entries=2)
    kept = SharedFilters([Filter(authors=[PK[0]], limit=10)])
    memo.put("t1", tenant, None, kept)
    assert memo.get("t1", tenant, None) is kept
    assert memo.get("t1", tenant, PK[0]) is None  # another viewer
    assert memo.get("t1", other, None) is None  # the tenant as it is now: worked out again
    memo.put("t2", tenant, None, kept)
    memo.put("t3", tenant, None, kept)  # past the bound: the oldest text goes
    assert memo.size == 2 and memo.get("t1", tenant, None) is None
    assert memo.get("t3", tenant, None) is kept and memo.hits == 2
