"""`python -m bench prefill --size N`: make a pre-filled store ahead of a run, list the kept
ones, or serve a copy for `bench load` (the store itself: bench/prefillstore.py)."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import corpus
from bench.peers import Postgres, home, start_engram
from bench.prefillstore import open_store, read_marker


def _serve(pg: Postgres, say: Callable[[str], None]) -> None:
    """A copy of the store behind `engram serve` until interrupted, then dropped."""
    url, drop = pg.create_database(pg.template)
    workdir = Path(pg.pgdata).parent / "serve-relay"
    try:
        relay = start_engram(workdir, ["--database-url", url])
        try:
            say(
                f"serving a copy at {relay.url} (relay pid {relay.pid}, PostgreSQL pid"
                f" {pg.pid}); for example: python -m bench load --url {relay.url}"
                f" --pid {relay.pid} --pg-pid {pg.pid} --profile sustained; Ctrl-C stops"
            )
            with contextlib.suppress(KeyboardInterrupt):
                signal.signal(signal.SIGTERM, _interrupt)
                while relay.proc.poll() is None:
                    time.sleep(1)
            if relay.proc.poll() is not None:
                say(f"the relay exited: {relay.log_tail(5)}")
        finally:
            relay.stop()
    finally:
        drop()
        with contextlib.suppress(OSError):
            shutil.rmtree(workdir)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench prefill",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--size", type=int, help="events to fill it with (e.g. 1000000)")
    p.add_argument("--corpus", choices=corpus.CORPORA, default="realistic")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--serve", action="store_true", help="then serve a copy with `engram serve` until Ctrl-C"
    )
    p.add_argument("--list", action="store_true", help="list the kept stores")
    args = p.parse_args(argv)
    say = lambda s: print(s, flush=True)  # noqa: E731
    if args.list:
        for directory in sorted((home() / "prefill").glob("*")):
            filled = read_marker(directory)
            say(f"{directory}: {filled.describe() if filled else 'not filled (cut short?)'}")
        return 0
    if not args.size or args.size < 1:
        p.error("--size N (at least 1) is required, or --list")
    pg, filled = open_store(args.corpus, args.seed, args.size, say)
    try:
        say(filled.describe())
        if args.serve:
            _serve(pg, say)
    finally:
        pg.close()
    say(f"PostgreSQL stopped; remove the store with: rm -rf {filled.directory}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
