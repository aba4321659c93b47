"""Relay memory with stalled subscribers: `python -m bench stalled [--subscribers 1000]`.

Starts this relay (embedded PostgreSQL, default settings unless overridden with --env),
opens N subscribers on bare sockets with a small receive window that never read, then
has four publishers push a burst of events they all match. Prints the relay process's
RSS (not PostgreSQL's) at start, with the subscribers connected, at its peak during the
burst and after the stalled subscribers were dropped, next to the relay's own queue
accounting from /metrics (the numbers the send-queue budget bounds). Figures only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shutil
import socket
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import websockets

from bench.peers import start_engram
from engram.nip01 import pubkey_of, sign_event
from relay.wire import encode_event

MIB = 1024 * 1024


def stalled_socket(port: int, flt: dict) -> socket.socket:
    """A websocket subscriber that never reads after its REQ (4 KiB receive window)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    payload = json.dumps(["REQ", "stalled", flt]).encode()
    n = len(payload)
    header = b"\x81" + (bytes([0x80 | n]) if n < 126 else b"\xfe" + n.to_bytes(2, "big"))
    sock.sendall(header + bytes(4) + payload)  # zero masking key: the payload as is
    return sock


def scrape(port: int) -> dict[str, float]:
    """Unlabelled samples plus the drop counters by reason."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        lines = r.read().decode().splitlines()
    out: dict[str, float] = {}
    for line in lines:
        if line.startswith("engram_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


class PeakRss(threading.Thread):
    """The relay process's largest RSS, sampled every 50 ms until stopped."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.proc = psutil.Process(pid)
        self.peak = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            with contextlib.suppress(psutil.Error):
                self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.05)


async def publish(url: str, events: list[bytes], publishers: int = 4) -> None:
    async def one(chunk: list[bytes]) -> None:
        async with websockets.connect(url, max_size=None) as ws:
            for i in range(0, len(chunk), 100):
                part = chunk[i : i + 100]
                for frame in part:
                    await ws.send(frame.decode())
                oks = 0
                while oks < len(part):
                    if json.loads(await ws.recv())[0] == "OK":
                        oks += 1

    await asyncio.gather(*(one(events[i::publishers]) for i in range(publishers)))


def _burst(count: int, size: int) -> tuple[dict[str, list[str]], list[bytes]]:
    """The subscribers' filter and the EVENT frames of the burst (signed up front)."""
    sk = bytes(31) + b"\x07"
    flt = {"authors": [pubkey_of(sk)]}
    now = int(time.time())
    events = [
        b'["EVENT",'
        + encode_event(sign_event(sk, now, 1, [], f"{i:06d}" + "z" * size, bytes(32)))
        + b"]"
        for i in range(count)
    ]
    return flt, events


def _mb(n: float) -> float:
    return n / MIB


def _wait_all_gone(port: int, seconds: float = 120) -> dict[str, float]:
    """/metrics once no connection is left (the relay dropped the stalled ones), or at
    the deadline."""
    deadline = time.monotonic() + seconds
    while True:
        m = scrape(port)
        if time.monotonic() >= deadline:
            return m
        if m.get('engram_connections{tenant="default"}', 0) == 0:  # all gone
            return m
        time.sleep(0.5)


def _measure(
    relay: Any, args: argparse.Namespace, flt: dict, events: list[bytes], socks: list
) -> None:
    port = int(relay.url.rsplit(":", 1)[1])
    proc = psutil.Process(relay.pid)
    print(f"relay RSS at start: {_mb(proc.memory_info().rss):.1f} MiB")
    socks += [stalled_socket(port, flt) for _ in range(args.subscribers)]
    time.sleep(1.0)
    print(
        f"{args.subscribers} stalled subscribers connected: {_mb(proc.memory_info().rss):.1f} MiB"
    )
    watch = PeakRss(relay.pid)
    watch.start()
    t0 = time.monotonic()
    asyncio.run(publish(relay.url, events))
    burst = args.events * args.size
    took = time.monotonic() - t0
    print(
        f"burst of {args.events} x {args.size} B ({_mb(burst):.0f} MiB to each subscriber,"
        f" {_mb(burst) * args.subscribers / 1024:.1f} GiB in all) in {took:.1f} s"
    )
    m = scrape(port)
    print(
        f"  queued now {_mb(m.get('engram_send_queue_bytes', 0)):.1f} MiB; peak total "
        f"{_mb(m.get('engram_send_queue_bytes_peak', 0)):.1f} MiB (budget "
        f"{_mb(m.get('engram_send_queue_budget_bytes', 0)):.0f} MiB); peak one connection "
        f"{_mb(m.get('engram_send_queue_connection_bytes_peak', 0)):.1f} MiB"
    )
    m = _wait_all_gone(port)
    watch.done.set()
    watch.join()
    drops = {k.split('"')[1]: int(v) for k, v in m.items() if "drops_total{" in k}
    print(f"  peak relay RSS during the burst: {_mb(watch.peak):.1f} MiB")
    print(
        f"  dropped: {int(m.get('engram_slow_consumers_total', 0))} ({drops}); "
        f"queued now {_mb(m.get('engram_send_queue_bytes', 0)):.1f} MiB; "
        f"relay RSS {_mb(proc.memory_info().rss):.1f} MiB"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench stalled", description=__doc__)
    parser.add_argument("--subscribers", type=int, default=1000)
    parser.add_argument("--events", type=int, default=2000, help="events in the burst")
    parser.add_argument("--size", type=int, default=16_000, help="content bytes per event")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE for the relay")
    parser.add_argument("--log", help="keep the relay's log at this path")
    args = parser.parse_args(argv)
    env = {
        "ENGRAM_LOG_LEVEL": "error",
        # no ping timeout mid-run: only the slow-consumer policy closes the subscribers
        "ENGRAM_PING_INTERVAL_SECONDS": "3600",
        **dict(kv.split("=", 1) for kv in args.env),
    }
    flt, events = _burst(args.events, args.size)
    workdir = Path(tempfile.mkdtemp(prefix="engram-stalled-"))
    (workdir / "data").mkdir()  # a --data-dir must exist (a new database is made there)
    relay = start_engram(workdir, ["--data-dir", str(workdir / "data")], env)
    socks: list[socket.socket] = []
    try:
        _measure(relay, args, flt, events, socks)
        return 0
    finally:
        for s in socks:
            s.close()
        relay.stop()
        if args.log:
            shutil.copy(workdir / "relay.log", args.log)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
