"""Hostile input: fuzzed frames never crash a connection and always get a specific NIP-01
answer; SQL-looking filter values are data; nothing secret reaches logs or metrics; a
thousand subscribers on one process are all served."""

from __future__ import annotations

import asyncio
import json
import resource
import time
import urllib.request

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from nostr_client import Client

from engram.nip01 import pubkey_of, sign_event
from relay import wire

AUX = bytes(32)
SK = (0xBAD0).to_bytes(32, "big")
PREFIXES = ("invalid:", "restricted:", "auth-required:", "rate-limited:", "blocked:", "error:")

VALID_EVENT = msgspec.to_builtins(sign_event(SK, 1_700_000_000, 1, [["t", "x"]], "hi", AUX))


def _mutations() -> st.SearchStrategy[bytes]:
    """Frames shaped like Nostr messages, broken in the ways clients and attackers do."""
    junk = st.one_of(
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=False),
        st.text(max_size=20),
        st.none(),
        st.booleans(),
        st.lists(st.integers(), max_size=3),
    )
    event = st.fixed_dictionaries({k: st.one_of(st.just(v), junk) for k, v in VALID_EVENT.items()})
    filters = st.dictionaries(
        st.sampled_from(
            ["ids", "authors", "kinds", "#e", "#p", "since", "until", "limit", "search", "bogus"]
        ),
        st.one_of(junk, st.lists(junk, max_size=4)),
        max_size=4,
    )
    verb = st.sampled_from(["EVENT", "REQ", "CLOSE", "AUTH", "COUNT", "NOPE", ""])
    msg = st.one_of(
        st.tuples(verb, event).map(list),
        st.tuples(verb, st.text(max_size=70), filters, filters).map(list),
        st.lists(junk, max_size=4),
        junk,
    )
    encoded = msg.map(lambda m: json.dumps(m).encode())
    truncated = st.tuples(encoded, st.integers(0, 200)).map(lambda t: t[0][: t[1]])
    nested = st.integers(1, 3000).map(lambda n: b"[" * n + b"]" * n)
    raw = st.binary(max_size=200)
    special = st.sampled_from(
        [
            b'["EVENT",{"content":"\\ud800"}]',
            b'["REQ","s",{"limit":-1}]',
            b'["REQ","s",{"limit":1e400}]',
            b'["REQ","s",{"ids":["' + b"a" * 10_000 + b'"]}]',
            b'["EVENT",' + json.dumps({**VALID_EVENT, "id": "f" * 5000}).encode() + b"]",
            b'["EVENT",'
            + json.dumps({**VALID_EVENT, "tags": [["t", str(i)] for i in range(10_000)]}).encode()
            + b"]",
            b'["REQ","\xff\xfe",{}]',
            b"\xef\xbb\xbf[]",
            b'["CLOSE",' + b"9" * 400 + b"]",
        ]
    )
    return st.one_of(encoded, truncated, nested, raw, special)


def _is_specific_reply(frame: bytes) -> bool:
    msg = msgspec.json.decode(frame)
    if msg[0] == "NOTICE":
        return msg[1].startswith(PREFIXES)
    if msg[0] == "OK":
        return msg[2] is True or msg[3].startswith(PREFIXES)
    if msg[0] == "CLOSED":
        return msg[2].startswith(PREFIXES)
    return False


@settings(max_examples=400, deadline=None)
@given(_mutations())
def test_codec_answers_every_bad_frame_specifically(frame):
    try:
        wire.decode(frame)
    except wire.WireError as exc:
        assert _is_specific_reply(exc.reply), exc.reply


@pytest.fixture(scope="module")
def fuzz_relay(pg_server_url, tmp_path_factory):
    from relay_fixtures import create_database_sync, launch_relay

    rp = launch_relay(
        create_database_sync(pg_server_url),
        str(tmp_path_factory.mktemp("fuzz")),
        {"ENGRAM_LIMITS_MAX_MESSAGE_LENGTH": "65536"},
    )
    yield rp
    rp.stop()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frames=st.lists(_mutations(), min_size=1, max_size=5))
