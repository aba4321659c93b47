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
import re
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import corpus
from bench.corpus import CHUNK, CORPORA, DEFAULT_SIZES, Picks, Prepared
from bench.floodclients import HANG, Flooder, ShapeStats, Victim
from bench.floodreport import FloodRun, Options, report, victim_line
from bench.floodshapes import flood_shapes
from bench.lanes import run_async
from bench.procwatch import Watch
from bench.results import write_results
from bench.scalereport import WARMUP, size_label
from bench.served import fresh_store, vacuum_analyze
from bench.targets import RelayTarget, load_chunk

BEGIN, END = "<!-- flood:begin -->", "<!-- flood:end -->"


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
        say("    " + victim_line(run.baseline))
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
        say("    " + victim_line(run.flood))
        await _drain(run, flooders, o.deadline)
        ticker.cancel()
        for f in flooders:  # whatever is still pending is past the deadline by now
            f.expire(float("inf"))
        run.closed_after = reads_closed(url)
        _say_flooded(run, o.deadline, say)
    finally:
        victim.close()
        for f in flooders:
            f.close()


async def _drain(run: FloodRun, flooders: list[Flooder], deadline: float) -> None:
    """No new REQ: wait for the ones in flight to end (up to the deadline, and a bit)."""
    t0 = time.perf_counter()
    while any(f.pending for f in flooders) and time.perf_counter() - t0 < deadline + 2:
        await asyncio.sleep(0.05)
    run.drain_seconds = time.perf_counter() - t0


def _say_flooded(run: FloodRun, deadline: float, say: Callable[[str], None]) -> None:
    total = run.stats.total()
    hangs = total.outcomes.get(HANG, 0)
    say(
        f"    flooded: {total.sent:,} REQs, "
        + ", ".join(f"{k} x{n}" for k, n in total.outcomes.most_common())
    )
    if hangs:
        say(f"    !!! {hangs:,} flooded REQs HUNG: no answer within {deadline:g} s")


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


# --- command line ----------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
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
    return ap


def _options(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Options:
    if args.size < 1:
        ap.error("--size must be at least 1")
    if args.seconds <= 0 or (args.baseline_seconds is not None and args.baseline_seconds <= 0):
        ap.error("--seconds and --baseline-seconds must be positive")
    if args.flooders < 1 or not 1 <= args.in_flight <= 32:
        ap.error("--flooders must be at least 1 and --in-flight between 1 and 32")
    if args.deadline <= 0:
        ap.error("--deadline must be positive")
    return Options(
        args.seconds,
        args.baseline_seconds or args.seconds,
        args.flooders,
        args.in_flight,
        args.deadline,
        args.seed,
        tuple(x.strip() for x in args.only.split(",") if x.strip()),
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = _parser()
    args = ap.parse_args(argv)
    o = _options(ap, args)
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
