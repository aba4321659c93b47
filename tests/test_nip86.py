"""NIP-86 relay management, authorized by NIP-98, against real relay processes.

Two nodes on one PostgreSQL (shared by the module), two new tenants for each test (a:
admin ADMIN_A; b: members only) and one operator for the whole relay. Calls are made the
way NIP-86 clients (Amethyst, NORMA) make them: POST to the relay's URL with
`Content-Type: application/nostr+json+rpc` and a NIP-98 `Authorization: Nostr <base64>`
event built and signed by nostr-sdk. A change made through one node holds on the other
once it reloaded its configuration; each wait ends on a positive marker (a NIP-11 name
set after the change), never a sleep.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import os
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import asyncpg
import pytest
from cli_support import tenant_cli
from nostr_sdk import EventBuilder, Keys, Kind, Tag, Timestamp
from relay_fixtures import create_database_sync, launch_relay
from test_tenants import connect, ev, http_get, nip11_name, wait_for

from engram.nip01 import pubkey_of

OPERATOR, ADMIN_A, STRANGER, SPAMMER, MEMBER, REPORTER = (
    (0x86A0 + i).to_bytes(32, "big") for i in range(6)
)
RPC = "application/nostr+json+rpc"


def keys(sk: bytes) -> Keys:
    return Keys.parse(sk.hex())


def auth_header(
    sk: bytes,
    url: str,
    body: bytes,
    created_at: int | None = None,
    payload: str | None = None,
    http_method: str = "POST",
) -> str:
    """NIP-98 event for one request, built and signed with nostr-sdk. A token is good for
    one call: the nonce tag keeps two identical calls in one second from being one event."""
    tags = [
        Tag.parse(["u", url]),
        Tag.parse(["method", http_method]),
        Tag.parse(["payload", payload or hashlib.sha256(body).hexdigest()]),
        Tag.parse(["nonce", os.urandom(8).hex()]),
    ]
    builder = EventBuilder(Kind(27235), "").tags(tags)
    if created_at is not None:
        builder = builder.custom_created_at(Timestamp.from_secs(created_at))
    event = builder.finalize(keys(sk))
    return "Nostr " + base64.b64encode(event.as_json().encode()).decode()


def post(
    port: int, host: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, Any], dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("POST", "/", body=body, headers={"Host": host, **headers})
    resp = conn.getresponse()
    data = resp.read()
    return resp.status, json.loads(data) if data else {}, dict(resp.getheaders())


def rpc(
    port: int,
    host: str,
    sk: bytes | None,
    method: str,
    params: list[Any] | None = None,
    **auth: Any,
) -> tuple[int, dict[str, Any]]:
    """One management call as an NIP-86 client makes it: the relay's wss URL as https."""
    body = json.dumps({"method": method, "params": params or []}).encode()
    headers = {"Content-Type": RPC}
    if sk is not None:
        url = auth.pop("url", f"https://{host}/")
        headers["Authorization"] = auth_header(sk, url, body, **auth)
    status, answer, _ = post(port, host, body, headers)
    return status, answer


def call(port: int, host: str, sk: bytes, method: str, *params: Any) -> Any:
    """A call that must succeed; its result."""
    status, answer = rpc(port, host, sk, method, list(params))
    assert status == 200, answer
    assert "error" not in answer or answer["error"] is None, answer
    return answer["result"]


def synced(node: Any, host: str, marker: str, via: Any) -> None:
    """Set the NIP-11 name through `via`, then wait until `node` serves it: `node` has
    loaded every change made before (the configuration is versioned as a whole)."""
    call(via.port, host, OPERATOR, "changerelayname", marker)
    wait_for(lambda: nip11_name(node.port, host) == marker)


ENV = {
    "ENGRAM_TENANT_REFRESH_SECONDS": "0.5",
    "ENGRAM_BUS_POLL_SECONDS": "0.5",
    "ENGRAM_OPERATORS": pubkey_of(OPERATOR),
    # as behind a TLS proxy: the tenants are wss://<host> (the hosts each test adds)
    "ENGRAM_PUBLIC_URLS": "wss://relay.test",
}


