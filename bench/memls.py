"""`python -m bench memls`: time `engram mem ls` of N memories on a set of relays of ours.

Starts an embedded PostgreSQL and `--relays` relay processes (each its own database),
writes `--memories` engrams of one agent to every relay (pipelined, not timed), then times
`AgentMemory.ls()` over the whole set (connect, AUTH, NIP-11, paging past max_limit,
validating and decrypting every distinct event, merging heads) and over one relay, and
once the `engram mem ls` command as a process (interpreter start-up included).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


async def _load(urls: list[str], seckey: bytes, owner: str, n: int) -> None:
    from cli.nostr.client import connect_relay
    from engram import Memory, build_event

    now = int(time.time()) - n
    events = [
        build_event(
            seckey,
            owner,
            Memory(slug=f"mem/bench/{i:05d}", value=f"memory number {i} " + "x" * 200),
            now + i // 10,
            os.urandom(32),
            os.urandom(32),
        )
        for i in range(n)
    ]
    for url in urls:
        client = await connect_relay(url, seckey)
        try:
            for start in range(0, n, 2_000):
                results = await client.try_publish_many(events[start : start + 2_000])
                refused = [m for ok, m in results.values() if not ok]
                if refused:
                    raise RuntimeError(f"{url} refused {len(refused)} events: {refused[0]}")
        finally:
            await client.close()


async def _time_ls(memory: object, rounds: int) -> tuple[list[float], int]:
    times: list[float] = []
    count = 0
    for _ in range(rounds):
        start = time.perf_counter()
        listing = await memory.ls()  # type: ignore[attr-defined]
        times.append(time.perf_counter() - start)
        count = len(listing.entries)
    return times, count


def _line(name: str, times: list[float], count: int) -> str:
    best, median = min(times), statistics.median(times)
    return (
        f"{name:<34} {count:>6} memories  best {best:6.2f} s  median {median:6.2f} s"
        f"  ({count / median:,.0f} memories/s)"
    )


def _process_ls(urls: list[str], agent_sk: bytes, owner: str) -> str:
    """`engram mem ls` as a user runs it: a process of its own, the relays from the
    environment; timed from start to exit."""
    cmd = [sys.executable, "-m", "cli.commands.main", "mem", "ls", "--timeout", "600"]
    cli_env = {
        **os.environ,
        "ENGRAM_PRIVATE_KEY": agent_sk.hex(),
        "ENGRAM_OWNER": owner,
        "ENGRAM_RELAY": ",".join(urls),
    }
    start = time.perf_counter()
    out = subprocess.run(cmd, env=cli_env, cwd=ROOT, capture_output=True, check=True)
    took = time.perf_counter() - start
    lines = out.stdout.count(b"\n")
    return _line(f"engram mem ls (process), set of {len(urls)}", [took], lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench memls", description=__doc__)
    parser.add_argument("--memories", type=int, default=5_000)
    parser.add_argument("--relays", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-limit", type=int, default=500, help="each relay's max_limit")
    args = parser.parse_args(argv)

    from bench.peers import Postgres, Running, start_engram
    from cli.memory.api import AgentMemory
    from cli.nostr.identity import load_identity
    from engram.nip01 import pubkey_of

    workdir = Path(tempfile.mkdtemp(prefix="engram-memls-"))
    pg = Postgres(workdir)
    relays: list[Running] = []
    drops = []
    try:
        env = {
            "ENGRAM_LOG_LEVEL": "warning",
            "ENGRAM_LIMITS_MAX_LIMIT": str(args.max_limit),
            "PYTHONPATH": str(ROOT),
        }
        for i in range(args.relays):
            url, drop = pg.create_database()
            drops.append(drop)
            relays.append(start_engram(workdir / f"r{i}", ["--database-url", url], env))
        urls = [r.url for r in relays]
        agent_sk, owner_sk = os.urandom(32), os.urandom(32)
        owner = pubkey_of(owner_sk)
        print(f"loading {args.memories} memories into {len(urls)} relays (not timed)...")
        asyncio.run(_load(urls, agent_sk, owner, args.memories))
        ident = load_identity(None, owner, None, env={"ENGRAM_PRIVATE_KEY": agent_sk.hex()})
        print(f"max_limit {args.max_limit}; {args.rounds} rounds; {os.cpu_count()} CPUs")
        for name, chosen in (
            (f"AgentMemory.ls, set of {len(urls)}", urls),
            ("AgentMemory.ls, one relay", urls[:1]),
        ):
            memory = AgentMemory(ident, chosen, timeout=600)
            times, count = asyncio.run(_time_ls(memory, args.rounds))
            print(_line(name, times, count))
        print(_process_ls(urls, agent_sk, owner))
        return 0
    finally:
        for r in relays:
            r.stop()
        for drop in drops:
            with contextlib.suppress(Exception):
                drop()
        pg.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
