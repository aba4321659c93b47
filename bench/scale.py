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
import asyncio
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from bench import charts, corpus, wsclient
from bench.compare import write_results
from bench.corpus import CHUNK, CORPORA, SHAPES, Picks, Prepared
from bench.events import EventSet
from bench.load import Profile, Watch, ingest_phase, run_async
from bench.scalereport import (
    WARMUP,
    ChunkLoad,
    CorpusRun,
    Disk,
    Shape,
    Step,
    report,
    size_label,
    write_charts,
)

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
ANSWER_TIMEOUT = 60.0  # a REQ unanswered this long is reported, not waited for
TABLES = ("events", "event_tags")

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_enc = msgspec.json.encode


# --- what a REQ of each shape sends -------------------------------------------------


def request(shape: str, value: Any) -> tuple[str, dict[str, Any]]:
    """(verb, filter) of one run of `shape` with `value`."""
    if shape == "COUNT":
        return "COUNT", {"kinds": [7], "#e": [value]}
    if shape == "ids":
        return "REQ", {"ids": [value]}
    if shape == "authors":
        return "REQ", {"authors": [value], "limit": 10}
    if shape == "kinds":
        return "REQ", {"kinds": value, "limit": 20}
    if shape == "feed 20":
        return "REQ", {"authors": value, "kinds": [1], "limit": 50}
    what = shape.split(" ", 1)[0]
    if what == "search":
        return "REQ", {"search": value, "limit": 20}
    return "REQ", {what: [value], "limit": 20}


# --- targets: the relay through its websocket, or the store API ------------------------


class Asker:
    """One websocket connection sending one REQ/COUNT at a time (from `source`, a local
    address, when given: another client as the relay sees it)."""

    def __init__(self, timeout: float = ANSWER_TIMEOUT, source: str | None = None) -> None:
        self.conn: wsclient.WsConnection | None = None
        self.sub = ""
        self.answer: asyncio.Future[str] | None = None
        self.returned = 0
        self.timeout = timeout
        self.source = source

    async def open(self, url: str) -> None:
        self.conn = await wsclient.connect(url, self.on_message, self.on_close, source=self.source)

    def on_message(self, payload: bytes) -> None:
        items = _frame.decode(payload)
        verb = bytes(items[0]) if items else b""
        if verb == b'"EVENT"':
            self.returned += 1
        elif verb in (b'"EOSE"', b'"COUNT"', b'"CLOSED"') and len(items) >= 2:
            if _str.decode(items[1]) != self.sub or self.answer is None or self.answer.done():
                return
            why = _str.decode(items[2]) if verb == b'"CLOSED"' and len(items) > 2 else ""
            self.answer.set_result(verb.decode().strip('"') + (f" {why}" if why else ""))

    def on_close(self, reason: str) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(f"connection closed: {reason}")

    async def ask(self, sub: str, frame: bytes, close: bytes | None) -> tuple[float, str]:
        assert self.conn is not None
        self.sub = sub
        self.answer = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        self.conn.send(frame)
        try:
            outcome = await asyncio.wait_for(asyncio.shield(self.answer), self.timeout)
        except TimeoutError:
            outcome = f"no answer within {self.timeout:.0f} s"
        elapsed = time.perf_counter() - t0
        if close is not None:
            self.conn.send(close)
        return elapsed, outcome


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


# --- one corpus -----------------------------------------------------------------------


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


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
        res.p99 = _pct(samples, 0.99)
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


async def vacuum_analyze(admin: Any) -> float:
    """VACUUM ANALYZE of the tables (what autovacuum does shortly after a bulk load);
    returns its wall time."""
    t0 = time.perf_counter()
    for table in TABLES:
        await admin.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - t0


def _shape_line(shape: str, r: Shape) -> str:
    if r.p50 is None:
        return f"{shape:15s} -  ({', '.join(r.outcomes)})"
    odd = {k: n for k, n in r.outcomes.items() if k not in ("EOSE", "COUNT")}
    return f"{shape:15s} p50 {r.p50:8.2f} ms  p99 {r.p99:8.2f} ms  CPU {r.cpu_us:8.0f} us" + (
        f"  {odd}" if odd else ""
    )


@dataclass
class Served:
    """A fresh embedded PostgreSQL with one database, and `engram serve` on it (or None)."""

    root: Path
    pg: Any  # bench.peers.Postgres
    dsn: str
    server: str  # the server's settings shown in reports
    relay: Any = None  # bench.peers.Running

    def kept(self) -> str:
        from bench.pgcluster import bin_dir

        return (
            f"{self.pg.pgdata}, PostgreSQL running: connect with {bin_dir() / 'psql'}"
            f' "{self.dsn}"; stop with kill -INT {self.pg.pid} && rm -rf {self.root}'
        )


@contextlib.contextmanager
def fresh_store(
    corpus: str, bench: str, via: str, keep: bool, say: Callable[[str], None]
) -> Iterator[Served]:
    """A fresh embedded PostgreSQL (default settings) and, with `via` "ws", a real
    `engram serve` on it; the relay is stopped on exit (callers may stop it earlier),
    PostgreSQL and the data directory too unless `keep`."""
    from bench.peers import Postgres, start_engram

    root = Path(tempfile.mkdtemp(prefix=f"engram-bench-{bench}-{corpus}-"))
    pg = Postgres(root, cleanup_mode=None if keep else "delete")
    served: Served | None = None
    try:
        dsn, _drop = pg.create_database()
        served = Served(root, pg, dsn, pg.settings())
        if via == "ws":
            served.relay = start_engram(root / "relay", ["--database-url", dsn])
            say(
                f"  {corpus}: engram serve (pid {served.relay.pid}) at {served.relay.url},"
                f" {served.server}"
            )
        yield served
    finally:
        if served is not None and served.relay is not None:
            served.relay.stop()
        if not keep:
            pg.close()
            shutil.rmtree(root, ignore_errors=True)


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


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
    args = ap.parse_args(argv)
    try:
        sizes = sorted({int(s) for s in args.sizes.split(",") if s.strip()})
    except ValueError:
        ap.error(f"--sizes: expected comma-separated integers, got {args.sizes!r}")
    if not sizes or sizes[0] < 1:
        ap.error("--sizes: every size must be at least 1")
    if args.reps < 1 or args.chunk < 1:
        ap.error("--reps and --chunk must be at least 1")
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