@pytest.fixture(scope="module")
def pair(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple]:
    """Two nodes on one database, shared by the module's tests: each test adds tenants of
    its own (`nodes`), so no test sees another's moderation, members or events (every
    list, ban and event is kept per tenant)."""
    tmp = str(tmp_path_factory.mktemp("nip86"))
    first = launch_relay(create_database_sync(pg_server_url), tmp, ENV)
    try:
        second = launch_relay(first.database_url, tmp, ENV)
        try:
            yield first, second
        finally:
            second.stop()
    finally:
        first.stop()


def tenant_setup(db_url: str, *args: str) -> None:
    """`engram tenant ARGS --database-url DB_URL`, the same command run in this process
    (in a thread of its own: the command runs its own event loop), for a fixture's setup;
    the tests' own CLI calls are real processes (`tenant_cli`)."""
    from typer.testing import CliRunner

    from cli.commands.main import app

    def invoke() -> Any:
        return CliRunner().invoke(app, ["tenant", *args, "--database-url", db_url])

    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(invoke).result()
    assert result.exit_code == 0, (args, result.output, result.exception)


@pytest.fixture
def nodes(pair: tuple) -> tuple:
    """(node 1, node 2, host a, host b): two new tenants on the module's two nodes, a (open,
    admin ADMIN_A) and b (members only: SPAMMER), both named "ready" once both nodes
    loaded them."""
    first, second = pair
    db = first.database_url
    tag = uuid.uuid4().hex[:8]
    ta, tb = f"a-{tag}.test", f"b-{tag}.test"
    tenant_setup(db, "add", ta)
    tenant_setup(db, "add", tb, "--write", "members")
    tenant_setup(db, "member", "add", tb, pubkey_of(SPAMMER))
    tenant_setup(db, "admin", "add", ta, pubkey_of(ADMIN_A))
    tenant_setup(db, "set", ta, "--name", "ready")
    tenant_setup(db, "set", tb, "--name", "ready")
    for node in (first, second):
        for host in (ta, tb):
            wait_for(lambda n=node, h=host: nip11_name(n.port, h) == "ready")
    return first, second, ta, tb


async def published(port: int, host: str, *events: Any) -> list[list[Any]]:
    c = await connect(port, host)
    try:
        return [await c.publish(e) for e in events]
    finally:
        await c.close()


async def query(port: int, host: str, flt: dict[str, Any]) -> list[dict[str, Any]]:
    c = await connect(port, host)
    try:
        return await c.query(flt)
    finally:
        await c.close()


