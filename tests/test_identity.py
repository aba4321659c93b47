"""The relay knows who it is (issue 37): NIP-42 AUTH, NIP-62 and NIP-98 are taken only
for the relay's configured public URLs, or (none configured) the URL it listens on,
never because the client's Host header named another. The attacks run as an attacker
would run them, over real websockets and HTTP against real relay processes; each has a
positive twin that must still work.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.client
import json
import os
import socket
import subprocess
import sys
import time
from typing import Any

import pytest
from cli_support import tenant_cli
from nostr_client import Client
from relay_fixtures import RelayProcess, create_database_sync, launch_relay, until

from engram.nip01 import Event, pubkey_of, sign_event

AUX = bytes(32)
OPERATOR, VICTIM, FRIEND, LEAVER, STRANGER, READER = (
    (0x1D00 + i).to_bytes(32, "big") for i in range(6)
)
PUBLIC = "wss://relay.example.com"


def ev(sk: bytes, kind: int = 1, tags: Any = (), content: str = "", created_at: int = 0) -> Event:
    at = created_at or int(time.time())
    return sign_event(sk, at, kind, [list(t) for t in tags], content, AUX)


def auth_event(sk: bytes, relay_url: str, challenge: str) -> Event:
    return ev(sk, 22242, [("relay", relay_url), ("challenge", challenge)])


async def connect(port: int, host: str) -> Client:
    """A websocket to 127.0.0.1:`port` whose Host header is exactly `host`: what anyone
    can send (a relay in the middle names itself)."""
    sock = socket.create_connection(("127.0.0.1", port))
    return await Client.connect(f"ws://{host}/", sock=sock)


async def try_auth(c: Client, sk: bytes, relay_url: str) -> list[Any]:
    e = auth_event(sk, relay_url, await c.get_challenge())
    await c.send(["AUTH", e])
    ok = await c.expect("OK")
    assert ok[1] == e.id
    return ok


def http_request(
    port: int,
    method: str,
    host: str | list[str] | None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> tuple[int, str]:
    """One request with exactly the Host header(s) given (None: none at all)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest(method, "/", skip_host=True, skip_accept_encoding=True)
    for value in [host] if isinstance(host, str) else host or []:
        conn.putheader("Host", value)
    for k, v in (headers or {}).items():
        conn.putheader(k, v)
    conn.putheader("Content-Length", str(len(body)))
    conn.endheaders(body)
    resp = conn.getresponse()
    return resp.status, resp.read().decode()


@pytest.fixture(scope="module")
def plain(pg_server_url, tmp_path_factory) -> Any:
    """`engram serve` as shipped (no public URL), with an operator for NIP-86; and a second
    node on the same database."""
    url = create_database_sync(pg_server_url)
    tmp = str(tmp_path_factory.mktemp("plain"))
    env = {"ENGRAM_OPERATORS": pubkey_of(OPERATOR)}
    first = launch_relay(url, tmp, env)
    second = launch_relay(url, tmp, env)
    yield first, second
    first.stop()
    second.stop()


@pytest.fixture(scope="module")
def public_nodes(pg_server_url, tmp_path_factory) -> Any:
    """Two nodes behind one TLS proxy, as their operator configures them: --public-url."""
    url = create_database_sync(pg_server_url)
    tmp = str(tmp_path_factory.mktemp("public"))
    env = {"ENGRAM_OPERATORS": pubkey_of(OPERATOR)}
    nodes = [launch_relay(url, tmp, env, args=("--public-url", PUBLIC)) for _ in range(2)]
    yield nodes
    for rp in nodes:
        rp.stop()


@pytest.fixture(scope="module")
def public(public_nodes) -> RelayProcess:
    return public_nodes[0]


# --- NIP-42 -------------------------------------------------------------------------------


async def test_relay_in_the_middle_cannot_pass_on_a_victims_auth(plain) -> None:
    """The attacker connects with `Host: evil.example`, forwards our challenge to a victim
    connected to its own wss://evil.example, and relays back the victim's AUTH: refused,
    and the victim's direct messages stay unread. The victim's AUTH for this relay's own
    URL, on the same connection, is accepted (the twin)."""
    rp, _ = plain
    port = rp.port
    dm = ev(FRIEND, 4, [("p", pubkey_of(VICTIM))], "ciphertext for the victim")
    async with await connect(port, "127.0.0.1") as c:
        assert (await c.publish(dm))[2] is True
    inbox = {"kinds": [4], "#p": [pubkey_of(VICTIM)]}
    async with await connect(port, "evil.example") as attacker:
        for signed_for in (
            "wss://evil.example",
            "ws://evil.example",
            f"ws://evil.example:{port}",
            f"wss://127.0.0.1:{port}",  # our host and port, another scheme
            f"ws://127.0.0.1:{port + 1}",  # our host, another port
            f"ws://127.0.0.1:{port}/elsewhere",  # another path
        ):
            ok = await try_auth(attacker, VICTIM, signed_for)
            assert ok[2] is False and ok[3].startswith("auth-required:"), (signed_for, ok)
            assert "another relay" in ok[3] and f"ws://127.0.0.1:{port}" in ok[3]
        events, end = await attacker.req("dm", inbox)
        assert events == [] and end[0] == "CLOSED" and end[2].startswith("auth-required:")
        # the twin: signed for this relay's URL (any of its loopback names)
        for ours in (f"ws://127.0.0.1:{port}", f"ws://localhost:{port}/", f"ws://[::1]:{port}"):
            assert (await try_auth(attacker, VICTIM, ours))[2] is True, ours
        assert [e["id"] for e in await attacker.query(inbox)] == [dm.id]


