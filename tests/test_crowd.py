"""Crowds of connections (issue 47, item 3), on real relay processes and sockets.

What `bench crowd` measures at 10,000 connections is checked here for correctness at a
small scale: every connection of a crowd gets a fan-out exactly once with its own
subscription id, what it did not subscribe to never reaches it, the relay stays usable
and forgets the crowd once it has left; the open-files limit is raised at start-up;
the keepalive closes a connection that does not answer pings and keeps one that does.
Nothing here is timed.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import pytest
from nostr_client import Client, raw_ws, raw_ws_send
from relay_fixtures import RelayProcess, until

from bench import wsclient
from engram.nip01 import sign_event
from relay.memtrim import Trimmer
from relay.wsserver import PARALLEL_MIN

CROWD = 200
SK = bytes(31) + b"\x2f"


def _limits(pid: int) -> tuple[int, int]:
    """The process's open-files (soft, hard) limits, as the kernel shows them."""
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line in /proc/PID/limits")


def test_open_files_soft_limit_is_raised_at_start_up(start_relay) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(512, hard)
    if low >= hard:
        pytest.skip("the hard open-files limit leaves nothing to raise")
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))  # the relay inherits it
    try:
        rp = start_relay()
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert _limits(rp.pid) == (hard, hard)
    assert f"open files limit: {hard} (raised from {low})" in rp.log()


class Member:
    """One connection of the crowd and every message it received."""

    def __init__(self, sub_id: str) -> None:
        self.sub_id = sub_id
        self.frames: list[list] = []
        self.eose = asyncio.Event()
        self.ws: wsclient.WsConnection | None = None

    def on_message(self, payload: bytes) -> None:
        frame = msgspec.json.decode(payload)
        if frame[0] == "EOSE":
            self.eose.set()
        else:
            self.frames.append(frame)

    def events(self) -> list[str]:
        return [f[2]["id"] for f in self.frames if f[0] == "EVENT"]


async def _metric(rp: RelayProcess, name: str) -> float:
    """A tenant-labelled gauge of /metrics (the default tenant)."""

    def scrape() -> str:
        import urllib.request

        with urllib.request.urlopen(rp.http_url + "/metrics", timeout=10) as r:
            return r.read().decode()

    text = await asyncio.to_thread(scrape)
    prefix = name + '{tenant="default"} '
    return sum(float(x[len(prefix) :]) for x in text.splitlines() if x.startswith(prefix))


async def _gauge_is(rp: RelayProcess, name: str, value: float) -> bool:
    return await _metric(rp, name) == value


def _note(tag: str, n: int) -> object:
    return sign_event(SK, int(time.time()), 1, [["t", tag]], f"crowd note {n}", bytes(32))


async def _crowd(url: str, tag: str, count: int) -> list[Member]:
    members = [Member(f"crowd-{i}") for i in range(count)]

    async def join(m: Member) -> None:
        m.ws = await wsclient.connect(url, m.on_message, timeout=60)
        req = ["REQ", m.sub_id, {"kinds": [1], "#t": [tag], "limit": 0}]
        m.ws.send(wsclient.client_frame(msgspec.json.encode(req)))
        await asyncio.wait_for(m.eose.wait(), 60)

    await asyncio.gather(*(join(m) for m in members))
    return members


async def test_a_crowd_gets_every_fan_out_once_and_the_relay_stays_correct(
    relay: RelayProcess,
) -> None:
    members = await _crowd(relay.url, "crowd", CROWD)
    assert await _metric(relay, "engram_subscriptions") == CROWD
    first, other, last = _note("crowd", 1), _note("elsewhere", 2), _note("crowd", 3)
    async with await Client.connect(relay.url) as publisher:
        for ev in (first, other, last):
            ok = await publisher.publish(ev)
            assert ok[2] is True, ok
        await until(lambda: all(len(m.events()) >= 2 for m in members), "the crowd got both notes")
        # the relay still answers another client, and stored all three
        got = await publisher.query({"ids": [first.id, other.id, last.id]})
        assert {e["id"] for e in got} == {first.id, other.id, last.id}
    for m in members:
        assert m.events() == [first.id, last.id]  # once each, in order; never `other`
        assert {f[1] for f in m.frames} == {m.sub_id}  # under its own subscription id
        assert m.frames[0][2] == msgspec.json.decode(msgspec.json.encode(first))
    for m in members:
        assert m.ws is not None
        m.ws.close()
    await until(
        lambda: _gauge_is(relay, "engram_connections", 0), "the crowd's connections are gone"
    )
    assert await _metric(relay, "engram_subscriptions") == 0
    # and a new crowd is served as the first was
    again = await _crowd(relay.url, "crowd", 20)
    async with await Client.connect(relay.url) as publisher:
        fresh = _note("crowd", 4)
        assert (await publisher.publish(fresh))[2] is True
        await until(lambda: all(m.events() == [fresh.id] for m in again), "the new crowd got it")
    for m in again:
        assert m.ws is not None
        m.ws.close()


