"""`python -m bench scale`: read latency and ingest rate as the store grows.

Preloads one embedded PostgreSQL store in steps (default 10k, 100k, 1M events) and, at
each size, times the common reads through `PostgresStore.query`/`count` (the relay's
read path without the websocket) and the ingest of the next events into it.

The corpus is synthetic and deterministic (seeded): 1,000 authors at 10k growing to
10,000 from 1M (10 per 1,000 events); kinds 1 (notes), 7 (reactions), 3 (contact lists),
0 (metadata), 30023 (articles) and 30174 (engrams); `e`, `p` and `t` tags and content
words drawn with Zipf-like popularity (a few authors, hashtags, people and notes take
most of the references). Event ids are real (NIP-01 hashes); **signatures are random
bytes**: the store never verifies them (the relay does, before the store), so this
measures the store only, and signing a million events would take longer than the run.

Events go in through `PostgresStore.submit`, i.e. the relay's group-commit writer with
its default batch size and durability (fsync'd commits). "ingest" is the rate of the
first 10,000 events loaded on top of each size (empty: the first 10,000 of all), with
the relay+PostgreSQL CPU per event. After each step the store is `VACUUM ANALYZE`d, as
autovacuum would do on its own shortly after a bulk load. Events arrive in created_at
order (30 s apart, jittered by up to 10 minutes), as a relay sees them. CPU per query is
this process plus every PostgreSQL process (background work such as autovacuum included).

Queries (each a p50/p99 over `--reps` runs, parameters varying between runs):
  authors     {"authors":[a],"limit":10}, a drawn by author popularity
  #p popular  {"#p":[one of the 5 most-mentioned people],"limit":50}
  #t popular  {"#t":[one of the 5 most-used hashtags],"limit":50}
  deep page   page 50 of a top-5 author's history: {"authors":[a],"until":t,"limit":20}
  feed 20     {"authors":[20 authors],"kinds":[1],"limit":50}
  head        the CLI's engram head fetch: {"kinds":[30174],"authors":[a],"#p":[a],"#d":[s]}
  COUNT       {"kinds":[7],"#e":[a reacted-to note]} (NIP-45)
  search      {"search":"<a word used in ~1% of notes>","limit":20} (NIP-50)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import bisect
import datetime as dt
import hashlib
import itertools
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from bench import charts
from bench.compare import write_results
from bench.load import Watch
from engram.nip01 import Event, event_id
from relay.config import Settings
from relay.filters import Filter
from relay.wire import encode_event

DEFAULT_SIZES = (10_000, 100_000, 1_000_000)
INGEST_PROBE = 10_000  # events whose loading rate is "ingest into a store of size S"
TARGET_P99_MS = 20.0
BEGIN, END = "<!-- scale:begin -->", "<!-- scale:end -->"
QUERIES = ("authors", "#p popular", "#t popular", "deep page", "feed 20", "head", "COUNT", "search")
# Kind mix of the corpus (weights).
KIND_MIX = {1: 60, 7: 18, 3: 3, 0: 2, 30023: 5, 30174: 12}
WORDS = 2_000  # content vocabulary
HASHTAGS = 500
ENGRAM_SLUGS = 40  # addresses per agent
RECENT_NOTES = 5_000  # reactions and replies point at one of the latest notes
SEARCH_RANK = 100  # the search word: the 100th most common (~1% of notes contain it)
_YEAR = 400 * 86_400  # created_at of the first event: 1M events at 30 s fit after it


class Zipf:
    """Draws ranks 0..n-1 with P(k) ~ 1/(k+1)^s (bisect over cumulative weights)."""

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        self.rng = rng
        self.cum = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(n)))

    def __call__(self) -> int:
        return bisect.bisect_left(self.cum, self.rng.random() * self.cum[-1])


def authors_for(size: int) -> int:
    return min(10_000, max(1_000, size // 100))


@dataclass
class Corpus:
    """The deterministic event stream; remembers what the queries need to pick from."""

    seed: int
    now: int = field(default_factory=lambda: int(time.time()))
    made: int = 0
    rng: random.Random = field(init=False)
    pubkeys: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # recent kind-1 ids (a ring)
    reacted: list[str] = field(default_factory=list)  # sample of reaction targets
    heads: list[tuple[str, str]] = field(default_factory=list)  # sample of (agent, slug)
    p_count: Counter[str] = field(default_factory=Counter)
    t_count: Counter[str] = field(default_factory=Counter)
    a_count: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self._kinds = list(KIND_MIX)
        self._kind_cum = list(itertools.accumulate(KIND_MIX.values()))
        self._words = Zipf(WORDS, 1.0, self.rng)
        self._tags = Zipf(HASHTAGS, 1.0, self.rng)
        self._note_pick = Zipf(RECENT_NOTES, 1.0, self.rng)
        self._authors: Zipf | None = None
        self._people: Zipf | None = None

    def grow_authors(self, n: int) -> None:
        while len(self.pubkeys) < n:
            i = len(self.pubkeys)
            self.pubkeys.append(hashlib.sha256(f"scale-{self.seed}-{i}".encode()).hexdigest())
        self._authors = Zipf(n, 0.9, self.rng)
        self._people = Zipf(n, 1.0, self.rng)

    def word(self, rank: int) -> str:
        return f"w{rank}"

    def _content(self, n: int) -> str:
        return " ".join(self.word(self._words()) for _ in range(n))

    def _person(self) -> str:
        assert self._people is not None
        p = self.pubkeys[self._people()]
        self.p_count[p] += 1
        return p

    def _hashtag(self) -> str:
        t = f"topic{self._tags()}"
        self.t_count[t] += 1
        return t

    def _recent_note(self) -> str | None:
        if not self.notes:
            return None
        k = self._note_pick()
        return self.notes[-1 - k] if k < len(self.notes) else self.notes[0]

    def event(self) -> tuple[Event, bytes]:
        assert self._authors is not None
        rng = self.rng
        self.made += 1
        kind = self._kinds[bisect.bisect_left(self._kind_cum, rng.random() * self._kind_cum[-1])]
        author = self.pubkeys[self._authors()]
        # arrival order, 30 s apart on average, up to 10 minutes late or early: what a
        # relay sees (stored rows roughly follow created_at, as newest-first reads assume)
        created_at = self.now - _YEAR + self.made * 30 + rng.randrange(-600, 600)
        tags: list[list[str]] = []
        content = ""
        if kind == 1:
            content = self._content(rng.randrange(6, 20))
            if rng.random() < 0.4:
                tags.append(["t", self._hashtag()])
            if rng.random() < 0.3:
                tags.append(["p", self._person()])
            if rng.random() < 0.2 and (note := self._recent_note()) is not None:
                tags.append(["e", note])
        elif kind == 7:
            content = "+"
            note = self._recent_note()
            if note is not None:
                tags.append(["e", note])
                if len(self.reacted) < 2_000:
                    self.reacted.append(note)
                elif rng.random() < 0.01:
                    self.reacted[rng.randrange(2_000)] = note
            tags.append(["p", self._person()])
        elif kind == 3:
            tags = [["p", self._person()] for _ in range(rng.randrange(10, 60))]
        elif kind == 0:
            content = msgspec.json.encode({"name": author[:8], "about": self._content(8)}).decode()
        elif kind == 30023:
            tags = [["d", f"article-{rng.randrange(100)}"]]
            tags += [["t", self._hashtag()] for _ in range(rng.randrange(1, 4))]
            content = self._content(rng.randrange(40, 120))
        else:  # 30174: an agent's own memory (owner = itself), ciphertext-like content
            slug = f"slug-{rng.randrange(ENGRAM_SLUGS)}"
            tags = [["d", hashlib.sha256(f"{author}:{slug}".encode()).hexdigest()], ["p", author]]
            content = base64.b64encode(rng.randbytes(rng.randrange(120, 400))).decode()
            if len(self.heads) < 2_000:
                self.heads.append((author, tags[0][1]))
            elif rng.random() < 0.01:
                self.heads[rng.randrange(2_000)] = (author, tags[0][1])
        eid = event_id(author, created_at, kind, tags, content)
        if kind == 1:
            self.notes.append(eid)
            if len(self.notes) > 2 * RECENT_NOTES:
                del self.notes[:RECENT_NOTES]
        self.a_count[author] += 1
        sig = rng.randbytes(64).hex()  # not a signature: the store never checks (see above)
        ev = Event(
            id=eid,
            pubkey=author,
            created_at=created_at,
            kind=kind,
            tags=tags,
            content=content,
            sig=sig,
        )
        return ev, encode_event(ev)


@dataclass
class Step:
    size: int  # events loaded (rows may be fewer: replaceable events replace)
    rows: int = 0
    ingest_rate: float | None = None  # events/s of the probe loaded on top of this size
    ingest_cpu_us: float | None = None  # relay (this process) + PostgreSQL CPU per event
    load_seconds: float = 0.0
    p50: dict[str, float] = field(default_factory=dict)
    p99: dict[str, float] = field(default_factory=dict)
    cpu_us: dict[str, float] = field(default_factory=dict)  # relay+PostgreSQL CPU per query
    db_mb: float = 0.0


def _cpu(pg_pid: int | None) -> float:
    return time.process_time() + (Watch.tree_cpu(pg_pid) or 0.0)


async def _load(
    store: object, corpus: Corpus, n: int, pg_pid: int | None = None, chunk: int = 20_000
) -> tuple[float, float]:
    """Store `n` new events; returns (wall s, relay+PostgreSQL CPU s) of the storing only
    (the events of each chunk are made before its clock starts)."""
    from relay.store import SaveStatus

    wall = cpu = 0.0
    left = n
    while left > 0:
        k = min(chunk, left)
        batch = [corpus.event() for _ in range(k)]
        c0, t0 = _cpu(pg_pid), time.perf_counter()
        futures = [store.submit(ev, raw) for ev, raw in batch]  # type: ignore[attr-defined]
        results = await asyncio.gather(*futures)
        wall += time.perf_counter() - t0
        cpu += _cpu(pg_pid) - c0
        bad = [r for r in results if r.status is SaveStatus.ERROR]
        if bad:
            raise RuntimeError(f"load failed: {bad[0].message}")
        left -= k
    return wall, cpu


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _queries(
    store: object, corpus: Corpus, reps: int, rng: random.Random, pg_pid: int | None = None
) -> dict[str, tuple[list[float], float]]:
    """Latency samples (ms) and relay+PostgreSQL CPU (us) per query; parameters drawn anew
    for every run. CPU is what contention on a shared machine inflates least."""
    assert corpus._authors is not None
    top_p = [p for p, _ in corpus.p_count.most_common(5)]
    top_t = [t for t, _ in corpus.t_count.most_common(5)]
    top_a = [a for a, _ in corpus.a_count.most_common(5)]
    # `until` of page 50 (20 a page) of each top author's history, read once up front.
    until: dict[str, int] = {}
    for a in top_a:
        rows = await store.query([Filter(authors=[a], limit=1000)])  # type: ignore[attr-defined]
        if len(rows) >= 981:
            until[a] = msgspec.json.decode(rows[980])["created_at"]
    pick_author = corpus._authors
    search_word = corpus.word(SEARCH_RANK)

    def make(name: str) -> tuple[list[Filter], str | None, bool]:
        if name == "authors":
            return [Filter(authors=[corpus.pubkeys[pick_author()]], limit=10)], None, False
        if name == "#p popular":
            return [Filter(tags={"p": [rng.choice(top_p)]}, limit=50)], None, False
        if name == "#t popular":
            return [Filter(tags={"t": [rng.choice(top_t)]}, limit=50)], None, False
        if name == "deep page":
            a = rng.choice(list(until) or top_a)
            return [Filter(authors=[a], until=until.get(a), limit=20)], None, False
        if name == "feed 20":
            feed = list(dict.fromkeys(corpus.pubkeys[pick_author()] for _ in range(40)))[:20]
            return [Filter(authors=feed, kinds=[1], limit=50)], None, False
        if name == "head":
            agent, d = rng.choice(corpus.heads)
            f = Filter(kinds=[30174], authors=[agent], tags={"p": [agent], "d": [d]}, limit=1)
            return [f], agent, False
        if name == "COUNT":
            return [Filter(kinds=[7], tags={"e": [rng.choice(corpus.reacted)]})], None, True
        return [Filter(search=search_word, limit=20)], None, False

    out: dict[str, tuple[list[float], float]] = {}
    for name in QUERIES:
        samples: list[float] = []
        cpu = 0.0
        for i in range(reps + 10):
            if i == 10:
                cpu = _cpu(pg_pid)
            filters, viewer, count = make(name)
            t0 = time.perf_counter()
            if count:
                await store.count(filters, viewer=viewer)  # type: ignore[attr-defined]
            else:
                await store.query(filters, viewer=viewer)  # type: ignore[attr-defined]
            if i >= 10:  # the first runs prepare statements
                samples.append((time.perf_counter() - t0) * 1000)
        out[name] = samples, (_cpu(pg_pid) - cpu) / reps * 1e6
    return out


def run_scale(
    sizes: list[int], reps: int, seed: int, say: Callable[[str], None], keep: bool = False
) -> list[Step]:
    """Start an embedded PostgreSQL, run the steps on a fresh database, stop it (`keep`:
    leave it running with the loaded store, to look at plans afterwards)."""
    from bench.peers import Postgres

    root = Path(tempfile.mkdtemp(prefix="engram-bench-scale-"))
    pg = Postgres(root, cleanup_mode=None if keep else "delete")
    try:
        dsn, _ = pg.create_database()
        if keep:
            say(f"database (kept running): {dsn}")
        return asyncio.run(_run_steps(dsn, pg.pid, sizes, reps, seed, say))
    finally:
        if not keep:
            pg.close()
            shutil.rmtree(root, ignore_errors=True)


async def _run_steps(
    dsn: str,
    pg_pid: int | None,
    sizes: list[int],
    reps: int,
    seed: int,
    say: Callable[[str], None],
) -> list[Step]:
    import asyncpg

    from relay.store.postgres import PostgresStore

    steps: list[Step] = []
    store = await PostgresStore.open(dsn, Settings())
    admin = await asyncpg.connect(dsn)
    corpus = Corpus(seed)
    rng = random.Random(seed + 1)
    loaded = 0
    empty = Step(0)
    steps.append(empty)
    try:
        for size in sorted(sizes):
            corpus.grow_authors(authors_for(size))
            # the probe: the first INGEST_PROBE events on top of the previous size
            probe = min(INGEST_PROBE, size - loaded)
            step_from = steps[-1]
            t0 = time.perf_counter()
            wall, cpu = await _load(store, corpus, probe, pg_pid)
            step_from.ingest_rate = probe / wall
            step_from.ingest_cpu_us = cpu / probe * 1e6
            say(
                f"ingest on top of {loaded:,}: {step_from.ingest_rate:,.0f} ev/s,"
                f" {step_from.ingest_cpu_us:.0f} us CPU/event"
            )
            t1 = time.perf_counter()
            rest = size - loaded - probe
            while rest > 0:
                k = min(100_000, rest)
                await _load(store, corpus, k)
                rest -= k
                say(f"  loaded {size - rest:,} of {size:,} ({time.perf_counter() - t1:.0f} s)")
            loaded = size
            await admin.execute("VACUUM ANALYZE events")
            step = Step(size, load_seconds=time.perf_counter() - t0)
            step.rows = await admin.fetchval("SELECT count(*) FROM events")
            step.db_mb = await admin.fetchval("SELECT pg_database_size(current_database())")
            step.db_mb /= 2**20
            say(f"store: {step.rows:,} rows, {step.db_mb:,.0f} MB; timing queries ...")
            samples = await _queries(store, corpus, reps, rng, pg_pid)
            for name, (xs, cpu_us) in samples.items():
                step.cpu_us[name] = cpu_us
                step.p50[name] = statistics.median(xs)
                step.p99[name] = _pct(xs, 0.99)
                say(
                    f"  {name:12s} p50 {step.p50[name]:7.2f} ms  p99 {step.p99[name]:7.2f} ms"
                    f"  CPU {cpu_us:7.0f} us"
                )
            steps.append(step)
        # the probe on top of the largest size
        wall, cpu = await _load(store, corpus, INGEST_PROBE, pg_pid)
        steps[-1].ingest_rate = INGEST_PROBE / wall
        steps[-1].ingest_cpu_us = cpu / INGEST_PROBE * 1e6
        say(
            f"ingest on top of {loaded:,}: {steps[-1].ingest_rate:,.0f} ev/s,"
            f" {steps[-1].ingest_cpu_us:.0f} us CPU/event"
        )
    finally:
        await admin.close()
        await store.close()
    return steps


def report(steps: list[Step], argv: list[str], reps: int) -> str:
    from bench.compare import machine

    sized = [s for s in steps if s.size]
    first, last = sized[0], sized[-1]
    head = ["query", *(f"{_n(s.size)} p50 / p99 ms (CPU us)" for s in sized)]
    head += [f"p99 {_n(last.size)}/{_n(first.size)}", "target"]
    rows = []
    for q in QUERIES:
        cells = [f"{s.p50[q]:.2f} / {s.p99[q]:.2f} ({s.cpu_us[q]:.0f})" for s in sized]
        ratio = last.p99[q] / first.p99[q] if first.p99[q] else float("inf")
        ok = ratio <= 2 and last.p99[q] <= TARGET_P99_MS
        rows.append([q, *cells, f"{ratio:.2f}", "met" if ok else "**missed**"])
    empty = steps[0].ingest_rate or 0
    lines = [
        f"- command: `python -m bench scale{' ' + ' '.join(argv) if argv else ''}`",
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {machine()}",
        f"- {reps} runs per query and size, one client, through PostgresStore.query/count;"
        " signatures are random bytes (the store never verifies them)",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
        *("| " + " | ".join(r) + " |" for r in rows),
        "",
        "| store | rows | database MB | load s | ingest ev/s on top | CPU us/event | vs empty |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in steps:
        rate = s.ingest_rate
        rel = f"{rate / empty:.2f}" if rate and empty else "-"
        lines.append(
            f"| {_n(s.size) if s.size else 'empty'} | {s.rows:,} | {s.db_mb:,.0f} |"
            f" {s.load_seconds:.0f} | {rate or 0:,.0f} | {s.ingest_cpu_us or 0:.0f} | {rel} |"
        )
    return "\n".join(lines)


def write_charts(steps: list[Step], directory: Path) -> list[Path]:
    sized = [s for s in steps if s.size]
    xs = [float(s.size) for s in sized]
    out = []
    p = charts.lines(
        directory / "scale-p99.png",
        "p99 read latency against store size (ms)",
        xs,
        {q: [s.p99[q] for s in sized] for q in QUERIES},
        "events in the store",
        "p99 ms",
        limit=TARGET_P99_MS,
    )
    if p:
        out.append(p)
    p = charts.lines(
        directory / "scale-cpu.png",
        "relay+PostgreSQL CPU per query against store size (us)",
        xs,
        {q: [s.cpu_us.get(q) for s in sized] for q in QUERIES},
        "events in the store",
        "CPU us per query",
    )
    if p:
        out.append(p)
    ing = [s for s in steps if s.ingest_rate]
    p = charts.bars(
        directory / "scale-ingest.png",
        "ingest rate on top of each store size (events/s)",
        [_n(s.size) if s.size else "empty" for s in ing],
        {"ev/s": [s.ingest_rate for s in ing]},
        "events/s",
    )
    if p:
        out.append(p)
    return out


def _n(x: int) -> str:
    return f"{x // 1_000_000}M" if x >= 1_000_000 else f"{x // 1000}k"


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
        help="store sizes in events, comma-separated (each at least 10000)",
    )
    ap.add_argument("--reps", type=int, default=300, help="runs per query and size")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--keep", action="store_true", help="leave PostgreSQL running with the store afterwards"
    )
    ap.add_argument("--results", type=Path, help="write the tables into this markdown file")
    ap.add_argument(
        "--charts", type=Path, help="directory for the PNG charts (default: next to --results)"
    )
    args = ap.parse_args(argv)
    sizes = sorted({int(s) for s in args.sizes.split(",") if s})
    if not sizes or sizes[0] < INGEST_PROBE:
        ap.error(f"sizes must be at least {INGEST_PROBE}")
    t0 = time.monotonic()
    steps = run_scale(sizes, args.reps, args.seed, lambda s: print(s, flush=True), keep=args.keep)
    text = report(steps, argv, args.reps)
    directory = args.charts or (args.results.parent if args.results else None)
    if directory is not None:
        made = write_charts(steps, directory)
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
