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
  sync both    reconcile, then copy both ways (`cli.sync.sync_relays`)
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
        await ws.recv()
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
        await ws.recv()
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench negentropy", description=__doc__)
    parser.add_argument("--events", type=int, default=100_000, help="events per store")
    parser.add_argument("--diff", type=float, default=0.01, help="fraction that differs")
    parser.add_argument("--sessions", type=int, default=4, help="sessions held for the RSS")
    args = parser.parse_args(argv)
    from cli.sync import sync_relays

    n = args.events
    half = max(1, int(n * args.diff / 2))
    workdir = Path(tempfile.mkdtemp(prefix="engram-negentropy-"))
    pg = Postgres(workdir)
    nodes: list[Running] = []
    drops = []
    try:
        ka, kb = hashlib.sha256(b"bench-a").digest(), hashlib.sha256(b"bench-b").digest()
        common_key = pubkey_of(hashlib.sha256(b"bench-common").digest())
        print(f"building {n} events per store, {half} on each side only ...", flush=True)
        common = [_fake(i, common_key) for i in range(n - half)]
        only_a = [_signed(ka, i, "a") for i in range(half)]
        only_b = [_signed(kb, i, "b") for i in range(half)]
        urls = []
        for name, events in (("a", common + only_a), ("b", common + only_b)):
            url, drop = pg.create_database()
            drops.append(drop)
            took = asyncio.run(_load(url, events))
            print(f"  store {name}: {len(events)} events loaded in {took:.1f} s", flush=True)
            urls.append(url)
        env = {
            "ENGRAM_LOG_LEVEL": "warning",
            "ENGRAM_NEGENTROPY_MAX_SESSIONS": str(max(4, args.sessions)),
        }
        for name, url in zip("ab", urls, strict=True):
            nodes.append(start_engram(workdir / name, ["--database-url", url], env))
        a, b = nodes
        print(f"{pg.settings()}; 2 relay processes on loopback")

        import psutil

        from cli.client import fetch_nip11, open_relay
        from cli.sync import Peer, reconcile

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
        items_b = Items.from_pairs((e.created_at, bytes.fromhex(e.id)) for e in common + only_b)
        took, rounds, have, need = asyncio.run(_initiator(a.url, items_b))
        assert (have, need) == (half, half), (have, need)
        print(f"  {'reconcile client list<->relay A':<42} {took:6.2f} s  {rounds} rounds")

        before, during = asyncio.run(_sessions_rss(a.url, a.pid, args.sessions))
        per_items = Items.from_pairs(
            (e.created_at, bytes.fromhex(e.id)) for e in common + only_a
        ).nbytes()
        print(
            f"  relay memory per session: {per_items / 1e6:.1f} MB of item columns "
            f"({per_items / n:.0f} B/event); RSS {before / 1e6:.0f} -> {during / 1e6:.0f} MB "
            f"with {args.sessions} sessions open ({(during - before) / args.sessions / 1e6:.1f}"
            " MB each)"
        )

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