def test_refusals_change_nothing(nodes):
    n1, _, ta, tb = nodes
    port, host = n1.port, ta
    target = pubkey_of(STRANGER)
    now = int(time.time())
    cases = {
        "unauthenticated": dict(sk=None),
        "wrong pubkey": dict(sk=STRANGER),
        "admin of another tenant": dict(sk=ADMIN_A, host=tb),
        "wrong u": dict(sk=OPERATOR, url=f"https://{tb}/"),
        "wrong path in u": dict(sk=OPERATOR, url=f"https://{ta}/other"),
        "wrong payload hash": dict(sk=OPERATOR, payload="00" * 32),
        "wrong method tag": dict(sk=OPERATOR, http_method="GET"),
        "stale created_at": dict(sk=OPERATOR, created_at=now - 600),
        "future created_at": dict(sk=OPERATOR, created_at=now + 600),
    }
    for name, case in cases.items():
        sk = case.pop("sk")
        h = case.pop("host", host)
        status, answer = rpc(port, h, sk, "banpubkey", [target, "spam"], **case)
        assert status == 401, (name, status, answer)
        assert answer["result"] is None and answer["error"].startswith("unauthorized"), name
    # the NIP-98 event itself must match the body actually sent
    body = json.dumps({"method": "banpubkey", "params": [target]}).encode()
    signed_for_other = auth_header(OPERATOR, f"https://{ta}/", b'{"method":"supportedmethods"}')
    status, _, headers = post(
        port, host, body, {"Content-Type": RPC, "Authorization": signed_for_other}
    )
    assert status == 401 and headers.get("www-authenticate") == "Nostr"

    def raw(body: bytes, content_type: str = RPC) -> tuple[int, dict[str, Any]]:
        auth = auth_header(OPERATOR, f"https://{host}/", body)
        status, answer, _ = post(
            port, host, body, {"Content-Type": content_type, "Authorization": auth}
        )
        return status, answer

    status, answer = raw(b"{not json")
    assert status == 400 and "not JSON" in answer["error"]
    status, answer = raw(b'{"params": []}')
    assert status == 400 and "method" in answer["error"]
    status, answer = raw(b'{"method": "banpubkey", "params": "x"}')
    assert status == 400 and "params" in answer["error"]
    status, answer = raw(b'{"method": "supportedmethods"}', content_type="application/json")
    assert status == 415 and RPC in answer["error"]
    status, answer = rpc(port, host, OPERATOR, "dropalltables", [])
    assert status == 400 and answer["error"] == "unsupported method: 'dropalltables'"
    for method, params, why in (
        ("banpubkey", [], "missing parameter 1"),
        ("banpubkey", ["zz"], "pubkey"),
        ("banevent", ["12"], "event id"),
        ("allowkind", ["1"], "kind"),
        ("blockip", ["300.1.1.1"], "ip"),
        ("changerelayname", [7], "must be a string"),
    ):
        status, answer = rpc(port, host, OPERATOR, method, params)
        assert status == 400 and why in answer["error"], (method, answer)

    assert call(port, host, OPERATOR, "listbannedpubkeys") == []
    assert call(port, host, ADMIN_A, "listblockedips") == []
    assert call(port, host, OPERATOR, "listallowedkinds") == []
    assert nip11_name(port, host) == "ready"


def test_supported_methods_are_the_ones_that_act(nodes, start_relay):
    n1, _, ta, _ = nodes
    methods = call(n1.port, ta, ADMIN_A, "supportedmethods")
    assert methods[0] == "supportedmethods"
    assert set(methods) == {
        "supportedmethods",
        "banpubkey",
        "unbanpubkey",
        "listbannedpubkeys",
        "allowpubkey",
        "unallowpubkey",
        "listallowedpubkeys",
        "banevent",
        "unbanevent",
        "allowevent",
        "unallowevent",
        "listbannedevents",
        "listallowedevents",
        "listeventsneedingmoderation",
        "allowkind",
        "disallowkind",
        "listallowedkinds",
        "listdisallowedkinds",
        "blockip",
        "unblockip",
        "listblockedips",
        "changerelayname",
        "changerelaydescription",
        "changerelayicon",
    }
    # a relay without tenants: members and NIP-11 fields live in settings, not here
    single = start_relay(env={"ENGRAM_OPERATORS": pubkey_of(OPERATOR)})
    host = f"127.0.0.1:{single.port}"
    url = f"http://{host}/"  # no public URL: the one it listens on
    status, answer = rpc(single.port, host, OPERATOR, "supportedmethods", url=url)
    methods = answer["result"]
    assert "banpubkey" in methods and "changerelayname" not in methods
    assert "allowpubkey" not in methods
    status, answer = rpc(single.port, host, OPERATOR, "changerelayname", ["x"], url=url)
    assert status == 400 and "unsupported method" in answer["error"]
    doc = json.loads(http_get(single.port, host)[1])
    assert 62 in doc["supported_nips"] and 86 in doc["supported_nips"]


