"""`python -m bench recall speed`: recall's latency, build rate and size on a local relay.

For each size N (default 1k, 10k, 100k): a fresh agent/owner pair, N memories from the
evaluation generator (`bench.recallset`, repeated under new slugs past its 5,405) written to
one relay of ours on an embedded PostgreSQL (not timed), then:
- first build: a new process runs `AgentMemory.recall` once with an empty cache (connect,
  AUTH, paging, verifying and decrypting every event, embedding, indexing, saving the
  cache); memories/s = N / that call's time (the model's load is reported apart);
- warm: `--queries` recalls in that process (API), and through `engram mcp` with the `mcp`
  SDK client (stdio): p50 / p99;
- cold: `engram mem recall QUERY` as a process with a current cache, wall time (median and
  worst of 5), start-up and the check for changes included;
- size: the cache file's bytes per memory; RSS (max resident) of the processes holding the
  index (the API process after its warm queries, and the cold CLI);
- with `--session-calls N`: a long session of one long-running owner (a new process): N
  recall calls `--session-pause` seconds apart, a write every `--session-write-every`
  calls, a background exact check every `--session-reconcile` seconds and a save a second
  after each change: p50 / p99 of the calls (writes not timed) and how many background
  checks and saves ran meanwhile (issue 49: background work off the callers' path).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import asyncio, json, resource, sys, time
from pathlib import Path
from cli.nostr.identity import load_identity
from cli.memory.api import AgentMemory
from cli.memory.recall.dense import load
args = json.loads(sys.argv[1])
t = time.perf_counter(); load(); model_s = time.perf_counter() - t
ident = load_identity(None, args["owner"], None, env={"ENGRAM_PRIVATE_KEY": args["sk"]})
mem = AgentMemory(ident, [args["url"]], timeout=3600, recall_dir=Path(args["dir"]))
async def main():
    t = time.perf_counter(); await mem.recall(args["queries"][0], 10)
    build = time.perf_counter() - t
    times = []
    for q in args["queries"]:
        t = time.perf_counter(); await mem.recall(q, 10); times.append(time.perf_counter() - t)
    return build, times
build, times = asyncio.run(main())
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
now = [int(x.split()[1]) * 1024 for x in open("/proc/self/status") if x.startswith("VmRSS")][0]
print(json.dumps({"model_s": model_s, "build_s": build, "warm": times, "rss": rss, "rss_now": now}))
"""


# A long session of one long-running owner (as `engram mcp` holds it): calls with a pause
# between them and a write every few calls, so that background exact checks and saves run
# during the session; only the recall calls are timed.
SESSION_CHILD = r"""
import asyncio, json, sys, time
from pathlib import Path
from cli.nostr.identity import load_identity
from cli.memory.api import AgentMemory
from cli.memory.recall import Recall, RecallSettings
args = json.loads(sys.argv[1])
ident = load_identity(None, args["owner"], None, env={"ENGRAM_PRIVATE_KEY": args["sk"]})
mem = AgentMemory(ident, [args["url"]], timeout=3600, recall_dir=Path(args["dir"]))
settings = RecallSettings(reconcile_seconds=args["reconcile"], save_delay=args["save_delay"])
mem._recall = Recall(ident, [args["url"]], 3600, cache_dir=Path(args["dir"]), settings=settings)
async def main():
    qs = args["queries"]
    await mem.recall(qs[0], 10)
    times = []
    for i in range(args["calls"]):
        if args["write_every"] and i % args["write_every"] == 0:
            await mem.set(f"session/note-{i}", f"Session note {i}: {qs[i % len(qs)]}")
        t = time.perf_counter(); await mem.recall(qs[i % len(qs)], 10)
        times.append(time.perf_counter() - t)
        await asyncio.sleep(args["pause"])
    r = mem._recall
    out = {"times": times, "checks": r.background_checks, "saves": r.background_saves}
    await mem.close()
    return out
print(json.dumps(asyncio.run(main())))
"""


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def _load(url: str, sk: bytes, owner: str, n: int) -> None:
    from bench.recallset import build
    from cli.nostr.client import connect_relay
    from engram import Memory, build_event

    base = build().memories
    client = await connect_relay(url, sk)
    try:
        batch = []
        for i in range(n):
            m = base[i % len(base)]
            slug = m.slug if i < len(base) else f"{m.slug}-r{i // len(base)}"
            body = Memory(slug=slug, value=m.value)
            batch.append(
                build_event(
                    sk, owner, body, m.created_at + i // len(base), os.urandom(32), os.urandom(32)
                )
            )
            if len(batch) == 2_000 or i == n - 1:
                results = await client.try_publish_many(batch)
                bad = [msg for ok, msg in results.values() if not ok]
                if bad:
                    raise RuntimeError(f"refused {len(bad)}: {bad[0]}")
                batch = []
    finally:
        await client.close()


