"""Tenants on their own databases, served by two relay nodes sharing the relay database.

Isolation (REQ, COUNT, deletion, live events), live delivery across nodes for both
tenants, and `engram tenant move` under running writers with nothing lost. Every wait is
on a condition with a generous bound; nothing is timed.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time

import asyncpg
import pytest
from nostr_client import Client
from relay_fixtures import create_database, until

from engram.nip01 import pubkey_of, sign_event

AUX = bytes(32)
WAIT = 120.0
ENV = {"ENGRAM_TENANT_REFRESH_SECONDS": "0.5", "ENGRAM_BUS_POLL_SECONDS": "0.5"}


def key(n: int) -> bytes:
    return (0x7E4A4700 + n).to_bytes(32, "big")


def ev(sk: bytes, content: str = "", kind: int = 1, tags=()):
    return sign_event(sk, int(time.time()), kind, [list(t) for t in tags], content, AUX)


def cli(control: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [sys.executable, "-m", "cli.commands.main", "tenant", *args, "--database-url", control],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    return proc


async def connect(port: int, host: str) -> Client:
    sock = socket.create_connection(("127.0.0.1", port))
    return await Client.connect(f"ws://{host}:{port}", sock=sock)


def serves(port: int, host: str) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/", headers={"Host": host, "Accept": "application/nostr+json"})
    resp = conn.getresponse()
    body = resp.read().decode()
    return resp.status == 200 and json.loads(body).get("name") == host


async def received(c: Client, event_id: str, timeout: float = WAIT) -> list[str]:
    """Ids of live events on `c` up to and including `event_id`."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while True:
        msg = await c.recv(timeout=max(0.1, deadline - time.monotonic()))
        if msg[0] == "EVENT":
            seen.append(msg[2]["id"])
            if msg[2]["id"] == event_id:
                return seen


async def rows(url: str, sql: str, *args: object) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(sql, *args))
    finally:
        await conn.close()


async def count(c: Client, flt: dict) -> int:
    await c.send(["COUNT", "n", flt])
    return int((await c.expect("COUNT"))[2]["count"])


@pytest.fixture
async def placed(start_relay, pg_server_url):
    """Two nodes; a.test on database A, b.test on database B (the relay's holds config)."""
    control = await create_database(pg_server_url)
    a_db, b_db = await create_database(pg_server_url), await create_database(pg_server_url)
    n1 = start_relay(database_url=control, env=ENV)
    n2 = start_relay(database_url=control, env=ENV)
    await asyncio.to_thread(cli, control, "add", "a.test", "--tenant-database-url", a_db)
    await asyncio.to_thread(cli, control, "add", "b.test", "--tenant-database-url", b_db)
    for node in (n1, n2):
        for host in ("a.test", "b.test"):
            await until(lambda n=node, h=host: serves(n.port, h), f"{host} is served")
    return n1, n2, control, a_db, b_db, pg_server_url


async def test_isolation_and_live_delivery_across_nodes(placed):
    n1, n2, control, a_db, b_db, _ = placed
    sk = key(1)
    flt = {"authors": [pubkey_of(sk)]}
    async with (
        await connect(n1.port, "a.test") as a1,
        await connect(n1.port, "b.test") as b1,
        await connect(n2.port, "a.test") as a2,
        await connect(n2.port, "b.test") as b2,
    ):
        assert (await a2.req("live", flt))[1][0] == "EOSE"
        assert (await b2.req("live", flt))[1][0] == "EOSE"
        ea = ev(sk, "for a")
        assert (await a1.publish(ea))[2] is True
        assert await received(a2, ea.id) == [ea.id]  # across nodes, on A's bus
        eb = ev(sk, "for b")
        assert (await b1.publish(eb))[2] is True
        assert await received(b2, eb.id) == [eb.id]  # and never a's event first
        # REQ and COUNT see only their own tenant, on either node
        for a, b in ((a1, b1), (a2, b2)):
            assert [e["id"] for e in await a.query(flt)] == [ea.id]
            assert [e["id"] for e in await b.query(flt)] == [eb.id]
            assert await count(a, flt) == 1 and await count(b, flt) == 1
        # each tenant's rows on its own database; none in the relay's
        assert {r[0] for r in await rows(a_db, "SELECT tenant FROM events")} == {"a.test"}
        assert {r[0] for r in await rows(b_db, "SELECT tenant FROM events")} == {"b.test"}
        assert await rows(control, "SELECT 1 FROM events") == []
        # a deletion in a.test naming both events deletes only a.test's
        delete = ev(sk, kind=5, tags=[("e", ea.id), ("e", eb.id)])
        assert (await a1.publish(delete))[2] is True
        assert await received(a2, delete.id) == [delete.id]
        assert [e["id"] for e in await a2.query({**flt, "kinds": [1]})] == []
        assert [e["id"] for e in await b2.query(flt)] == [eb.id]
        # ephemeral events stay in their tenant too
        eph = ev(sk, "ephemeral b", kind=20001)
        assert (await b1.publish(eph))[2] is True
        assert await received(b2, eph.id) == [eph.id]
        last_a = ev(sk, "a again")
        assert (await a1.publish(last_a))[2] is True
        assert await received(a2, last_a.id) == [last_a.id]


