"""Slow consumers: a reader that is behind keeps its connection, one that stopped is
dropped, and queued output stays within the configured bounds (relay.sendqueue).

Real relay processes; the stopped reader is a bare socket that never reads. Nothing here
measures time: each test waits on a condition (with a generous bound) and asserts on what
was delivered and on the relay's own queue accounting from /metrics.
"""

from __future__ import annotations

import asyncio
import math
import socket
import time
import urllib.request

import msgspec
import pytest
import websockets
from nostr_client import Client, raw_ws, raw_ws_send
from prometheus_client.parser import text_string_to_metric_families

from engram.nip01 import Event, pubkey_of, sign_event
from relay.sendqueue import FRAME_OVERHEAD
from relay.wire import encode_event

AUX = bytes(32)
MIB = 1024 * 1024
WAIT = 180.0  # generous upper bound for any condition on a loaded 2-core machine


def key(n: int) -> bytes:
    return (0x510C0000 + n).to_bytes(32, "big")


def events(sk: bytes, n: int, size: int) -> list[Event]:
    now = int(time.time())
    return [sign_event(sk, now, 1, [], f"{i:06d}" + "z" * (size - 6), AUX) for i in range(n)]


def frame_size(e: Event, sub_id: str) -> int:
    return len(b'["EVENT","' + sub_id.encode() + b'",' + encode_event(e) + b"]")


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


async def metric(port: int, name: str, **labels: str) -> float:
    samples = await asyncio.to_thread(scrape, port)
    return samples.get((name, frozenset(labels.items())), 0.0)


