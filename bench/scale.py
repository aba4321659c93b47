"""`python -m bench scale`: what users see of the relay as its store grows.

For each corpus (`--corpus realistic|skewed|both`, bench/corpus.py: a Zipf one, and one
where a few words and one tag value are on every row), a fresh embedded PostgreSQL and a
real `engram serve` process on it (default settings), loaded in steps (default 10k,
100k, 1M events) with **signed** events sent through the relay's websocket: 8
connections x 100 EVENTs in flight, one websocket write per message (bench.load's
ingest phase). Events are signed and cached before any clock starts (bench/.cache/).

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
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench import charts, corpus, wsclient
from bench.compare import write_results
from bench.corpus import CHUNK, CORPORA, SHAPES, Picks, Prepared
from bench.events import EventSet
from bench.load import Profile, Watch, ingest_phase, run_async

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
WARMUP = 10  # unrecorded runs of each shape (prepared statements, caches)
ANSWER_TIMEOUT = 60.0  # a REQ unanswered this long is reported, not waited for
TARGET_FLOOR_MS = 15.0  # issue 25: p99 at 1M <= max(2 x p99 at 10k, 15 ms)
DRIFT_TARGET = 1.25  # issue 25: CPU per EVENT, last 100k / first 100k
TABLES = ("events", "event_tags")

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_enc = msgspec.json.encode


# --- results ------------------------------------------------------------------------


@dataclass
class ChunkLoad:
    start: int
    end: int
    wall: float
    cpu: float | None  # relay (or this process) + PostgreSQL, seconds
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def events(self) -> int:
        return self.end - self.start


@dataclass
class Disk:
    datadir: int = 0
    wal: int = 0
    database: int = 0
    # (table, index or "", bytes): each table's heap and TOAST, and each index
    relations: list[tuple[str, str, int]] = field(default_factory=list)

    def table(self, name: str) -> int:
        return sum(b for t, _, b in self.relations if t == name)


@dataclass
class Shape:
    p50: float | None = None
    p99: float | None = None
    cpu_us: float | None = None
    outcomes: Counter[str] = field(default_factory=Counter)
    returned: int = 0
    matches: tuple[int, int] | None = None  # fewest and most events carrying a value


@dataclass
class Step:
    size: int
    rows: int = 0
    chunks: list[ChunkLoad] = field(default_factory=list)
    shapes: dict[str, Shape] = field(default_factory=dict)
    disk: Disk = field(default_factory=Disk)
    vacuum_seconds: float = 0.0

    @property
    def load_wall(self) -> float:
        return sum(c.wall for c in self.chunks)

    def cpu_per_event(self) -> float | None:
        return _per_event(self.chunks)


@dataclass
class CorpusRun:
    corpus: str
    steps: list[Step] = field(default_factory=list)
    indexes: list[tuple[str, str, int, int]] = field(default_factory=list)  # +idx_scan
    server: str = ""
    kept: str = ""

    @property
    def chunks(self) -> list[ChunkLoad]:
        return [c for s in self.steps for c in s.chunks]


def _per_event(chunks: list[ChunkLoad]) -> float | None:
    n = sum(c.events for c in chunks)
    if not n or any(c.cpu is None for c in chunks):
        return None
    return sum(c.cpu or 0.0 for c in chunks) / n * 1e6


def drift(chunks: list[ChunkLoad], window: int) -> tuple[float | None, float | None, int, int]:
    """CPU us per EVENT over the first and the last `window` events loaded (whole chunks),
    with the number of events each covers."""
    if not chunks:
        return None, None, 0, 0
    total = chunks[-1].end
    first = [c for c in chunks if c.end <= window] or chunks[:1]
    last = [c for c in chunks if c.start >= total - window] or chunks[-1:]
    return (
        _per_event(first),
        _per_event(last),
        sum(c.events for c in first),
        sum(c.events for c in last),
    )


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


class _Asker:
    """One websocket connection sending one REQ/COUNT at a time."""

    def __init__(self) -> None:
        self.conn: wsclient.WsConnection | None = None
        self.sub = ""
        self.answer: asyncio.Future[str] | None = None
        self.returned = 0

    async def open(self, url: str) -> None:
        self.conn = await wsclient.connect(url, self.on_message, self.on_close)

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
            outcome = await asyncio.wait_for(asyncio.shield(self.answer), ANSWER_TIMEOUT)
        except TimeoutError:
            outcome = f"no answer within {ANSWER_TIMEOUT:.0f} s"
        elapsed = time.perf_counter() - t0
        if close is not None:
            self.conn.send(close)
        return elapsed, outcome


class RelayTarget:
    """`engram serve` on loopback: EVENTs and REQs through its websocket."""

    def __init__(self, url: str, pid: int, pg_pid: int | None) -> None:
        self.url = url
        self.watch = Watch(pid, pg_pid)
        self.asker = _Asker()
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
            self.asker = _Asker()
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
            chunk = await target.load(start, end, events)
            step.chunks.append(chunk)
            per = chunk.cpu / chunk.events * 1e6 if chunk.cpu is not None else float("nan")
            say(
                f"  {run.corpus}: loaded {end:,} ({chunk.events / chunk.wall:,.0f} ev/s,"
                f" {per:.0f} us CPU/event, {time.perf_counter() - t_load:.0f} s)"
            )
            for why, n in chunk.errors.most_common(3):
                say(f"    refused x{n}: {why}")
            if end not in sizes:
                continue
            t0 = time.perf_counter()
            for table in TABLES:
                await admin.execute(f"VACUUM ANALYZE {table}")
            step.vacuum_seconds = time.perf_counter() - t0
            step.rows = await admin.fetchval("SELECT count(*) FROM events")
            step.disk = await measure_disk(admin, pgdata)
            say(
                f"  {run.corpus} {_n(end)}: {step.rows:,} rows, data directory"
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
    from bench.peers import Postgres, start_engram

    run = CorpusRun(prepared.corpus)
    root = Path(tempfile.mkdtemp(prefix=f"engram-bench-scale-{prepared.corpus}-"))
    pg = Postgres(root, cleanup_mode=None if keep else "delete")
    try:
        dsn, _drop = pg.create_database()
        run.server = pg.settings()
        relay = None
        if via == "ws":
            relay = start_engram(root / "relay", ["--database-url", dsn])
            say(f"  {run.corpus}: engram serve (pid {relay.pid}) at {relay.url}, {run.server}")
        try:
            run_async(_run_target(run, prepared, relay, pg.pid, dsn, pg.pgdata, reps, seed, say))
        finally:
            if relay is not None:
                relay.stop()
        run.indexes = run_async(index_use(dsn))
        if keep:
            from bench.pgcluster import bin_dir

            run.kept = f'{pg.pgdata} (running): {bin_dir() / "psql"} "{dsn}"'
            say(f"  kept {run.kept}")
    finally:
        if not keep:
            pg.close()
            shutil.rmtree(root, ignore_errors=True)
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


# --- report -------------------------------------------------------------------------


def _n(x: int) -> str:
    if x >= 1_000_000 and x % 1_000_000 == 0:
        return f"{x // 1_000_000}M"
    if x >= 1000 and x % 1000 == 0:
        return f"{x // 1000}k"
    return f"{x:,}"


def _mb(b: int) -> str:
    return f"{b / 2**20:,.1f}"


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def target_met(small: float | None, large: float | None) -> str:
    if small is None or large is None:
        return "-"
    return "met" if large <= max(2 * small, TARGET_FLOOR_MS) else "**missed**"


def corpus_report(run: CorpusRun, chunk: int) -> list[str]:
    steps = run.steps
    first, last = steps[0], steps[-1]
    head = ["shape", f"events with the value at {_n(last.size)}"]
    head += [f"{_n(s.size)} p50 / p99 ms (CPU us)" for s in steps]
    if len(steps) > 1:
        head += [
            f"p99 {_n(last.size)}/{_n(first.size)}",
            f"p99 <= max(2x {_n(first.size)}, {TARGET_FLOOR_MS:g} ms)",
        ]
    lines = [f"### corpus: {run.corpus}", "", "| " + " | ".join(head) + " |"]
    lines.append("|" + "---|" * len(head))
    notes: list[str] = []
    for shape in SHAPES:
        m = last.shapes[shape].matches if shape in last.shapes else None
        cells = [f"`{shape}`", "-" if m is None else f"{m[0]:,}-{m[1]:,}"]
        for s in steps:
            r = s.shapes.get(shape, Shape())
            cpu = "-" if r.cpu_us is None else f"{r.cpu_us:.0f}"
            cells.append(f"{_ms(r.p50)} / {_ms(r.p99)} ({cpu})")
            for why, n in r.outcomes.items():
                if why not in ("EOSE", "COUNT"):
                    notes.append(f"- {_n(s.size)} `{shape}`: {n} x {why}")
        if len(steps) > 1:
            a, b = first.shapes.get(shape, Shape()).p99, last.shapes.get(shape, Shape()).p99
            cells.append(f"{b / a:.2f}" if a and b else "-")
            cells.append(target_met(a, b))
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", *notes] if notes else []
    lines += [
        "",
        "| store | rows | load s | ingest ev/s | CPU us/EVENT | data dir MB | WAL MB"
        " | database MB | events MB | event_tags MB | bytes/event (dir) | bytes/event (db) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        loaded = sum(c.events for c in s.chunks)
        rate = loaded / s.load_wall if s.load_wall else 0.0
        cpu = s.cpu_per_event()
        d = s.disk
        lines.append(
            f"| {_n(s.size)} | {s.rows:,} | {s.load_wall:.1f} | {rate:,.0f} |"
            f" {'-' if cpu is None else f'{cpu:.0f}'} | {_mb(d.datadir)} | {_mb(d.wal)} |"
            f" {_mb(d.database)} | {_mb(d.table('events'))} | {_mb(d.table('event_tags'))} |"
            f" {d.datadir / s.size:,.0f} | {d.database / s.size:,.0f} |"
        )
    lo, hi, n_lo, n_hi = drift(run.chunks, chunk)
    total_wall = sum(c.wall for c in run.chunks)
    lines += [
        "",
        f"- load: {last.size:,} events in {total_wall:.0f} s of ingest"
        f" ({last.size / total_wall if total_wall else 0:,.0f} ev/s);"
        + (
            f" relay+PostgreSQL CPU per EVENT {lo:.0f} us over the first {n_lo:,} events,"
            f" {hi:.0f} us over the last {n_hi:,}: {hi / lo:.2f}x"
            f" (target <= {DRIFT_TARGET}x: {'met' if hi / lo <= DRIFT_TARGET else '**missed**'})"
            if lo and hi
            else " CPU per EVENT not measured"
        ),
        "- CPU us/EVENT per chunk: "
        + ", ".join(
            f"{_n(c.end)} {c.cpu / c.events * 1e6:.0f}" for c in run.chunks if c.cpu is not None
        ),
        "- VACUUM ANALYZE before timing: "
        + ", ".join(f"{_n(s.size)} {s.vacuum_seconds:.1f} s" for s in steps),
    ]
    errors = Counter[str]()
    for c in run.chunks:
        errors.update(c.errors)
    for why, n in errors.most_common(5):
        lines.append(f"- EVENTs refused: {n} x {why}")
    lines += [
        "",
        f"Relations at {_n(last.size)} ({run.corpus}), `idx_scan` counted over the whole run"
        " (loading included):",
        "",
        "| table | relation | MB | bytes/event | idx_scan |",
        "|---|---|---|---|---|",
    ]
    scans = {(t, i): n for t, i, _, n in run.indexes}
    for table, rel, size in last.disk.relations:
        used = scans.get((table, rel))
        lines.append(
            f"| {table} | {rel} | {_mb(size)} | {size / last.size:,.0f} |"
            f" {'' if used is None else f'{used:,}'} |"
        )
    if run.kept:
        lines += ["", f"- kept: {run.kept}"]
    return lines


def report(
    runs: list[CorpusRun],
    argv: list[str],
    reps: int,
    via: str,
    chunk: int,
    loadavg: tuple[tuple[float, ...], tuple[float, ...]],
) -> str:
    from bench.compare import machine

    how = (
        "signed EVENTs and REQs through `engram serve`'s websocket (8 connections x 100"
        " EVENTs in flight, one write per message; REQs one at a time on one connection)"
        if via == "ws"
        else "PostgresStore.submit/query/count in this process (no websocket, no signatures)"
    )
    before, after = loadavg
    lines = [
        f"- command: `python -m bench scale{' ' + ' '.join(argv) if argv else ''}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}; {runs[0].server if runs else ''}",
        "- load average (1, 5, 15 min): before "
        + ", ".join(f"{x:.2f}" for x in before)
        + "; after "
        + ", ".join(f"{x:.2f}" for x in after),
        f"- {how}; {reps} runs per shape and size after {WARMUP} unrecorded; CPU per query is"
        " relay+PostgreSQL (process trees); a cell's CPU divides by the runs",
        "",
    ]
    for run in runs:
        lines += [*corpus_report(run, chunk), ""]
    return "\n".join(lines).rstrip()


def write_charts(runs: list[CorpusRun], directory: Path) -> list[Path]:
    out = []
    for run in runs:
        if len(run.steps) < 2:
            continue
        xs = [float(s.size) for s in run.steps]
        p = charts.lines(
            directory / f"scale-p99-{run.corpus}.png",
            f"p99 REQ -> EOSE through the websocket, {run.corpus} corpus (ms)",
            xs,
            {q: [s.shapes[q].p99 if q in s.shapes else None for s in run.steps] for q in SHAPES},
            "events in the store",
            "p99 ms",
            limit=TARGET_FLOOR_MS,
        )
        if p:
            out.append(p)
    chunks = [r.chunks for r in runs]
    if chunks and len(chunks[0]) > 1 and all(len(c) == len(chunks[0]) for c in chunks):
        p = charts.lines(
            directory / "scale-ingest.png",
            "relay+PostgreSQL CPU per EVENT of each loaded chunk (us)",
            [float(c.end) for c in chunks[0]],
            {
                r.corpus: [c.cpu / c.events * 1e6 if c.cpu is not None else None for c in r.chunks]
                for r in runs
            },
            "events in the store after the chunk",
            "CPU us per EVENT",
        )
        if p:
            out.append(p)
    return out


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
