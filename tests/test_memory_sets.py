"""Issue 13: agent memory on a relay set, complete listings, sync, migration, backup, search.

Real relays of ours (`start_relay`), nostr-sdk's LocalRelay (an independent implementation)
as a member of a set, and `engram mem` run as a real process.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import msgspec
from ae_vectors import AE, SECKEY_A, SECKEY_O, ae_events
from cli_support import (
    Keys,
    both_ways,
    clean_env,
    corrupt_core,
    engram,
    engram_async,
    fake_relay,
    publish,
    put,
    shared_local_relay,
)
from relay_fixtures import RelayProcess, free_port, proxied_env
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection

from cli.memory.api import AgentMemory
from cli.memory.hook import Nothing, Nudge, Profile, fetch_core
from cli.nostr.client import connect_relay
from cli.nostr.identity import Identity, load_identity
from cli.nostr.peer import MAX_PAGE
from engram import Core, Memory, Tombstone, build_event
from engram.nip01 import Event, pubkey_of
from relay.store import DEFAULT_TENANT
from relay.store.sqlwrite import INSERT_REGULAR, encode_row, insert_parameters

# --- helpers ----------------------------------------------------------------------------


def identity(keys: Keys) -> Identity:
    return load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})


def api(keys: Keys, relays: list[str], timeout: float = 60) -> AgentMemory:
    return AgentMemory(identity(keys), relays, timeout=timeout)


def event_for(keys: Keys, slug: str, value: str | None, created_at: int) -> Event:
    body = (
        Core(value or "")
        if slug == "core"
        else (Tombstone(slug=slug) if value is None else Memory(slug=slug, value=value))
    )
    return build_event(keys.agent_sk, keys.owner, body, created_at, os.urandom(32), os.urandom(32))


async def mem(keys: Keys, relays: list[str], *args: str) -> Any:
    """`engram mem ARGS…` as a real process, generous limits: this machine is shared."""
    env = keys.agent_env(",".join(relays))
    cmd = ["mem", *args, "--timeout", "300"]
    return await asyncio.to_thread(engram, *cmd, env=env, timeout=600)


def listed(text: str) -> list[dict[str, Any]]:
    """`ls --json` rows cut to NIP-AE's listing members (slug, event_id, created_at)."""
    return [{k: r[k] for k in ("slug", "event_id", "created_at")} for r in json.loads(text)]


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return str(result.stdout.decode())


@contextlib.contextmanager
def local_relay(tmp_path: Path) -> Iterator[str]:
    """nostr-sdk's LocalRelay (Rust, in memory) in its own process, rate limit lifted."""
    workdir = tmp_path / "local-relay"
    workdir.mkdir()
    yield from shared_local_relay(str(workdir))


@contextlib.asynccontextmanager
async def stop_on_write(target: RelayProcess, port: int = 0) -> AsyncIterator[str]:
    """A proxy in front of `target` that stops the relay process when a client sends its
    first EVENT: a relay going down in the middle of a write. Later connections go to
    whatever relay is at the same port again (after a restart)."""
    stopped = asyncio.Event()

    async def handler(client: ServerConnection) -> None:
        async with connect(f"ws://127.0.0.1:{target.port}", max_size=None) as upstream:

            async def up() -> None:
                async for raw in client:
                    if not stopped.is_set() and str(raw).startswith('["EVENT"'):
                        stopped.set()
                        await asyncio.to_thread(target.stop)
                        await client.close()
                        return
                    await upstream.send(raw)

            async def down() -> None:
                async for raw in upstream:
                    await client.send(raw)

            await both_ways(up(), down())

    async with fake_relay(handler, port) as url:
        yield url


async def archive(
    start_relay: Callable[..., RelayProcess], relay: RelayProcess, events: list[Event]
) -> RelayProcess:
    """Store events straight into a relay's database, keeping every version of an address
    (the unique head index dropped): a relay that returns historical versions, as NIP-AE
    readers must tolerate, and the fastest way to load thousands of events. The relay is then
    restarted (same database and port, returned): its live tail starts after these rows,
    which would otherwise reach it as another node's writes, live, at its next poll,
    maybe in the middle of the test's listing."""
    conn = await asyncpg.connect(relay.database_url)
    try:
        await conn.execute("DROP INDEX IF EXISTS events_address")
        for start in range(0, len(events), 5_000):
            chunk = events[start : start + 5_000]
            rows = [encode_row(e, msgspec.json.encode(e)) for e in chunk]
            tenants = [DEFAULT_TENANT] * len(rows)
            await conn.fetch(INSERT_REGULAR, *insert_parameters(tenants, rows, "test"))
    finally:
        await conn.close()
    relay.stop()
    return start_relay(env=relay.extra, database_url=relay.database_url, port=relay.port)