async def test_ban_pubkey_through_one_node_holds_on_the_other(nodes):
    n1, n2, ta, tb = nodes
    spam = [ev(SPAMMER, content=f"buy now {i}") for i in range(3)]
    keep = ev(STRANGER, content="a real note")
    for ok in await published(n2.port, ta, *spam, keep):
        assert ok[2] is True, ok
    in_b = ev(SPAMMER, content="a member's note in b")
    assert (await published(n2.port, tb, in_b))[0][2] is True
    spammer = pubkey_of(SPAMMER)

    assert call(n1.port, ta, ADMIN_A, "banpubkey", spammer, "spam") is True
    assert call(n2.port, ta, OPERATOR, "listbannedpubkeys") == [
        {"pubkey": spammer, "reason": "spam"}
    ]
    shown = json.loads(tenant_cli(n1.database_url, "moderation", ta).stdout)
    assert shown["banned_pubkeys"] == [{"pubkey": spammer, "reason": "spam"}]
    # stored events are gone at once, on both nodes (one database)
    for node in (n1, n2):
        got = await query(node.port, ta, {"kinds": [1]})
        assert [e["id"] for e in got] == [keep.id]
    # the applying node refuses at once; the other once it reloaded
    ok = (await published(n1.port, ta, ev(SPAMMER, content="again")))[0]
    assert ok[2] is False and ok[3].startswith("blocked:"), ok
    synced(n2, ta, "after ban", via=n1)
    ok = (await published(n2.port, ta, ev(SPAMMER, content="via the other node")))[0]
    assert ok[2] is False and ok[3].startswith("blocked:"), ok
    assert await query(n2.port, ta, {"authors": [spammer]}) == []
    # another tenant is not affected
    assert [e["id"] for e in await query(n2.port, tb, {"authors": [spammer]})] == [in_b.id]
    assert (await published(n2.port, tb, ev(SPAMMER, content="still fine")))[0][2] is True
    assert call(n2.port, tb, OPERATOR, "listbannedpubkeys") == []

    assert call(n2.port, ta, ADMIN_A, "unbanpubkey", spammer) is True
    assert call(n1.port, ta, OPERATOR, "listbannedpubkeys") == []
    synced(n1, ta, "after unban", via=n2)
    assert (await published(n1.port, ta, ev(SPAMMER, content="reformed")))[0][2] is True


async def test_cli_and_api_share_one_state(nodes):
    n1, n2, ta, tb = nodes
    db = n1.database_url
    stranger = pubkey_of(STRANGER)
    tenant_cli(db, "ban", ta, stranger, "--reason", "from the shell")
    assert call(n2.port, ta, ADMIN_A, "listbannedpubkeys") == [
        {"pubkey": stranger, "reason": "from the shell"}
    ]
    synced(n2, ta, "after cli ban", via=n1)
    ok = (await published(n2.port, ta, ev(STRANGER, content="hi")))[0]
    assert ok[2] is False and ok[3].startswith("blocked:")
    call(n1.port, ta, ADMIN_A, "unbanpubkey", stranger)
    assert json.loads(tenant_cli(db, "moderation", ta).stdout)["banned_pubkeys"] == []
    call(n1.port, tb, OPERATOR, "blockip", "10.9.8.7", "scraper")
    tenant_cli(db, "disallow-kind", tb, "7")
    shown = json.loads(tenant_cli(db, "moderation", tb).stdout)
    assert shown["blocked_ips"] == [{"ip": "10.9.8.7", "reason": "scraper"}]
    assert shown["disallowed_kinds"] == [7]
    tenant_cli(db, "unblock-ip", tb, "10.9.8.7")
    assert call(n2.port, tb, OPERATOR, "listblockedips") == []
    assert tenant_cli(db, "ban", "nowhere.test", stranger, check=False).returncode == 1


