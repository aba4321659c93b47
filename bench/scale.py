"""`python -m bench scale`: what users see of the relay as its store grows.

For each corpus (`--corpus realistic|skewed|both`, bench/corpus.py: a Zipf one, and one
where a few words and one tag value are on every row), a fresh embedded PostgreSQL and a
real `engram serve` process on it (default settings), loaded in steps (default 10k,
100k, 1M events) with **signed** events sent through the relay's websocket: 8
connections x 100 EVENTs in flight, one websocket write per message (bench.load's
ingest phase). Events are signed and cached before any clock starts (bench/.cache/,
~650 MB per million events; signing a million takes minutes, once).

At each size, after `VACUUM ANALYZE` (what autovacuum does shortly after a bulk load),
sequential REQs on one connection (REQ -> EOSE, or COUNT -> COUNT; p50/p99 over `--reps`
runs after a few unrecorded ones, the value drawn anew for each run):
  search / #e / #p / #t  common   one of the 5 most used values        limit 20
                         mid      a value on 0.1-1 % of the events     limit 20
                         rare     a value on 1-5 events                limit 20
                         absent   a value no event carries             limit 20
  ids        {"ids":[one id]}
  authors    {"authors":[a],"limit":10}, a drawn by author popularity
  kinds      {"kinds":[1],"limit":20}
  feed 20    {"authors":[20 authors],"kinds":[1],"limit":50}
  COUNT      {"kinds":[7],"#e":[a reacted-to note]} (NIP-45)
The values come from the generator's own counts at that size (bench/corpus.py), never
tuned; the report shows how many events carry them.

Reported per corpus and size: p50/p99 and relay+PostgreSQL CPU per query (the relay's
process tree and the postmaster's, which pg_ctl starts outside the relay's tree); ingest
rate and CPU per EVENT of every loaded chunk (100k by default), first against last; the
load's wall time; bytes on disk (data directory, its WAL, the database, `events`,
`event_tags` and every index on them with its `idx_scan` at the end of the run, bytes
per event); the load average before and after. `--via store` times the store API in
this process instead (PostgresStore.submit/query/count: no websocket, no signature
checks). `--keep` leaves the data directories and PostgreSQL running for EXPLAIN.
The tables and charts are made by bench/scalereport.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import charts, corpus
from bench.asker import request
from bench.corpus import CHUNK, CORPORA, DEFAULT_SIZES, SHAPES, Picks, Prepared
from bench.lanes import run_async
from bench.results import quantile, write_results
from bench.scalereport import (
    WARMUP,
    CorpusRun,
    Disk,
    Shape,
    Step,
    report,
    size_label,
    write_charts,
)
from bench.served import TABLES, fresh_store, vacuum_analyze
from bench.targets import RelayTarget, StoreTarget, load_chunk

BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"


# --- one corpus -----------------------------------------------------------------------


async def time_shapes(target: Any, picks: Picks, reps: int, seed: int) -> dict[str, Shape]:
    """Every shape, one REQ at a time: latency (ms), CPU per query (us), outcomes."""
    import random

    rng = random.Random(f"runs/{seed}/{picks.size}")
    out: dict[str, Shape] = {}
    for k, shape in enumerate(SHAPES):
        values = picks.values.get(shape) or []
        res = out[shape] = Shape()
        counts = picks.matches.get(shape)
        if counts:
            res.matches = (min(counts), max(counts))
        if not values:
            res.outcomes["no value of this class in the corpus"] += 1
            continue
        warm = min(WARMUP, reps)
        runs = []
        for i in range(warm + reps):
            verb, f = request(shape, rng.choice(values))
            runs.append((f"s{k}-{i}", verb, f))
        prepared = target.prepare(runs)
        for p in prepared[:warm]:
            await target.ask(p)
        got0, cpu0 = target.returned(), target.cpu()
        samples = []
        for p in prepared[warm:]:
            elapsed, outcome = await target.ask(p)
            samples.append(elapsed * 1e3)
            res.outcomes[outcome] += 1
        res.cpu_us = (target.cpu() - cpu0) / reps * 1e6
        res.returned = target.returned() - got0
        res.p50 = statistics.median(samples)
        res.p99 = quantile(samples, 0.99)
    return out


def dir_bytes(path: Path) -> int:
    total = 0
    for where, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(where, name)).st_size
    return total


async def measure_disk(admin: Any, pgdata: Path) -> Disk:
    disk = Disk(dir_bytes(pgdata), dir_bytes(pgdata / "pg_wal"))
    disk.database = await admin.fetchval("SELECT pg_database_size(current_database())")
    for table in TABLES:
        heap, total, indexes = await admin.fetchrow(
            "SELECT pg_relation_size(c.oid), pg_total_relation_size(c.oid),"
            " pg_indexes_size(c.oid) FROM pg_class c WHERE c.relname = $1 AND c.relkind = 'r'",
            table,
        ) or (0, 0, 0)
        disk.relations.append((table, "(total)", total))
        disk.relations.append((table, "(heap)", heap))
        disk.relations.append((table, "(toast, maps)", total - heap - indexes))
        for index, size in await admin.fetch(
            "SELECT indexrelname, pg_relation_size(indexrelid) FROM pg_stat_user_indexes"
            " WHERE relname = $1 ORDER BY indexrelname",
            table,
        ):
            disk.relations.append((table, index, size))
    return disk


async def index_use(dsn: str) -> list[tuple[str, str, int, int]]:
    """Each index of the tables with its size and idx_scan (read after the relay stopped,
    so its backends have reported their statistics)."""
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT relname, indexrelname, pg_relation_size(indexrelid), idx_scan"
            " FROM pg_stat_user_indexes WHERE relname = ANY($1::text[])"
            " ORDER BY relname, indexrelname",
            list(TABLES),
        )
    finally:
        await conn.close()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


async def _measure(
    run: CorpusRun,
    prepared: Prepared,
    target: Any,
    dsn: str,
    pgdata: Path,
    reps: int,
    seed: int,
    say: Callable[[str], None],
) -> None:
    import asyncpg

    admin = await asyncpg.connect(dsn)
    sizes = [p.size for p in prepared.meta.picks]
    step = Step(sizes[0])
    t_load = time.perf_counter()
    try:
        for start, end, events in prepared.chunks():
            step.chunks.append(
                await load_chunk(target, run.corpus, start, end, events, t_load, say)
            )
            if end not in sizes:
                continue
            step.vacuum_seconds = await vacuum_analyze(admin)
            step.rows = await admin.fetchval("SELECT count(*) FROM events")
            step.disk = await measure_disk(admin, pgdata)
            say(
                f"  {run.corpus} {size_label(end)}: {step.rows:,} rows, data directory"
                f" {step.disk.datadir / 2**20:,.0f} MB (WAL {step.disk.wal / 2**20:,.0f} MB);"
                f" timing {len(SHAPES)} shapes x {reps} REQs ..."
            )
            step.shapes = await time_shapes(target, prepared.picks(end), reps, seed)
            for shape, res in step.shapes.items():
                say("    " + _shape_line(shape, res))
            run.steps.append(step)
            if end != sizes[-1]:
                step = Step(next(s for s in sizes if s > end))
    finally:
        await admin.close()
        await target.close()


def _shape_line(shape: str, r: Shape) -> str:
    if r.p50 is None:
        return f"{shape:15s} -  ({', '.join(r.outcomes)})"
    odd = {k: n for k, n in r.outcomes.items() if k not in ("EOSE", "COUNT")}
    return f"{shape:15s} p50 {r.p50:8.2f} ms  p99 {r.p99:8.2f} ms  CPU {r.cpu_us:8.0f} us" + (
        f"  {odd}" if odd else ""
    )


def run_corpus(
    prepared: Prepared, reps: int, seed: int, via: str, keep: bool, say: Callable[[str], None]
) -> CorpusRun:
    """A fresh embedded PostgreSQL (and relay), loaded and timed; stopped unless `keep`."""
    run = CorpusRun(prepared.corpus)
    with fresh_store(prepared.corpus, "scale", via, keep, say) as s:
        run.server = s.server
        try:
            run_async(
                _run_target(run, prepared, s.relay, s.pg.pid, s.dsn, s.pg.pgdata, reps, seed, say)
            )
        finally:
            if s.relay is not None:
                s.relay.stop()
        run.indexes = run_async(index_use(s.dsn))
        if keep:
            run.kept = s.kept()
            say(f"  kept {run.kept}")
    return run


async def _run_target(
    run: CorpusRun,
    prepared: Prepared,
    relay: Any,
    pg_pid: int | None,
    dsn: str,
    pgdata: Path,
    reps: int,
    seed: int,
    say: Callable[[str], None],
) -> None:
    if relay is not None:
        target: Any = RelayTarget(relay.url, relay.pid, pg_pid)
    else:
        from relay.config import Settings
        from relay.store.postgres import PostgresStore

        target = StoreTarget(await PostgresStore.open(dsn, Settings()), pg_pid)
    await _measure(run, prepared, target, dsn, pgdata, reps, seed, say)


# --- command line -------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m bench scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="store sizes in events, comma-separated",
    )
    ap.add_argument("--corpus", choices=(*CORPORA, "both"), default="both")
    ap.add_argument("--reps", type=int, default=300, help="timed runs per shape and size")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--chunk", type=int, default=CHUNK, help="events per measured ingest chunk (and cache file)"
    )
    ap.add_argument(
        "--via",
        choices=("ws", "store"),
        default="ws",
        help="ws: engram serve through its websocket (default); store: the store API in-process",
    )
    ap.add_argument(
        "--keep",
        action="store_true",
        help="leave each corpus's PostgreSQL running with its data directory, for EXPLAIN",
    )
    ap.add_argument("--results", type=Path, help="write the tables into this markdown file")
    ap.add_argument(
        "--charts", type=Path, help="directory for the PNG charts (default: next to --results)"
    )
    return ap


def _sizes(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[int]:
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        ap.error(f"--sizes: expected comma-separated integers, got {args.sizes!r}")
    if not sizes or sizes[0] < 1:
        ap.error("--sizes: every size must be at least 1")
    if args.reps < 1 or args.chunk < 1:
        ap.error("--reps and --chunk must be at least 1")
    return sizes


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    args = ap.parse_args(argv)
    sizes = _sizes(ap, args)
    names = CORPORA if args.corpus == "both" else (args.corpus,)
    say = lambda s: print(s, flush=True)  # noqa: E731
    before = os.getloadavg()
    say(f"load average before the run: {', '.join(f'{x:.2f}' for x in before)}")
    t0 = time.monotonic()
    runs = []
    for name in names:
        t = time.monotonic()
        prepared = corpus.prepare(name, args.seed, sizes, args.chunk, say)
        say(
            f"{name}: {sizes[-1]:,} signed events ready in {time.monotonic() - t:.0f} s"
            f" ({prepared.directory})"
        )
        runs.append(run_corpus(prepared, args.reps, args.seed, args.via, args.keep, say))
    after = os.getloadavg()
    text = report(runs, argv, args.reps, args.via, args.chunk, (before, after))
    directory = args.charts or (args.results.parent if args.results else None)
    if directory is not None:
        made = write_charts(runs, directory)
        if made:
            text += "\n\n" + "\n".join(f"![{p.stem}]({p.name})" for p in made)
            print("charts: " + ", ".join(map(str, made)))
        else:
            print(charts.SKIPPED)
    print()
    print(text)
    print(f"\n(scale took {time.monotonic() - t0:.0f} s)")
    if args.results:
        write_results(args.results, text, BEGIN, END)
        print(f"wrote {args.results}")
    return 0
