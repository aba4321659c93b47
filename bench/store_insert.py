"""Insert throughput of PostgresStore.save (group commit) vs single-row autocommit INSERTs.

    python -m bench.store_insert [--events 20000] [--baseline-events 2000]

Runs against a throw-away embedded PostgreSQL with its default, durable settings
(fsync on, synchronous_commit on), or against --database-url (a role that may CREATE
DATABASE). Each run gets a fresh database. Events are signed before the clock starts;
the figure is events acknowledged per second of wall time, including every commit.

Benchmarks are hard: numbers depend on the disk's fsync latency above all; compare
rows on one machine only.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import random
import shutil
import tempfile
import time
import uuid
from importlib.metadata import version
from pathlib import Path
from typing import Any

import asyncpg
import msgspec

from bench.results import machine
from engram.nip01 import Event, sign_event
from relay.config import Settings
from relay.store import SaveStatus
from relay.store import sqlwrite as q
from relay.store.embedded import quote_ident, start_server, with_database
from relay.store.pgwriter import Pending
from relay.store.postgres import PostgresStore
from relay.store.sqlwrite import encode_row

_COPY_COLUMNS = "tenant, id, pubkey, created_at, kind, d, owner, tagvals, content, raw, expires_at"
_TEMP = (
    "CREATE TEMP TABLE IF NOT EXISTS events_in (tenant text, id bytea, pubkey bytea,"
    " created_at int8, kind int4, d text, owner bytea, tagvals text, content text,"
    " raw bytea, expires_at int8, ord bigserial); TRUNCATE events_in"
)
# Stands in for the store's unnest() source, with the same columns (origin, words, ord).
_FROM_TEMP = (
    "SELECT t.tenant, t.id, t.pubkey, t.created_at, t.kind, t.d, t.owner, t.tagvals::text[],"
    " '', t.raw, t.expires_at, $1::text, to_tsvector('simple', t.content)"
    " FROM events_in t"
)
_SINGLE = (
    f"INSERT INTO events ({_COPY_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7,"
    " $8::text::text[], $9, $10, $11) ON CONFLICT (tenant, id) DO NOTHING"
)


class CopyStore(PostgresStore):
    """The alternative measured: COPY the batch into a temp table, INSERT ... SELECT."""

    async def _insert(self, conn: Any, sql: str, rows: list[Pending]) -> set[tuple[str, bytes]]:
        await conn.execute(_TEMP)
        records = [(p.tenant, *p.row) for p in rows]
        await conn.copy_records_to_table(
            "events_in", records=records, columns=_COPY_COLUMNS.split(", ")
        )
        stmt = sql.replace(q._UNNEST, _FROM_TEMP).replace("$12::text", "$1::text")  # origin
        return set(map(tuple, await conn.fetch(stmt, self.node_id)))


def make_events(n: int, addressable: int = 0) -> list[tuple[Event, bytes]]:
    """n signed events: kind 1 with a few tags, or kind 30000 over `addressable` d values."""
    rng = random.Random(1)
    keys = [rng.randbytes(32) for _ in range(50)]
    out = []
    for i in range(n):
        key = keys[i % len(keys)]
        if addressable:
            kind, tags = 30000, [["d", f"list-{rng.randrange(addressable)}"]]
        else:
            kind, tags = 1, [["e", rng.randbytes(32).hex()], ["t", "bench"]]
        content = rng.randbytes(rng.randint(50, 400)).hex()
        ev = sign_event(key, 1_700_000_000 + rng.randrange(100_000), kind, tags, content, bytes(32))
        out.append((ev, msgspec.json.encode(ev)))
    return out


async def fresh_database(server: str) -> str:
    name = "bench_" + uuid.uuid4().hex[:12]
    conn = await asyncpg.connect(server)
    await conn.execute(f"CREATE DATABASE {quote_ident(name)}")
    await conn.close()
    return with_database(server, name)


async def run_store(
    server: str, events: list[tuple[Event, bytes]], concurrency: int, cls: type[PostgresStore]
) -> tuple[float, dict[str, int]]:
    store = await cls.open(await fresh_database(server), Settings())
    it = iter(events)
    counts: dict[str, int] = {}

    async def client() -> None:
        for ev, raw in it:
            status = (await store.save(ev, raw)).status
            counts[status.value] = counts.get(status.value, 0) + 1

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - t0
    await store.close()
    assert SaveStatus.ERROR.value not in counts, counts
    return len(events) / elapsed, counts


async def run_single_row(server: str, events: list[tuple[Event, bytes]], conns: int) -> float:
    """Baseline: one autocommit INSERT (one round trip, one commit) per event."""
    dsn = await fresh_database(server)
    store = await PostgresStore.open(dsn, Settings())  # applies the schema
    await store.close()
    pool = await asyncpg.create_pool(dsn, min_size=conns, max_size=conns)
    it = iter(events)

    async def client() -> None:
        async with pool.acquire() as conn:
            for ev, raw in it:
                await conn.execute(_SINGLE, "default", *encode_row(ev, raw))

    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(conns)))
    elapsed = time.perf_counter() - t0
    await pool.close()
    return len(events) / elapsed


async def describe(server: str) -> str:
    conn = await asyncpg.connect(server)
    pg = await conn.fetchval("SHOW server_version")
    sync = await conn.fetchval("SHOW synchronous_commit")
    fsync = await conn.fetchval("SHOW fsync")
    await conn.close()
    return (
        f"{machine()}; Python {platform.python_version()};"
        f" asyncpg {version('asyncpg')}; PostgreSQL {pg} (fsync={fsync},"
        f" synchronous_commit={sync})"
    )


async def main(args: argparse.Namespace) -> None:
    server = args.database_url
    handle = tmp = None
    if server is None:
        tmp = Path(tempfile.mkdtemp(prefix="engram-bench-"))
        handle = start_server(tmp / "pgdata", cleanup_mode="delete")
        server = handle.get_uri()
    print(await describe(server))
    print(f"event loop: {type(asyncio.get_running_loop()).__module__}")
    t0 = time.perf_counter()
    regular = make_events(args.events)
    addressable = make_events(args.events, addressable=args.events // 10)
    print(f"signed {2 * args.events} events in {time.perf_counter() - t0:.1f} s\n")
    rows = []
    for name, cls in (("unnest", PostgresStore), ("copy", CopyStore)):
        if name == "copy" and not args.copy:
            continue
        rate, counts = await run_store(server, regular, args.concurrency, cls)
        rows.append((f"PostgresStore.save [{name}], kind 1", len(regular), rate, counts))
        rate, counts = await run_store(server, addressable, args.concurrency, cls)
        label = f"PostgresStore.save [{name}], kind 30000 ({args.events // 10} addresses)"
        rows.append((label, len(addressable), rate, counts))
    few = regular[: args.baseline_events]
    rows.append(
        ("single-row autocommit INSERT, 1 conn", len(few), await run_single_row(server, few, 1), {})
    )
    rows.append(
        (
            "single-row autocommit INSERT, 10 conns",
            len(few),
            await run_single_row(server, few, 10),
            {},
        )
    )
    print(f"{'workload':58} {'events':>7} {'rows/s':>9}  results")
    for label, n, rate, counts in rows:
        print(f"{label:58} {n:7d} {rate:9.0f}  {counts or ''}")
    if handle is not None and tmp is not None:
        handle.cleanup()  # stops the server, deletes pgdata
        shutil.rmtree(tmp, ignore_errors=True)


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--baseline-events", type=int, default=2_000)
    p.add_argument("--concurrency", type=int, default=1_000, help="concurrent saving tasks")
    p.add_argument("--copy", action="store_true", help="also measure the COPY variant")
    p.add_argument("--database-url", help="server URL instead of an embedded server")
    p.add_argument("--no-uvloop", action="store_true")
    args = p.parse_args()
    try:
        import uvloop
    except ImportError:
        uvloop = None
    if uvloop is not None and not args.no_uvloop:
        uvloop.run(main(args))
    else:
        asyncio.run(main(args))


if __name__ == "__main__":
    cli()
