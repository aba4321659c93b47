"""The pre-filled store's library (issue 47): a kept store of N events, filled once and
copied for every run, so ingest is measured on a big table, not an empty one. Used by
`bench compare --prefill N` and by the `python -m bench prefill` command (bench/prefill.py).
one ahead of a run (or to serve a copy for `bench load`).

What is in it: the first N events of a `bench scale` corpus (bench/corpus.py; realistic by
default), signed once and cached (a cached scale corpus with a store size of N is reused),
sent through the websocket of `engram serve` from the checkout being measured
(`bench.peers.relay_root()`: ENGRAM_BENCH_RELAY_ROOT, so its own schema and code wrote
it), 8 connections with queued frames joined into one write (the fill is not measured),
then VACUUM ANALYZE and a CHECKPOINT.

Where: the database `prefill` of an embedded PostgreSQL whose data directory is kept under
$ENGRAM_BENCH_HOME/prefill/<corpus>-s<seed>-n<size>-m<schema>/ (~/.cache/engram-bench by
default); <schema> hashes that checkout's migrations, so a checkout with another schema
fills a store of its own. `filled.json` marks a finished fill; a fill that was cut short
is started over. Filling 1M events takes a few minutes and ~3 GB; 10M about half an
hour and ~19 GB, plus as much again for the copy each run makes.

How a run uses it: each start of ours gets a copy (CREATE DATABASE ... TEMPLATE prefill
STRATEGY FILE_COPY: the same rows, statistics and visibility map, copied before any clock
starts), dropped after the run, so every round and every run starts from the same store.
The peers (in memory, or on a schema of their own) start empty.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import hashlib
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from bench import corpus
from bench.lanes import run_async
from bench.peers import PeerError, Postgres, home, relay_root, start_engram
from bench.procwatch import Watch
from bench.served import vacuum_analyze
from bench.workload import Profile, ingest_phase

TEMPLATE = "prefill"  # the filled database, copied for every run
MARKER = "filled.json"
# the fill: 8 connections, queued frames joined into one write (not measured: quickest)
FILL = Profile(connections=8, window=200, client="pipelined")
FILL_RATE = 200  # EVENTs/s below which a chunk of the fill times out (a stuck relay)


@dataclass
class Filled:
    """What a kept store holds and how it was made (its `filled.json`)."""

    corpus: str
    seed: int
    size: int  # events sent
    rows: int  # rows of `events` after the fill (replaced versions are not kept)
    schema: str
    relay_root: str
    seconds: float
    date: str
    refused: dict[str, int]  # always empty: a fill with refusals is not kept
    directory: str = ""

    def describe(self) -> str:
        return (
            f"ours starts from a copy of {self.rows:,} stored events (the first {self.size:,}"
            f" of the {self.corpus} corpus, seed {self.seed}), filled through `engram serve`"
            f" of {self.relay_root} in {self.seconds:.0f} s on {self.date}; kept in"
            f" {self.directory}; the peers start empty"
        )


def schema_key(root: Path) -> str:
    """A hash of the checkout's migrations (names and text): its stores' schema."""
    h = hashlib.sha256()
    for path in sorted((root / "migrations").glob("*.sql")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:12]


def store_dir(name: str, seed: int, size: int, root: Path) -> Path:
    return home() / "prefill" / f"{name}-s{seed}-n{size}-m{schema_key(root)}"


def read_marker(directory: Path) -> Filled | None:
    with contextlib.suppress(OSError, ValueError, TypeError):
        data = json.loads((directory / MARKER).read_text())
        return Filled(**{**data, "directory": str(directory)})
    return None


def open_store(
    name: str, seed: int, size: int, say: Callable[[str], None] = print
) -> tuple[Postgres, Filled]:
    """The kept store of `size` events for the relay under test, filled first when
    missing; its server runs (stopped by `close()`) and `pg.template` names the filled
    database, which `bench.peers` copies for each start of ours."""
    root = relay_root()
    directory = store_dir(name, seed, size, root)
    directory.mkdir(parents=True, exist_ok=True)
    pg = Postgres(directory, cleanup_mode="stop")
    try:
        filled = read_marker(directory)
        if filled is None:
            say(f"prefill: filling {directory} with {size:,} {name} events (kept for reuse)")
            filled = fill(pg, directory, name, seed, size, root, say)
        else:
            say(f"prefill: reusing {directory} ({filled.rows:,} rows, filled {filled.date})")
    except BaseException:
        pg.close()
        raise
    pg.template = TEMPLATE
    return pg, filled


def fill(
    pg: Postgres,
    directory: Path,
    name: str,
    seed: int,
    size: int,
    root: Path,
    say: Callable[[str], None],
) -> Filled:
    """Fill the database TEMPLATE through the relay, seal it, write the marker."""
    from relay.store.embedded import with_database

    prepared = corpus.cached(name, seed, size) or corpus.prepare(name, seed, [size], say=say)
    run_async(_recreate(pg.uri))
    dsn = with_database(pg.uri, TEMPLATE)
    t0 = time.monotonic()
    relay = start_engram(directory / "fill-relay", ["--database-url", dsn])
    refused: Counter[str] = Counter()
    try:
        watch = Watch(relay.pid, pg.pid)
        for start, end, events in prepared.chunks(upto=size):
            profile = replace(FILL, phase_timeout=max(120.0, (end - start) / FILL_RATE))
            r = run_async(ingest_phase(f"fill {start}-{end}", relay.url, events, profile, watch))
            refused.update(r.errors)
            say(
                f"  prefill: {end:,} of {size:,} sent"
                f" ({(end - start) / max(r.elapsed, 1e-9):,.0f} ev/s,"
                f" {time.monotonic() - t0:.0f} s)"
            )
    finally:
        relay.stop()
    if refused:  # not a store to measure on: filled again next time
        why = "; ".join(f"x{n}: {w}" for w, n in refused.most_common(3))
        raise PeerError(f"prefill: {refused.total()} EVENTs refused ({why}): {relay.log_tail(3)}")
    rows = run_async(_seal(pg.uri, dsn))
    filled = Filled(
        corpus=name,
        seed=seed,
        size=size,
        rows=rows,
        schema=schema_key(root),
        relay_root=str(root),
        seconds=round(time.monotonic() - t0, 1),
        date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        refused=dict(refused),
    )
    data = {k: v for k, v in asdict(filled).items() if k != "directory"}
    (directory / MARKER).write_text(json.dumps(data, indent=1) + "\n")
    filled.directory = str(directory)
    return filled


async def _recreate(uri: str) -> None:
    """An empty database TEMPLATE (what a cut-short fill left is dropped first)."""
    import asyncpg

    conn = await asyncpg.connect(uri)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", TEMPLATE)
        if exists:
            await conn.execute(f'ALTER DATABASE "{TEMPLATE}" WITH IS_TEMPLATE false')
            await conn.execute(f'DROP DATABASE "{TEMPLATE}" WITH (FORCE)')
        await conn.execute(f'CREATE DATABASE "{TEMPLATE}"')
    finally:
        await conn.close()


async def _seal(uri: str, dsn: str) -> int:
    """VACUUM ANALYZE and count the filled database, then make it a template nobody
    connects to (so nothing changes it between copies); returns its rows of `events`."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await vacuum_analyze(conn)
        rows = int(await conn.fetchval("SELECT count(*) FROM events"))
    finally:
        await conn.close()
    admin = await asyncpg.connect(uri)
    try:
        await admin.execute("CHECKPOINT")
        await admin.execute(
            f'ALTER DATABASE "{TEMPLATE}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false'
        )
    finally:
        await admin.close()
    return rows


# --- command line ------------------------------------------------------------------------


def add_prefill_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prefill",
        type=int,
        default=0,
        metavar="N",
        help="start ours on a copy of a kept store of N events (e.g. 1000000, 10000000;"
        " made on first use, see `python -m bench prefill --help`); 0: an empty store",
    )
    p.add_argument(
        "--prefill-corpus", choices=corpus.CORPORA, default="realistic", help="its events"
    )
    p.add_argument("--prefill-seed", type=int, default=1, help="its corpus's seed")
