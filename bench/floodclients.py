"""The two clients of `bench flood` and what they count.

`Flooder`: one connection from FLOODER_ADDRESS keeping `in_flight` costly REQs in flight
(bench.floodshapes, in rotation), each CLOSEd after its EOSE and the next sent at once;
every REQ's outcome is recorded per shape (`FloodStats`): EOSE, CLOSED with its reason,
the connection lost under it, or no answer within the deadline (a hang).
`Victim`: another client (VICTIM_ADDRESS) asking `authors` REQs one at a time.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field

import msgspec

from bench import wsclient
from bench.asker import Asker, request
from bench.floodshapes import FloodShape
from bench.procwatch import Snapshot, Watch
from bench.results import quantile, reason_key

FLOODER_ADDRESS = "127.0.0.1"  # the flooding client (all its connections)
VICTIM_ADDRESS = "127.0.0.2"  # another client
HANG = "no answer within the deadline (hang)"
DROPPED = "connection closed under it"

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_enc = msgspec.json.encode


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
        return quantile(self.latencies, q)


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


def cores(phase: Phase, watch: Watch, before: Snapshot, wall: float) -> None:
    relay, pg, bench = watch.since(before)
    phase.seconds = wall
    if relay is not None:
        phase.relay_cores = relay / wall
    if pg is not None:
        phase.pg_cores = pg / wall
    phase.bench_cores = bench / wall
