"""NIP-77: reconcile two relays' stores of N events that differ by a fraction.

`python -m bench negentropy [--events 100000] [--diff 0.01]` starts an embedded
PostgreSQL and two relay processes (`engram serve`), each on its own database. Store A
gets N events, store B the same N minus half the difference plus as many of its own
(so each side holds diff/2 * N events the other lacks). The common events are written
straight through the store (PostgresStore.save: same rows as ingest, but with fake
signatures, so loading 2 x 100,000 events does not spend minutes signing); the
differing ones are real signed events, since the sync copies them through the relays.

Measured, each from the client's side over loopback websockets:
  reconcile    relay <-> relay through the client (engram sync's negentropy bridge)
  initiator    the client's own list of B against relay A (client <-> relay)
  sync both    reconcile, then copy both ways (`cli.commands.sync.sync_relays`)
and the relay's memory for one open session: its item columns (computed), and the
relay process's RSS growth with `--sessions` sessions held open at once.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import websockets

from bench.peers import Postgres, Running, start_engram
from engram.negentropy import Items, Negentropy
from engram.nip01 import Event, pubkey_of, sign_event

AUX = bytes(32)
BASE = 1_700_000_000


def _fake(i: int, pubkey: str) -> Event:
    """A well-formed event with a fake signature (stored directly, never relayed)."""
    eid = hashlib.sha256(b"negentropy-bench-%d" % i).hexdigest()
    return Event(
        id=eid,
        pubkey=pubkey,
        created_at=BASE + i // 3,  # three events per second: equal timestamps are common
        kind=1,
        tags=[],
        content=f"common {i}",
        sig="00" * 64,
    )


def _signed(key: bytes, i: int, side: str) -> Event:
    return sign_event(key, BASE + (i * 7919) % 40_000, 1, [], f"only on {side} {i}", AUX)


async def _load(db_url: str, events: list[Event]) -> float:
    from relay import wire
    from relay.config import Settings
    from relay.store.postgres import PostgresStore

    store = await PostgresStore.open(db_url, Settings(write_batch_max=2000))
    started = time.perf_counter()
    try:
        for k in range(0, len(events), 20_000):
            futures = [store.submit(e, wire.encode_event(e)) for e in events[k : k + 20_000]]
            results = await asyncio.gather(*futures)
            assert all(r.status.value == "stored" for r in results), results[0]
        await store._pool.execute("ANALYZE events")
    finally:
        await store.close()
    return time.perf_counter() - started


async def _initiator(url: str, items: Items) -> tuple[float, int, int, int]:
    neg = Negentropy(items, 200_000)
    started = time.perf_counter()
    async with websockets.connect(url, max_size=None) as ws:
        out: bytes | None = neg.initiate()
        verb, rounds, have, need = "NEG-OPEN", 0, 0, 0
        while out is not None:
            frame = ["NEG-OPEN", "b", {}, out.hex()] if verb == "NEG-OPEN" else None
            await ws.send(msgspec.json.encode(frame or ["NEG-MSG", "b", out.hex()]).decode())
            verb = "NEG-MSG"
            msg = msgspec.json.decode(await ws.recv())
            assert msg[0] == "NEG-MSG", msg
            rounds += 1
            out, h, n = neg.reconcile_initiator(bytes.fromhex(msg[2]))
            have += len(h)
            need += len(n)
    return time.perf_counter() - started, rounds, have, need


async def _sessions_rss(url: str, pid: int, sessions: int) -> tuple[int, int]:
    """RSS of the relay before and while `sessions` sessions over the whole set are open."""
    import psutil

    proc = psutil.Process(pid)
    empty = Negentropy(Items.from_pairs([])).initiate().hex()
    async with websockets.connect(url, max_size=None) as ws:
        before = proc.memory_info().rss
        for s in range(sessions):
            await ws.send(msgspec.json.encode(["NEG-OPEN", f"m{s}", {}, empty]).decode())
            while True:
                msg = msgspec.json.decode(await ws.recv())
                if msg[0] in ("NEG-MSG", "NEG-ERR") and msg[1] == f"m{s}":
                    break
            assert msg[0] == "NEG-MSG", msg
        during = proc.memory_info().rss
    return before, during


Sides = tuple[list[Event], list[Event], list[Event]]  # common, only on A, only on B


def _sides(n: int, half: int) -> Sides:
    ka, kb = hashlib.sha256(b"bench-a").digest(), hashlib.sha256(b"bench-b").digest()
    common_key = pubkey_of(hashlib.sha256(b"bench-common").digest())
    print(f"building {n} events per store, {half} on each side only ...", flush=True)
    common = [_fake(i, common_key) for i in range(n - half)]
    only_a = [_signed(ka, i, "a") for i in range(half)]
    only_b = [_signed(kb, i, "b") for i in range(half)]
    return common, only_a, only_b


def _build_stores(pg: Postgres, sides: Sides, drops: list[Any]) -> list[str]:
    """Store A: the common events and A's own; store B: the common ones and B's own.
    Returns their database URLs."""
    common, only_a, only_b = sides
    urls = []
    for name, events in (("a", common + only_a), ("b", common + only_b)):
        url, drop = pg.create_database()
        drops.append(drop)
        took = asyncio.run(_load(url, events))
        print(f"  store {name}: {len(events)} events loaded in {took:.1f} s", flush=True)
        urls.append(url)
    return urls


def _time_bridge(nodes: list[Running], half: int) -> None:
    """`engram sync`'s negentropy bridge between the two relays, twice: time, rounds,
    and the CPU of the client and of each relay."""
    import psutil

    from cli.commands.sync import Peer, reconcile
    from cli.nostr.client import fetch_nip11, open_relay

    a, b = nodes
    relays = [psutil.Process(node.pid) for node in nodes]

    async def bridge() -> tuple[float, int, int, int]:
        docs = [await fetch_nip11(node.url, 10) for node in nodes]
        started = time.perf_counter()
        async with open_relay(a.url) as ca, open_relay(b.url) as cb:
            rec = await reconcile(Peer(ca, None, docs[0]), Peer(cb, None, docs[1]), {})
        took = time.perf_counter() - started
        return took, rec.rounds, len(rec.only_a), len(rec.only_b)

    for label in ("reconcile relay<->relay (bridge)", "reconcile relay<->relay, again"):
        cpu = [sum(p.cpu_times()[:2]) for p in relays]
        mine = time.process_time()
        took, rounds, oa, ob = asyncio.run(bridge())
        mine = time.process_time() - mine
        cpu = [sum(p.cpu_times()[:2]) - c for p, c in zip(relays, cpu, strict=True)]
        assert (oa, ob) == (half, half), (oa, ob)
        print(
            f"  {label:<42} {took:6.2f} s  {rounds} messages, {oa} + {ob} found; CPU s:"
            f" client {mine:.2f}, relay A {cpu[0]:.2f}, relay B {cpu[1]:.2f}"
        )


def _time_client(a: Running, sides: Sides, half: int) -> None:
    """The client's own list of B against relay A (client <-> relay)."""
    common, _, only_b = sides
    items_b = Items.from_pairs((e.created_at, bytes.fromhex(e.id)) for e in common + only_b)
    took, rounds, have, need = asyncio.run(_initiator(a.url, items_b))
    assert (have, need) == (half, half), (have, need)
    print(f"  {'reconcile client list<->relay A':<42} {took:6.2f} s  {rounds} rounds")