async def test_a_public_url_is_the_relays_only_name(public) -> None:
    port = public.port
    for host in ("relay.example.com", "127.0.0.1", "evil.example"):
        async with await connect(port, host) as c:
            for other in (f"ws://127.0.0.1:{port}", f"{PUBLIC}:8443", "ws://relay.example.com"):
                ok = await try_auth(c, STRANGER, other)
                assert ok[2] is False and PUBLIC in ok[3], (host, other, ok)
            assert (await try_auth(c, STRANGER, PUBLIC + "/"))[2] is True


def test_the_relay_says_who_it_is(plain, public) -> None:
    """Its page names its configured URLs, never the Host header's; without one it says
    so at start-up, once, with how to set it; `engram config show` shows the setting."""
    rp, _ = plain
    status, page = http_request(rp.port, "GET", "evil.example")
    assert status == 200 and "evil.example" not in page
    assert f"ws://127.0.0.1:{rp.port}" in page and "No public URL is configured" in page
    status, page = http_request(public.port, "GET", "evil.example")
    assert status == 200 and PUBLIC in page and "evil.example" not in page
    assert "No public URL" not in page and f"127.0.0.1:{public.port}" not in page
    assert rp.log().count("no public URL is configured") == 1
    assert "--public-url wss://relay.example.com" in rp.log()
    assert "no public URL" not in public.log()
    shown = subprocess.run(
        [sys.executable, "-m", "cli.commands.main", "config", "show", "--json"],
        env={**os.environ, "ENGRAM_PUBLIC_URLS": f"{PUBLIC},wss://mem.example.org/nostr"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout)["public_urls"] == [PUBLIC, "wss://mem.example.org/nostr"]
    bad = subprocess.run(
        [sys.executable, "-m", "cli.commands.main", "config", "show"],
        env={**os.environ, "ENGRAM_PUBLIC_URLS": "relay.example.com"},
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "public_urls" in bad.stderr and "wss://" in bad.stderr


# --- NIP-62 -------------------------------------------------------------------------------


async def test_a_vanish_request_for_another_relay_is_not_replayed_here(plain) -> None:
    """A request to vanish the user addressed to wss://relay-x.example, replayed here with
    `Host: relay-x.example`: refused, nothing erased. One naming this relay's URL: taken."""
    rp, other_node = plain
    port = rp.port
    notes = [ev(LEAVER, content=f"note {i}") for i in range(3)]
    async with await connect(port, "127.0.0.1") as c:
        for n in notes:
            assert (await c.publish(n))[2] is True
    mine = {"authors": [pubkey_of(LEAVER)], "kinds": [1]}
    for host, named in (
        ("relay-x.example", "wss://relay-x.example"),
        (f"relay-x.example:{port}", f"ws://relay-x.example:{port}"),
        ("127.0.0.1", f"wss://127.0.0.1:{port}"),
    ):
        request = ev(LEAVER, 62, [("relay", named)], "bye")
        async with await connect(port, host) as attacker:
            ok = await attacker.publish(request)
            assert ok[2] is False and "does not name this relay" in ok[3], (named, ok)
    async with await connect(port, "127.0.0.1") as c:
        assert len(await c.query(mine)) == 3
        request = ev(LEAVER, 62, [("relay", f"ws://localhost:{port}")], "bye")
        assert (await c.publish(request))[2] is True
    async with await connect(other_node.port, "127.0.0.1") as c:
        assert await c.query(mine) == []


# --- NIP-98 -------------------------------------------------------------------------------


def nip98(sk: bytes, url: str, body: bytes, created_at: int | None = None) -> str:
    tags = [("u", url), ("method", "POST"), ("payload", hashlib.sha256(body).hexdigest())]
    event = ev(sk, 27235, tags, created_at=created_at or int(time.time()))
    from msgspec import json as mjson

    return "Nostr " + base64.b64encode(mjson.encode(event)).decode()


def manage(port: int, host: str, authorization: str, body: bytes) -> tuple[int, dict[str, Any]]:
    status, text = http_request(
        port,
        "POST",
        host,
        body,
        {"Content-Type": "application/nostr+json+rpc", "Authorization": authorization},
    )
    return status, json.loads(text)


def test_nip98_tokens_name_this_relay_and_are_used_once(plain, public_nodes) -> None:
    rp, _ = plain
    port = rp.port
    body = json.dumps({"method": "listbannedpubkeys", "params": []}).encode()
    for host, u in (
        ("relay-x.example", "https://relay-x.example/"),  # signed for another relay
        (f"127.0.0.1:{port}", f"https://127.0.0.1:{port}/"),  # another scheme
        (f"127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}/"),  # another port
        (f"127.0.0.1:{port}", "http://127.0.0.1/"),  # no port: 80
    ):
        status, answer = manage(port, host, nip98(OPERATOR, u, body), body)
        assert status == 401 and "u tag" in answer["error"], (u, answer)
    token = nip98(OPERATOR, f"http://127.0.0.1:{port}/", body)
    assert manage(port, f"127.0.0.1:{port}", token, body) == (200, {"result": []})
    status, answer = manage(port, f"127.0.0.1:{port}", token, body)  # the same token again
    assert status == 401 and "already used" in answer["error"], answer
    # a new token for the same call: accepted
    fresh = nip98(OPERATOR, f"http://localhost:{port}", body, created_at=int(time.time()) - 1)
    assert manage(port, "localhost", fresh, body) == (200, {"result": []})
    # behind one public URL, a token used on one node is used on every node
    first, second = public_nodes
    token = nip98(OPERATOR, "https://relay.example.com/", body)
    assert manage(first.port, "relay.example.com", token, body) == (200, {"result": []})
    for node in (second, first):
        status, answer = manage(node.port, "relay.example.com", token, body)
        assert status == 401 and "already used" in answer["error"], answer


# --- tenants ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tenanted(pg_server_url, tmp_path_factory) -> Any:
    url = create_database_sync(pg_server_url)
    rp = launch_relay(
        url, str(tmp_path_factory.mktemp("tenanted")), {"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"}
    )
    tenant_cli(url, "add", "a.test")
    tenant_cli(url, "add", "b.test", "--alias", "mem.b.test", "--public-url", "wss://b.test/")
    tenant_cli(url, "add", "c.test", "--auth-challenge", "on-connect", "--name", "ready")
    until_sync(lambda: http_request(rp.port, "GET", "c.test")[0] == 200)
    yield rp
    rp.stop()


def until_sync(check: Any) -> None:
    asyncio.run(until(check, "the tenants are loaded"))


async def test_a_tenants_identity_comes_from_its_configuration(tenanted) -> None:
    port = tenanted.port
    async with await connect(port, "a.test") as a:  # no URL of its own: the listening port
        for other in ("wss://a.test", f"ws://b.test:{port}", f"ws://127.0.0.1:{port}"):
            assert (await try_auth(a, STRANGER, other))[2] is False, other
        assert (await try_auth(a, STRANGER, f"ws://a.test:{port}"))[2] is True
    async with await connect(port, "mem.b.test") as b:  # its own public URL, and only it
        for other in (f"ws://b.test:{port}", "wss://mem.b.test", "wss://a.test"):
            assert (await try_auth(b, STRANGER, other))[2] is False, other
        assert (await try_auth(b, STRANGER, "wss://b.test"))[2] is True
    shown = json.loads(tenant_cli(tenanted.database_url, "show", "b.test").stdout)
    assert shown["public_urls"] == ["wss://b.test/"]
    refused = tenant_cli(
        tenanted.database_url, "set", "a.test", "--public-url", "wss://b.test", check=False
    )
    assert refused.returncode == 1 and "not on one of its hosts" in refused.stderr


async def test_the_auth_challenge_comes_when_needed_or_on_connect(tenanted) -> None:
    """By default a client that does not speak NIP-42 publishes a public note and gets its
    OK first; the challenge comes with the first `auth-required:` answer. A tenant set to
    `on-connect` sends it first thing."""
    port = tenanted.port
    async with await connect(port, "a.test") as c:
        note = ev(STRANGER, content="public")
        await c.send(["EVENT", note])
        raw = json.loads(await c.ws.recv())  # the very next frame, unfiltered
        assert raw == ["OK", note.id, True, ""]
        await c.send(["REQ", "dm", {"kinds": [4]}])
        assert json.loads(await c.ws.recv())[0] == "AUTH"
        closed = json.loads(await c.ws.recv())
        assert closed[:2] == ["CLOSED", "dm"] and closed[2].startswith("auth-required:")
    async with await connect(port, "c.test") as c:
        assert json.loads(await c.ws.recv())[0] == "AUTH"


async def test_the_projects_client_authenticates_when_challenged_late(plain) -> None:
    """cli.nostr.client (under `engram mem`, the memory API, MCP and sync): its first read of a
    private kind is refused `auth-required:` with the challenge; it AUTHs and reads."""
    from cli.nostr.client import open_relay

    port = plain[0].port
    dm = ev(FRIEND, 4, [("p", pubkey_of(READER))], "for the reader")
    async with await connect(port, "127.0.0.1") as c:
        assert (await c.publish(dm))[2] is True
    async with open_relay(f"ws://127.0.0.1:{port}", READER) as client:
        got = await client.query({"kinds": [4], "#p": [pubkey_of(READER)]})
        assert [e.id for e in got] == [dm.id]
        protected = ev(READER, 1, [("-",)], "only I may publish this")
        assert await client.publish(protected) == ""


# --- Host, /metrics ------------------------------------------------------------------------


def test_host_headers_are_parsed_as_rfc_9110_says(tenanted) -> None:
    port = tenanted.port
    nip11 = {"Accept": "application/nostr+json"}
    for bad in ("a.test@b.test", "b.test:abc", "b.test:1:2", "b test", "[::1", "b.test/x"):
        status, _ = http_request(port, "GET", bad, headers=nip11)
        assert status == 400, bad
    status, text = http_request(port, "GET", ["b.test", "a.test"], headers=nip11)
    assert status == 400  # (uvicorn's HTTP parser refuses it before the app: fine)
    assert http_request(port, "GET", None, headers=nip11)[0] == 400  # HTTP/1.1 needs one
    for good in ("b.test", "B.TEST.", "b.test:", f"b.test:{port}", "mem.b.test:443"):
        status, text = http_request(port, "GET", good, headers=nip11)
        assert status == 200 and json.loads(text)["name"] == "b.test", good
    assert http_request(port, "GET", "[::1]:80")[0] == 404  # an IP-literal: no such tenant
    # the websocket upgrade too
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: a.test@b.test\r\nUpgrade: websocket\r\nConnection: Upgrade"
        b"\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    assert sock.recv(64).startswith(b"HTTP/1.1 400")
    sock.close()


def test_configured_hosts_and_host_headers_are_keyed_alike() -> None:
    """A tenant's configured host name and the Host header that names it meet in one
    form: lower case, no trailing dot, an IP address canonical."""
    from relay.hosts import host_key, host_of

    for configured, header, key in [
        ("Example.COM.", "example.com", "example.com"),
        ("wss://Relay.Example.com:443/", "relay.example.com.:443", "relay.example.com"),
        ("[0:0::1]", "[::1]:7777", "::1"),
        ("127.0.0.1", "127.0.0.1:80", "127.0.0.1"),
    ]:
        assert host_of(configured) == host_key(header) == key, configured


async def test_metrics_allow_names_resolve_one_at_a_time_within_a_deadline(monkeypatch) -> None:
    """Any request from an unlisted address may make the relay resolve the allowlist's
    names: a resolver that hangs costs one lookup per name, bounded by RESOLVE_TIMEOUT,
    however many requests come meanwhile."""
    import asyncio
    import time

    from relay import allowlist

    monkeypatch.setattr(allowlist, "RESOLVE_TIMEOUT", 0.2)
    calls = 0

    async def hanging(*args: object, **kwargs: object) -> list[object]:
        nonlocal calls
        calls += 1
        await asyncio.sleep(30)
        return []

    monkeypatch.setattr(asyncio.get_running_loop(), "getaddrinfo", hanging)
    listed = allowlist.Allowlist(["prometheus"], "metrics_allow")
    began = time.monotonic()
    answers = await asyncio.gather(*(listed.allows("10.1.2.3") for _ in range(50)))
    assert answers == [False] * 50 and calls == 1
    assert time.monotonic() - began < 5


def test_metrics_are_for_the_operator_only(plain, start_relay) -> None:
    rp, _ = plain

    def metrics(port: int, headers: dict[str, str] | None = None) -> tuple[int, str]:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics", headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read().decode()

    status, text = metrics(rp.port)
    assert status == 200 and "engram_connections" in text
    proxied = start_relay(
        env={"ENGRAM_RATE_TRUST_FORWARDED_FOR": "true", "ENGRAM_METRICS_ALLOW": "localhost"}
    )
    assert metrics(proxied.port)[0] == 200  # `localhost` resolves to the peer's address
    status, text = metrics(proxied.port, {"X-Forwarded-For": "203.0.113.9"})  # via a proxy
    assert status == 403 and "metrics_allow" in text and "engram_" not in text
    elsewhere = start_relay(env={"ENGRAM_METRICS_ALLOW": "192.0.2.0/24"})
    assert metrics(elsewhere.port)[0] == 403