def test_fuzzed_frames_never_break_a_connection(fuzz_relay, frames):
    async def run() -> None:
        async with await Client.connect(fuzz_relay.url) as c:
            for frame in frames:
                try:
                    text = frame.decode()
                except UnicodeDecodeError:
                    await c.ws.send(frame)  # binary frame: invalid UTF-8 is still answered
                else:
                    await c.ws.send(text)
            # every reply that came is specific, and the connection still works
            await c.send(["REQ", "alive", {"limit": 0}])
            while True:
                msg = await c.recv()
                if msg[:2] == ["EOSE", "alive"]:
                    break
                if msg[0] in ("EVENT", "EOSE", "COUNT"):  # answers to frames that were valid
                    continue
                assert _is_specific_reply(msgspec.json.encode(msg)), msg

    asyncio.run(run())


async def test_sql_in_filter_values_is_data(relay):
    sk = (0x5A1).to_bytes(32, "big")
    hostile = "x'); DROP TABLE events; --"
    async with await Client.connect(relay.url) as c:
        e = sign_event(sk, int(time.time()), 1, [["t", hostile]], "bobby tables", AUX)
        assert (await c.publish(e))[2] is True
        got = await c.query({"#t": [hostile]})
        assert [x["id"] for x in got] == [e.id]
        for flt in (
            {"search": "'; DELETE FROM events; --"},
            {"#d": ["' OR '1'='1"]},
            {"search": "bobby) OR (1=1"},
        ):
            _, end = await c.req("q", flt)
            assert end[0] in ("EOSE", "CLOSED")
            if end[0] == "CLOSED":
                assert end[2].startswith(PREFIXES)
            await c.send(["CLOSE", "q"])
        assert [x["id"] for x in await c.query({"authors": [pubkey_of(sk)]})] == [e.id]


async def test_no_content_or_keys_in_logs_or_metrics(relay):
    secret_text = "PLAINTEXT-SHOULD-NOT-LEAK-7f3a"
    sk = (0x5EC12E7).to_bytes(32, "big")
    async with await Client.connect(relay.url) as c:
        good = sign_event(sk, int(time.time()), 1, [], secret_text, AUX)
        assert (await c.publish(good))[2] is True
        bad = msgspec.structs.replace(good, content=secret_text + "!")  # id mismatch
        assert (await c.publish(bad))[2] is False
        await c.send_raw('["EVENT",{"content":"' + secret_text + '"}]')
        await c.recv()
        await c.send(["AUTH", sign_event(sk, 1, 22242, [], secret_text, AUX)])
        await c.expect("OK")
    with urllib.request.urlopen(relay.http_url + "/metrics", timeout=5) as r:
        metrics = r.read().decode()
    await asyncio.sleep(0.3)
    for text in (relay.log(), metrics):
        assert secret_text not in text
        assert sk.hex() not in text


@pytest.mark.slow
async def test_a_thousand_subscribers_on_one_process(start_relay):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 8192)), hard))
    rp = start_relay()

    def rss_kb() -> int:
        with open(f"/proc/{rp.pid}/status") as fh:
            return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS"))

    sk = (0x1000).to_bytes(32, "big")
    before = rss_kb()
    clients: list[Client] = []
    try:
        for _ in range(10):
            clients += await asyncio.gather(*(Client.connect(rp.url) for _ in range(100)))
        ends = await asyncio.gather(*(c.req("s", {"authors": [pubkey_of(sk)]}) for c in clients))
        assert all(end[0] == "EOSE" for _, end in ends)
        after = rss_kb()
        print(
            f"\nrelay RSS {before} kB -> {after} kB with 1000 subscribed connections: "
            f"{(after - before) / 1000:.1f} kB per connection"
        )
        async with await Client.connect(rp.url) as pub:
            e = sign_event(sk, int(time.time()), 1, [], "to everyone", AUX)
            assert (await pub.publish(e))[2] is True
        got = await asyncio.gather(*(c.recv(timeout=120) for c in clients))  # outer bound
        assert all(m[0] == "EVENT" and m[2]["id"] == e.id for m in got)
    finally:
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
