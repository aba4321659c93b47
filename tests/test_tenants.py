"""Multi-tenancy end to end: one relay process, one PostgreSQL, tenants by Host header."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import time

import pytest
from cli_support import tenant_cli
from nostr_client import Client

from engram.nip01 import pubkey_of, sign_event
from engram.nip19 import npub
from engram.nipoa import sign_attestation

AUX = bytes(32)
MEMBER, OWNER, AGENT, STRANGER, OUTSIDER = ((0xA11CE000 + i).to_bytes(32, "big") for i in range(5))


def ev(sk: bytes, kind: int = 1, tags=(), content: str = "", created_at: int | None = None):
    ts = int(time.time()) if created_at is None else created_at
    return sign_event(sk, ts, kind, [list(t) for t in tags], content, AUX)


async def connect(port: int, host: str) -> Client:
    """A client whose Host header is `host`, on 127.0.0.1 (no DNS involved)."""
    sock = socket.create_connection(("127.0.0.1", port))
    return await Client.connect(f"ws://{host}:{port}", sock=sock)


def http_get(port: int, host: str, nip11: bool = True) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    headers = {"Host": host}
    if nip11:
        headers["Accept"] = "application/nostr+json"
    conn.request("GET", "/", headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read().decode()


def nip11_name(port: int, host: str) -> str | None:
    """The tenant's NIP-11 name; None while the relay does not serve `host` yet (a tenant
    added a moment ago: the relay loads it at its next poll)."""
    status, body = http_get(port, host)
    return str(json.loads(body)["name"]) if status == 200 else None


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.2)


@pytest.fixture
def tenanted(start_relay):
    """A running relay, then tenants added through the CLI while it runs."""
    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    db = rp.database_url
    tenant_cli(db, "add", "a.test", "--limit", "max_limit=7")
    tenant_cli(db, "add", "B.test:8080", "--alias", "b2.test", "--write", "members")
    tenant_cli(db, "member", "add", "b.test", npub(pubkey_of(MEMBER)))
    tenant_cli(db, "member", "add", "b.test", pubkey_of(OWNER))
    tenant_cli(db, "set", "a.test", "--name", "Alpha")  # last: its reload carries it all
    wait_for(lambda: nip11_name(rp.port, "a.test") == "Alpha")
    return rp


def test_cli_round_trip_and_live_reload(tenanted):
    rp, db = tenanted, tenanted.database_url
    listing = tenant_cli(db, "ls").stdout.splitlines()
    assert listing[0].startswith("a.test\topen\t0 members")
    assert listing[1] == "b.test\tmembers\t2 members\tb2.test"
    shown = json.loads(tenant_cli(db, "show", "b.test").stdout)
    assert shown["aliases"] == ["b2.test"] and pubkey_of(MEMBER) in shown["members"]
    assert tenant_cli(db, "add", "b2.test", check=False).returncode == 1  # alias taken

    status, body = http_get(rp.port, "a.test:1234")  # the port is stripped
    doc = json.loads(body)
    assert status == 200 and doc["limitation"]["max_limit"] == 7
    assert doc["limitation"]["restricted_writes"] is False
    doc_b = json.loads(http_get(rp.port, "b2.test")[1])
    assert doc_b["name"] == "b.test" and doc_b["limitation"]["restricted_writes"] is True
    status, body = http_get(rp.port, "unknown.test")
    assert status == 404 and "unknown" not in body

    tenant_cli(db, "set", "a.test", "--name", "Alpha Two", "--auth-required")
    wait_for(lambda: json.loads(http_get(rp.port, "a.test")[1])["name"] == "Alpha Two")
    assert json.loads(http_get(rp.port, "a.test")[1])["limitation"]["auth_required"] is True
    tenant_cli(db, "member", "rm", "b.test", pubkey_of(OWNER))
    assert pubkey_of(OWNER) not in tenant_cli(db, "member", "ls", "b.test").stdout


async def test_unknown_host_websocket_is_refused(tenanted):
    with pytest.raises(Exception) as exc:
        await connect(tenanted.port, "unknown.test")
    assert "404" in str(exc.value)


async def test_tenants_are_isolated(tenanted):
    port = tenanted.port
    shared = ev(MEMBER, content="one event, two tenants")
    a, b = await connect(port, "a.test"), await connect(port, "b.test")
    live_b = await connect(port, "b2.test")
    try:
        _, end = await live_b.req("live", {"kinds": [1, 0]})
        assert end[0] == "EOSE"
        assert await a.publish(shared) == ["OK", shared.id, True, ""]
        assert await b.publish(shared) == ["OK", shared.id, True, ""]  # not a duplicate
        assert (await live_b.recv())[2]["id"] == shared.id  # B's own copy, live

        now = int(time.time())
        meta_b = ev(MEMBER, 0, content='{"name":"b"}', created_at=now - 10)
        meta_a = ev(MEMBER, 0, content='{"name":"a"}', created_at=now)
        assert (await b.publish(meta_b))[2] is True
        assert (await live_b.recv())[2]["id"] == meta_b.id
        assert (await a.publish(meta_a))[2] is True  # newer, but in A: B keeps its own
        only_a = ev(MEMBER, content="only in A")
        assert (await a.publish(only_a))[2] is True

        flt = {"authors": [pubkey_of(MEMBER)]}
        assert {e["id"] for e in await a.query(flt)} == {shared.id, meta_a.id, only_a.id}
        assert {e["id"] for e in await b.query(flt)} == {shared.id, meta_b.id}
        probe = ev(OWNER, content="probe in B")  # B's live subscriber saw nothing of A:
        assert (await b.publish(probe))[2] is True  # the probe, published after, comes first
        assert await live_b.until_probe(probe.id) == []

        await a.send(["COUNT", "n", flt])
        assert (await a.expect("COUNT"))[2] == {"count": 3}
        await b.send(["COUNT", "n", flt])
        assert (await b.expect("COUNT"))[2] == {"count": 2}
        # deleting on A (by id and by address) leaves B's copies alone
        deletion = ev(MEMBER, 5, [("e", shared.id), ("a", f"0:{pubkey_of(MEMBER)}:")])
        assert (await a.publish(deletion))[2] is True
        assert {e["id"] for e in await a.query(flt)} == {only_a.id, deletion.id}
        assert {e["id"] for e in await b.query(flt)} == {shared.id, meta_b.id}
        assert (await b.publish(shared))[3].startswith("duplicate:")  # not blocked on B

        # an AUTH made for A is refused on B
        auth_a = sign_event(
            MEMBER,
            now,
            22242,
            [["relay", f"ws://a.test:{port}"], ["challenge", await b.get_challenge()]],
            "",
            AUX,
        )
        await b.send(["AUTH", auth_a])
        ok = await b.expect("OK")
        assert ok[2] is False and "relay" in ok[3]
        assert (await b.auth(MEMBER, f"ws://b.test:{port}/", now))[2] is True
    finally:
        for c in (a, b, live_b):
            await c.close()


async def test_members_policy_and_agent_admission(tenanted):
    port = tenanted.port
    now = int(time.time())
    url = f"ws://b.test:{port}"

    async def auth_with(sk: bytes, extra_tags: list[list[str]]) -> tuple[Client, list]:
        c = await connect(port, "b.test")
        tags = [["relay", url], ["challenge", await c.get_challenge()], *extra_tags]
        e = sign_event(sk, now, 22242, tags, "", AUX)
        await c.send(["AUTH", e])
        return c, await c.expect("OK")

    c = await connect(port, "b.test")
    try:
        ok = await c.publish(ev(STRANGER, content="let me in"))
        assert ok[2] is False and ok[3].startswith("auth-required:")
        assert (await c.auth(STRANGER, url, now))[2] is True
        ok = await c.publish(ev(STRANGER, content="let me in"))
        assert ok[2] is False and ok[3].startswith("restricted:")
        assert (await c.publish(ev(MEMBER, content="member")))[2] is True
    finally:
        await c.close()

    agent = pubkey_of(AGENT)
    good = sign_attestation(OWNER, agent, f"kind=1&created_at<{now + 3600}", AUX)
    c, ok = await auth_with(AGENT, [good])
    try:
        assert ok[2] is True, ok
        assert (await c.publish(ev(AGENT, content="admitted agent")))[2] is True
        ok = await c.publish(ev(AGENT, kind=7, content="+"))
        assert ok[2] is False and ok[3].startswith("restricted:") and "kind 7" in ok[3]
    finally:
        await c.close()

    forged = [*good[:3], sign_attestation(OUTSIDER, agent, good[2], AUX)[3]]
    expired = sign_attestation(OWNER, agent, f"created_at<{now - 60}", AUX)
    non_member = sign_attestation(OUTSIDER, agent, "", AUX)
    for tag, prefix in (
        (forged, "invalid:"),
        (expired, "restricted:"),
        (non_member, "restricted:"),
    ):
        c, ok = await auth_with(AGENT, [tag])
        try:
            assert ok[2] is False and ok[3].startswith(prefix), ok
            refused = await c.publish(ev(AGENT, content="not admitted"))
            assert refused[2] is False
        finally:
            await c.close()

    # the tenant without a members policy takes anyone
    a = await connect(port, "a.test")
    try:
        assert (await a.publish(ev(STRANGER, content="open door")))[2] is True
    finally:
        await a.close()


def test_rm_refuses_while_events_remain(tenanted):
    db = tenanted.database_url

    async def publish() -> None:
        c = await connect(tenanted.port, "a.test")
        try:
            assert (await c.publish(ev(STRANGER, content="keep me")))[2] is True
        finally:
            await c.close()

    asyncio.run(publish())
    proc = tenant_cli(db, "rm", "a.test", check=False)
    assert proc.returncode == 1 and "holds 1 events" in proc.stderr
    assert "1 events deleted" in tenant_cli(db, "rm", "a.test", "--purge").stdout
    wait_for(lambda: http_get(tenanted.port, "a.test")[0] == 404)
    assert http_get(tenanted.port, "b.test")[0] == 200


async def test_every_change_names_its_database_and_a_database_no_relay_serves_warns(
    tenanted, database_url: str
):
    """`engram tenant add HOST --database-url URL` (the spelling a new user reaches for)
    writes the tenant into URL, the relay's own database on this command: loud now."""
    served = await asyncio.to_thread(
        tenant_cli, tenanted.database_url, "set", "a.test", "--name", "Alpha Three"
    )
    assert "updated tenant a.test (written to the relay database " in served.stdout
    assert tenanted.database_url.rpartition("/")[2] in served.stdout
    assert "warning" not in served.stderr  # a relay runs on it
    mistaken = await asyncio.to_thread(tenant_cli, database_url, "add", "c.test")  # no relay
    assert "added tenant c.test (written to the relay database " in mistaken.stdout
    assert database_url.rpartition("/")[2] in mistaken.stdout
    assert "warning: no relay is connected to" in mistaken.stderr
    assert "--tenant-database-url" in mistaken.stderr
    for args in (("member", "add", "c.test", pubkey_of(MEMBER)), ("rm", "c.test")):
        again = await asyncio.to_thread(tenant_cli, database_url, *args)
        assert "written to the relay database" in again.stdout
        assert "no relay is connected" in again.stderr