async def test_allow_pubkey_makes_a_member(nodes):
    n1, n2, ta, tb = nodes
    member = pubkey_of(MEMBER)
    # on an open tenant everyone may publish: allowing is refused, naming what would make
    # it mean something (the write policy is the operator's own decision), and nothing
    # changes
    status, answer = rpc(n1.port, ta, OPERATOR, "allowpubkey", [member])
    assert status == 400 and "--write members" in answer["error"], answer
    assert call(n1.port, ta, OPERATOR, "listallowedpubkeys") == []
    assert json.loads(tenant_cli(n1.database_url, "show", ta).stdout)["members"] == []
    ok = (await published(n2.port, tb, ev(MEMBER, content="let me in")))[0]
    assert ok[2] is False and ok[3].startswith("auth-required:")
    assert call(n1.port, tb, OPERATOR, "allowpubkey", member, "invited") is True
    assert {"pubkey": member} in call(n1.port, tb, OPERATOR, "listallowedpubkeys")
    assert member in tenant_cli(n1.database_url, "member", "ls", tb).stdout
    synced(n2, tb, "after allow", via=n1)
    assert (await published(n2.port, tb, ev(MEMBER, content="in")))[0][2] is True
    # NIP-86: a ban takes the author off the allow list, allowing lifts the ban
    assert call(n1.port, tb, OPERATOR, "banpubkey", member, "oops") is True
    assert {"pubkey": member} not in call(n1.port, tb, OPERATOR, "listallowedpubkeys")
    assert call(n1.port, tb, OPERATOR, "allowpubkey", member) is True
    assert call(n1.port, tb, OPERATOR, "listbannedpubkeys") == []
    tenant_cli(n1.database_url, "ban", tb, member)
    tenant_cli(n1.database_url, "member", "add", tb, member)  # the CLI's allowpubkey
    assert call(n1.port, tb, OPERATOR, "listbannedpubkeys") == []
    assert {"pubkey": member} in call(n1.port, tb, OPERATOR, "listallowedpubkeys")
    assert call(n1.port, tb, OPERATOR, "unallowpubkey", member) is True
    assert {"pubkey": member} not in call(n2.port, tb, OPERATOR, "listallowedpubkeys")
    synced(n2, tb, "after unallow", via=n1)
    ok = (await published(n2.port, tb, ev(MEMBER, content="out")))[0]
    assert ok[2] is False and ok[3].startswith("auth-required:")
    # the tenant admin of a.test administers a.test only
    status, _ = rpc(n1.port, tb, ADMIN_A, "allowpubkey", [member])
    assert status == 401


