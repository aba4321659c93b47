"""Several relay processes on one PostgreSQL: live events cross processes and survive
lost LISTEN connections and dead nodes; the tail never skips a late commit."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import asyncpg
import pytest
from nostr_client import Client

from engram.nip01 import pubkey_of, sign_event
from relay.config import Settings
from relay.store import SaveStatus
from relay.store.postgres import PostgresStore
from relay.wire import encode_event

AUX = bytes(32)


def key(n: int) -> bytes:
    return (0x5CA1E000 + n).to_bytes(32, "big")


def ev(sk: bytes, kind: int = 1, content: str = ""):
    return sign_event(sk, int(time.time()), kind, [], content, AUX)


async def until_received(c: Client, *event_ids: str, timeout: float = 30.0) -> None:
    """Wait until every one of these events has arrived, in whatever order: live events
    published on different processes carry no order between them (a node serves its own
    subscribers at once, the others' through the bus)."""
    deadline = time.monotonic() + timeout
    waiting = set(event_ids)
    while waiting:
        msg = await c.recv(timeout=max(0.1, deadline - time.monotonic()))
        if msg[0] == "EVENT":
            waiting.discard(msg[2]["id"])


@pytest.fixture
def two_nodes(start_relay):
    first = start_relay(env={"ENGRAM_BUS_POLL_SECONDS": "0.5"})
    second = start_relay(database_url=first.database_url, env={"ENGRAM_BUS_POLL_SECONDS": "0.5"})
    return first, second


@pytest.fixture
def notify_only_nodes(start_relay):
    """Two nodes whose fallback poll is far longer than any wait here: a live event that
    arrives at all was carried by NOTIFY (an outcome, not a measured latency)."""
    env = {"ENGRAM_BUS_POLL_SECONDS": "600"}
    first = start_relay(env=env)
    return first, start_relay(database_url=first.database_url, env=env)


async def test_live_events_cross_processes(notify_only_nodes):
    n1, n2 = notify_only_nodes
    sk = key(1)
    flt = {"authors": [pubkey_of(sk)]}
    async with await Client.connect(n1.url) as sub, await Client.connect(n2.url) as pub:
        _, end = await sub.req("s", flt)
        assert end[0] == "EOSE"
        stored = ev(sk, content="stored on node 2")
        assert (await pub.publish(stored))[2] is True
        await until_received(sub, stored.id, timeout=60)  # woken by NOTIFY: no poll in 600 s
        eph = ev(sk, kind=20001, content="ephemeral via node 2")
        assert (await pub.publish(eph))[2] is True
        await until_received(sub, eph.id, timeout=60)
        # the publishing node's own subscriber gets each event once, not again via the bus
        _, end = await pub.req("own", flt)
        local = ev(sk, content="local")
        assert (await pub.publish(local))[2] is True
        await until_received(pub, local.id)
        # a probe stored on node 1 reaches node 2 through the bus, after `local`'s row:
        # a duplicate of `local` from the bus would arrive before it
        probe = ev(sk, content="probe via node 1")
        assert (await sub.publish(probe))[2] is True
        before = await pub.until_probe(probe.id, timeout=60)
        assert not [m for m in before if m[0] == "EVENT" and m[2]["id"] == local.id], "duplicate"


async def test_listener_reconnects_and_catches_up(two_nodes, pg_server_url):
    n1, n2 = two_nodes
    sk = key(2)
    async with await Client.connect(n1.url) as sub, await Client.connect(n2.url) as pub:
        _, end = await sub.req("s", {"authors": [pubkey_of(sk)]})
        assert end[0] == "EOSE"
        admin = await asyncpg.connect(pg_server_url)
        try:  # cut every LISTEN connection of both nodes, mid-stream
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%' OR query = 'SELECT 1'"
            )
            assert killed >= 1
        finally:
            await admin.close()
        events = [ev(sk, content=f"during reconnect {i}") for i in range(5)]
        for e in events:
            assert (await pub.publish(e))[2] is True
        for e in events:  # delayed, never lost
            await until_received(sub, e.id, timeout=15)


async def test_one_node_killed_the_other_keeps_serving(two_nodes):
    n1, n2 = two_nodes
    sk = key(3)
    async with await Client.connect(n2.url) as sub, await Client.connect(n2.url) as pub:
        _, end = await sub.req("s", {"authors": [pubkey_of(sk)]})
        assert end[0] == "EOSE"
        os.kill(n1.pid, signal.SIGKILL)
        n1.proc.wait(10)
        for i in range(3):
            e = ev(sk, content=f"after the other died {i}")
            assert (await pub.publish(e))[2] is True
            await until_received(sub, e.id)


def test_held_back_reads_back_off_to_the_poll():
    """A long transaction costs a re-read every poll, not one every 20 ms."""
    from relay.store.pgbus import _retry_after

    waits: list[float] = []
    for _ in range(12):
        waits.append(_retry_after(waits[-1] if waits else None, 1.0))
    assert waits[0] == 0.02 and waits == sorted(waits)
    assert waits[-3:] == [1.0, 1.0, 1.0]
    assert _retry_after(None, 0.01) == 0.01  # never longer than the poll


