"""Read replicas: a real primary and a real streaming replica (`pg_basebackup -R`).

REQs are answered by the replica (its own statistics say so); stopping and starting the
replica under REQ load fails no REQ; with replay paused, read-your-writes still holds (the
primary answers) and the replica leaves the rotation past the lag limit, returning after
`pg_wal_replay_resume()`. No timing assertions: every wait is on a condition.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator

import asyncpg
import pytest
from nostr_client import Client
from relay_fixtures import until

from bench.pgcluster import Cluster
from engram.nip01 import pubkey_of, sign_event

AUX = bytes(32)
SETTINGS = {
    "ENGRAM_REPLICA_CHECK_SECONDS": "0.2",
    "ENGRAM_REPLICA_MAX_LAG_SECONDS": "2",
    "ENGRAM_BUS_POLL_SECONDS": "0.5",
    # The REQs here name one author: the relay's read cache answers them from memory
    # (relay.store.readcache) until it reads the prefix again, after half to all of
    # read_cache_seconds. Those reads are what the replica's statistics show: with the
    # default 60 s a read_from_replica after the cache was filled waited about 30 s.
    "ENGRAM_READ_CACHE_SECONDS": "1",
}


def key(n: int) -> bytes:
    return (0x4E71CA00 + n).to_bytes(32, "big")


def ev(sk: bytes, content: str, kind: int = 1):
    return sign_event(sk, int(time.time()), kind, [], content, AUX)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    c = Cluster()
    try:
        c.add_replica()
        yield c
    finally:
        c.close()


@pytest.fixture
async def dbs(cluster: Cluster) -> AsyncIterator[tuple[str, str]]:
    """(primary URL, replica URL) of a new database, once the replica has it too."""
    name = "r_" + uuid.uuid4().hex[:12]
    conn = await asyncpg.connect(cluster.primary.url())
    try:
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()
    replica = cluster.nodes[1]
    await until(lambda: _exists(replica.url(), name), "the replica has the database")
    yield cluster.primary.url(name), replica.url(name)


async def _exists(url: str, name: str) -> bool:
    conn = await asyncpg.connect(url)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name))
    finally:
        await conn.close()


def replica_state(rp) -> str:
    """The state /metrics reports for the (only) replica."""
    with urllib.request.urlopen(rp.http_url + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found = re.findall(r'engram_replica_state\{replica="[^"]*",state="(\w+)"\} 1\.0', text)
    assert len(found) == 1, text
    return found[0]


def ready(rp) -> bool:
    with urllib.request.urlopen(rp.http_url + "/readyz", timeout=10) as r:
        return r.status == 200


async def replica_reads(replica_url: str) -> int:
    """Scans of `events` on the replica: its own statistics, not the relay's word."""
    conn = await asyncpg.connect(replica_url)
    try:
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        return int(
            await conn.fetchval(
                "SELECT coalesce(sum(coalesce(idx_scan, 0) + coalesce(seq_scan, 0)), 0)"
                " FROM pg_stat_user_tables WHERE relname = 'events'"
            )
        )
    finally:
        await conn.close()


async def read_from_replica(c: Client, replica_url: str, flt: dict, expect: int) -> None:
    """REQs on `c` until the replica's statistics show it answered some."""
    before = await replica_reads(replica_url)

    async def answered() -> bool:
        for _ in range(5):
            got = await c.query(flt)
            assert len(got) == expect
        return await replica_reads(replica_url) > before

    await until(answered, "the replica answers REQs")


async def test_reqs_answered_by_the_replica(start_relay, dbs):
    primary, replica = dbs
    rp = start_relay(database_url=primary, args=("--replica-url", replica), env=SETTINGS)
    await until(lambda: replica_state(rp) == "up", "the replica is up")
    sk = key(1)
    flt = {"authors": [pubkey_of(sk)]}
    async with await Client.connect(rp.url) as c:
        for i in range(3):
            e = ev(sk, f"note {i}")
            assert (await c.publish(e))[2] is True
            got = await c.query(flt)  # read-your-writes, every time
            assert e.id in {x["id"] for x in got}
        await read_from_replica(c, replica, flt, 3)
        await c.send(["COUNT", "n", flt])
        assert (await c.expect("COUNT"))[2]["count"] == 3