async def test_ban_event_and_the_reports_queue(nodes):
    n1, n2, ta, tb = nodes
    bad, fine, elsewhere = (ev(STRANGER, content=c) for c in ("bad", "fine", "in b"))
    reports = [
        ev(REPORTER, 1984, [("e", bad.id, "illegal"), ("p", bad.pubkey)]),
        ev(REPORTER, 1984, [("e", fine.id, "spam")]),
    ]
    for ok in await published(n1.port, ta, bad, fine, *reports):
        assert ok[2] is True, ok
    tenant_cli(n1.database_url, "member", "add", tb, pubkey_of(STRANGER))
    tenant_cli(n1.database_url, "member", "add", tb, pubkey_of(REPORTER))
    synced(n2, tb, "members in", via=n1)
    in_b = [elsewhere, ev(REPORTER, 1984, [("e", elsewhere.id, "spam")])]
    for ok in await published(n2.port, tb, *in_b):
        assert ok[2] is True, ok

    queue = call(n2.port, ta, ADMIN_A, "listeventsneedingmoderation")
    assert sorted(queue, key=lambda x: x["id"]) == sorted(
        [{"id": bad.id, "reason": "illegal"}, {"id": fine.id, "reason": "spam"}],
        key=lambda x: x["id"],
    )
    assert call(n2.port, tb, OPERATOR, "listeventsneedingmoderation") == [
        {"id": elsewhere.id, "reason": "spam"}
    ]

    assert call(n1.port, ta, ADMIN_A, "banevent", bad.id, "illegal content") is True
    assert call(n1.port, ta, ADMIN_A, "allowevent", fine.id, "not spam") is True
    assert call(n2.port, ta, ADMIN_A, "listbannedevents") == [
        {"id": bad.id, "reason": "illegal content"}
    ]
    assert call(n2.port, ta, ADMIN_A, "listeventsneedingmoderation") == []
    for node in (n1, n2):
        assert await query(node.port, ta, {"ids": [bad.id]}) == []
        assert len(await query(node.port, ta, {"ids": [fine.id]})) == 1
    synced(n2, ta, "after banevent", via=n1)
    for node in (n1, n2):
        ok = (await published(node.port, ta, bad))[0]
        assert ok[2] is False and ok[3].startswith("blocked:"), ok
    # b.test keeps its own copy of the world
    assert len(await query(n1.port, tb, {"ids": [elsewhere.id]})) == 1
    assert call(n2.port, ta, ADMIN_A, "listallowedevents") == [
        {"id": fine.id, "reason": "not spam"}
    ]
    # unallowevent: the still-reported event is back on the queue
    assert call(n1.port, ta, ADMIN_A, "unallowevent", fine.id) is True
    assert call(n1.port, ta, ADMIN_A, "listallowedevents") == []
    assert call(n1.port, ta, ADMIN_A, "listeventsneedingmoderation") == [
        {"id": fine.id, "reason": "spam"}
    ]
    # unbanevent: the id may be sent again (what was deleted stays deleted)
    assert call(n1.port, ta, ADMIN_A, "unbanevent", bad.id) is True
    assert call(n2.port, ta, ADMIN_A, "listbannedevents") == []
    synced(n2, ta, "after unbanevent", via=n1)
    assert (await published(n2.port, ta, bad))[0][2] is True
    tenant_cli(n1.database_url, "ban-event", ta, bad.id)
    tenant_cli(n1.database_url, "unban-event", ta, bad.id)
    assert call(n2.port, ta, ADMIN_A, "listbannedevents") == []


async def test_kinds(nodes):
    n1, n2, ta, tb = nodes
    assert call(n1.port, ta, ADMIN_A, "disallowkind", 7) is True
    synced(n2, ta, "no reactions", via=n1)
    ok = (await published(n2.port, ta, ev(STRANGER, 7, content="+")))[0]
    assert ok[2] is False and ok[3] == "blocked: kind 7 is not allowed on this relay"
    assert (await published(n2.port, ta, ev(STRANGER, 30023, [("d", "x")])))[0][2] is True
    assert call(n1.port, ta, ADMIN_A, "allowkind", 1) is True
    assert call(n1.port, ta, ADMIN_A, "allowkind", 0) is True
    assert call(n2.port, ta, ADMIN_A, "listallowedkinds") == [0, 1]
    synced(n2, ta, "notes only", via=n1)
    assert (await published(n2.port, ta, ev(STRANGER, content="note")))[0][2] is True
    ok = (await published(n2.port, ta, ev(STRANGER, 30023, [("d", "y")])))[0]
    assert ok[2] is False and ok[3].startswith("blocked:")
    assert (await published(n2.port, tb, ev(SPAMMER, 7, content="+")))[0][2] is True
    assert call(n1.port, ta, ADMIN_A, "disallowkind", 1) is True
    assert call(n1.port, ta, ADMIN_A, "listallowedkinds") == [0]
    assert call(n1.port, ta, ADMIN_A, "listdisallowedkinds") == [1, 7]