async def wait_metric(port: int, name: str, want, what: str, **labels: str) -> float:
    """Poll /metrics until `want(value)`; fails only after `WAIT` seconds."""
    deadline = time.monotonic() + WAIT
    while True:
        value = await metric(port, name, **labels)
        if want(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: {name}{labels} = {value}")
        await asyncio.sleep(0.25)


async def publish_burst(url: str, evs: list[Event], publishers: int = 4) -> None:
    """Four publishers pushing as fast as the relay takes them (pipelined batches)."""

    async def one(chunk: list[Event]) -> None:
        async with await Client.connect(url) as c:
            for i in range(0, len(chunk), 100):  # pipelined: 100 EVENTs, then their OKs
                oks = await c.publish_many(chunk[i : i + 100])
                assert all(ok[2] for ok in oks.values()), [o for o in oks.values() if not o[2]]

    await asyncio.gather(*(one(evs[i::publishers]) for i in range(publishers)))


class Reader:
    """An ordinary subscriber that reads everything as it comes, counting frames."""

    def __init__(self, ws, sub_id: str) -> None:
        self.ws = ws
        self.sub_id = sub_id
        self.ids: set[str] = set()
        self.bytes = 0
        self.other: list[str] = []  # anything but our EVENTs (a NOTICE would land here)

    @classmethod
    async def open(cls, url: str, sub_id: str, flt: dict) -> Reader:
        ws = await websockets.connect(url, max_size=None)
        r = cls(ws, sub_id)
        await ws.send(msgspec.json.encode(["REQ", sub_id, flt]).decode())
        while True:  # the AUTH challenge, then EOSE
            msg = msgspec.json.decode(await asyncio.wait_for(ws.recv(), 30))
            if msg[0] == "EOSE":
                return r

    async def read_until(self, want: set[str]) -> None:
        deadline = time.monotonic() + WAIT
        while not want <= self.ids:
            left = deadline - time.monotonic()
            assert left > 0, f"got {len(self.ids & want)} of {len(want)}; other: {self.other}"
            frame = await asyncio.wait_for(self.ws.recv(), left)
            msg = msgspec.json.decode(frame)
            if msg[0] == "EVENT" and msg[1] == self.sub_id:
                self.ids.add(msg[2]["id"])
                self.bytes += len(frame)
            else:
                self.other.append(frame[:200])

    async def close(self) -> None:
        await self.ws.close()


def stopped_reader(port: int, flt: dict) -> socket.socket:
    """Subscribes, then never reads again (a small receive window: it fills at once)."""
    sock = raw_ws(port)
    raw_ws_send(sock, msgspec.json.encode(["REQ", "stopped", flt]).decode())
    return sock


async def drain(sock: socket.socket) -> int:
    """Read until the relay has hung up; returns the bytes that were still in flight."""
    sock.settimeout(WAIT)
    received = 0
    try:
        while chunk := await asyncio.to_thread(sock.recv, 1 << 20):
            received += len(chunk)
    except ConnectionResetError:  # cut (aborted), not closed: also a hang-up
        pass
    sock.close()
    return received


@pytest.mark.parametrize("size", [16_000, 500], ids=["16KB", "500B"])
async def test_reader_that_keeps_reading_past_its_cap_gets_everything(start_relay, size):
    """A burst larger than the connection's cap goes through a reader that keeps reading:
    it is behind at times, never stopped, so it is never dropped. The cap is set to 8 MiB
    (the default is 32 MiB) and the burst is 33/32 of it, as 33 MiB was of the default: the
    reader's lag grows with the burst (near half of it with 16 KB events), so the margin to
    the cap is the one the default had, with a quarter of the events."""
    cap = 8 * MIB
    rp = start_relay(env={"ENGRAM_SEND_QUEUE_BYTES": str(cap)})  # relay budget: the default
    sk = key(1 if size > 1000 else 2)
    flt = {"authors": [pubkey_of(sk)]}
    one = frame_size(events(sk, 1, size)[0], "r")
    n = math.ceil(cap * 33 / 32 / one)  # a burst of more than the cap for the reader
    burst = events(sk, n, size)
    reader = await Reader.open(rp.url, "r", flt)
    try:
        reading = asyncio.create_task(reader.read_until({e.id for e in burst}))
        await publish_burst(rp.url, burst)
        await reading
        assert reader.bytes >= cap
        assert reader.other == []  # no NOTICE, nothing but its events
        assert await metric(rp.port, "engram_slow_consumers_total") == 0
        peak = await metric(rp.port, "engram_send_queue_connection_bytes_peak")
        total = await metric(rp.port, "engram_send_queue_bytes_peak")
        print(f"\n{size} B events, {n} ({reader.bytes} B): queued peak {peak:.0f} B on one")
        print(f"connection, {total:.0f} B in total; no reader was dropped")
        assert peak <= cap  # never reached the cap: it was behind, not stopped
    finally:
        await reader.close()


@pytest.mark.parametrize("size", [16_000, 500], ids=["16KB", "500B"])
async def test_stopped_reader_is_dropped_others_get_everything(start_relay, size):
    rp = start_relay(env={"ENGRAM_SLOW_CONSUMER_SECONDS": "5"})
    sk = key(3 if size > 1000 else 4)
    flt = {"authors": [pubkey_of(sk)]}
    n = math.ceil(12 * MIB / frame_size(events(sk, 1, size)[0], "stopped"))
    burst = events(sk, n, size)
    stopped = [stopped_reader(rp.port, flt) for _ in range(2)]
    readers = [await Reader.open(rp.url, f"r{i}", flt) for i in range(2)]
    try:
        reading = [asyncio.create_task(r.read_until({e.id for e in burst})) for r in readers]
        await publish_burst(rp.url, burst)
        await asyncio.gather(*reading)  # the readers got everything, in spite of the two
        # both stopped readers are dropped for stalling (not a cap, not the budget)...
        await wait_metric(
            rp.port, "engram_slow_consumer_drops_total", lambda v: v == 2, "drops", reason="stalled"
        )
        for sock in stopped:  # ...and cut: what they still get is a fraction of the burst
            assert await drain(sock) < n * size // 2
        for reason in ("cap", "budget"):
            assert await metric(rp.port, "engram_slow_consumer_drops_total", reason=reason) == 0
        assert all(r.other == [] for r in readers)
        # their queued output was released
        await wait_metric(rp.port, "engram_send_queue_bytes", lambda v: v == 0, "queue released")
        print(f"\n{size} B: queued peak per connection", end=" ")
        print(await metric(rp.port, "engram_send_queue_connection_bytes_peak"), end=", total ")
        print(await metric(rp.port, "engram_send_queue_bytes_peak"))
        # the readers' connections still work
        async with await Client.connect(rp.url) as c:
            last = events(sk, 1, 10)[0]
            assert (await c.publish(last))[2] is True
            for r in readers:
                await r.read_until({last.id})
    finally:
        for r in readers:
            await r.close()


async def test_queued_output_stays_within_the_budget(start_relay):
    """Two stopped readers, a budget smaller than their queues together: the relay drops
    the furthest behind first; its accounting never exceeds the budget plus one frame.
    (The budget is large next to a reading subscriber's lag, which is never the furthest
    behind: the stopped ones are past 8 MiB each when the budget is first reached.)"""
    budget, cap = 16 * MIB, 12 * MIB
    rp = start_relay(
        env={
            "ENGRAM_SEND_QUEUE_BUDGET_BYTES": str(budget),
            "ENGRAM_SEND_QUEUE_BYTES": str(cap),
            "ENGRAM_SLOW_CONSUMER_SECONDS": "600",  # only the byte bounds act here
        }
    )
    sk = key(5)
    flt = {"authors": [pubkey_of(sk)]}
    size = 16_000
    burst = events(sk, 1_800, size)  # ~29 MB to each reader
    biggest = frame_size(burst[0], "stopped") + FRAME_OVERHEAD
    stopped = [stopped_reader(rp.port, flt) for _ in range(2)]
    reader = await Reader.open(rp.url, "r", flt)
    try:
        async with await Client.connect(rp.url) as c:
            for i in range(0, len(burst), 50):  # the reader keeps up, batch by batch
                chunk = burst[i : i + 50]
                assert all(ok[2] for ok in (await c.publish_many(chunk)).values())
                await reader.read_until({e.id for e in chunk})
        assert reader.other == []
        drops = await wait_metric(
            rp.port, "engram_slow_consumer_drops_total", lambda v: v >= 1, "drops", reason="budget"
        )
        total = await metric(rp.port, "engram_send_queue_bytes_peak")
        peak = await metric(rp.port, "engram_send_queue_connection_bytes_peak")
        print(f"\nbudget {budget}: peak total {total:.0f} B, peak one {peak:.0f} B, {drops} shed")
        assert total <= budget + biggest  # the budget, plus the frame that crossed it
        assert peak <= cap + biggest
        assert await metric(rp.port, "engram_send_queue_bytes") <= budget
    finally:
        await reader.close()
        for sock in stopped:
            sock.close()