async def test_replica_restarts_under_req_load(start_relay, dbs, cluster):
    primary, replica = dbs
    node = cluster.nodes[1]
    rp = start_relay(database_url=primary, args=("--replica-url", replica), env=SETTINGS)
    await until(lambda: replica_state(rp) == "up", "the replica is up")
    sk = key(2)
    flt = {"authors": [pubkey_of(sk)]}
    async with await Client.connect(rp.url) as c:
        stored = [ev(sk, f"before load {i}") for i in range(20)]
        oks = await c.publish_many(stored)
        assert all(ok[2] is True for ok in oks.values())
        await read_from_replica(c, replica, flt, len(stored))

    done = {"reqs": 0}
    failures: list[object] = []
    stop = asyncio.Event()

    async def load(n: int) -> None:
        async with await Client.connect(rp.url) as c:
            while not stop.is_set():
                events, end = await c.req(f"l{n}", flt)
                if end[0] != "EOSE" or len(events) != len(stored):
                    failures.append((end, len(events)))
                await c.send(["CLOSE", f"l{n}"])
                done["reqs"] += 1

    workers = [asyncio.create_task(load(n)) for n in range(4)]
    try:
        await until(lambda: done["reqs"] >= 20 or failures, "REQ load runs")
        await asyncio.to_thread(node.stop, "fast")
        await until(lambda: replica_state(rp) == "down", "the stopped replica leaves")
        assert ready(rp)  # /readyz follows the primary only
        during = done["reqs"]
        await until(lambda: done["reqs"] >= during + 20 or failures, "REQs served while down")
        await asyncio.to_thread(node.start)
        await until(lambda: replica_state(rp) == "up", "the restarted replica returns")
        async with await Client.connect(rp.url) as c:
            await read_from_replica(c, replica, flt, len(stored))
        after = done["reqs"]
        await until(lambda: done["reqs"] >= after + 20 or failures, "REQs after the return")
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        if not node.running():
            await asyncio.to_thread(node.start)
    assert failures == []
    assert all(w.exception() is None for w in workers)


async def test_paused_replay_read_your_writes_and_lag(start_relay, dbs):
    primary, replica = dbs
    rp = start_relay(database_url=primary, args=("--replica-url", replica), env=SETTINGS)
    await until(lambda: replica_state(rp) == "up", "the replica is up")
    sk = key(3)
    flt = {"authors": [pubkey_of(sk)]}
    admin = await asyncpg.connect(replica)
    try:
        async with await Client.connect(rp.url) as c, await Client.connect(rp.url) as other:
            first = ev(sk, "before the pause")
            assert (await c.publish(first))[2] is True
            await read_from_replica(c, replica, flt, 1)
            await admin.execute("SELECT pg_wal_replay_pause()")
            await until(
                lambda: admin.fetchval("SELECT pg_get_wal_replay_pause_state() = 'paused'"),
                "replay is paused",
            )
            for i in range(3):  # the replica cannot have these: the primary answers
                e = ev(sk, f"while paused {i}")
                assert (await c.publish(e))[2] is True
                assert e.id in {x["id"] for x in await c.query(flt)}
                assert e.id in {x["id"] for x in await other.query(flt)}
            await until(lambda: replica_state(rp) == "lagging", "the replica lags out")
            assert ready(rp)
            assert len(await c.query(flt)) == 4  # the primary answers meanwhile
            await admin.execute("SELECT pg_wal_replay_resume()")
            await until(lambda: replica_state(rp) == "up", "the replica returns")
            await read_from_replica(c, replica, flt, 4)
    finally:
        await admin.execute("SELECT pg_wal_replay_resume()")
        await admin.close()


def test_replica_urls_from_env_masked_and_labelled():
    import msgspec

    from cli.commands.ops import masked
    from relay.config import load_settings
    from relay.store.replicas import label

    urls = "postgresql://u:secret1@a:5433/db, postgresql://u:secret2@b/db"
    s = load_settings(env={"ENGRAM_REPLICA_URLS": urls})
    assert s.replica_urls == ["postgresql://u:secret1@a:5433/db", "postgresql://u:secret2@b/db"]
    assert "secret" not in str(masked(msgspec.to_builtins(s)))
    assert [label(u) for u in s.replica_urls] == ["a:5433/db", "b/db"]
    assert load_settings(env={"ENGRAM_REPLICA_URLS": ""}).replica_urls == []


def test_lag_is_the_age_of_the_oldest_wal_not_replayed():
    from relay.config import Settings
    from relay.store.replicas import ReplicaSet

    rs = ReplicaSet([], Settings(), primary=None)  # type: ignore[arg-type]
    assert rs.lag_of(0) == 0.0  # nothing sampled yet
    now = time.monotonic()
    rs._samples.extend([(now - 30, 100), (now - 20, 200), (now - 5, 300)])
    assert rs.lag_of(300) == 0.0 and rs.lag_of(400) == 0.0  # holds all the primary wrote
    assert rs.lag_of(250) >= 5.0 > rs.lag_of(250) - 15  # behind since the 300 sample
    assert rs.lag_of(150) >= 20.0  # behind since the 200 sample
    assert rs.lag_of(100) < rs.lag_of(99)  # an idle primary never makes it look late
