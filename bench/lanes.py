"""The client side of a bench run: how frames go out, and connections ("lanes") that keep
a window of operations in flight and time each one.

- `Client` / `CLIENTS`: a load-generator design (bench.wsclient, lean and pre-encoded;
  bench.wslib, the `websockets` library; `pipelined`, joined writes: never a headline).
- `PhaseRun`: one phase's counters and the future that resolves when every operation
  has ended, and, given a chunk size, the CPU and latencies of every `chunk` answers
  (a long ingest's cost as it goes); `drive` is its timed region (every lane started,
  CPU watched).
- `EventLane` (EVENT -> OK), `ReqLane` (REQ -> EOSE, then CLOSE): one connection each,
  everything in callbacks, one write per message unless the client coalesces; a lane
  answers a NIP-42 challenge with `engram.nip42`'s AUTH event.
- `Subscriber` / `FanOut`: live subscriptions timing publish -> delivery.
- `run_async` (uvloop when installed), `raise_fd_limit` (1,000 subscribers need it).

A new bench command drives its own operations by subclassing `Lane` (`remaining`,
`drop_remaining`, `pump`, and `handle` for its answers) and timing it with `drive`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from bench import wsclient, wslib
from bench.events import EventSet
from bench.procwatch import Snapshot, Watch
from bench.results import Chunk, PhaseResult, reason_key
from engram import KIND_ENGRAM
from engram.nip42 import auth_event

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_bool = msgspec.json.Decoder(bool)
_enc = msgspec.json.encode
_EVENT_ID = re.compile(rb'"id"\s*:\s*"([0-9a-f]{64})"')
now = time.perf_counter


@dataclass(frozen=True)
class Client:
    """A load-generator client design: how a message becomes what `send` takes, how a
    connection opens (bench.wsclient: lean, frames pre-encoded; bench.wslib: the
    `websockets` library, a typical Python client), and whether the frames queued while
    reading one chunk go out in one write (`coalesce`).

    Real clients (nostr-sdk, nostr-tools, websockets, picows) write each message on its
    own, so the relay reads about one frame per read: that is the default. Coalescing is
    the named `pipelined` client; its figures hide the relay's cost per read and are
    never the headline."""

    name: str
    frame: Callable[[bytes], bytes]
    connect: Callable[..., Any]
    coalesce: bool = False


CLIENTS = {
    "builtin": Client("builtin", wsclient.client_frame, wsclient.connect),
    "pipelined": Client("pipelined", wsclient.client_frame, wsclient.connect, coalesce=True),
    "websockets": Client("websockets", wslib.frame, wslib.connect),
}


class PhaseRun:
    """Counters of one phase and the future that resolves when all operations ended.

    With `chunk` > 0, the phase is also measured stretch by stretch: each time another
    `chunk` operations have ended, the CPU of the watched processes and the position in
    the latencies are noted, so a long ingest shows whether its cost per EVENT drifts
    (one snapshot per chunk: a few ms of /proc reads per 100,000 answers)."""

    def __init__(self, name: str, expected: int, chunk: int = 0) -> None:
        self.result = PhaseResult(name)
        self.expected = expected
        self.finished = 0
        self.chunk = max(0, chunk)
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._watch: Watch | None = None
        self._marks: list[tuple[int, float, Snapshot, int]] = []
        self._next_mark = 0
        if expected <= 0:
            self.done.set_result(None)

    def finish(self, n: int = 1) -> None:
        self.finished += n
        if self._watch is not None and self.finished >= self._next_mark:
            self._mark(self._watch)
            self._next_mark = (self.finished // self.chunk + 1) * self.chunk
        if self.finished >= self.expected and not self.done.done():
            self.done.set_result(None)

    def start_chunks(self, watch: Watch, t0: float, before: Snapshot) -> None:
        """Measure by chunk from this moment (`drive`'s start) on, if a chunk is set."""
        if self.chunk:
            self._watch = watch
            self._marks = [(0, t0, before, 0)]
            self._next_mark = self.chunk

    def _mark(self, watch: Watch) -> None:
        self._marks.append((self.finished, now(), watch.snapshot(), len(self.result.latencies)))

    def close_chunks(self) -> None:
        """End the last (maybe partial) chunk and file every chunk's figures."""
        watch, self._watch = self._watch, None
        if watch is None:
            return
        if self._marks[-1][0] < self.finished:
            self._mark(watch)
        lat = self.result.latencies
        for (a, t0, s0, l0), (b, t1, s1, l1) in itertools.pairwise(self._marks):
            relay = s1[0] - s0[0] if s0[0] is not None and s1[0] is not None else None
            pg = s1[1] - s0[1] if s0[1] is not None and s1[1] is not None else None
            self.result.chunks.append(Chunk(a, b, t1 - t0, relay, pg, lat[l0:l1]))


class Lane:
    """One connection driving a window of in-flight operations (EVENT->OK or REQ->EOSE).

    Everything happens in callbacks: an answer frees a slot, the next frames are queued,
    and all frames queued while reading one chunk go out in one write.
    """

    def __init__(
        self,
        phase: PhaseRun,
        url: str,
        window: int,
        per_conn_max: int = 0,
        client: Client = CLIENTS["builtin"],
    ) -> None:
        self.client = client
        self.phase = phase
        self.r = phase.result
        self.url = url
        self.window = window
        self.per_conn_max = per_conn_max
        self.conn: Any = None  # wsclient.WsConnection or wslib.WebsocketsConnection
        self.pending: dict[str, Any] = {}
        self.out: list[bytes] = []
        self.on_conn = 0
        self.quiet = False  # closing on purpose: not an error
        self.reconnecting = False
        self.task: asyncio.Future[None] | None = None
        self.challenge: str | None = None
        self.challenge_seen = asyncio.Event()
        self.auth: tuple[str, asyncio.Future[tuple[bool, str]]] | None = None

    async def open(self) -> None:
        self.conn = await self.client.connect(self.url, self.on_message, self.on_close, self.flush)

    def flush(self) -> None:
        if self.out and self.conn is not None:
            if self.client.coalesce:
                self.conn.send_many(self.out)
            else:
                for frame in self.out:  # one write per message, as users' clients send
                    self.conn.send(frame)
            self.out = []

    def close(self) -> None:
        self.quiet = True
        if self.conn is not None:
            self.conn.close()

    def remaining(self) -> int:
        raise NotImplementedError

    def drop_remaining(self) -> None:
        raise NotImplementedError

    def pump(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self.pump()
        self.flush()

    def on_close(self, reason: str) -> None:
        if self.quiet:
            return
        n = len(self.pending) + self.remaining()
        if n:
            self.r.errors[f"connection closed: {reason_key(reason)}"] += n
            self.pending.clear()
            self.drop_remaining()
            self.phase.finish(n)

    async def reconnect(self) -> None:
        """A fresh connection once this one carried `per_conn_max` EVENTs."""
        self.quiet = True
        if self.conn is not None:
            self.conn.close()
        self.quiet = False
        try:
            await self.open()
        except (OSError, TimeoutError) as exc:
            n = self.remaining()
            self.r.errors[f"reconnect failed: {reason_key(str(exc))}"] += n
            self.drop_remaining()
            self.phase.finish(n)
            return
        self.on_conn = 0
        self.reconnecting = False
        self.start()

    def on_message(self, payload: bytes) -> None:
        try:
            items = _frame.decode(payload)
            verb = bytes(items[0]) if items else b""
            self.handle(verb, items)
        except (msgspec.DecodeError, msgspec.ValidationError):
            self.r.errors["undecodable frame from relay"] += 1

    def handle(self, verb: bytes, items: list[msgspec.Raw]) -> None:
        if verb == b'"AUTH"' and len(items) >= 2:
            self.challenge = _str.decode(items[1])
            self.challenge_seen.set()
        elif verb == b'"OK"' and self.auth is not None and len(items) >= 3:
            eid, fut = self.auth
            if _str.decode(items[1]) == eid and not fut.done():
                msg = _str.decode(items[3]) if len(items) > 3 else ""
                fut.set_result((_bool.decode(items[2]), msg))
        elif verb == b'"NOTICE"' and len(items) >= 2:
            self.r.errors[f"NOTICE {reason_key(_str.decode(items[1]))}"] += 1

    async def authenticate(self, seckey: bytes, wait: float = 1.0) -> str | None:
        """NIP-42 AUTH if the relay sends a challenge; returns an error text or None.

        A relay that challenges only when needed (NIP-42 allows it at any time; engram's
        default) is asked for something that needs AUTH: a `limit: 0` read of engrams,
        whose `auth-required:` answer brings the challenge (a relay that serves it
        answers EOSE, and sends no challenge)."""
        assert self.conn is not None
        if not self.challenge_seen.is_set():
            probe = b'["REQ","auth?",{"kinds":[' + str(KIND_ENGRAM).encode() + b'],"limit":0}]'
            self.conn.send(self.client.frame(probe))
        try:
            await asyncio.wait_for(self.challenge_seen.wait(), wait)
        except TimeoutError:
            return "relay sent no AUTH challenge"
        ev = auth_event(seckey, self.url, self.challenge or "", int(time.time()), os.urandom(32))
        fut: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        self.auth = (ev.id, fut)
        self.conn.send(self.client.frame(b'["AUTH",' + _enc(ev) + b"]"))
        try:
            accepted, msg = await asyncio.wait_for(fut, 10)
        except TimeoutError:
            return "no OK for AUTH"
        finally:
            self.auth = None
        return None if accepted else f"AUTH refused: {msg}"


class EventLane(Lane):
    """EVENT frames, answered by OK (matched by event id)."""

    def __init__(
        self,
        phase: PhaseRun,
        url: str,
        window: int,
        frames: list[bytes],
        ids: list[str],
        per_conn_max: int = 0,
        client: Client = CLIENTS["builtin"],
    ) -> None:
        super().__init__(phase, url, window, per_conn_max, client)
        self.frames = frames
        self.ids = ids
        self.pos = 0

    def remaining(self) -> int:
        return len(self.frames) - self.pos

    def drop_remaining(self) -> None:
        self.pos = len(self.frames)

    def pump(self) -> None:
        t = now()
        while len(self.pending) < self.window and self.pos < len(self.frames):
            if self.per_conn_max and self.on_conn >= self.per_conn_max:
                if not self.pending and not self.reconnecting:
                    self.reconnecting = True
                    self.task = asyncio.ensure_future(self.reconnect())
                return
            i = self.pos
            self.pos += 1
            self.on_conn += 1
            self.pending[self.ids[i]] = t
            self.out.append(self.frames[i])

    def handle(self, verb: bytes, items: list[msgspec.Raw]) -> None:
        if verb == b'"OK"' and len(items) >= 3:
            t = self.pending.pop(_str.decode(items[1]), None)
            if t is None:
                return super().handle(verb, items)
            r = self.r
            r.latencies.append(now() - t)
            msg = _str.decode(items[3]) if len(items) > 3 else ""
            if _bool.decode(items[2]):
                r.ops += 1
                if msg:
                    r.notes[reason_key(msg)] += 1
            else:
                r.errors[reason_key(msg)] += 1
            self.phase.finish()
            self.pump()
        else:
            super().handle(verb, items)


class ReqLane(Lane):
    """REQ frames, answered by EOSE (or CLOSED); each REQ is CLOSEd after its EOSE."""

    def __init__(
        self,
        phase: PhaseRun,
        url: str,
        window: int,
        items: list[tuple[str, bytes, bytes]],
        client: Client = CLIENTS["builtin"],
    ) -> None:
        super().__init__(phase, url, window, 0, client)
        self.items = items
        self.pos = 0

    def remaining(self) -> int:
        return len(self.items) - self.pos

    def drop_remaining(self) -> None:
        self.pos = len(self.items)

    def pump(self) -> None:
        t = now()
        while len(self.pending) < self.window and self.pos < len(self.items):
            sub, req, close = self.items[self.pos]
            self.pos += 1
            self.pending[sub] = (t, close)
            self.out.append(req)

    def handle(self, verb: bytes, items: list[msgspec.Raw]) -> None:
        if verb == b'"EVENT"':
            self.r.returned += 1
        elif verb == b'"EOSE"' and len(items) >= 2:
            entry = self.pending.pop(_str.decode(items[1]), None)
            if entry is not None:
                self.r.latencies.append(now() - entry[0])
                self.r.ops += 1
                self.out.append(entry[1])
                self.phase.finish()
                self.pump()
        elif verb == b'"CLOSED"' and len(items) >= 2:
            entry = self.pending.pop(_str.decode(items[1]), None)
            if entry is not None:
                msg = _str.decode(items[2]) if len(items) > 2 else ""
                self.r.errors[f"CLOSED {reason_key(msg)}"] += 1
                self.phase.finish()
                self.pump()
        else:
            super().handle(verb, items)


async def open_all(lanes: Sequence[Lane], batch: int = 50) -> None:
    for i in range(0, len(lanes), batch):
        await asyncio.gather(*(lane.open() for lane in lanes[i : i + batch]))


async def drive(phase: PhaseRun, lanes: Sequence[Lane], watch: Watch, timeout: float) -> None:
    """The timed region: start every lane, wait for the last answer (or the timeout)."""
    before = watch.snapshot()
    t0 = now()
    phase.start_chunks(watch, t0, before)
    for lane in lanes:
        lane.start()
    try:
        await asyncio.wait_for(asyncio.shield(phase.done), timeout)
    except TimeoutError:
        missing = phase.expected - phase.finished
        phase.result.errors[f"timeout after {timeout:.0f} s (no answer)"] += missing
    phase.result.elapsed = now() - t0
    phase.close_chunks()
    watch.close(phase.result, before)
    for lane in lanes:
        lane.close()


# --- frames, built before any clock starts ----------------------------------------------


def event_frames(events: EventSet, client: Client = CLIENTS["builtin"]) -> list[bytes]:
    return [client.frame(b'["EVENT",' + raw + b"]") for raw in events.raw]


def req_items(
    filters: list[dict[str, Any]], prefix: str, client: Client = CLIENTS["builtin"]
) -> list[tuple[str, bytes, bytes]]:
    items = []
    for i, f in enumerate(filters):
        sub = f"{prefix}{i}"
        items.append((sub, client.frame(_enc(["REQ", sub, f])), client.frame(_enc(["CLOSE", sub]))))
    return items


def split(total: int, parts: int) -> list[int]:
    """`total` operations shared out over `parts` lanes as evenly as whole numbers go."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


# --- fan-out: live subscriptions, publish -> delivery ------------------------------------


class Subscriber:
    """One fan-out subscriber connection with one live subscription."""

    def __init__(self, fan: FanOut) -> None:
        self.fan = fan
        self.conn: Any = None
        self.ready: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.quiet = False

    def on_message(self, payload: bytes) -> None:
        head = payload[:24]
        if b'"EVENT"' in head:
            m = _EVENT_ID.search(payload)
            if m is not None and self.ready.done():
                self.fan.deliver(m.group(1).decode())
        elif b'"EOSE"' in head:
            if not self.ready.done():
                self.ready.set_result(None)
        elif b'"CLOSED"' in head and not self.ready.done():
            items = msgspec.json.decode(payload)
            self.ready.set_result(f"CLOSED {reason_key(str(items[-1]))}")

    def on_close(self, reason: str) -> None:
        if not self.ready.done():
            self.ready.set_result(f"closed before EOSE: {reason_key(reason)}")
        elif not self.quiet:
            self.fan.result.errors[f"subscriber disconnected: {reason_key(reason)}"] += 1


class FanOut:
    """Subscribers of one filter, publish times by event id, and the delivery latencies
    the subscribers report."""

    def __init__(self, name: str) -> None:
        self.result = PhaseResult(name)
        self.subs: list[Subscriber] = []
        self.sent: dict[str, float] = {}
        self.delivered = 0
        self.last = 0.0

    async def subscribe(self, url: str, count: int, client: Client, req: bytes) -> int:
        """Open `count` subscriber connections, 50 at a time, each sending `req` and
        waiting up to 30 s for its EOSE; returns how many are live (the others are
        counted as errors by reason)."""

        async def one(s: Subscriber) -> None:
            try:
                s.conn = await client.connect(url, s.on_message, s.on_close)
            except (OSError, TimeoutError) as exc:
                s.ready.set_result(f"connect failed: {reason_key(str(exc))}")
                return
            s.conn.send(req)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(s.ready), 30)
            if not s.ready.done():
                s.ready.set_result("no EOSE within 30 s")

        self.subs = [Subscriber(self) for _ in range(count)]
        for i in range(0, len(self.subs), 50):
            await asyncio.gather(*(one(s) for s in self.subs[i : i + 50]))
        live = 0
        for s in self.subs:
            why = s.ready.result()
            if why is None:
                live += 1
            else:
                self.result.errors[f"subscribe failed: {why}"] += 1
        return live

    def close(self) -> None:
        for s in self.subs:
            s.quiet = True
            if s.conn is not None:
                s.conn.close()

    def deliver(self, eid: str) -> None:
        t = self.sent.get(eid)
        if t is None:
            return
        self.last = now()
        self.result.latencies.append(self.last - t)
        self.delivered += 1


# --- the event loop and the process ---------------------------------------------------------


def raise_fd_limit(want: int = 8192) -> None:
    """Fan-out to 1,000 subscribers needs more than the usual 1,024 descriptors."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, want)) if hard != resource.RLIM_INFINITY else max(soft, want)
    if target > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def run_async(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.run(coro)
    return uvloop.run(coro)