async def test_tail_never_skips_a_late_commit(database_url, make_event):
    """A transaction that began first but commits last is still delivered, in order."""
    writer = await PostgresStore.open(database_url, Settings())
    reader = await PostgresStore.open(database_url, Settings())
    slow = await asyncpg.connect(database_url)
    try:
        position = await reader.bus_position()
        late = make_event(key(4), content="committed late")
        await slow.execute("BEGIN")
        await slow.execute("SELECT pg_current_xact_id()")  # takes its xid first
        early = make_event(key(5), content="committed early")
        assert (await writer.save(early, encode_event(early))).status is SaveStatus.STORED
        position, rows = await reader.bus_read(position)
        assert rows == []  # held back: an older transaction is still in flight
        await slow.execute(
            "INSERT INTO events (tenant, id, pubkey, created_at, kind, content, sig, raw)"
            " VALUES ('default', $1, $2, $3, 1, $4, $5, $6)",
            bytes.fromhex(late.id),
            bytes.fromhex(late.pubkey),
            late.created_at,
            late.content,
            bytes.fromhex(late.sig),
            encode_event(late),
        )
        await slow.execute("COMMIT")
        position, rows = await reader.bus_read(position)
        assert [raw for _, raw in rows] == [encode_event(late), encode_event(early)]
        assert (await reader.bus_read(position))[1] == []  # and nothing twice
    finally:
        await slow.close()
        await writer.close()
        await reader.close()


async def test_workers_share_live_events(start_relay):
    rp = start_relay(args=("--workers", "2"), env={"ENGRAM_BUS_POLL_SECONDS": "0.5"})
    sk = key(6)
    flt = {"authors": [pubkey_of(sk)]}
    subs = [await Client.connect(rp.url) for _ in range(6)]
    pubs = [await Client.connect(rp.url) for _ in range(4)]
    try:
        for i, s in enumerate(subs):
            _, end = await s.req(f"s{i}", flt)
            assert end[0] == "EOSE"
        events = [ev(sk, content=f"via worker {i}") for i in range(len(pubs))]
        for p, e in zip(pubs, events, strict=True):
            assert (await p.publish(e))[2] is True
        for s in subs:  # whichever process each landed on, every event arrives
            await until_received(s, *(e.id for e in events))
    finally:
        for c in subs + pubs:
            await c.close()


# --- operations across processes ----------------------------------------------------------


def scrape(port: int) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        body = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def worker_of(rp_pid: int, port: int, client: Client) -> int:
    """The pid of the worker process holding this client's connection."""
    import psutil

    local = client.ws.local_address[1]
    for child in psutil.Process(rp_pid).children(recursive=True):
        try:
            conns = child.net_connections(kind="tcp")
        except psutil.Error:
            continue
        for c in conns:
            if c.laddr and c.laddr.port == port and c.raddr and c.raddr.port == local:
                return child.pid
    raise AssertionError("no worker holds this connection")


async def test_metrics_sum_every_worker(start_relay):
    rp = start_relay(args=("--workers", "2"), env={"ENGRAM_BUS_POLL_SECONDS": "0.5"})
    sk = key(7)
    clients: dict[int, list[Client]] = {}
    try:
        for _ in range(1000):  # connect (and stay connected) until both workers hold some
            c = await Client.connect(rp.url)
            clients.setdefault(worker_of(rp.pid, rp.port, c), []).append(c)
            if len(clients) == 2:
                break
        assert len(clients) == 2, "every connection landed on one worker"
        stored = 0
        for i, c in enumerate(c for cs in clients.values() for c in cs):
            for j in range(1 + i % 3):  # a different number on each connection
                assert (await c.publish(ev(sk, content=f"{i}.{j}")))[2] is True
                stored += 1
        open_now = sum(len(v) for v in clients.values())
        for _ in range(6):  # whichever worker answers the scrape, the sums are the relay's
            m = await asyncio.to_thread(scrape, rp.port)
            key_ = frozenset({"tenant": "default", "result": "stored", "reason": ""}.items())
            assert m[("engram_events_total", key_)] == stored
            msgs = frozenset({"tenant": "default", "type": "EVENT"}.items())
            assert m[("engram_messages_total", msgs)] == stored
            assert m[("engram_connections", frozenset({"tenant": "default"}.items()))] == open_now
    finally:
        for cs in clients.values():
            for c in cs:
                await c.close()


async def test_live_tail_delay_is_visible_and_delivery_resumes(notify_only_nodes):
    """A long transaction holds back the snapshot's xmin: the cross-node tail waits (shown
    in /metrics and /readyz), and delivers by itself once the transaction ends. Its end
    sends no NOTIFY and the poll is 600 s here: the held-back tail reads again by itself."""
    import urllib.request

    n1, n2 = notify_only_nodes
    sk = key(8)
    flt = {"authors": [pubkey_of(sk)]}
    delay = ("engram_live_tail_delay_seconds", frozenset())
    long_tx = await asyncpg.connect(n1.database_url)
    try:
        async with await Client.connect(n1.url) as sub, await Client.connect(n2.url) as pub:
            _, end = await sub.req("s", flt)
            assert end[0] == "EOSE"
            tx = long_tx.transaction()
            await tx.start()
            await long_tx.fetchval("SELECT pg_current_xact_id()")  # holds an xid: xmin stays
            held = ev(sk, content="committed behind a long transaction")
            assert (await pub.publish(held))[2] is True
            deadline = time.monotonic() + 60
            while (await asyncio.to_thread(scrape, n1.port)).get(delay, 0) <= 0:
                assert time.monotonic() < deadline, "the tail delay never showed"
                await asyncio.sleep(0.2)
            with urllib.request.urlopen(n1.http_url + "/readyz", timeout=10) as r:
                body = r.read().decode()
            assert r.status == 200 and "live tail: held back" in body, body
            await tx.rollback()  # the long transaction ends...
            await until_received(sub, held.id, timeout=60)  # ...and delivery resumes
            deadline = time.monotonic() + 60
            while (await asyncio.to_thread(scrape, n1.port)).get(delay, 0) != 0:
                assert time.monotonic() < deadline, "the tail delay never went back to 0"
                await asyncio.sleep(0.2)
    finally:
        await long_tx.close()
