"""Reads are bounded: a REQ past its budget ends with the documented CLOSED, and one
client's reads cannot take every store slot from the others (relay.readgate)."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

import asyncpg
import pytest
from nostr_client import Client

from relay.readgate import ReadGate


class Conn:
    def __init__(self, ip: str) -> None:
        self.ip = ip
        self.reads: asyncio.Semaphore | None = None


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
