"""Memory over a long mixed run: `python -m bench soak [--minutes 10]`.

Starts this relay (embedded PostgreSQL, default settings) and drives it with rounds of
the standard load phases (ingest, engram ingest, REQ, head fetch, fan-out to 100
subscribers), each round with fresh events, until the time is up; prints the relay's
RSS after every round, so a leak shows as a rising column. Prints figures only.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench.lanes import raise_fd_limit, run_async
from bench.peers import start_engram
from bench.procwatch import Watch
from bench.workload import Profile, run_load


def _rss_mb(pid: int) -> float:
    return (Watch.tree_rss(pid) or 0) / 2**20


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--events", type=int, default=10_000, help="kind-1 events per round")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="engram-soak-"))
    (workdir / "data").mkdir()  # a --data-dir must exist (a new database is made there)
    relay = start_engram(
        workdir, ["--data-dir", str(workdir / "data")], {"ENGRAM_LOG_LEVEL": "warning"}
    )
    raise_fd_limit()
    try:
        start = time.monotonic()
        print(f"relay pid {relay.pid}; RSS {_rss_mb(relay.pid):.1f} MB at start")
        print("round  minutes  ops  RSS MB")
        round_ = 0
        while time.monotonic() - start < args.minutes * 60:
            round_ += 1
            profile = Profile(
                seed=1000 + round_,
                events=args.events,
                engrams=args.events // 2,
                reqs=2000,
                heads=2000,
                subscribers=(100,),
                fanout_seconds=3,
            )
            ops = len(run_async(run_load(relay.url, profile)))  # phases run
            minutes = (time.monotonic() - start) / 60
            print(f"{round_:>5}  {minutes:7.1f}  {ops:>3}  {_rss_mb(relay.pid):6.1f}", flush=True)
        return 0
    finally:
        relay.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
