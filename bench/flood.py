"""`python -m bench flood`: one client's REQ latency while others flood costly REQs.

Issue 25, "done when" 3: while 8 connections send costly REQs back to back, another
client's `authors` REQs keep p99 <= 50 ms, and every flooded REQ ends with EOSE or a
clear CLOSED reason, never a hang.

The store is `bench scale`'s (bench/scale.py, bench/corpus.py): a fresh embedded
PostgreSQL and a real `engram serve` on it (default settings), loaded with the signed
corpus (`--corpus`, default skewed) up to `--size` events through the relay's websocket
(8 connections x 100 EVENTs in flight, one write per message), then VACUUM ANALYZE.
The corpus comes from the cache of `bench scale` when one holds that size (whatever
sizes it was made for; only the chunks up to `--size` are read), else it is signed
anew for the default sizes up to `--size`.

Then two timed phases of `--seconds` each:
  baseline  the victim alone: one connection from 127.0.0.2 (another client's address
            as the relay sees it: its own per-IP read budget) sending
            {"authors":[a],"limit":10} one at a time, a drawn by author popularity
            (scale's `authors` shape), each CLOSEd after its EOSE
  flood     the same victim, while `--flooders` connections from 127.0.0.1 (one
            anonymous client; loopback is exempt from rate limits, so this is a
            flood no rate limit thins) each keep `--in-flight` costly REQs in flight,
            the next sent as soon as one is answered, rotating through FLOOD_SHAPES:
            absent and rare words and tag values, many-valued absent tag lists, a
            common value or word with a kind nobody publishes or a time span long past
            (every row of the value is read and turned down), and 16 such filters in
            one REQ.
Every flooded REQ's outcome is recorded: EOSE, CLOSED with its reason (grouped by its
text with numbers blanked), the connection closed under it, or no answer within
`--deadline` seconds (a hang: the REQ is then CLOSEd by the client and reported loudly).
After the flood phase no new REQ is sent and the ones in flight are waited for (up to
the deadline). `--only NAME,...` floods with some shapes only (a shape's own cost: a
flooded REQ's latency is mostly its wait behind the flood's other REQs).

Reported: the victim's p50/p99/max and outcomes in each phase, relay / PostgreSQL /
bench cores busy in each phase (CPU seconds of the process trees, the postmaster's
included, over wall seconds), flooded REQs per shape and outcome with their latency,
answered flooded REQs per second, the relay's `engram_reads_closed_total` by reason
before and after the flood (/metrics), and the load average before and after. The
verdict: met when the victim's p99 under flood is <= 50 ms and every flooded REQ ended
with EOSE or CLOSED.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench import corpus, wsclient
from bench.compare import write_results
from bench.corpus import BASE_TIME, CHUNK, CORPORA, Picks, Prepared
from bench.load import Watch, reason_key, run_async
from bench.scale import (
    DEFAULT_SIZES,
    Asker,
    RelayTarget,
    fresh_store,
    load_chunk,
    request,
    vacuum_analyze,
)
from bench.scalereport import WARMUP, run_lines, size_label

BEGIN, END = "<!-- flood:begin -->", "<!-- flood:end -->"
TARGET_P99_MS = 50.0  # issue 25, done when 3
FLOODER_ADDRESS = "127.0.0.1"  # the flooding client (all its connections)
VICTIM_ADDRESS = "127.0.0.2"  # another client
ABSENT_KIND = 5  # no corpus publishes kind 5 (corpus.KIND_MIX)
LIMIT = 10
MAX_FILTERS = 16  # relay.config.Limits.max_filters
MAX_VALUES = 256  # relay.config.Limits.max_filter_values
HANG = "no answer within the deadline (hang)"
DROPPED = "connection closed under it"

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_enc = msgspec.json.encode


# --- what the flooders send --------------------------------------------------------------


@dataclass
class FloodShape:
    name: str
    what: str  # the filter(s), for the report
    make: Callable[[random.Random], list[dict[str, Any]]]  # the filters of one REQ


def flood_shapes(picks: Picks) -> list[FloodShape]:
    """The costly REQs, from the values of this store size (a shape whose values the
    corpus lacks at this size is left out)."""
    v = picks.values

    def absent(what: str) -> Callable[[random.Random], str]:
        return lambda rng: corpus.absent(what, rng.randrange(10**9))

    def one_of(key: str) -> Callable[[random.Random], Any] | None:
        values = v.get(key) or []
        return (lambda rng: rng.choice(values)) if values else None

    known_t = [x for c in ("common", "mid", "rare") for x in v.get(f"#t {c}") or []]
    known_t = list(dict.fromkeys(known_t))[:MAX_VALUES]
    span = BASE_TIME + 3600  # the corpus's first hour
    out = [
        FloodShape(
            "search absent",
            f"search a word no event has, limit {LIMIT}",
            lambda rng: [{"search": absent("search")(rng), "limit": LIMIT}],
        )
    ]
    for tag in ("#e", "#p", "#t"):
        out.append(
            FloodShape(
                f"{tag} absent",
                f"`{tag}` a value no event has, limit {LIMIT}",
                lambda rng, tag=tag: [{tag: [absent(tag)(rng)], "limit": LIMIT}],
            )
        )
    out.append(
        FloodShape(
            f"#t {MAX_VALUES} absent",
            f"`#t` {MAX_VALUES} values no event has, limit {LIMIT}",
            lambda rng: [{"#t": [absent("#t")(rng) for _ in range(MAX_VALUES)], "limit": LIMIT}],
        )
    )
    rare = one_of("search rare")
    if rare is not None:
        out.append(
            FloodShape(
                "search rare",
                f"search a word on 1-5 events, limit {LIMIT}",
                lambda rng: [{"search": rare(rng), "limit": LIMIT}],
            )
        )
    common_word = one_of("search common")
    if common_word is not None:
        out += [
            FloodShape(
                f"search common in kind {ABSENT_KIND}",
                f"search a top-5 word in kind {ABSENT_KIND} (none), limit {LIMIT}",
                lambda rng: [{"search": common_word(rng), "kinds": [ABSENT_KIND], "limit": LIMIT}],
            ),
            FloodShape(
                "search common in first hour",
                f"search a top-5 word until the corpus's first hour, limit {LIMIT}",
                lambda rng: [{"search": common_word(rng), "until": span, "limit": LIMIT}],
            ),
            FloodShape(
                "search common + absent",
                f"search a top-5 word AND a word no event has, limit {LIMIT}",
                lambda rng: [
                    {"search": f"{common_word(rng)} {absent('search')(rng)}", "limit": LIMIT}
                ],
            ),
        ]
    for tag in ("#t", "#p"):
        common = one_of(f"{tag} common")
        if common is not None:
            out.append(
                FloodShape(
                    f"{tag} common in kind {ABSENT_KIND}",
                    f"`{tag}` a top-5 value, kinds [{ABSENT_KIND}] (none), limit {LIMIT}",
                    lambda rng, tag=tag, common=common: [
                        {tag: [common(rng)], "kinds": [ABSENT_KIND], "limit": LIMIT}
                    ],
                )
            )
    if known_t:
        out.append(
            FloodShape(
                f"#t known in kind {ABSENT_KIND}",
                f"`#t` the {len(known_t)} common, mid and rare values, kinds"
                f" [{ABSENT_KIND}] (none), limit {LIMIT}",
                lambda rng: [{"#t": list(known_t), "kinds": [ABSENT_KIND], "limit": LIMIT}],
            )
        )
    singles = list(out)
    out.append(
        FloodShape(
            f"{MAX_FILTERS} filters",
            f"{MAX_FILTERS} filters in one REQ, each of a shape above (drawn)",
            lambda rng: [rng.choice(singles).make(rng)[0] for _ in range(MAX_FILTERS)],
        )
    )
    return out


# --- outcomes ----------------------------------------------------------------------------


@dataclass
class ShapeStats:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # ms, every answered REQ


@dataclass
class FloodStats:
    shapes: dict[str, ShapeStats] = field(default_factory=dict)
    answered_in_window: int = 0
    returned: int = 0  # events received
    late: int = 0  # answers that came after the REQ was counted as a hang
    reconnects: int = 0
    notices: Counter[str] = field(default_factory=Counter)
    window_open: bool = True

    def record(self, shape: str, outcome: str, seconds: float | None) -> None:
        s = self.shapes[shape]
        s.outcomes[outcome] += 1
        if seconds is not None:
            s.latencies.append(seconds * 1e3)
        if self.window_open:
            self.answered_in_window += 1

    def total(self) -> ShapeStats:
        out = ShapeStats()
        for s in self.shapes.values():
            out.sent += s.sent
            out.outcomes.update(s.outcomes)
            out.latencies += s.latencies
        return out


def closed_outcome(message: str) -> str:
    return f"CLOSED {reason_key(message)}"


class Flooder:
    """One connection keeping `in_flight` costly REQs in flight, each answered one
    CLOSEd after its EOSE, the next sent at once."""

    def __init__(
        self,
        n: int,
        url: str,
        in_flight: int,
        shapes: list[FloodShape],
        stats: FloodStats,
        deadline: float,
        seed: int,
    ) -> None:
        self.n = n
        self.url = url
        self.in_flight = in_flight
        self.shapes = shapes
        self.stats = stats
        self.deadline = deadline
        self.rng = random.Random(f"flood/{seed}/{n}")
        self.turn = n  # each connection starts at another shape
        self.count = 0
        self.pending: dict[str, tuple[str, float]] = {}  # sub -> (shape, sent at)
        self.expired: set[str] = set()
        self.conn: wsclient.WsConnection | None = None
        self.running = False
        self.reopening: asyncio.Task[None] | None = None  # held: the loop keeps weak refs

    async def open(self) -> None:
        self.conn = await wsclient.connect(
            self.url, self.on_message, self.on_close, source=FLOODER_ADDRESS
        )

    def start(self) -> None:
        self.running = True
        self.pump()

    def stop(self) -> None:
        self.running = False

    def pump(self) -> None:
        while self.running and self.conn is not None and not self.conn.closed:
            if len(self.pending) >= self.in_flight:
                return
            shape = self.shapes[self.turn % len(self.shapes)]
            self.turn += 1
            sub = f"f{self.n}-{self.count}"
            self.count += 1
            frame = wsclient.client_frame(_enc(["REQ", sub, *shape.make(self.rng)]))
            self.stats.shapes[shape.name].sent += 1
            self.pending[sub] = (shape.name, time.perf_counter())
            self.conn.send(frame)

    def _answered(self, sub: str, outcome: str) -> None:
        entry = self.pending.pop(sub, None)
        if entry is None:
            if sub in self.expired:
                self.expired.discard(sub)
                self.stats.late += 1
            return
        shape, t0 = entry
        self.stats.record(shape, outcome, time.perf_counter() - t0)
        self.pump()

    def on_message(self, payload: bytes) -> None:
        try:
            items = _frame.decode(payload)
        except msgspec.DecodeError:
            self.stats.notices["undecodable frame from relay"] += 1
            return
        verb = bytes(items[0]) if items else b""
        if verb == b'"EVENT"':
            self.stats.returned += 1
        elif verb == b'"EOSE"' and len(items) >= 2:
            sub = _str.decode(items[1])
            if self.conn is not None:
                self.conn.send(wsclient.client_frame(_enc(["CLOSE", sub])))
            self._answered(sub, "EOSE")
        elif verb == b'"CLOSED"' and len(items) >= 2:
            why = _str.decode(items[2]) if len(items) > 2 else ""
            self._answered(_str.decode(items[1]), closed_outcome(why))
        elif verb == b'"NOTICE"' and len(items) >= 2:
            self.stats.notices[reason_key(_str.decode(items[1]))] += 1

    def on_close(self, reason: str) -> None:
        for shape, _t0 in self.pending.values():
            self.stats.record(shape, f"{DROPPED}: {reason_key(reason)}", None)
        self.pending.clear()
        if self.running:
            self.stats.reconnects += 1
            self.reopening = asyncio.get_running_loop().create_task(self._reopen())

    async def _reopen(self) -> None:
        try:
            await self.open()
        except (OSError, TimeoutError) as exc:
            self.stats.notices[f"reconnect failed: {reason_key(str(exc))}"] += 1
            return
        self.pump()

    def expire(self, now: float) -> None:
        """REQs unanswered past the deadline: counted as hangs, CLOSEd, slots freed."""
        for sub, (shape, t0) in list(self.pending.items()):
            if now - t0 > self.deadline:
                del self.pending[sub]
                self.expired.add(sub)
                self.stats.record(shape, HANG, None)
                if self.conn is not None:
                    self.conn.send(wsclient.client_frame(_enc(["CLOSE", sub])))
        self.pump()

    def close(self) -> None:
        self.running = False
        if self.conn is not None:
            self.conn.close()


# --- the victim ----------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # ms
    outcomes: Counter[str] = field(default_factory=Counter)
    relay_cores: float | None = None
    pg_cores: float | None = None
    bench_cores: float | None = None

    def pct(self, q: float) -> float | None:
        s = sorted(self.latencies)
        return s[min(len(s) - 1, int(q * len(s)))] if s else None


class Victim:
    """Another client: `authors` REQs one at a time (scale's shape), reconnecting if
    the relay drops it."""

    def __init__(self, url: str, authors: list[str], deadline: float, seed: int) -> None:
        self.url = url
        self.authors = authors
        self.asker = Asker(timeout=deadline, source=VICTIM_ADDRESS)
        self.deadline = deadline
        self.rng = random.Random(f"victim/{seed}")
        self.count = 0

    async def ask(self) -> tuple[float, str]:
        if self.asker.conn is None or self.asker.conn.closed:
            self.asker = Asker(timeout=self.deadline, source=VICTIM_ADDRESS)
            await self.asker.open(self.url)
        verb, f = request("authors", self.rng.choice(self.authors))
        sub = f"v{self.count}"
        self.count += 1
        req = wsclient.client_frame(_enc([verb, sub, f]))
        return await self.asker.ask(sub, req, wsclient.client_frame(_enc(["CLOSE", sub])))

    async def run(self, phase: Phase, seconds: float, watch: Watch) -> None:
        before = watch.snapshot()
        t0 = time.perf_counter()
        end = t0 + seconds
        while time.perf_counter() < end:
            elapsed, outcome = await self.ask()
            if outcome == "EOSE":
                phase.latencies.append(elapsed * 1e3)
            phase.outcomes[outcome] += 1
        cores(phase, watch, before, time.perf_counter() - t0)

    def close(self) -> None:
        if self.asker.conn is not None:
            self.asker.conn.close()


def cores(phase: Phase, watch: Watch, before: tuple[Any, ...], wall: float) -> None:
    after = watch.snapshot()
    phase.seconds = wall
    if before[0] is not None and after[0] is not None:
        phase.relay_cores = (after[0] - before[0]) / wall
    if before[1] is not None and after[1] is not None:
        phase.pg_cores = (after[1] - before[1]) / wall
    phase.bench_cores = (after[2] - before[2]) / wall


# --- /metrics --------------------------------------------------------------------------------

_CLOSED_SAMPLE = re.compile(r'^engram_reads_closed_total\{[^}]*reason="([^"]*)"[^}]*\}\s+(\S+)')


def reads_closed(url: str) -> dict[str, float]:
    """The relay's `engram_reads_closed_total`, summed by reason (tenants together)."""
    import urllib.request

    port = url.rsplit(":", 1)[1].split("/", 1)[0]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        m = _CLOSED_SAMPLE.match(line)
        if m:
            out[m.group(1)] += float(m.group(2))
    return dict(out)


# --- the run -------------------------------------------------------------------------------


@dataclass
class FloodRun:
    corpus: str
    size: int
    rows: int = 0
    server: str = ""
    load_seconds: float = 0.0
    refused: Counter[str] = field(default_factory=Counter)
    baseline: Phase = field(default_factory=lambda: Phase("baseline (no flood)"))
    flood: Phase = field(default_factory=lambda: Phase("under flood"))
    stats: FloodStats = field(default_factory=FloodStats)
    shapes: list[FloodShape] = field(default_factory=list)
    drain_seconds: float = 0.0
    closed_before: dict[str, float] = field(default_factory=dict)
    closed_after: dict[str, float] = field(default_factory=dict)


@dataclass
class Options:
    seconds: float
    baseline_seconds: float
    flooders: int
    in_flight: int
    deadline: float
    seed: int
    only: tuple[str, ...] = ()  # flood shapes to send (names); empty: all


async def flood_phases(
    run: FloodRun, url: str, watch: Watch, picks: Picks, o: Options, say: Callable[[str], None]
) -> None:
    """Baseline, then the flood with the victim beside it, then the drain."""
    run.shapes = [s for s in flood_shapes(picks) if not o.only or s.name in o.only]
    run.stats.shapes = {s.name: ShapeStats() for s in run.shapes}
    victim = Victim(url, picks.values["authors"], o.deadline, o.seed)
    flooders = [
        Flooder(n, url, o.in_flight, run.shapes, run.stats, o.deadline, o.seed)
        for n in range(o.flooders)
    ]
    try:
        for _ in range(WARMUP):
            await victim.ask()
        say(f"  baseline: the victim alone for {o.baseline_seconds:g} s ...")
        await victim.run(run.baseline, o.baseline_seconds, watch)
        say("    " + _victim_line(run.baseline))
        run.closed_before = reads_closed(url)
        await asyncio.gather(*(f.open() for f in flooders))
        say(
            f"  flood: {o.flooders} connections x {o.in_flight} REQs in flight"
            f" ({len(run.shapes)} shapes), and the victim, for {o.seconds:g} s ..."
        )
        ticker = asyncio.get_running_loop().create_task(_expire_every(flooders, 0.25))
        for f in flooders:
            f.start()
        await victim.run(run.flood, o.seconds, watch)
        run.stats.window_open = False
        for f in flooders:
            f.stop()
        say("    " + _victim_line(run.flood))
        t0 = time.perf_counter()
        while any(f.pending for f in flooders) and time.perf_counter() - t0 < o.deadline + 2:
            await asyncio.sleep(0.05)
        run.drain_seconds = time.perf_counter() - t0
        ticker.cancel()
        for f in flooders:  # whatever is still pending is past the deadline by now
            f.expire(float("inf"))
        run.closed_after = reads_closed(url)
        total = run.stats.total()
        hangs = total.outcomes.get(HANG, 0)
        say(
            f"    flooded: {total.sent:,} REQs, "
            + ", ".join(f"{k} x{n}" for k, n in total.outcomes.most_common())
        )
        if hangs:
            say(f"    !!! {hangs:,} flooded REQs HUNG: no answer within {o.deadline:g} s")
    finally:
        victim.close()
        for f in flooders:
            f.close()


async def _expire_every(flooders: list[Flooder], period: float) -> None:
    while True:
        await asyncio.sleep(period)
        now = time.perf_counter()
        for f in flooders:
            f.expire(now)


async def _load_and_flood(
    run: FloodRun,
    prepared: Prepared,
    relay: Any,
    pg_pid: int | None,
    dsn: str,
    o: Options,
    say: Callable[[str], None],
) -> None:
    import asyncpg

    target = RelayTarget(relay.url, relay.pid, pg_pid)
    t_load = time.perf_counter()
    for start, end, events in prepared.chunks(run.size):
        chunk = await load_chunk(target, run.corpus, start, end, events, t_load, say)
        run.refused.update(chunk.errors)
    run.load_seconds = time.perf_counter() - t_load
    admin = await asyncpg.connect(dsn)
    try:
        await vacuum_analyze(admin)
        run.rows = await admin.fetchval("SELECT count(*) FROM events")
    finally:
        await admin.close()
    say(f"  {run.corpus} {size_label(run.size)}: {run.rows:,} rows after VACUUM ANALYZE")
    await flood_phases(run, relay.url, target.watch, prepared.picks(run.size), o, say)


def prepared_corpus(name: str, seed: int, size: int, say: Callable[[str], None]) -> Prepared:
    """`bench scale`'s cached corpus holding `size`, else one signed for the default sizes
    up to `size`."""
    found = corpus.cached(name, seed, size, CHUNK)
    if found is not None:
        return found
    sizes = [s for s in DEFAULT_SIZES if s < size] + [size]
    return corpus.prepare(name, seed, sizes, CHUNK, say)


# --- report ----------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def _cores(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _victim_line(p: Phase) -> str:
    odd = {k: n for k, n in p.outcomes.items() if k != "EOSE"}
    return (
        f"victim {p.name}: {len(p.latencies):,} REQs, p50 {_ms(p.pct(0.5))} ms,"
        f" p99 {_ms(p.pct(0.99))} ms, max {_ms(p.pct(1.0))} ms" + (f" {odd}" if odd else "")
    )


def clean(total: ShapeStats) -> bool:
    """Every flooded REQ ended with EOSE or CLOSED."""
    return all(k == "EOSE" or k.startswith("CLOSED ") for k in total.outcomes)


def verdict(run: FloodRun) -> str:
    p99 = run.flood.pct(0.99)
    total = run.stats.total()
    hangs = total.outcomes.get(HANG, 0)
    dropped = sum(n for k, n in total.outcomes.items() if k.startswith(DROPPED))
    victim_odd = sum(n for k, n in run.flood.outcomes.items() if k != "EOSE")
    ok = p99 is not None and p99 <= TARGET_P99_MS and clean(total) and not victim_odd
    why = [
        f"victim p99 under flood {_ms(p99)} ms (target <= {TARGET_P99_MS:g} ms)",
        f"{hangs:,} flooded REQs hung",
        f"{dropped:,} lost with their connection",
    ]
    if victim_odd:
        why.append(f"{victim_odd:,} victim REQs not answered with EOSE")
    return f"**Verdict (issue 25, done when 3): {'met' if ok else 'MISSED'}**: " + "; ".join(why)


def report(run: FloodRun, argv: list[str], o: Options, loadavg: tuple[Any, Any]) -> str:
    total = run.stats.total()
    answered = sum(total.outcomes.values())
    lines = [
        *run_lines("flood", argv, run.server, loadavg),
        f"- store: {run.corpus} corpus, {run.size:,} signed EVENTs sent through `engram serve`'s"
        f" websocket in {run.load_seconds:,.0f} s ({run.rows:,} rows after VACUUM ANALYZE)"
        + (f"; refused: {dict(run.refused.most_common(3))}" if run.refused else ""),
        f'- victim: one connection from {VICTIM_ADDRESS}, `{{"authors":[a],"limit":10}}`'
        " one at a time (a drawn by author popularity), each CLOSEd after its EOSE;"
        f" flood: {o.flooders} connections from {FLOODER_ADDRESS} (loopback: no rate limit)"
        f" x {o.in_flight} REQs in flight, rotating through the shapes below; a REQ"
        f" unanswered {o.deadline:g} s is a hang",
        "",
        "| victim `authors` | s | REQs | p50 ms | p99 ms | max ms | not EOSE |"
        " relay cores | PG cores | bench cores |",
        "|---|--:|--:|--:|--:|--:|---|--:|--:|--:|",
    ]
    for p in (run.baseline, run.flood):
        odd = ", ".join(f"{k} x{n}" for k, n in p.outcomes.items() if k != "EOSE") or "0"
        lines.append(
            f"| {p.name} | {p.seconds:.0f} | {len(p.latencies):,} | {_ms(p.pct(0.5))} |"
            f" {_ms(p.pct(0.99))} | {_ms(p.pct(1.0))} | {odd} | {_cores(p.relay_cores)} |"
            f" {_cores(p.pg_cores)} | {_cores(p.bench_cores)} |"
        )
    rate = run.stats.answered_in_window / run.flood.seconds if run.flood.seconds else 0.0
    lines += [
        "",
        f"Flooded REQs: {total.sent:,} sent, {answered:,} ended"
        f" ({run.stats.answered_in_window:,} within the {run.flood.seconds:.0f} s:"
        f" {rate:,.1f}/s; the rest in {run.drain_seconds:.1f} s after it),"
        f" {run.stats.returned:,} events returned",
        "",
        "Latency of a flooded REQ includes its wait for the relay's read slots (a queue"
        " of the flood's own REQs); `--only SHAPE` floods with one shape to see its cost.",
        "",
        "| flood shape | filter | sent | EOSE | CLOSED | hang | conn. lost | p50 ms | max ms |",
        "|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for shape in run.shapes:
        lines.append(_shape_row(shape.name, shape.what, run.stats.shapes[shape.name]))
    lines.append(_shape_row("**all**", "", total))
    closed = Counter({k: n for k, n in total.outcomes.items() if k.startswith("CLOSED ")})
    if closed:
        lines += ["", "| CLOSED reason (flooded REQs) | REQs |", "|---|--:|"]
        lines += [f"| `{k[7:]}` | {n:,} |" for k, n in closed.most_common()]
    dropped = {k: n for k, n in total.outcomes.items() if k.startswith(DROPPED)}
    if dropped:
        lines += [
            "",
            "Lost with their connection: " + ", ".join(f"{k} x{n}" for k, n in dropped.items()),
        ]
    reasons = sorted(set(run.closed_before) | set(run.closed_after))
    lines += [
        "",
        "`engram_reads_closed_total` (/metrics) before / after the flood: "
        + (
            ", ".join(
                f"{r} {run.closed_before.get(r, 0):,.0f} / {run.closed_after.get(r, 0):,.0f}"
                for r in reasons
            )
            or "0 / 0 (no sample)"
        ),
    ]
    extra = []
    if run.stats.late:
        extra.append(f"{run.stats.late:,} answers came after their REQ was counted as a hang")
    if run.stats.reconnects:
        extra.append(f"flooders reconnected {run.stats.reconnects:,} times")
    if run.stats.notices:
        extra.append("NOTICEs: " + ", ".join(f"{k} x{n}" for k, n in run.stats.notices.items()))
    if extra:
        lines += ["", "; ".join(extra)]
    lines += ["", verdict(run)]
    return "\n".join(lines)


def _shape_row(name: str, what: str, s: ShapeStats) -> str:
    closed = sum(n for k, n in s.outcomes.items() if k.startswith("CLOSED "))
    hang = s.outcomes.get(HANG, 0)
    lost = sum(n for k, n in s.outcomes.items() if k.startswith(DROPPED))
    p50 = statistics.median(s.latencies) if s.latencies else None
    top = max(s.latencies) if s.latencies else None
    hang_cell = f"**{hang:,}**" if hang else "0"
    return (
        f"| {name} | {what} | {s.sent:,} | {s.outcomes.get('EOSE', 0):,} | {closed:,} |"
        f" {hang_cell} | {lost:,} | {_ms(p50)} | {_ms(top)} |"
    )


# --- command line ----------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m bench flood",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--corpus", choices=CORPORA, default="skewed")
    ap.add_argument("--size", type=int, default=1_000_000, help="events loaded (default 1M)")
    ap.add_argument("--seconds", type=float, default=30.0, help="flood phase (wall seconds)")
    ap.add_argument(
        "--baseline-seconds", type=float, help="victim-alone phase (default: --seconds)"
    )
    ap.add_argument("--flooders", type=int, default=8, help="flooding connections")
    ap.add_argument("--in-flight", type=int, default=8, help="REQs in flight per flooder")
    ap.add_argument(
        "--deadline", type=float, default=30.0, help="seconds without an answer = a hang"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--only",
        default="",
        help="flood with these shapes only (names as in the report, comma-separated),"
        " e.g. to see one shape's cost alone",
    )
    ap.add_argument("--results", type=Path, help="write the report into this markdown file")
    args = ap.parse_args(argv)
    if args.size < 1:
        ap.error("--size must be at least 1")
    if args.seconds <= 0 or (args.baseline_seconds is not None and args.baseline_seconds <= 0):
        ap.error("--seconds and --baseline-seconds must be positive")
    if args.flooders < 1 or not 1 <= args.in_flight <= 32:
        ap.error("--flooders must be at least 1 and --in-flight between 1 and 32")
    if args.deadline <= 0:
        ap.error("--deadline must be positive")
    o = Options(
        args.seconds,
        args.baseline_seconds or args.seconds,
        args.flooders,
        args.in_flight,
        args.deadline,
        args.seed,
        tuple(x.strip() for x in args.only.split(",") if x.strip()),
    )
    say = lambda s: print(s, flush=True)  # noqa: E731
    before = os.getloadavg()
    say(f"load average before the run: {', '.join(f'{x:.2f}' for x in before)}")
    t0 = time.monotonic()
    prepared = prepared_corpus(args.corpus, args.seed, args.size, say)
    say(f"{args.corpus}: {args.size:,} signed events ready ({prepared.directory})")
    names = [s.name for s in flood_shapes(prepared.picks(args.size))]
    unknown = [x for x in o.only if x not in names]
    if unknown:
        ap.error(
            f"--only: no flood shape {', '.join(map(repr, unknown))} (shapes: {', '.join(names)})"
        )
    run = FloodRun(args.corpus, args.size)
    with fresh_store(args.corpus, "flood", "ws", False, say) as s:
        run.server = s.server
        run_async(_load_and_flood(run, prepared, s.relay, s.pg.pid, s.dsn, o, say))
    text = report(run, argv, o, (before, os.getloadavg()))
    print()
    print(text)
    print(f"\n(flood took {time.monotonic() - t0:.0f} s)")
    if args.results:
        write_results(args.results, text, BEGIN, END)
        print(f"wrote {args.results}")
    return 0
