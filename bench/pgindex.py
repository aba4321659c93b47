"""`python -m bench pgindex`: PostgreSQL CPU per stored event, index by index.

Ingests the same signed events (the `compare` kind-1 or engram scenario) through
`PostgresStore.submit` (the relay's group-commit writer, fsync'd commits, 800 in flight)
into a fresh database per run, once with the schema as shipped and once with each index
of `events` removed or changed in turn. Variants are interleaved round by round, so a
busy moment of the machine hits all of them alike. The figure is the CPU of every
PostgreSQL process (backends, WAL writer, checkpointer) from the first submit until two
seconds after the last commit, plus a `VACUUM events` then, per event. Autovacuum is off
for the table during a run: whether its ANALYZE (about 1.4 s of CPU at 40,000 events)
fell inside a run decided the figure more than any index did (one schema measured 63-97
us in three rounds). The VACUUM stands in for its other work, such as flushing the GIN
indexes' pending lists. "cost" is what the index adds (the shipped schema minus the
variant without it); "ingest only" leaves the VACUUM out.

This is how the PostgreSQL share of CPU per EVENT in `compare` is explained: which
index costs what, and what a change to it would save. Relay CPU is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import msgspec

from bench.events import Keyring, load_events
from bench.procwatch import Watch
from bench.results import machine, write_results
from engram.nip01 import Event
from relay.config import Settings
from relay.store import SaveStatus
from relay.store.postgres import PostgresStore

IN_FLIGHT = 800
SETTLE_SECONDS = 2.0

# variant -> SQL run after the migrations (the shipped schema is "as shipped")
_NO_TAG_TABLE = [
    "DROP TRIGGER event_tags_insert ON events",
    "DROP TRIGGER event_tags_update ON events",
    "DROP TRIGGER event_tags_delete ON events",
]
VARIANTS: dict[str, list[str]] = {
    "as shipped": [],
    "without events_words": ["DROP INDEX events_words"],
    "without event_tags (triggers)": _NO_TAG_TABLE,
    "with the old tagvals GIN instead": [
        *_NO_TAG_TABLE,
        "CREATE INDEX events_tagvals ON events USING gin (tagvals)",
    ],
    "without the replace trigger": ["DROP TRIGGER event_tags_update ON events"],
    "without the NIP-62 checks": [
        "DROP TABLE vanished CASCADE",
        "CREATE TABLE vanished (tenant text, pubkey bytea, until int8, ptag text)",
    ],
    "without events_xid": ["DROP INDEX events_xid"],
    "without events_time": ["DROP INDEX events_time"],
    "without events_kind_time": ["DROP INDEX events_kind_time"],
    "without events_author_time": ["DROP INDEX events_author_time"],
    "search index, fastupdate off": ["ALTER INDEX events_words SET (fastupdate = off)"],
    "search index, 16 MB pending list": [
        "ALTER INDEX events_words SET (gin_pending_list_limit = 16384)"
    ],
    "primary key and address only": [
        *_NO_TAG_TABLE,
        *(
            f"DROP INDEX {name}"
            for name in (
                "events_words",
                "events_xid",
                "events_time",
                "events_kind_time",
                "events_author_time",
            )
        ),
    ],
}


async def ingest(
    pg_pid: int, dsn: str, sql: list[str], events: list[tuple[Event, bytes]]
) -> tuple[float, float]:
    """PostgreSQL CPU seconds to store `events` into a fresh database changed by `sql`:
    (ingest only, ingest plus the VACUUM that settles deferred index work)."""
    store = await PostgresStore.open(dsn, Settings())
    try:
        async with store._pool.acquire() as conn:
            # autovacuum's ANALYZE (to_tsvector over a 30,000-row sample, ~1.4 s) would
            # land in some runs and not others; the VACUUM at the end stands in for the rest
            await conn.execute("ALTER TABLE events SET (autovacuum_enabled = off)")
            for statement in sql:
                await conn.execute(statement)
            await conn.execute("CHECKPOINT")
        gate = asyncio.Semaphore(IN_FLIGHT)

        async def one(event: Event, raw: bytes) -> None:
            async with gate:
                result = await store.save(event, raw)
            # STALE: an engram whose newer version committed first (several writers)
            if result.status not in (SaveStatus.STORED, SaveStatus.STALE):
                raise RuntimeError(f"not stored: {result}")

        c0 = Watch.tree_cpu(pg_pid) or 0.0
        await asyncio.gather(*(one(e, r) for e, r in events))
        await asyncio.sleep(SETTLE_SECONDS)
        c1 = Watch.tree_cpu(pg_pid) or 0.0
        async with store._pool.acquire() as conn:
            await conn.execute("VACUUM events")
        return c1 - c0, (Watch.tree_cpu(pg_pid) or 0.0) - c0
    finally:
        await store.close()


def run(args: argparse.Namespace) -> str:
    from bench.peers import Postgres

    names = list(VARIANTS) if not args.variants else args.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    if names[0] != "as shipped":
        names.insert(0, "as shipped")
    keys = Keyring(args.seed)
    raws = load_events(args.scenario, args.events, keys).raw
    events = [(msgspec.json.decode(r, type=Event), r) for r in raws]
    root = Path(tempfile.mkdtemp(prefix="engram-bench-pgindex-"))
    pg = Postgres(root)
    samples: dict[str, list[float]] = {n: [] for n in names}
    only: dict[str, list[float]] = {n: [] for n in names}
    started = dt.datetime.now(dt.UTC)
    try:
        for r in range(args.rounds):
            for name in names:
                dsn, drop = pg.create_database()
                try:
                    cpu = asyncio.run(ingest(pg.pid or 0, dsn, VARIANTS[name], events))
                finally:
                    drop()
                only[name].append(cpu[0] / len(events) * 1e6)
                samples[name].append(cpu[1] / len(events) * 1e6)
                print(
                    f"round {r + 1} {name}: {samples[name][-1]:.1f} us/event"
                    f" ({only[name][-1]:.1f} before the VACUUM)",
                    flush=True,
                )
    finally:
        pg.close()
        shutil.rmtree(root, ignore_errors=True)
    base = statistics.median(samples["as shipped"])
    lines = [
        f"`python -m bench pgindex --scenario {args.scenario} --events {args.events}"
        f" --rounds {args.rounds}`, {started:%Y-%m-%d %H:%M} UTC, {machine()}",
        "",
        "| schema | PostgreSQL us/event, median | per round | cost of the index"
        " | ingest only, median (per round) |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        med = statistics.median(samples[name])
        rounds = " / ".join(f"{v:.1f}" for v in samples[name])
        cost = "" if name == "as shipped" else f"{base - med:+.1f}"
        ingest_only = " / ".join(f"{v:.1f}" for v in only[name])
        lines.append(
            f"| {name} | {med:.1f} | {rounds} | {cost}"
            f" | {statistics.median(only[name]):.1f} ({ingest_only}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench pgindex",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scenario", choices=("kind1", "engram"), default="kind1")
    p.add_argument("--events", type=int, default=40_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--variants", help="comma-separated subset (default: all)")
    p.add_argument("--results", type=Path, help="write the table into this markdown file")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    text = run(args)
    print(f"\n{text}\n\n({time.perf_counter() - t0:.0f} s)")
    if args.results:
        marker = f"pgindex-{args.scenario}"  # one generated block per scenario
        write_results(args.results, text, f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->")
    return 0