def _session_memory(a: Running, sides: Sides, n: int, sessions: int) -> None:
    """One session's item columns (computed) and relay A's RSS growth with `sessions`
    sessions held open at once."""
    common, only_a, _ = sides
    before, during = asyncio.run(_sessions_rss(a.url, a.pid, sessions))
    per_items = Items.from_pairs(
        (e.created_at, bytes.fromhex(e.id)) for e in common + only_a
    ).nbytes()
    print(
        f"  relay memory per session: {per_items / 1e6:.1f} MB of item columns "
        f"({per_items / n:.0f} B/event); RSS {before / 1e6:.0f} -> {during / 1e6:.0f} MB "
        f"with {sessions} sessions open ({(during - before) / sessions / 1e6:.1f}"
        " MB each)"
    )


def _time_sync(a: Running, b: Running) -> None:
    """`cli.commands.sync.sync_relays` both ways: reconcile and copy, then again (nothing to do)."""
    from cli.commands.sync import sync_relays

    started = time.perf_counter()
    summary = asyncio.run(sync_relays(a.url, b.url, {}, "both"))
    took = time.perf_counter() - started
    print(
        f"  {'sync both (reconcile + copy)':<42} {took:6.2f} s  "
        f"copied {summary.copied_up} up, {summary.copied_down} down, "
        f"refused {dict(summary.refused) or 'none'}"
    )
    started = time.perf_counter()
    again = asyncio.run(sync_relays(a.url, b.url, {}, "both"))
    took = time.perf_counter() - started
    print(f"  {'sync both again (nothing to do)':<42} {took:6.2f} s  have {again.have}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench negentropy", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="events per store")
    parser.add_argument("--diff", type=float, default=0.01, help="fraction that differs")
    parser.add_argument("--sessions", type=int, default=4, help="sessions held for the RSS")
    args = parser.parse_args(argv)

    n = args.events
    half = max(1, int(n * args.diff / 2))
    workdir = Path(tempfile.mkdtemp(prefix="engram-negentropy-"))
    pg = Postgres(workdir)
    nodes: list[Running] = []
    drops: list[Any] = []
    try:
        sides = _sides(n, half)
        urls = _build_stores(pg, sides, drops)
        env = {
            "ENGRAM_LOG_LEVEL": "warning",
            "ENGRAM_NEGENTROPY_MAX_SESSIONS": str(max(4, args.sessions)),
        }
        for name, url in zip("ab", urls, strict=True):
            nodes.append(start_engram(workdir / name, ["--database-url", url], env))
        a, b = nodes
        print(f"{pg.settings()}; 2 relay processes on loopback")
        _time_bridge(nodes, half)
        _time_client(a, sides, half)
        _session_memory(a, sides, n, args.sessions)
        _time_sync(a, b)
        return 0
    finally:
        for node in nodes:
            node.stop()
        for drop in drops:
            try:
                drop()
            except Exception as exc:  # the server goes away with the workdir anyway
                print(f"(drop failed: {exc})", file=sys.stderr)
        pg.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