async def test_move_under_running_writers_loses_nothing(placed):
    n1, n2, control, _a_db, b_db, server = placed
    c_db = await create_database(server)
    sk = key(2)
    flt = {"authors": [pubkey_of(sk)]}
    accepted: list[str] = []
    failures: list[object] = []
    stop = asyncio.Event()

    async def writer(port: int, tag: str) -> None:
        async with await connect(port, "a.test") as c:
            i = 0
            while not stop.is_set():
                e = ev(sk, f"{tag} {i}")
                ok = await c.publish(e)
                if ok[2] is True:
                    accepted.append(e.id)
                else:
                    failures.append(ok)
                i += 1

    async with await connect(n1.port, "b.test") as b:
        eb = ev(sk, "b stays")
        assert (await b.publish(eb))[2] is True
    writers = [asyncio.create_task(writer(n.port, f"via {n.port}")) for n in (n1, n2)]
    try:
        await until(lambda: len(accepted) >= 50 or failures, "the writers run")
        # the grace period covers both nodes noticing the switch (a 0.5 s refresh, then
        # opening the new database) while their writers are busy on a loaded machine
        moved = await asyncio.to_thread(
            cli, control, "move", "a.test", "--to", c_db, "--grace", "15"
        )
        assert "moved a.test: copied" in moved.stdout, moved.stdout
        switched = len(accepted)
        await until(lambda: len(accepted) >= switched + 50 or failures, "writes after the move")
    finally:
        stop.set()
        await asyncio.gather(*writers, return_exceptions=True)
    assert failures == []
    assert all(w.exception() is None for w in writers)
    want = set(accepted)
    on_c = {bytes(r[0]).hex() for r in await rows(c_db, "SELECT id FROM events")}
    assert want <= on_c  # every accepted write reached the new database
    assert {r[0] for r in await rows(c_db, "SELECT DISTINCT tenant FROM events")} == {"a.test"}
    assert {r[0] for r in await rows(b_db, "SELECT DISTINCT tenant FROM events")} == {"b.test"}
    for node in (n1, n2):
        async with await connect(node.port, "a.test") as a:
            got: set[str] = set()
            ids = sorted(want)
            for i in range(0, len(ids), 100):  # default_limit: 100 per filter
                got |= {e["id"] for e in await a.query({"ids": ids[i : i + 100]})}
            assert got == want
            assert await count(a, flt) == len(want)
        async with await connect(node.port, "b.test") as b:
            assert [e["id"] for e in await b.query(flt)] == [eb.id]
    # live delivery across nodes on the new database
    async with await connect(n2.port, "a.test") as sub, await connect(n1.port, "a.test") as pub:
        assert (await sub.req("live", {**flt, "limit": 0}))[1][0] == "EOSE"
        e = ev(sk, "after the move, live")
        assert (await pub.publish(e))[2] is True
        # n2's tail of the new database may still be working through the rows the move
        # copied (a loaded machine): those arrive first; nothing but this tenant's events
        seen = await received(sub, e.id)
        assert seen[-1] == e.id and set(seen[:-1]) <= want


async def test_cli_export_import_prune_rm_use_the_tenant_database(pg_server_url, tmp_path):
    control = await create_database(pg_server_url)
    a_db = await create_database(pg_server_url)
    await asyncio.to_thread(cli, control, "add", "a.test", "--tenant-database-url", a_db)
    sk = key(3)
    old = sign_event(sk, int(time.time()) - 10 * 86400, 1, [], "old", AUX)
    new = ev(sk, "new")
    src = tmp_path / "in.jsonl"
    src.write_bytes(b"".join(msgspec_json(e) + b"\n" for e in (old, new)))

    def engram(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "cli.commands.main", *args, "--database-url", control],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    assert "imported 2" in await asyncio.to_thread(engram, "import", str(src), "--tenant", "a.test")
    stored = {bytes(r[0]).hex() for r in await rows(a_db, "SELECT id FROM events")}
    assert stored == {old.id, new.id}
    assert await rows(control, "SELECT 1 FROM events") == []
    out = await asyncio.to_thread(engram, "export", "--tenant", "a.test")
    assert {json.loads(line)["id"] for line in out.splitlines()} == {old.id, new.id}
    pruned = await asyncio.to_thread(engram, "prune", "--older-than", "5d", "--tenant", "a.test")
    assert pruned.startswith("deleted 1 events")
    assert {bytes(r[0]).hex() for r in await rows(a_db, "SELECT id FROM events")} == {new.id}
    removed = await asyncio.to_thread(cli, control, "rm", "a.test", "--purge")
    assert "1 events deleted" in removed.stdout
    assert await rows(a_db, "SELECT 1 FROM events") == []


def msgspec_json(event) -> bytes:
    import msgspec

    return msgspec.json.encode(event)
