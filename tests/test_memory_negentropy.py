"""Agent memory sync and migration over NIP-77 (issues 13 and 15): the client reconciles
what it has read against each relay that serves negentropy, so only the heads a relay
lacks are published there (exactly as signed); relays that do not serve it are paged
with REQ. Real relays of ours, one with negentropy turned off, and nostr-sdk's LocalRelay.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import websockets
from cli_support import Keys, fake_relay
from relay_fixtures import RelayProcess, free_port, proxied_env
from test_memory_sets import api, event_for, local_relay, mem, ok, put
from websockets.asyncio.server import ServerConnection

from engram.nip01 import Event


def history(keys: Keys, n: int) -> tuple[list[Event], list[Event]]:
    """`n` memories, each with an older version: (every event, the heads)."""
    now = int(time.time()) - 2_000
    old = [event_for(keys, f"mem/h/{i}", f"old {i}", now + i) for i in range(n)]
    new = [event_for(keys, f"mem/h/{i}", f"new {i}", now + 500 + i) for i in range(n)]
    return old + new, new


async def held_heads(keys: Keys, url: str) -> dict[str, str]:
    """slug -> head event id, as that relay alone lists them."""
    listing = await api(keys, [url]).ls()
    return {e.slug: e.event_id for e in listing.entries}


async def test_sync_repairs_relays_via_negentropy_and_is_idempotent(
    start_relay: Callable[..., RelayProcess],
) -> None:
    a, b, c = start_relay(), start_relay(), start_relay()
    keys = Keys.fresh()
    events, heads = history(keys, 12)
    await put(a.url, events, keys.agent_sk)
    await put(b.url, events[:12] + heads[:3], keys.agent_sk)  # b: old versions, 3 heads
    newer = event_for(keys, "mem/h/0", "newest", int(time.time()) - 10)
    await put(b.url, [newer], keys.agent_sk)  # and the newest head of one slug, b only
    relays = [a.url, b.url, c.url]  # c holds nothing

    out = json.loads(ok(await mem(keys, relays, "sync", "--json")))
    rows = out["relays"]
    assert out["heads"] == 12
    assert rows[a.url]["method"] == "req"  # the memory is read (decrypted) from one relay
    assert rows[b.url]["method"] == rows[c.url]["method"] == "negentropy"
    assert (rows[a.url]["published"], rows[a.url]["up_to_date"]) == (1, 11)
    assert (rows[b.url]["published"], rows[b.url]["up_to_date"]) == (9, 3)
    assert (rows[c.url]["published"], rows[c.url]["up_to_date"]) == (12, 0)
    assert all(r["refused"] == {} and r["error"] is None for r in rows.values())
    want = {f"mem/h/{i}": e.id for i, e in enumerate(heads)} | {"mem/h/0": newer.id}
    for url in relays:  # each relay alone now holds every head, the very same events
        assert await held_heads(keys, url) == want, url

    again = json.loads(ok(await mem(keys, relays, "sync", "--json")))["relays"]
    assert {u: (r["published"], r["up_to_date"]) for u, r in again.items()} == {
        u: (0, 12) for u in relays
    }
    assert [again[u]["method"] for u in relays] == ["req", "negentropy", "negentropy"]
    text = ok(await mem(keys, relays, "sync")).splitlines()
    assert f"{c.url}\t0 republished, 12 already there (via negentropy)" in text


async def test_migrate_to_a_fresh_relay_via_negentropy(
    start_relay: Callable[..., RelayProcess],
) -> None:
    source, fresh = start_relay(), start_relay()
    keys = Keys.fresh()
    events, heads = history(keys, 30)
    await put(source.url, events, keys.agent_sk)
    memory = api(keys, [source.url])
    core = await memory.set("core", "I am the agent.")

    moved = await memory.migrate(fresh.url)
    assert moved.ok and moved.heads == 31 and moved.missing == {fresh.url: []}
    target = moved.targets[fresh.url]
    # 31 heads and core's version (kind 4174): every version goes to every relay
    assert (target.method, target.published, target.up_to_date) == ("negentropy", 32, 0)
    want = {f"mem/h/{i}": e.id for i, e in enumerate(heads)}
    assert await held_heads(keys, fresh.url) == want  # heads only, as signed
    assert (await api(keys, [fresh.url]).get("core")).event_id == core.event_id

    again = json.loads(ok(await mem(keys, [source.url], "migrate", "--to", fresh.url, "--json")))
    row = again["relays"][fresh.url]
    assert (row["method"], row["published"], row["up_to_date"]) == ("negentropy", 0, 32)
    assert again["missing"] == {fresh.url: []}


def notice_proxy(upstream: str) -> Callable[[ServerConnection], Awaitable[None]]:
    """A relay behind a proxy that does not know NEG-* frames: it answers them with a
    NOTICE, as relays do for an unknown verb, and publishes no NIP-11 document."""

    async def proxy(ws: ServerConnection) -> None:
        async with websockets.connect(upstream, max_size=None) as up:

            async def client_to_relay() -> None:
                async for frame in ws:
                    if str(frame).startswith('["NEG-'):
                        await ws.send('["NOTICE","invalid: unknown message type"]')
                    else:
                        await up.send(frame)

            async def relay_to_client() -> None:
                async for frame in up:
                    await ws.send(frame)

            pumps = [asyncio.ensure_future(p()) for p in (client_to_relay, relay_to_client)]
            _, pending = await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            for task in pending:
                task.cancel()

    return proxy


async def test_falls_back_to_req_without_negentropy_and_works_with_local_relay(
    start_relay: Callable[..., RelayProcess], tmp_path: Path
) -> None:
    # negentropy off: NEG-OPEN is refused (and, where NIP-11 says so, not even tried)
    plain = start_relay(env={"ENGRAM_NEGENTROPY_MAX_SESSIONS": "0", "ENGRAM_LIMITS_MAX_LIMIT": "7"})
    proxy_port = free_port()  # hidden's public URLs: its own and its proxy's
    ours, hidden = start_relay(), start_relay(env=proxied_env(proxy_port))
    keys = Keys.fresh()
    events, heads = history(keys, 20)
    await put(plain.url, events, keys.agent_sk)
    with local_relay(tmp_path) as sdk:
        async with fake_relay(notice_proxy(hidden.url), proxy_port) as proxied:
            relays = [plain.url, ours.url, proxied, sdk]
            synced = await api(keys, relays).sync()
            assert synced.ok and synced.heads == 20
            methods = {u: r.method for u, r in synced.relays.items()}
            assert methods == {
                plain.url: "req",
                ours.url: "negentropy",
                proxied: "req",  # tried, answered with a NOTICE: paged instead
                sdk: "negentropy",
            }
            for url in relays[1:]:
                assert synced.relays[url].published == 20, url
            want = {f"mem/h/{i}": e.id for i, e in enumerate(heads)}
            for url in relays:
                assert await held_heads(keys, url) == want, url

            again = await api(keys, relays).sync()
            assert {u: (r.published, r.up_to_date) for u, r in again.relays.items()} == {
                u: (0, 20) for u in relays
            }
            assert {u: r.method for u, r in again.relays.items()} == methods