async def test_a_crowd_with_stopped_readers_gets_a_burst_whole_and_in_one_order(
    start_relay,
) -> None:
    """More sockets with output at once than the corker writes alone (PARALLEL_MIN): the
    helper threads write too, and the stopped readers' sockets take part of a write (the
    rest goes to their transports). Every reading connection gets every event of the
    burst once, intact, in the one order the relay published them; the stopped ones are
    dropped. What they did not read fits the kernel's socket buffers, so their own queues
    empty and the keepalive is what finds them (short here: the defaults take 50 s)."""
    rp = start_relay(
        env={
            "ENGRAM_SLOW_CONSUMER_SECONDS": "3",
            "ENGRAM_PING_INTERVAL_SECONDS": "2",
            "ENGRAM_PING_TIMEOUT_SECONDS": "2",
        }
    )
    members = await _crowd(rp.url, "burst", PARALLEL_MIN + 20)
    stopped = []
    for _ in range(10):  # subscribed, then never read again (a 4 KiB receive window)
        sock = raw_ws(rp.port)
        req = ["REQ", "stopped", {"kinds": [1], "#t": ["burst"], "limit": 0}]
        raw_ws_send(sock, msgspec.json.encode(req).decode())
        stopped.append(sock)
    await until(
        lambda: _gauge_is(rp, "engram_subscriptions", len(members) + len(stopped)),
        "every subscriber counted",
    )
    burst = [
        sign_event(SK, int(time.time()), 1, [["t", "burst"]], f"{i:04d}" + "x" * 400, bytes(32))
        for i in range(200)
    ]
    async with await Client.connect(rp.url) as publisher:
        oks = await publisher.publish_many(burst)
        assert all(ok[2] for ok in oks.values())
    await until(lambda: all(len(m.events()) >= len(burst) for m in members), "the burst arrived")
    order = members[0].events()
    assert sorted(order) == sorted(e.id for e in burst)  # each once
    for m in members:
        assert m.events() == order
    sent = {e.id: msgspec.json.decode(msgspec.json.encode(e)) for e in burst}
    assert all(f[2] == sent[f[2]["id"]] for m in members for f in m.frames)
    await until(
        lambda: _gauge_is(rp, "engram_connections", len(members)), "the stopped ones dropped"
    )
    for sock in stopped:
        sock.close()
    for m in members:
        assert m.ws is not None
        m.ws.close()


async def test_keepalive_keeps_who_answers_and_closes_who_does_not(start_relay) -> None:
    rp = start_relay(
        env={"ENGRAM_PING_INTERVAL_SECONDS": "0.5", "ENGRAM_PING_TIMEOUT_SECONDS": "0.5"}
    )
    lost: list[str] = []
    alive = await wsclient.connect(rp.url, lambda _: None, lost.append)  # answers pings
    silent = raw_ws(rp.port)  # reads nothing and never answers a ping
    silent.settimeout(60)  # an outer bound: the relay hangs up after about one second
    received = b""
    while chunk := await asyncio.to_thread(silent.recv, 65536):  # EOF: the relay hung up
        received += chunk
    silent.close()
    assert received.startswith(b"\x89")  # its unanswered ping, then the hang-up
    await asyncio.sleep(2.0)  # several more pings for the one that answers them
    assert not lost and not alive.closed
    async with await Client.connect(rp.url):  # and it is served as ever
        await until(lambda: _gauge_is(rp, "engram_connections", 2), "both counted")
    alive.close()


async def _trims_after(opened: int, closed: int, min_drop: int) -> int:
    """How many trims a Trimmer runs after `opened` connections of which `closed` left."""
    calls: list[int] = []
    trimmer = Trimmer(lambda pad: calls.append(pad) or 1, min_drop=min_drop)
    for _ in range(opened):
        trimmer.opened()
    for _ in range(closed):
        trimmer.closed()
    if trimmer.timer is not None:
        await until(lambda: calls and trimmer.timer is None, "the trim ran", timeout=60)
    return len(calls)


async def test_memory_is_trimmed_once_a_crowd_left(monkeypatch) -> None:
    from relay import memtrim

    monkeypatch.setattr(memtrim, "DELAY", 0.05)
    assert await _trims_after(opened=40, closed=40, min_drop=30) == 1
    # a few connections leaving, or a crowd mostly still there: no trim
    assert await _trims_after(opened=40, closed=20, min_drop=30) == 0
    assert await _trims_after(opened=100, closed=40, min_drop=30) == 0


def test_trim_is_found_on_this_system() -> None:
    """glibc here: the real malloc_trim is what the relay calls."""
    from relay.memtrim import _load

    trim: Callable[[int], int] | None = _load()
    assert trim is not None and trim(0) in (0, 1)
