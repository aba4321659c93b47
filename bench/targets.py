"""Where `bench scale` and `bench flood` send their load and their REQs: a relay through
its websocket (`RelayTarget`), or the store API in this process (`StoreTarget`, `bench
scale --via store`). Both load a chunk of cached events and time one REQ at a time."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec

from bench import wsclient
from bench.asker import Asker
from bench.events import EventSet
from bench.procwatch import Watch
from bench.scalereport import ChunkLoad
from bench.workload import Profile, ingest_phase

_enc = msgspec.json.encode


class RelayTarget:
    """`engram serve` on loopback: EVENTs and REQs through its websocket."""

    def __init__(self, url: str, pid: int, pg_pid: int | None) -> None:
        self.url = url
        self.watch = Watch(pid, pg_pid)
        self.asker = Asker()
        self.profile = Profile(connections=8, window=100, phase_timeout=3600.0)

    async def load(self, start: int, end: int, events: EventSet) -> ChunkLoad:
        r = await ingest_phase(f"load {start}-{end}", self.url, events, self.profile, self.watch)
        cpu = None if r.relay_cpu is None else r.relay_cpu + (r.pg_cpu or 0.0)
        return ChunkLoad(start, end, r.elapsed, cpu, r.errors)

    def cpu(self) -> float:
        relay, pg, _ = self.watch.snapshot()
        return (relay or 0.0) + (pg or 0.0)

    def prepare(self, runs: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
        out = []
        for sub, verb, f in runs:
            close = wsclient.client_frame(_enc(["CLOSE", sub])) if verb == "REQ" else None
            out.append((sub, wsclient.client_frame(_enc([verb, sub, f])), close))
        return out

    async def ask(self, prepared: Any) -> tuple[float, str]:
        if self.asker.conn is None or self.asker.conn.closed:
            self.asker = Asker()
            await self.asker.open(self.url)
        return await self.asker.ask(*prepared)

    def returned(self) -> int:
        return self.asker.returned

    async def close(self) -> None:
        if self.asker.conn is not None:
            self.asker.conn.close()


class StoreTarget:
    """PostgresStore in this process (`--via store`): the store's cost without the relay."""

    def __init__(self, store: Any, pg_pid: int | None) -> None:
        self.store = store
        self.pg_pid = pg_pid
        self.got = 0

    async def load(self, start: int, end: int, events: EventSet) -> ChunkLoad:
        from engram.nip01 import Event
        from relay.store import SaveStatus

        decoded = [msgspec.json.decode(raw, type=Event) for raw in events.raw]
        c0, t0 = self.cpu(), time.perf_counter()
        futures = [self.store.submit(ev, raw) for ev, raw in zip(decoded, events.raw, strict=True)]
        results = await asyncio.gather(*futures)
        wall, cpu = time.perf_counter() - t0, self.cpu() - c0
        errors = Counter(r.message for r in results if r.status is SaveStatus.ERROR)
        return ChunkLoad(start, end, wall, cpu, errors)

    def cpu(self) -> float:
        return time.process_time() + (Watch.tree_cpu(self.pg_pid) or 0.0)

    def prepare(self, runs: list[tuple[str, str, dict[str, Any]]]) -> list[Any]:
        from relay.config import Limits
        from relay.filters import parse_filter

        return [(verb, [parse_filter(f, Limits())]) for _, verb, f in runs]

    async def ask(self, prepared: Any) -> tuple[float, str]:
        from relay.store import StoreError

        verb, filters = prepared
        t0 = time.perf_counter()
        try:
            if verb == "COUNT":
                await self.store.count(filters)
            else:
                self.got += len(await self.store.query(filters))
            outcome = "EOSE" if verb == "REQ" else "COUNT"
        except StoreError as exc:
            outcome = f"CLOSED {exc}"
        return time.perf_counter() - t0, outcome

    def returned(self) -> int:
        return self.got

    async def close(self) -> None:
        await self.store.close()


async def load_chunk(
    target: RelayTarget | StoreTarget,
    corpus: str,
    start: int,
    end: int,
    events: EventSet,
    t_load: float,
    say: Callable[[str], None],
) -> ChunkLoad:
    """Send one cached chunk to the store, saying its rate and CPU per EVENT."""
    chunk = await target.load(start, end, events)
    per = chunk.cpu / chunk.events * 1e6 if chunk.cpu is not None else float("nan")
    say(
        f"  {corpus}: loaded {end:,} ({chunk.events / chunk.wall:,.0f} ev/s,"
        f" {per:.0f} us CPU/event, {time.perf_counter() - t_load:.0f} s)"
    )
    for why, n in chunk.errors.most_common(3):
        say(f"    refused x{n}: {why}")
    return chunk