# --- relay sets: writes, reads, a relay that stops mid-write, sync ----------------------


async def test_write_survives_a_relay_stopping_mid_write_and_sync_repairs_it(
    start_relay: Callable[..., RelayProcess],
) -> None:
    proxy_port = free_port()  # b's public URLs: its own and its proxy's
    a, b = start_relay(), start_relay(env=proxied_env(proxy_port))
    c = start_relay(env={"ENGRAM_LIMITS_MAX_LIMIT": "50", "ENGRAM_LIMITS_DEFAULT_LIMIT": "20"})
    keys = Keys.fresh()
    first = await api(keys, [a.url, b.url, c.url]).set("notes/x", "first")
    assert len(first.accepted) == 3
    async with stop_on_write(b, proxy_port) as b_url:
        relays = [a.url, b_url, c.url]
        write = await mem(keys, relays, "set", "notes/x", "second")  # b stops during this one
        out = ok(write)
        assert len(out.strip()) == 64
        assert b_url.encode() in write.stderr  # the relay that failed is named, with a reason
        assert a.url.encode() not in write.stderr and c.url.encode() not in write.stderr
        # b comes back, one write behind
        start_relay(database_url=b.database_url, port=b.port, env=proxied_env(proxy_port))

        got = await mem(keys, relays, "get", "notes/x")
        assert ok(got) == "second"
        err = got.stderr.decode()
        assert b_url in err and "behind" in err and "engram mem sync" in err
        assert a.url not in err and c.url not in err

        synced = await mem(keys, relays, "sync")
        lines = dict(line.split("\t") for line in ok(synced).splitlines())
        # the missed write is two events: its version (kind 4174) and its head
        assert lines[b_url].startswith("2 republished")
        assert lines[a.url].startswith("0 republished") and lines[c.url].startswith("0 republished")
        after = await mem(keys, relays, "get", "notes/x")
        assert ok(after) == "second" and after.stderr == b""
        again = dict(line.split("\t") for line in ok(await mem(keys, relays, "sync")).splitlines())
        assert all(v.startswith("0 republished") for v in again.values())  # idempotent
        # the same signed event everywhere: republished, never re-signed
        ids = set()
        for url in relays:
            entry = await api(keys, [url]).get("notes/x")
            ids.add(entry.event_id)
        assert ids == {out.strip()}


async def test_write_to_a_set_with_every_relay_down_is_exit_2(
    start_relay: Callable[..., RelayProcess],
) -> None:
    a, b = start_relay(), start_relay()
    a.stop()
    b.stop()
    result = await mem(Keys.fresh(), [a.url, b.url], "set", "x", "v")
    assert result.returncode == 2
    err = result.stderr.decode()
    assert a.url in err and b.url in err and err.count("\n") == 1