async def _mcp(env: dict[str, str], queries: list[str]) -> list[float]:
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import stdio_client

    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "cli.commands.main", "mcp", "--timeout", "3600"],
        env=env,
        cwd=str(ROOT),
    )
    with open(os.devnull, "w") as errlog:
        async with Client(stdio_client(params, errlog=errlog), read_timeout_seconds=3600) as c:
            await c.call_tool("memory_recall", {"query": queries[0]})  # loads the cache
            times = []
            for q in queries:
                t = time.perf_counter()
                result = await c.call_tool("memory_recall", {"query": q})
                times.append(time.perf_counter() - t)
                assert not result.is_error, result
    return times


def one_size(
    n: int, queries: list[str], workdir: Path, session_args: dict[str, Any]
) -> dict[str, Any]:
    from bench.peers import Postgres, start_engram
    from engram.nip01 import pubkey_of

    pg = Postgres(workdir)
    relay = None
    try:
        url_db, _drop = pg.create_database()
        env = {"ENGRAM_LOG_LEVEL": "warning", "PYTHONPATH": str(ROOT)}
        relay = start_engram(workdir / "relay", ["--database-url", url_db], env)
        sk, owner_sk = os.urandom(32), os.urandom(32)
        owner = pubkey_of(owner_sk)
        t = time.perf_counter()
        asyncio.run(_load(relay.url, sk, owner, n))
        print(f"  {n} memories written in {time.perf_counter() - t:.0f} s (not timed)")
        data_home = workdir / "data"
        cache_dir = data_home / "engram-relay" / "recall"
        args = {
            "owner": owner,
            "sk": sk.hex(),
            "url": relay.url,
            "dir": str(cache_dir),
            "queries": queries,
        }
        child = subprocess.run(
            [sys.executable, "-c", CHILD, json.dumps(args)], cwd=ROOT, capture_output=True
        )
        if child.returncode:
            raise RuntimeError(f"the API process failed: {child.stderr.decode()[-2000:]}")
        api = json.loads(child.stdout)
        (cache_file,) = cache_dir.glob("*.bin")
        env_cli = {
            **os.environ,
            "ENGRAM_PRIVATE_KEY": sk.hex(),
            "ENGRAM_OWNER": owner,
            "ENGRAM_RELAY": relay.url,
            "XDG_DATA_HOME": str(data_home),
        }
        mcp_times = asyncio.run(_mcp(env_cli, queries))
        walls = []
        for q in queries[:5]:
            t = time.perf_counter()
            subprocess.run(
                [sys.executable, "-m", "cli.commands.main", "mem", "recall", q],
                env=env_cli,
                cwd=ROOT,
                capture_output=True,
                check=True,
            )
            walls.append(time.perf_counter() - t)
        cli_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
        session: dict[str, float] = {}
        if session_args["calls"]:
            child = subprocess.run(
                [sys.executable, "-c", SESSION_CHILD, json.dumps(args | session_args)],
                cwd=ROOT,
                capture_output=True,
            )
            if child.returncode:
                raise RuntimeError(f"the session process failed: {child.stderr.decode()[-2000:]}")
            got = json.loads(child.stdout)
            session = {
                "session_calls": float(len(got["times"])),
                "session_p50_ms": 1e3 * _pct(got["times"], 50),
                "session_p99_ms": 1e3 * _pct(got["times"], 99),
                "session_checks": float(got["checks"]),
                "session_saves": float(got["saves"]),
            }
        return {
            "n": n,
            "model_s": api["model_s"],
            "build_s": api["build_s"],
            "build_rate": n / api["build_s"],
            "api_p50_ms": 1e3 * _pct(api["warm"], 50),
            "api_p99_ms": 1e3 * _pct(api["warm"], 99),
            "mcp_p50_ms": 1e3 * _pct(mcp_times, 50),
            "mcp_p99_ms": 1e3 * _pct(mcp_times, 99),
            "cold_median_s": statistics.median(walls),
            "cold_max_s": max(walls),
            "cache_bytes_per_memory": cache_file.stat().st_size / n,
            "rss_api_mb": api["rss"] / 2**20,
            "rss_api_now_mb": api["rss_now"] / 2**20,
            "rss_children_max_mb": cli_rss / 2**20,
        } | session
    finally:
        if relay is not None:
            relay.stop()
        pg.close()


