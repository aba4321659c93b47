"""A relay that served without tenants gains its first one (issue 46, item 9): the events
it stored before are never hidden silently. `engram tenant add` is refused while they
would be, saying what to run; `--adopt` makes the new tenant serve them; `--leave-default`
leaves them unserved on purpose. The built-in tenant is changed live with `engram tenant
set default`. Real relay processes and `engram` commands on real PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import shlex
import time

from cli_support import tenant_cli
from test_tenants import connect, http_get, wait_for

from engram.nip01 import sign_event
from relay.store import DEFAULT_TENANT

AUX = bytes(32)
AUTHOR = (0xF125700).to_bytes(32, "big")
HOST = "relay.example.com"


def note(n: int) -> object:
    return sign_event(AUTHOR, int(time.time()) - 100 + n, 1, [["t", "before"]], f"n{n}", AUX)


async def stored_ids(port: int, host: str) -> list[str]:
    """The ids a REQ for the notes' tag answers on `host`, newest first."""
    c = await connect(port, host)
    try:
        await c.send(["REQ", "s", {"#t": ["before"], "limit": 50}])
        got = []
        while (msg := await c.recv())[0] == "EVENT":
            got.append(msg[2]["id"])
        assert msg == ["EOSE", "s"], msg
        return got
    finally:
        await c.close()


async def publish(port: int, host: str, events: list) -> None:
    c = await connect(port, host)
    try:
        for e in events:
            assert (await c.publish(e))[2] is True
    finally:
        await c.close()