async def test_blocked_ip_cannot_connect(nodes):
    n1, n2, ta, tb = nodes
    already = await connect(n2.port, ta)  # connected before the block
    assert call(n1.port, ta, ADMIN_A, "blockip", "127.0.0.1", "abuse") is True
    assert call(n2.port, ta, ADMIN_A, "listblockedips") == [{"ip": "127.0.0.1", "reason": "abuse"}]
    synced(n2, ta, "blocked", via=n1)
    try:  # what it sends now is refused
        await already.send(["EVENT", ev(STRANGER, content="still here?")])
        assert (await already.expect("NOTICE"))[1] == "blocked: your address is blocked here"
    finally:
        await already.close()
    for node in (n1, n2):
        with pytest.raises(Exception) as refused:
            await connect(node.port, ta)
        assert "403" in str(refused.value)
    c = await connect(n2.port, tb)  # another tenant: not blocked
    await c.close()
    assert call(n1.port, ta, ADMIN_A, "unblockip", "127.0.0.1") is True
    synced(n2, ta, "unblocked", via=n1)
    c = await connect(n2.port, ta)
    await c.close()


def test_relay_information_follows(nodes):
    n1, n2, ta, tb = nodes
    call(n1.port, ta, ADMIN_A, "changerelaydescription", "A calm place")
    call(n1.port, ta, ADMIN_A, "changerelayicon", f"https://{ta}/icon.png")
    call(n1.port, ta, ADMIN_A, "changerelayname", "Alpha")
    for node in (n1, n2):
        wait_for(lambda n=node: nip11_name(n.port, ta) == "Alpha")
        doc = json.loads(http_get(node.port, ta)[1])
        assert doc["description"] == "A calm place"
        assert doc["icon"] == f"https://{ta}/icon.png"
    shown = json.loads(tenant_cli(n1.database_url, "show", ta).stdout)
    assert shown["name"] == "Alpha" and shown["admins"] == [pubkey_of(ADMIN_A)]
    assert nip11_name(n2.port, tb) == "ready"


def test_cors_preflight_allows_management_calls(nodes):
    n1, _, ta, _ = nodes
    conn = http.client.HTTPConnection("127.0.0.1", n1.port, timeout=10)
    conn.request(
        "OPTIONS",
        "/",
        headers={
            "Host": ta,
            "Origin": "https://norma.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type",
        },
    )
    resp = conn.getresponse()
    resp.read()
    assert resp.status == 204
    assert "POST" in resp.getheader("access-control-allow-methods", "")
    assert "Authorization" in resp.getheader("access-control-allow-headers", "")


async def test_a_nostr_sdk_client_needs_no_adjustment(nodes):
    """Amethyst and NORMA turn wss://host into https://host/ for `u`; both forms, with
    the default port or without a trailing slash, are the tenant's own URL. Another
    scheme or port is another relay (the relay's public URL is wss://, port 443)."""
    n1, _, ta, _ = nodes
    for url in (f"https://{ta}/", f"https://{ta}", f"wss://{ta}", f"https://{ta}:443/"):
        status, answer = rpc(n1.port, ta, ADMIN_A, "supportedmethods", url=url)
        assert status == 200, (url, answer)
    for url in (f"http://{ta}:{n1.port}/", f"http://{ta}/", f"https://{ta}:8443/"):
        status, answer = rpc(n1.port, ta, ADMIN_A, "supportedmethods", url=url)
        assert status == 401 and "u tag" in answer["error"], (url, answer)
    await asyncio.sleep(0)


