"""Reads are bounded: a REQ past its budget ends with the documented CLOSED, and one
client's reads cannot take every store slot from the others (relay.readgate)."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import asyncpg
import pytest
from nostr_client import Client

from relay.readgate import ReadGate, Slots


class Conn:
    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.reads: Slots | None = None


async def test_a_connection_waits_for_its_own_reads_not_for_others() -> None:
    gate = ReadGate(per_connection=2, per_ip=3)
    busy, other_conn, other_ip = Conn("10.0.0.1"), Conn("10.0.0.1"), Conn("10.0.0.2")
    release = asyncio.Event()
    entered: list[str] = []

    async def read(who: Conn, name: str) -> None:
        async with gate.hold(who):
            entered.append(name)
            await release.wait()

    tasks = [asyncio.create_task(read(busy, f"busy{i}")) for i in range(4)]
    tasks.append(asyncio.create_task(read(other_conn, "same-ip")))
    tasks.append(asyncio.create_task(read(other_ip, "other-ip")))
    tasks.append(asyncio.create_task(read(other_conn, "same-ip-2")))
    for _ in range(10):
        await asyncio.sleep(0)
    # the busy connection has its 2; the address its 3 (the third is the other
    # connection's); another address is not held back at all
    assert sorted(entered) == ["busy0", "busy1", "other-ip", "same-ip"]
    release.set()
    await asyncio.gather(*tasks)
    assert sorted(entered) == sorted(
        ["busy0", "busy1", "busy2", "busy3", "other-ip", "same-ip", "same-ip-2"]
    )
    assert gate.addresses() == 0  # nothing kept for addresses that left


async def test_a_cancelled_wait_gives_up_nothing_and_takes_nothing() -> None:
    """A REQ closed while it waits for its connection's slot: the slot it was about to get
    goes to the next waiter, the counts come back, and the gate forgets the address."""
    gate = ReadGate(per_connection=1, per_ip=8)
    conn = Conn("10.0.0.3")
    release = asyncio.Event()
    entered: list[str] = []

    async def read(name: str) -> None:
        async with gate.hold(conn):
            entered.append(name)
            await release.wait()

    first = asyncio.create_task(read("first"))
    waiting = [asyncio.create_task(read(f"w{i}")) for i in range(3)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert entered == ["first"]
    waiting[0].cancel()  # still waiting: leaves the queue
    release.set()
    await first
    # the slot first leaves goes to w1 (w0 left the queue), then w2's turn
    for _ in range(3):
        await asyncio.sleep(0)
    await asyncio.gather(*waiting, return_exceptions=True)
    assert entered == ["first", "w1", "w2"]
    async with gate.hold(conn):  # the connection's one slot is free again
        entered.append("after")
    assert gate.addresses() == 0
    assert conn.reads is not None and conn.reads._free == 1 and not conn.reads._waiters


async def test_a_slot_handed_to_a_cancelled_task_goes_to_the_next() -> None:
    slots = Slots(1)
    loop = asyncio.get_running_loop()
    await slots.acquire(loop)
    b = asyncio.create_task(slots.acquire(loop))
    c = asyncio.create_task(slots.acquire(loop))
    await asyncio.sleep(0)
    slots.release()  # b is handed the slot...
    b.cancel()  # ...and cancelled before it runs: c gets it
    await asyncio.gather(b, return_exceptions=True)
    await asyncio.wait_for(c, 5)
    assert b.cancelled()
    slots.release()
    assert slots._free == 1 and not slots._waiters


@pytest.mark.parametrize("verb", ["REQ", "COUNT"])
async def test_a_read_past_its_budget_is_closed_with_the_reason(
    start_relay: Any, verb: str
) -> None:
    """A statement that cannot finish within `query_timeout_seconds` (here: the table is
    locked by another session, which makes the wait certain) ends the REQ/COUNT with
    `CLOSED "error: query timed out after …"`, and the relay keeps answering."""
    relay = start_relay(env={"ENGRAM_QUERY_TIMEOUT_SECONDS": "1"})
    async with await Client.connect(relay.url) as c:
        await c.query({"kinds": [1], "limit": 1})  # migrations applied, pool warm
        lock = await asyncpg.connect(relay.database_url)
        try:
            tx = lock.transaction()
            await tx.start()
            await lock.execute("LOCK TABLE events IN ACCESS EXCLUSIVE MODE")
            await c.send([verb, "costly", {"#t": ["absent"]}])
            msg = await c.expect("CLOSED", timeout=60)
            assert msg[1] == "costly"
            assert msg[2].startswith("error: query timed out after 1 s"), msg
            await tx.rollback()
        finally:
            await lock.close()
        assert await c.query({"#t": ["absent"], "limit": 5}) == []
    with urllib.request.urlopen(f"{relay.http_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    assert 'engram_reads_closed_total{reason="budget",tenant=' in text, text
