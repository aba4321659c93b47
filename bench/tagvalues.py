"""`python -m bench tagvalues`: a REQ's latency by how many `#t` values it names.

Issue 37 asked that a REQ's cost not grow with the planning of its values: before, a tag
filter's values became one `OR`/`UNION` branch each (4.6 s to plan 4,096 of them). Now the
values of a tag travel as one array parameter read in a LATERAL over its `unnest` (one
statement shape whatever the count), and a REQ may name at most `max_req_values` (1,024)
in all. This measures what is left: one `engram serve` on a fresh embedded PostgreSQL,
`--events` kind-1 notes each tagged with one of `--tags` values, then `--reps` REQs one at
a time (each answered before the next is sent) of 16, 256 and 1,024 values (256 a
filter, `limit` 50 each), p50 / p95 / max.

`ENGRAM_BENCH_RELAY_ROOT=/path/to/checkout` runs another checkout's relay (a before/after
comparison with this harness). A benchmark: run it alone on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from bench.peers import Postgres, start_engram
from cli.nostr.client import connect_relay
from engram.nip01 import sign_event

COUNTS = (16, 256, 1024)
PER_FILTER = 256  # values a filter (max_filter_values)


def _filters(n: int, tags: int) -> list[dict[str, object]]:
    per = min(PER_FILTER, n)
    return [
        {"#t": [f"tag{(f * per + j) * 7 % (2 * tags)}" for j in range(per)], "limit": 50}
        for f in range(n // per)
    ]  # half the values are absent: rare and missing values as a real client sends them


async def _measure(url: str, events: int, tags: int, reps: int) -> list[str]:
    sk = os.urandom(32)
    client = await connect_relay(url, sk)
    try:
        now = int(time.time())
        notes = [
            sign_event(sk, now - i, 1, [["t", f"tag{i % tags}"]], f"note {i}", os.urandom(32))
            for i in range(events)
        ]
        for at in range(0, len(notes), 2_000):
            await client.publish_many(notes[at : at + 2_000])
        lines = []
        for n in COUNTS:
            filters = _filters(n, tags)
            took = []
            got = []
            for _ in range(reps):
                began = time.perf_counter()
                got = await client.query(filters)
                took.append(1e3 * (time.perf_counter() - began))
            took.sort()
            p95 = took[min(len(took) - 1, round(0.95 * (len(took) - 1)))]
            lines.append(
                f"| {n:,} | {len(filters)} | {len(got)} | {statistics.median(took):.2f} | "
                f"{p95:.2f} | {took[-1]:.2f} |"
            )
        return lines
    finally:
        await client.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m bench tagvalues", description=__doc__)
    p.add_argument("--events", type=int, default=20_000)
    p.add_argument("--tags", type=int, default=2_000, help="distinct `t` values stored")
    p.add_argument("--reps", type=int, default=40, help="REQs of each size")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="engram-bench-tagvalues-"))
    pg = Postgres(work)
    relay = None
    try:
        url_db, _drop = pg.create_database()
        relay = start_engram(work / "relay", ["--database-url", url_db])
        root = os.environ.get("ENGRAM_BENCH_RELAY_ROOT", "this checkout")
        print(f"relay of {root}; load average {os.getloadavg()[0]:.2f} (a benchmark wants < 0.5)")
        lines = asyncio.run(_measure(relay.url, args.events, args.tags, args.reps))
    finally:
        if relay is not None:
            relay.stop()
        pg.close()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.events:,} notes, {args.tags:,} tag values; {args.reps} REQs of each size")
    print("| `#t` values | filters | events | p50 ms | p95 ms | max ms |")
    print("|--:|--:|--:|--:|--:|--:|")
    print("\n".join(lines))
    return 0