async def test_a_tenant_on_its_own_database(start_relay, pg_server_url):
    """Moderation lists stay in the relay's database; the events acted on are in the
    tenant's own one (ban, banevent, reports, and the CLI the same way)."""
    from relay_fixtures import create_database

    own = await create_database(pg_server_url)
    rp = start_relay(
        env={
            "ENGRAM_TENANT_REFRESH_SECONDS": "0.5",
            "ENGRAM_OPERATORS": pubkey_of(OPERATOR),
            "ENGRAM_PUBLIC_URLS": "wss://relay.test",
        }
    )
    tenant_cli(rp.database_url, "add", "c.test", "--tenant-database-url", own, "--name", "C")
    wait_for(lambda: nip11_name(rp.port, "c.test") == "C")
    spam, note = ev(SPAMMER, content="spam"), ev(STRANGER, content="note")
    report = ev(REPORTER, 1984, [("e", note.id, "nudity")])
    for ok in await published(rp.port, "c.test", spam, note, report):
        assert ok[2] is True, ok
    assert call(rp.port, "c.test", OPERATOR, "listeventsneedingmoderation") == [
        {"id": note.id, "reason": "nudity"}
    ]
    call(rp.port, "c.test", OPERATOR, "banpubkey", pubkey_of(SPAMMER))
    call(rp.port, "c.test", OPERATOR, "banevent", note.id)
    assert await query(rp.port, "c.test", {"kinds": [1]}) == []
    ok = (await published(rp.port, "c.test", spam))[0]
    assert ok[2] is False and ok[3].startswith("blocked:")
    other = ev(STRANGER, content="another")
    assert (await published(rp.port, "c.test", other))[0][2] is True
    out = tenant_cli(rp.database_url, "ban", "c.test", pubkey_of(STRANGER)).stdout
    assert "(1 events deleted)" in out
    assert await query(rp.port, "c.test", {"kinds": [1]}) == []
    # removing the tenant removes its moderation
    tenant_cli(rp.database_url, "rm", "c.test", "--purge")
    conn = await asyncpg.connect(rp.database_url)
    try:
        for table in ("banned_pubkeys", "moderated_events"):
            assert await conn.fetchval(f"SELECT count(*) FROM {table}") == 0
    finally:
        await conn.close()


async def test_a_node_that_stored_before_it_knew_sweeps_at_its_reload(start_relay):
    """`slow` polls its configuration only every 600 s, so it accepts a banned author's
    event after the ban (deterministically: it has not reloaded). Its next reload (here
    brought on by a call it takes itself) deletes what it let in."""
    env = {"ENGRAM_OPERATORS": pubkey_of(OPERATOR), "ENGRAM_PUBLIC_URLS": "wss://relay.test"}
    fast = start_relay(env={**env, "ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    tenant_cli(fast.database_url, "add", "a.test", "--name", "A")
    slow = start_relay(
        database_url=fast.database_url, env={**env, "ENGRAM_TENANT_REFRESH_SECONDS": "600"}
    )
    wait_for(lambda: nip11_name(fast.port, "a.test") == "A")
    call(fast.port, "a.test", OPERATOR, "banpubkey", pubkey_of(SPAMMER))
    late = ev(SPAMMER, content="slipped in")
    bad = ev(STRANGER, content="banned by id later")
    call(fast.port, "a.test", OPERATOR, "banevent", bad.id)
    for ok in await published(slow.port, "a.test", late, bad):
        assert ok[2] is True, ok  # `slow` has not loaded the bans
    assert len(await query(fast.port, "a.test", {"ids": [late.id, bad.id]})) == 2
    call(slow.port, "a.test", OPERATOR, "changerelaydescription", "reloaded")
    assert await query(fast.port, "a.test", {"ids": [late.id, bad.id]}) == []
    ok = (await published(slow.port, "a.test", ev(SPAMMER, content="again")))[0]
    assert ok[2] is False and ok[3].startswith("blocked:")


def test_operators_are_checked_at_start() -> None:
    from relay.config import ConfigError, load_settings

    npub_and_hex = f"{pubkey_of(OPERATOR)}, {pubkey_of(ADMIN_A)}"
    assert len(load_settings(env={"ENGRAM_OPERATORS": npub_and_hex}).operators) == 2
    with pytest.raises(ConfigError, match="operators"):
        load_settings(env={"ENGRAM_OPERATORS": "not-a-key"})


def test_an_oversized_body_is_refused_unread(nodes):
    n1, _, ta, _ = nodes
    body = b'{"method": "supportedmethods", "params": ["' + b"x" * 200_000 + b'"]}'
    status, answer, _ = post(n1.port, ta, body, {"Content-Type": RPC})
    assert status == 413 and "larger than" in answer["error"]
