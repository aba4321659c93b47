"""Issue 46, item 3: a memory with more versions than the relay returns for one REQ.

Every per-slug read (get, log, audit SLUG, the base of every write, forget's deletion list
and its check afterwards) pages to the end through `cli.nostr.paging.fetch_all`, or says
plainly that it may be incomplete. A real relay process serves the module with a tiny
limit (3 per page, 2 when a filter names none), so a few versions are "past the limit"
exactly as 102 versions are on a relay whose default is 100.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from cli_support import Keys, engram_async, fake_relay, shared_relay
from relay_fixtures import RelayProcess
from websockets.asyncio.server import ServerConnection

from cli.memory.api import AgentMemory
from cli.nostr.client import connect_relay
from cli.nostr.errors import RefusedError
from cli.nostr.identity import load_identity
from cli.nostr.paging import fetch_all
from engram import KIND_ENGRAM, Memory, build_event, conversation_key, d_tag
from engram.nip01 import Event
from engram.versions import KIND_REVISION

SMALL = {"ENGRAM_LIMITS_MAX_LIMIT": "3", "ENGRAM_LIMITS_DEFAULT_LIMIT": "2"}
VERSIONS = 7  # > 3: every read of one slug needs several pages


@pytest.fixture(scope="module")
def small(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("small-relay")), SMALL)


@pytest.fixture
def keys() -> Keys:
    return Keys.fresh()


def api(keys: Keys, relays: list[str]) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    return AgentMemory(load_identity(None, keys.owner, None, env=env), relays, timeout=60)


def owner_api(keys: Keys, relays: list[str]) -> AgentMemory:
    env = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    return AgentMemory(load_identity(None, None, keys.agent, env=env), relays, timeout=60)


async def amem(keys: Keys, relays: list[str], *args: str, owner: bool = False) -> Any:
    """`engram mem ARGS…` as a real process, as the agent (or the owner naming the agent)."""
    if owner:
        env = keys.owner_env(",".join(relays))
        args = (*args, "--agent", keys.agent)
    else:
        env = keys.agent_env(",".join(relays))
    return await engram_async("mem", *args, "--timeout", "120", env=env)


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return str(result.stdout.decode())


async def agent_events(url: str, keys: Keys, slug: str) -> set[str]:
    """Ids of every head and revision of `slug` the relay holds, paged to the end."""
    d = d_tag(conversation_key(keys.agent_sk, keys.owner), slug)
    client = await connect_relay(url, keys.agent_sk)
    try:
        got = await fetch_all(
            client,
            {"kinds": [KIND_ENGRAM, KIND_REVISION], "authors": [keys.agent], "#d": [d]},
            3,
        )
    finally:
        await client.close()
    assert got.complete
    return set(got.events)


async def versions(keys: Keys, relays: list[str], slug: str) -> list[str]:
    """`VERSIONS` versions of `slug`, oldest first: their ids (all on the relay)."""
    memory = api(keys, relays)
    ids = [(await memory.set(slug, f"version {i}")).event_id for i in range(VERSIONS)]
    assert set(ids) <= await agent_events(relays[0], keys, f"mem/{slug}")
    return ids


async def test_log_lists_every_version(keys: Keys, small: RelayProcess) -> None:
    relays = [small.url]
    ids = await versions(keys, relays, "notes/long")
    log = json.loads(ok(await amem(keys, relays, "log", "notes/long", "--json")))
    assert [v["id"] for v in log] == ids[::-1]  # every version, newest first
    plain = ok(await amem(keys, relays, "log", "notes/long")).splitlines()
    assert [line.split("\t")[0] for line in plain] == ids[::-1]
    memory = api(keys, relays)
    for i, v in enumerate(reversed(log)):
        assert (await memory.get("notes/long", rev=v["id"])).value == f"version {i}"
    first = await amem(keys, relays, "get", "notes/long", "--as-of", str(log[-1]["created_at"]))
    assert ok(first) == "version 0"


async def test_audit_of_one_slug_finds_no_missing_predecessor(
    keys: Keys, small: RelayProcess
) -> None:
    relays = [small.url]
    await versions(keys, relays, "notes/long")
    one = json.loads(ok(await amem(keys, relays, "audit", "notes/long", "--json")))
    assert one["clean"] and one["findings"] == [] and one["versions"] == VERSIONS, one
    every = json.loads(ok(await amem(keys, relays, "audit", "--json")))
    assert every["clean"] and every["versions"] == VERSIONS, every


async def test_forget_deletes_every_version(keys: Keys, small: RelayProcess) -> None:
    relays = [small.url]
    ids = await versions(keys, relays, "notes/long")
    forget_id = ok(await amem(keys, relays, "forget", "notes/long")).strip()
    held = await agent_events(small.url, keys, "mem/notes/long")
    assert not held & set(ids), "the relay still holds versions forget never asked it to delete"
    assert forget_id in held
    # and nothing forgotten comes back through the history either
    after = json.loads(ok(await amem(keys, relays, "log", "notes/long", "--json")))
    assert [v["state"] for v in after] == ["forgotten"]
    for rev in (ids[0], ids[-1]):
        gone = await amem(keys, relays, "get", "notes/long", "--rev", rev)
        assert gone.returncode == 1 and b"version" not in gone.stdout
    clean = await amem(keys, relays, "audit", "notes/long")
    assert clean.returncode == 0, clean.stdout + clean.stderr


async def test_a_tombstone_far_back_still_refuses_its_value(
    keys: Keys, small: RelayProcess
) -> None:
    relays = [small.url]
    memory = api(keys, relays)
    await memory.set("notes/t", "the secret value")
    tomb = await memory.rm("notes/t", reason="not true")
    for i in range(VERSIONS):
        await memory.set("notes/t", f"other {i}")
    with pytest.raises(RefusedError) as refused:
        await memory.set("notes/t", "the secret value")
    assert refused.value.version_id == tomb.event_id
    again = await amem(keys, relays, "set", "notes/t", "the secret value")
    assert again.returncode == 1 and tomb.event_id in again.stderr.decode(), again.stderr
    assert ok(await amem(keys, relays, "get", "notes/t")) == f"other {VERSIONS - 1}"
    ok(await amem(keys, relays, "set", "notes/t", "the secret value", "--force"))
    assert ok(await amem(keys, relays, "get", "notes/t")) == "the secret value"


async def test_an_owner_denial_far_back_still_holds(keys: Keys, small: RelayProcess) -> None:
    relays = [small.url]
    denied_value = "the owner says no"
    first = await api(keys, relays).set("notes/d", denied_value)
    owner = owner_api(keys, relays)
    denial = await owner.deny("notes/d", reason="wrong")
    for i in range(VERSIONS):  # owner corrections: verdicts, pushing the denial back
        await owner.set("notes/d", f"corrected {i}")
    refused = await amem(keys, relays, "set", "notes/d", denied_value, "--force")
    err = refused.stderr.decode()
    assert refused.returncode == 1 and denial.event_id in err and "denied" in err, err
    assert ok(await amem(keys, relays, "get", "notes/d")) == f"corrected {VERSIONS - 1}"
    # the denied value is listed by hash, never shown: not through log, not by --rev
    log = json.loads(ok(await amem(keys, relays, "log", "notes/d", "--json")))
    states = {v["id"]: v["state"] for v in log}
    assert states[first.event_id] == "withheld" and len(log) == VERSIONS + 2
    rev = await amem(keys, relays, "get", "notes/d", "--rev", first.event_id)
    assert rev.returncode == 1 and denied_value.encode() not in rev.stdout + rev.stderr


def plain_head(keys: Keys, slug: str, value: str, created_at: int) -> Event:
    """A NIP-AE head with no history (any NIP-AE writer's)."""
    body = Memory(slug=slug, value=value)
    return build_event(keys.agent_sk, keys.owner, body, created_at, os.urandom(32), os.urandom(32))


async def test_a_slug_read_that_cannot_page_says_so() -> None:
    """A relay that ignores `until` (and publishes no limits): the read of one slug warns
    that it may be partial instead of passing a first page off as the whole history."""
    keys = Keys.fresh()
    now = int(time.time())
    page = [msgspec.to_builtins(plain_head(keys, f"mem/p/{i}", f"v{i}", now - i)) for i in range(3)]

    async def ignores_until(ws: ServerConnection) -> None:
        async for raw in ws:
            msg = msgspec.json.decode(raw)
            if msg[0] == "REQ":
                for e in page:
                    await ws.send(msgspec.json.encode(["EVENT", msg[1], e]).decode())
                await ws.send(msgspec.json.encode(["EOSE", msg[1]]).decode())

    async with fake_relay(ignores_until) as url:
        for args in (("get", "p/1"), ("log", "p/1"), ("audit", "p/1")):
            result = await amem(keys, [url], *args)
            assert result.returncode == 0, (args, result.stderr)
            assert b"may be incomplete" in result.stderr, (args, result.stderr)
            assert b"ignores `until`" in result.stderr, (args, result.stderr)
        assert ok(await amem(keys, [url], "get", "p/1")) == "v1"