async def test_the_first_tenant_adopts_the_events_stored_before(start_relay) -> None:
    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    db, port = rp.database_url, rp.port
    events = [note(i) for i in range(3)]
    await publish(port, "127.0.0.1", events)
    expected = [e.id for e in reversed(events)]
    assert await stored_ids(port, "127.0.0.1") == expected

    # the plain command would hide them: refused, nothing changed, the two commands named
    refused = tenant_cli(db, "add", HOST, "--name", "Example", check=False)
    assert refused.returncode == 1, refused.stderr
    why = refused.stderr
    assert "the relay holds 3 events stored before it had tenants" in why
    typed = f"engram tenant add {HOST} --name Example --database-url {shlex.quote(db)}"
    assert f"{typed} --adopt\n" in why and f"{typed} --leave-default" in why
    assert "stop the relay" in why
    assert tenant_cli(db, "ls").stdout == ""
    assert await stored_ids(port, "127.0.0.1") == expected  # still served

    # --adopt moves rows: only with no relay on the database
    busy = tenant_cli(db, "add", HOST, "--adopt", check=False)
    assert busy.returncode == 1 and "no relay is connected" in busy.stderr
    rp.stop()
    done = tenant_cli(db, "add", HOST, "--name", "Example", "--adopt", "--alias", "127.0.0.1")
    assert f"added tenant {HOST}, serving the 3 events stored before" in done.stdout
    assert "serves tenants' hosts only" in done.stderr

    again = start_relay(database_url=db, env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    assert await stored_ids(again.port, HOST) == expected
    assert await stored_ids(again.port, "127.0.0.1") == expected  # an alias of it now
    assert json.loads(http_get(again.port, HOST)[1])["name"] == "Example"
    assert http_get(again.port, "other.example.com")[0] == 404
    # what the tenant writes next sits beside them (the address index took the rename)
    later = note(9)
    await publish(again.port, HOST, [later])
    assert await stored_ids(again.port, HOST) == [later.id, *expected]


async def test_leave_default_starts_the_tenant_empty_and_hides_them(start_relay) -> None:
    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    db, port = rp.database_url, rp.port
    events = [note(i) for i in range(2)]
    await publish(port, "127.0.0.1", events)
    done = tenant_cli(db, "add", HOST, "--leave-default")
    assert done.stdout.startswith(f"added tenant {HOST} (written to")
    # the relay has taken the new configuration when 127.0.0.1 stops being served (HOST
    # answered 200 before it too: a relay without tenants serves every host)
    wait_for(lambda: http_get(port, "127.0.0.1")[0] == 404)
    assert http_get(port, HOST)[0] == 200
    assert await stored_ids(port, HOST) == []  # the negative twin: nothing adopted
    assert http_get(port, "127.0.0.1")[0] == 404
    # a second tenant changes nothing for them: no refusal
    assert tenant_cli(db, "add", "second.example.com").returncode == 0
    # and the last tenant removed, the built-in tenant serves them again
    tenant_cli(db, "rm", HOST)
    tenant_cli(db, "rm", "second.example.com")
    wait_for(lambda: http_get(port, "127.0.0.1")[0] == 200)
    assert await stored_ids(port, "127.0.0.1") == [e.id for e in reversed(events)]


async def test_a_first_tenant_on_an_empty_relay_is_added_with_a_note(start_relay) -> None:
    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    done = tenant_cli(rp.database_url, "add", HOST)
    assert done.returncode == 0 and "answers 404" in done.stderr
    assert "--alias 127.0.0.1 --alias localhost" in done.stderr
    refused = tenant_cli(rp.database_url, "add", DEFAULT_TENANT, check=False)
    assert refused.returncode == 1 and "built-in tenant" in refused.stderr


async def test_the_built_in_tenant_is_changed_live(start_relay) -> None:
    """`engram tenant set default`: a row of overrides for the relay's own settings,
    which does not turn the relay into one with tenants (every host still served)."""
    rp = start_relay(env={"ENGRAM_TENANT_REFRESH_SECONDS": "0.5"})
    db, port = rp.database_url, rp.port

    def limitation() -> dict:
        return json.loads(http_get(port, "127.0.0.1")[1])["limitation"]

    assert limitation()["max_limit"] == 500
    done = tenant_cli(db, "set", DEFAULT_TENANT, "--limit", "max_limit=7", "--name", "Mine")
    assert done.stdout.startswith(f"updated tenant {DEFAULT_TENANT}")
    wait_for(lambda: limitation()["max_limit"] == 7)
    assert json.loads(http_get(port, "anything.example")[1])["name"] == "Mine"  # every host
    assert tenant_cli(db, "ls").stdout.startswith(f"{DEFAULT_TENANT}\t(settings)\t")

    # private_kinds emptied: a DM (kind 4) is served to anyone, engrams stay private
    dm = sign_event(AUTHOR, int(time.time()), 4, [["p", "ab" * 32]], "ciphertext?iv=x", AUX)
    await publish(port, "127.0.0.1", [dm])

    async def dm_served() -> bool:
        c = await connect(port, "127.0.0.1")
        try:
            await c.send(["REQ", "d", {"kinds": [4]}])
            msg = await c.recv()
            return msg[0] == "EVENT" and msg[2]["id"] == dm.id
        finally:
            await c.close()

    assert not await dm_served()  # private by default: no AUTH, no DM
    tenant_cli(db, "set", DEFAULT_TENANT, "--limit", "private_kinds=")
    deadline = time.monotonic() + 60
    while not await dm_served():
        assert time.monotonic() < deadline, "private_kinds= did not reach the relay"
        await asyncio.sleep(0.2)

    # --write members on the built-in tenant: a limit of its row, members by key
    tenant_cli(db, "set", DEFAULT_TENANT, "--write", "members")
    wait_for(lambda: limitation()["restricted_writes"] is True)
    assert tenant_cli(db, "ls").stdout.startswith(f"{DEFAULT_TENANT}\tmembers\t")
    for bad, why in (
        (["--alias", "x.test"], "takes no --alias"),
        (["--public-url", "wss://x.test"], "takes no --public-url"),
    ):
        refused = tenant_cli(db, "set", DEFAULT_TENANT, *bad, check=False)
        assert refused.returncode == 1 and why in refused.stderr, refused.stderr
    refused = tenant_cli(db, "rm", DEFAULT_TENANT, check=False)
    assert refused.returncode == 1 and "cannot be removed" in refused.stderr