async def test_local_relay_and_a_max_limit_50_relay_in_one_set(
    start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    ours = start_relay()
    small = start_relay(env={"ENGRAM_LIMITS_MAX_LIMIT": "50", "ENGRAM_LIMITS_DEFAULT_LIMIT": "20"})
    keys = Keys.fresh()
    with local_relay(tmp_path) as sdk:
        relays = [ours.url, small.url, sdk]
        # written through the set: every member accepts and holds the head
        written = await api(keys, relays).set("core", "I am the agent. See [[mem/n/0]].")
        assert set(written.accepted) == set(relays) and not written.refused
        # 180 memories (25 per second) straight to the LocalRelay only, and a newer
        # version of one of them only to our relay: the set disagrees
        now = int(time.time()) - 1_000
        events = [event_for(keys, f"mem/n/{i}", f"value {i}", now + i // 25) for i in range(180)]
        await put(sdk, events, keys.agent_sk)
        newer = event_for(keys, "mem/n/7", "seven, newer", now + 500)
        await put(ours.url, [newer], keys.agent_sk)

        listing = await mem(keys, relays, "ls", "--json")
        rows = json.loads(ok(listing))
        assert len(rows) == 180
        assert {r["slug"]: r["event_id"] for r in rows}["mem/n/7"] == newer.id
        err = listing.stderr.decode()
        assert "behind" in err and ours.url in err and small.url in err and sdk in err

        got = await mem(keys, relays, "get", "n/7")
        assert ok(got) == "seven, newer"
        synced = await mem(keys, relays, "sync")
        lines = dict(line.split("\t") for line in ok(synced).splitlines())
        # it had core: its head and its version (kind 4174)
        assert lines[small.url].startswith("180 republished, 2 already there")
        assert lines[ours.url].startswith("179 republished")
        assert lines[sdk].startswith("1 republished")
        # each member alone now lists everything: the max_limit 50 relay through paging
        for url in relays:
            alone = await mem(keys, [url], "ls", "--json")
            assert len(json.loads(ok(alone))) == 180, url
            # LocalRelay publishes no NIP-11 document, so no max_limit: that is all it says
            lines = alone.stderr.decode().splitlines()
            assert lines == ([] if url != sdk else [lines[0]]), (url, lines)
            assert url != sdk or "NIP-11" in lines[0]
        final = (await mem(keys, relays, "ls")).stderr.decode()
        assert "behind" not in final and "skipped" not in final


# --- the fetch hook on a set ----------------------------------------------------------


async def test_hook_on_a_set(start_relay: Callable[..., RelayProcess]) -> None:
    with_core, empty = start_relay(), start_relay()
    down = start_relay()
    down.stop()
    keys = Keys.fresh()
    await publish(with_core.url, event_for(keys, "core", "I help Ada.", int(time.time())))
    ident = identity(keys)
    # the profile when any relay yields a valid core, even with another relay down
    assert await fetch_core(ident, [down.url, with_core.url], 10) == Profile("I help Ada.")
    assert await fetch_core(ident, f"{empty.url},{with_core.url}", 10) == Profile("I help Ada.")
    # the nudge only when every relay answered and none holds a core candidate
    assert isinstance(
        await fetch_core(identity(Keys.fresh()), [empty.url, with_core.url], 10), Nudge
    )
    not_all = await fetch_core(identity(Keys.fresh()), [empty.url, down.url], 10)
    assert isinstance(not_all, Nothing) and down.url in not_all.reason
    # a corrupt core on one relay and nothing on another is not "no core"
    bad = Keys.fresh()
    await publish(empty.url, corrupt_core(bad))
    assert isinstance(await fetch_core(identity(bad), [empty.url, with_core.url], 10), Nothing)


async def test_hook_deadline_covers_the_whole_set(start_relay: Callable[..., RelayProcess]) -> None:
    relay = start_relay()
    keys = Keys.fresh()
    await publish(relay.url, event_for(keys, "core", "still me", int(time.time())))

    async def hang(ws: ServerConnection) -> None:
        await ws.wait_closed()

    deadline = 15.0
    async with fake_relay(hang) as silent:
        start = time.monotonic()
        result = await fetch_core(identity(keys), [silent, relay.url], timeout=deadline)
        elapsed = time.monotonic() - start
        nothing = await fetch_core(identity(Keys.fresh()), [silent, relay.url], timeout=1.0)
    assert result == Profile("still me")
    # one deadline for the set, not one per relay (which would take 2 x deadline); the
    # deadline is long enough that a loaded machine's slowness fits in the margin
    assert elapsed < 2 * deadline
    assert isinstance(nothing, Nothing)  # the silent relay did not answer: no nudge


# --- complete listings and honest counts ----------------------------------------------


async def test_1500_slugs_with_6000_versions_list_completely_at_max_limit_50(
    start_relay: Callable[..., RelayProcess],
) -> None:
    """Four versions of each slug, a relay that returns them all (the historical versions
    a NIP-AE reader must tolerate) 50 at a time: 120 pages, more events than the client's
    largest page (cli.nostr.peer.MAX_PAGE), page boundaries inside a second."""
    relay = start_relay(env={"ENGRAM_LIMITS_MAX_LIMIT": "50", "ENGRAM_LIMITS_DEFAULT_LIMIT": "20"})
    keys = Keys.fresh()
    base = int(time.time()) - 100_000
    events: list[Event] = []
    expected: dict[str, str] = {}
    slugs = 1_500
    for version in range(4):
        for n in range(slugs):
            i = version * slugs + n
            slug = f"mem/s/{n:04d}"
            gone = version == 3 and n % 10 == 0  # every tenth slug ends as a tombstone
            # 30 events per second: page boundaries (50) fall inside a second
            e = event_for(keys, slug, None if gone else f"v{version} of {n}", base + i // 30)
            events.append(e)
            if version == 3 and not gone:
                expected[slug] = e.id
    assert len(events) > MAX_PAGE
    relay = await archive(start_relay, relay, events)
    result = await mem(keys, [relay.url], "ls", "--json")
    rows = json.loads(ok(result))
    assert len(rows) == 1_350
    assert {r["slug"]: r["event_id"] for r in rows} == expected
    assert result.stderr == b""


async def test_relay_that_ignores_until_gets_the_truncation_warning() -> None:
    keys = Keys.fresh()
    now = int(time.time())
    page = [msgspec.to_builtins(event_for(keys, f"mem/p/{i}", "v", now - i)) for i in range(3)]

    async def ignores_until(ws: ServerConnection) -> None:
        async for raw in ws:
            msg = msgspec.json.decode(raw)
            if msg[0] == "REQ":
                for e in page:
                    await ws.send(msgspec.json.encode(["EVENT", msg[1], e]).decode())
                await ws.send(msgspec.json.encode(["EOSE", msg[1]]).decode())

    async with fake_relay(ignores_until) as url:
        result = await mem(keys, [url], "ls")
    assert len(ok(result).splitlines()) == 3
    assert b"ignores `until`" in result.stderr


async def test_tampered_and_undecryptable_events_are_counted(
    start_relay: Callable[..., RelayProcess],
) -> None:
    relay = start_relay()
    keys = Keys.fresh()
    good = event_for(keys, "mem/good", "fine", int(time.time()) - 10)
    await publish(relay.url, good)
    await publish(relay.url, corrupt_core(keys))  # signed, but encrypted under another key
    tampered = event_for(keys, "mem/t", "original", int(time.time()) - 5)
    forged = event_for(keys, "mem/t", "forged", tampered.created_at)
    tampered = msgspec.structs.replace(tampered, content=forged.content)  # id/sig no longer fit
    relay = await archive(start_relay, relay, [tampered])  # a relay would refuse it
    result = await mem(keys, [relay.url], "ls")
    assert ok(result) == f"mem/good\t{good.id}\t{good.created_at}\t-\t-\n"
    assert "2 events skipped: 1 bad signature, 1 undecryptable" in result.stderr.decode()
    as_json = await mem(keys, [relay.url], "ls", "--json")
    assert [r["event_id"] for r in json.loads(ok(as_json))] == [good.id]
    counts = json.loads(as_json.stderr)["report"]["skipped"]
    assert counts == {"total": 2, "bad signature": 1, "undecryptable": 1}
    refs = json.loads(ok(await mem(keys, [relay.url], "refs", "--json")))
    assert refs["skipped"] == {"total": 2, "bad signature": 1, "undecryptable": 1}
    found = json.loads(ok(await mem(keys, [relay.url], "search", "fine", "--json")))
    assert found["skipped"]["total"] == 2
    listing = await api(keys, [relay.url]).ls()
    assert listing.report.skipped == {"bad signature": 1, "undecryptable": 1}


# --- local search ---------------------------------------------------------------------


async def test_search_finds_a_word_only_present_in_plaintext(
    start_relay: Callable[..., RelayProcess],
) -> None:
    relay = start_relay()
    keys = Keys.fresh()
    memory = api(keys, [relay.url])
    await memory.set("notes/trip", "We flew to Zanzibar in May.\nThe hotel was fine.")
    await memory.set("zanzibar/plans", "nothing yet")
    await memory.set("notes/other", "unrelated text")
    await memory.set("core", "I remember trips, e.g. [[mem/notes/trip]].")
    raw = await connect_relay(relay.url, keys.agent_sk)
    try:
        stored = await raw.query({"kinds": [30174], "authors": [keys.agent]})
    finally:
        await raw.close()
    assert stored and not any("zanzibar" in msgspec.json.encode(e).decode().lower() for e in stored)

    text = ok(await mem(keys, [relay.url], "search", "ZANZIBAR"))
    rows = [line.split("\t") for line in text.splitlines()]
    assert [r[0] for r in rows] == ["mem/zanzibar/plans", "mem/notes/trip"]  # slug hit first
    assert "Zanzibar in May" in rows[1][1] and "\n" not in rows[1][1]
    assert rows[1][2].isdigit()
    one = json.loads(
        ok(await mem(keys, [relay.url], "search", "zan.*bar", "--regex", "--limit", "1", "--json"))
    )
    assert [m["slug"] for m in one["matches"]] == ["mem/zanzibar/plans"]
    assert ok(await mem(keys, [relay.url], "search", "absent-word")) == ""
    bad = await mem(keys, [relay.url], "search", "(", "--regex")
    assert bad.returncode == 1


# --- migration and backup; the NIP-AE vectors on a set ----------------------------------


def vector_keys() -> Keys:
    return Keys(SECKEY_A, SECKEY_O)


async def test_vectors_on_a_set_export_import_and_migrate(
    start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    a, b, fresh, later = start_relay(), start_relay(), start_relay(), start_relay()
    keys = vector_keys()
    assert keys.agent == AE["derived"]["pubkey_a"]
    events = ae_events()
    for e in events:
        await publish(a.url, e)
    for e in events[:2]:  # b saw only the first two: it is behind on mem/example and core
        await publish(b.url, e)
    expected = AE["expected_state_after_all_events"]
    relays = [a.url, b.url]
    listing = await mem(keys, relays, "ls", "--json")
    assert listed(ok(listing)) == expected["listing"]
    assert b.url in listing.stderr.decode() and "behind" in listing.stderr.decode()
    core = await mem(keys, relays, "get", "core")
    assert ok(core) == expected["core_profile"]
    assert (await mem(keys, relays, "get", "mem/example")).returncode == 1  # tombstoned

    backup = tmp_path / "memory.jsonl"
    exported = await mem(keys, relays, "export", str(backup))
    assert exported.returncode == 0, exported.stderr
    lines = backup.read_text().splitlines()
    assert len(lines) == 3  # heads: core, the note and mem/example's tombstone
    assert {json.loads(line)["id"] for line in lines} == {e.id for e in events[1:]}
    assert "meeting note" not in backup.read_text()  # ciphertext only

    imported = await mem(keys, [fresh.url], "import", str(backup))
    assert ok(imported).startswith(f"{fresh.url}\t3 republished")
    assert listed(ok(await mem(keys, [fresh.url], "ls", "--json"))) == expected["listing"]
    again = await mem(keys, [fresh.url], "import", str(backup))
    assert ok(again).startswith(f"{fresh.url}\t0 republished, 3 already there")

    migrated = await mem(keys, relays, "migrate", "--to", later.url)
    assert ok(migrated).startswith(f"{later.url}\t3 republished")
    assert ok(await mem(keys, [later.url], "get", "core")) == expected["core_profile"]
    assert ok(await mem(keys, relays, "migrate", "--to", later.url)).startswith(
        f"{later.url}\t0 republished"
    )


async def test_migrate_names_the_slugs_a_new_relay_does_not_keep(
    start_relay: Callable[..., RelayProcess],
) -> None:
    source = start_relay()
    keys = Keys.fresh()
    await api(keys, [source.url]).set("kept/nowhere", "value")

    async def forgetful(ws: ServerConnection) -> None:  # says OK, stores nothing
        async for raw in ws:
            msg = msgspec.json.decode(raw)
            if msg[0] == "EVENT":
                await ws.send(msgspec.json.encode(["OK", msg[1]["id"], True, ""]).decode())
            elif msg[0] == "REQ":
                await ws.send(msgspec.json.encode(["EOSE", msg[1]]).decode())
            else:  # NEG-OPEN: no NIP-77 here, as a relay that lacks it says
                await ws.send(msgspec.json.encode(["NOTICE", "unknown message"]).decode())

    async with fake_relay(forgetful) as url:
        result = await mem(keys, [source.url], "migrate", "--to", url)
    assert result.returncode == 2
    assert "mem/kept/nowhere" in result.stderr.decode()


def test_owner_reads_a_set_with_agent(start_relay: Callable[..., RelayProcess]) -> None:
    a, b = start_relay(), start_relay()
    keys = Keys.fresh()
    asyncio.run(api(keys, [a.url, b.url]).set("core", "profile"))
    env = clean_env(ENGRAM_PRIVATE_KEY=keys.owner_sk.hex(), ENGRAM_RELAY=f"{a.url},{b.url}")
    result = asyncio.run(engram_async("mem", "get", "core", "--agent", keys.agent, env=env))
    assert (result.returncode, result.stdout) == (0, b"profile")
    assert pubkey_of(keys.owner_sk) == keys.owner