def speed(argv: list[str]) -> int:
    from bench.recallset import build

    p = argparse.ArgumentParser(prog="python -m bench recall speed")
    p.add_argument("--sizes", default="1000,10000,100000")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument(
        "--session-calls", type=int, default=0, help="also a long session of N calls (0: none)"
    )
    p.add_argument("--session-pause", type=float, default=0.02, help="seconds between calls")
    p.add_argument("--session-reconcile", type=float, default=5.0, help="background check every")
    p.add_argument("--session-write-every", type=int, default=20, help="a write every N calls")
    args = p.parse_args(argv)
    session_args = {
        "calls": args.session_calls,
        "pause": args.session_pause,
        "reconcile": args.session_reconcile,
        "save_delay": 1.0,
        "write_every": args.session_write_every,
    }
    questions = [q.text for q in build().questions][: args.queries]
    print(f"load: {os.getloadavg()[0]:.2f} (a benchmark wants < 0.5); {os.cpu_count()} CPUs")
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        workdir = Path(tempfile.mkdtemp(prefix="engram-recall-speed-"))
        try:
            row = one_size(n, questions, workdir, session_args)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        rows.append(row)
        print("  " + json.dumps({k: round(v, 3) for k, v in row.items()}))
    print(
        "| memories | first build (memories/s) | API p50 / p99 ms | MCP p50 / p99 ms | "
        "cold CLI median / worst s | cache bytes/memory | RSS API / CLI MB |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:,} | {r['build_rate']:,.0f} | {r['api_p50_ms']:.1f} / "
            f"{r['api_p99_ms']:.1f} | {r['mcp_p50_ms']:.1f} / {r['mcp_p99_ms']:.1f} | "
            f"{r['cold_median_s']:.2f} / {r['cold_max_s']:.2f} | "
            f"{r['cache_bytes_per_memory']:.0f} | {r['rss_api_mb']:.0f} / "
            f"{r['rss_children_max_mb']:.0f} |"
        )
    if args.session_calls:
        print("\n| memories | session calls | p50 / p99 ms | background checks | saves |")
        print("|---|---|---|---|---|")
        for r in rows:
            print(
                f"| {r['n']:,} | {r['session_calls']:.0f} | {r['session_p50_ms']:.1f} / "
                f"{r['session_p99_ms']:.1f} | {r['session_checks']:.0f} | "
                f"{r['session_saves']:.0f} |"
            )
    return 0
