"""Publish-to-delivery latency across relay processes sharing one PostgreSQL.

`python -m bench crossnode [--rates 100,500,2000] [--seconds 5]` starts two relay
processes (`engram serve`) on one embedded PostgreSQL, subscribes on node A and publishes
on node B at each rate, and prints p50/p99/max of publish -> delivery, with the same
figures for a subscriber on node B (same process) as the baseline. Prints figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import websockets

from bench.peers import Running, start_engram
from bench.results import quantile
from engram.nip01 import pubkey_of, sign_event

AUX = bytes(32)


async def _measure(pub_url: str, sub_urls: dict[str, str], rate: int, seconds: float) -> None:
    sk = os.urandom(32)
    flt = {"authors": [pubkey_of(sk)]}
    sent: dict[str, float] = {}
    latencies: dict[str, list[float]] = {name: [] for name in sub_urls}
    subs = {}
    for name, url in sub_urls.items():
        ws = await websockets.connect(url, max_size=None)
        await ws.send(msgspec.json.encode(["REQ", "s", flt]).decode())
        while msgspec.json.decode(await ws.recv())[0] != "EOSE":
            pass
        subs[name] = ws

    async def receive(name: str, ws: websockets.ClientConnection) -> None:
        async for frame in ws:
            t = time.perf_counter()
            msg = msgspec.json.decode(frame)
            if msg[0] == "EVENT" and msg[2]["id"] in sent:
                latencies[name].append(t - sent[msg[2]["id"]])

    readers = [asyncio.create_task(receive(n, ws)) for n, ws in subs.items()]
    n = int(rate * seconds)
    events = [sign_event(sk, int(time.time()), 1, [], f"lat {i}", AUX) for i in range(n)]
    frames = [msgspec.json.encode(["EVENT", e]).decode() for e in events]
    pub = await websockets.connect(pub_url, max_size=None)
    drain = asyncio.create_task(_drain(pub))
    start = time.perf_counter()
    for i, (e, frame) in enumerate(zip(events, frames, strict=True)):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        sent[e.id] = time.perf_counter()
        await pub.send(frame)
    await asyncio.sleep(2.0)
    for task in (*readers, drain):
        task.cancel()
    for ws in (*subs.values(), pub):
        await ws.close()
    for name, values in latencies.items():
        if not values:
            print(f"  {rate:>6}/s  {name:<22} no deliveries")
            continue
        p50, p99 = quantile(values, 0.5) or 0.0, quantile(values, 0.99) or 0.0
        print(
            f"  {rate:>6}/s  {name:<22} delivered {len(values):>6}/{n:<6}"
            f" p50 {p50 * 1e3:7.2f} ms"
            f"  p99 {p99 * 1e3:7.2f} ms  max {max(values) * 1e3:7.2f} ms"
        )


async def _drain(ws: websockets.ClientConnection) -> None:
    async for _ in ws:
        pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench crossnode", description=__doc__)
    parser.add_argument("--rates", default="100,500,2000", help="events/s, comma separated")
    parser.add_argument("--seconds", type=float, default=5.0, help="per rate")
    parser.add_argument("--database-url", help="an existing database (default: embedded)")
    args = parser.parse_args(argv)
    from relay.store.embedded import ensure_database, start_server, with_database

    workdir = Path(tempfile.mkdtemp(prefix="engram-crossnode-"))
    server = None
    nodes: list[Running] = []
    try:
        if args.database_url:
            db_url = args.database_url
        else:
            server = start_server(workdir / "pgdata", cleanup_mode="delete")
            asyncio.run(ensure_database(server.get_uri(), "crossnode"))
            db_url = with_database(server.get_uri(), "crossnode")
        quiet = {"ENGRAM_LOG_LEVEL": "warning"}
        for name in ("a", "b"):
            nodes.append(start_engram(workdir / name, ["--database-url", db_url], quiet))
        a, b = nodes
        print("publish on node B; latency publish -> delivery (loopback, 2 relay processes)")
        for rate in (int(r) for r in args.rates.split(",")):
            subs = {"node A (other process)": a.url, "node B (same process)": b.url}
            asyncio.run(_measure(b.url, subs, rate, args.seconds))
        return 0
    finally:
        for node in nodes:
            node.stop()
        if server is not None:
            server.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
