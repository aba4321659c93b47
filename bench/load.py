"""`python -m bench load --url ws://127.0.0.1:7777`: drive a relay and report each phase.

Phases (the standard profile in `Profile`):
  kind1       EVENT ingest, kind 1 from 1,000 authors: N connections x a window in flight
  engram      EVENT ingest of valid kind-30174 engrams, replacing a hot set of addresses
  req         REQ {"authors":[k],"limit":10}, each closed after its EOSE
  head        the CLI's engram head fetch (kinds, authors, #p, #d) from connections
              authenticated (NIP-42) as the agent, when the relay sends a challenge
  fanout<S>   S subscribers (one connection each) while one publisher sends R events/s

Every frame is signed and encoded before the clock starts (events come from the file
cache of bench.events); connections are opened and authenticated before it too. Each
phase reports throughput, p50/p99/max latency (EVENT -> OK, REQ -> EOSE, publish ->
delivery), errors by reason, and, given the relay's PID, its CPU per operation and RSS
(the PID's whole process tree; `--pg-pid` adds a PostgreSQL postmaster's tree). The
generator's own CPU per operation is printed too, to show it is not the bottleneck.

The REQ and head phases read what the ingest phases wrote: run them in that order on a
relay whose store starts empty, or at least without these events (same seed = same
events = "duplicate" answers, which the report shows).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import random
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import psutil

from bench import wsclient, wslib
from bench.events import KIND_ENGRAM, EventSet, Keyring, cache_dir, fanout_tag, load_events
from engram.nip01 import sign_event

KIND_AUTH = 22242
PHASES = ("kind1", "engram", "req", "head", "fanout")
PHASE_TITLES = {
    "kind1": "ingest kind-1",
    "engram": "ingest engram",
    "req": "REQ authors limit 10",
    "head": "REQ engram head (auth)",
}
FIGURES = (
    "ops/s",
    "p50 ms",
    "p99 ms",
    "max ms",
    "errors",
    "relay CPU us/op",
    "pg CPU us/op",
    "relay+pg CPU us/op",
    "relay RSS MB",
    "gen CPU us/op",
    "relay cores",
    "pg cores",
    "gen cores",
)
HIGHER_IS_BETTER = frozenset({"ops/s"})

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_bool = msgspec.json.Decoder(bool)
_enc = msgspec.json.encode
_EVENT_ID = re.compile(rb'"id"\s*:\s*"([0-9a-f]{64})"')
_NUMBERS = re.compile(r"[0-9a-f]{16,}|\d+")
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


def reason_key(message: str) -> str:
    """Group error messages by their text with numbers and hex ids blanked out."""
    message = _NUMBERS.sub("#", message.strip())
    return message[:80] if message else "(no message)"


@dataclass
class Profile:
    """Sizes of one load run; the defaults are the standard profile at modest counts."""

    events: int = 10_000
    engrams: int = 5_000
    reqs: int = 3_000
    heads: int = 3_000
    connections: int = 8
    window: int = 100
    req_connections: int = 8
    req_window: int = 8
    subscribers: tuple[int, ...] = (100, 1000)
    fanout_rate: float = 50.0
    fanout_seconds: float = 5.0
    events_per_conn: int = 0  # reconnect after this many EVENTs on one connection (0: never)
    engram_slugs: int = 50  # addresses per agent: 16 agents x 50 = the hot set of 800
    seed: int = 1
    phase_timeout: float = 300.0
    phases: tuple[str, ...] = PHASES
    client: str = "builtin"  # a key of CLIENTS

    def phase_names(self) -> list[str]:
        out: list[str] = []
        for p in self.phases:
            if p == "fanout":
                out.extend(f"fanout{s}" for s in self.subscribers)
            else:
                out.append(p)
        return out


def phase_title(name: str) -> str:
    if name.startswith("fanout"):
        return f"fan-out {name[6:]} subs"
    return PHASE_TITLES.get(name, name)


@dataclass
class PhaseResult:
    """What one phase measured. `ops`: OKs accepted, EOSEs, or deliveries."""

    phase: str
    ops: int = 0
    elapsed: float = 0.0
    latencies: list[float] = field(default_factory=list, repr=False)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    notes: collections.Counter[str] = field(default_factory=collections.Counter)
    relay_cpu: float | None = None
    pg_cpu: float | None = None
    gen_cpu: float = 0.0
    rss: int | None = None
    returned: int = 0  # events received in answer to REQs
    skipped: str = ""

    def figures(self) -> dict[str, float | None]:
        lat = sorted(self.latencies)

        def q(p: float) -> float | None:
            return lat[min(len(lat) - 1, int(p * len(lat)))] * 1e3 if lat else None

        def per_op(cpu: float | None) -> float | None:
            return cpu / self.ops * 1e6 if cpu is not None and self.ops else None

        def busy(cpu: float | None) -> float | None:
            return cpu / self.elapsed if cpu is not None and self.elapsed > 0 else None

        return {
            "ops/s": self.ops / self.elapsed if self.elapsed > 0 else None,
            "p50 ms": q(0.50),
            "p99 ms": q(0.99),
            "max ms": lat[-1] * 1e3 if lat else None,
            "errors": float(sum(self.errors.values())),
            "relay CPU us/op": per_op(self.relay_cpu),
            "pg CPU us/op": per_op(self.pg_cpu),
            "relay+pg CPU us/op": per_op(
                None if self.relay_cpu is None else self.relay_cpu + (self.pg_cpu or 0.0)
            ),
            "relay RSS MB": self.rss / 2**20 if self.rss is not None else None,
            "gen CPU us/op": per_op(self.gen_cpu),
            # cores busy over the phase (CPU seconds / wall seconds): a relay that waits
            # shows as less than the cores it could use
            "relay cores": busy(self.relay_cpu),
            "pg cores": busy(self.pg_cpu),
            "gen cores": busy(self.gen_cpu),
        }


# --- process accounting -------------------------------------------------------------


class Watch:
    """CPU seconds and RSS of a relay's process tree (and a postmaster's tree)."""

    def __init__(self, pid: int | None = None, pg_pid: int | None = None) -> None:
        self.pid = pid
        self.pg_pid = pg_pid

    @staticmethod
    def _tree(pid: int | None) -> list[psutil.Process] | None:
        """The process and its live descendants (None if it is gone or not given)."""
        if pid is None:
            return None
        try:
            procs = [psutil.Process(pid)]
            return procs + procs[0].children(recursive=True)
        except psutil.Error:
            return None

    @staticmethod
    def tree_cpu(pid: int | None) -> float | None:
        """user+system of the process and its live descendants, plus reaped children."""
        procs = Watch._tree(pid)
        if procs is None:
            return None
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    @staticmethod
    def tree_rss(pid: int | None) -> int | None:
        procs = Watch._tree(pid)
        if procs is None:
            return None
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def snapshot(self) -> tuple[float | None, float | None, float]:
        return self.tree_cpu(self.pid), self.tree_cpu(self.pg_pid), time.process_time()

    def close(self, result: PhaseResult, before: tuple[float | None, float | None, float]) -> None:
        after = self.snapshot()
        if before[0] is not None and after[0] is not None:
            result.relay_cpu = after[0] - before[0]
        if before[1] is not None and after[1] is not None:
            result.pg_cpu = after[1] - before[1]
        result.gen_cpu = after[2] - before[2]
        result.rss = self.tree_rss(self.pid)


# --- shared phase machinery ---------------------------------------------------------


class _Phase:
    """Counters of one phase and the future that resolves when all operations ended."""

    def __init__(self, name: str, expected: int) -> None:
        self.result = PhaseResult(name)
        self.expected = expected
        self.finished = 0
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if expected <= 0:
            self.done.set_result(None)

    def finish(self, n: int = 1) -> None:
        self.finished += n
        if self.finished >= self.expected and not self.done.done():
            self.done.set_result(None)


class _Lane:
    """One connection driving a window of in-flight operations (EVENT->OK or REQ->EOSE).

    Everything happens in callbacks: an answer frees a slot, the next frames are queued,
    and all frames queued while reading one chunk go out in one write.
    """

    def __init__(
        self,
        phase: _Phase,
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
        """NIP-42 AUTH if the relay sent a challenge; returns an error text or None."""
        try:
            await asyncio.wait_for(self.challenge_seen.wait(), wait)
        except TimeoutError:
            return "relay sent no AUTH challenge"
        tags = [["relay", self.url], ["challenge", self.challenge or ""]]
        ev = sign_event(seckey, int(time.time()), KIND_AUTH, tags, "", os.urandom(32))
        fut: asyncio.Future[tuple[bool, str]] = asyncio.get_running_loop().create_future()
        self.auth = (ev.id, fut)
        assert self.conn is not None
        self.conn.send(self.client.frame(b'["AUTH",' + _enc(ev) + b"]"))
        try:
            accepted, msg = await asyncio.wait_for(fut, 10)
        except TimeoutError:
            return "no OK for AUTH"
        finally:
            self.auth = None
        return None if accepted else f"AUTH refused: {msg}"


class _EventLane(_Lane):
    """EVENT frames, answered by OK (matched by event id)."""

    def __init__(
        self,
        phase: _Phase,
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


class _ReqLane(_Lane):
    """REQ frames, answered by EOSE (or CLOSED); each REQ is CLOSEd after its EOSE."""

    def __init__(
        self,
        phase: _Phase,
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


async def _open_all(lanes: Sequence[_Lane], batch: int = 50) -> None:
    for i in range(0, len(lanes), batch):
        await asyncio.gather(*(lane.open() for lane in lanes[i : i + batch]))


async def _drive(phase: _Phase, lanes: Sequence[_Lane], watch: Watch, timeout: float) -> None:
    """The timed region: start every lane, wait for the last answer (or the timeout)."""
    before = watch.snapshot()
    t0 = now()
    for lane in lanes:
        lane.start()
    try:
        await asyncio.wait_for(asyncio.shield(phase.done), timeout)
    except TimeoutError:
        missing = phase.expected - phase.finished
        phase.result.errors[f"timeout after {timeout:.0f} s (no answer)"] += missing
    phase.result.elapsed = now() - t0
    watch.close(phase.result, before)
    for lane in lanes:
        lane.close()


# --- phases -------------------------------------------------------------------------


def event_frames(events: EventSet, client: Client = CLIENTS["builtin"]) -> list[bytes]:
    return [client.frame(b'["EVENT",' + raw + b"]") for raw in events.raw]


async def ingest_phase(
    name: str, url: str, events: EventSet, profile: Profile, watch: Watch
) -> PhaseResult:
    client = CLIENTS[profile.client]
    frames = event_frames(events, client)
    phase = _Phase(name, len(frames))
    n = profile.connections
    lanes = [
        _EventLane(
            phase,
            url,
            profile.window,
            frames[i::n],
            events.ids[i::n],
            profile.events_per_conn,
            client,
        )
        for i in range(n)
    ]
    await _open_all(lanes)
    await _drive(phase, lanes, watch, profile.phase_timeout)
    return phase.result


def _req_items(
    filters: list[dict[str, Any]], prefix: str, client: Client = CLIENTS["builtin"]
) -> list[tuple[str, bytes, bytes]]:
    items = []
    for i, f in enumerate(filters):
        sub = f"{prefix}{i}"
        items.append((sub, client.frame(_enc(["REQ", sub, f])), client.frame(_enc(["CLOSE", sub]))))
    return items


async def req_phase(url: str, keys: Keyring, profile: Profile, watch: Watch) -> PhaseResult:
    rng = random.Random(f"req/{profile.seed}")
    n = profile.req_connections
    per = [
        [{"authors": [rng.choice(keys.author_pubkeys)], "limit": 10} for _ in range(count)]
        for count in _split(profile.reqs, n)
    ]
    phase = _Phase("req", profile.reqs)
    client = CLIENTS[profile.client]
    lanes = [
        _ReqLane(phase, url, profile.req_window, _req_items(f, "q", client), client) for f in per
    ]
    await _open_all(lanes)
    await _drive(phase, lanes, watch, profile.phase_timeout)
    return phase.result


async def head_phase(url: str, keys: Keyring, profile: Profile, watch: Watch) -> PhaseResult:
    """The CLI's head fetch, each connection authenticated as one agent."""
    rng = random.Random(f"head/{profile.seed}")
    n = profile.req_connections
    phase = _Phase("head", profile.heads)
    lanes = []
    for i, count in enumerate(_split(profile.heads, n)):
        a = i % keys.agents
        filters = [
            {
                "kinds": [KIND_ENGRAM],
                "authors": [keys.agent_pubkeys[a]],
                "#p": [keys.owner_pubkeys[a]],
                "#d": [rng.choice(keys.d_tags[a])],
            }
            for _ in range(count)
        ]
        client = CLIENTS[profile.client]
        lanes.append(
            _ReqLane(phase, url, profile.req_window, _req_items(filters, "h", client), client)
        )
    await _open_all(lanes)
    outcomes = await asyncio.gather(
        *(lane.authenticate(keys.agent_keys[i % keys.agents]) for i, lane in enumerate(lanes))
    )
    for why in outcomes:
        if why:
            phase.result.notes[why] += 1
    await _drive(phase, lanes, watch, profile.phase_timeout)
    return phase.result


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class _Subscriber:
    """One fan-out subscriber connection with one live subscription."""

    def __init__(self, fan: _FanOut) -> None:
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


class _FanOut:
    def __init__(self, name: str) -> None:
        self.result = PhaseResult(name)
        self.sent: dict[str, float] = {}
        self.delivered = 0
        self.last = 0.0

    def deliver(self, eid: str) -> None:
        t = self.sent.get(eid)
        if t is None:
            return
        self.last = now()
        self.result.latencies.append(self.last - t)
        self.delivered += 1


async def fanout_phase(
    url: str, subscribers: int, events: EventSet, profile: Profile, watch: Watch
) -> PhaseResult:
    """S subscribers of one filter; a publisher sends `rate` events/s; publish -> delivery."""
    name = f"fanout{subscribers}"
    fan = _FanOut(name)
    r = fan.result
    client = CLIENTS[profile.client]
    req = client.frame(
        _enc(["REQ", "fan", {"kinds": [1], "#t": [fanout_tag(profile.seed)], "limit": 0}])
    )
    subs = [_Subscriber(fan) for _ in range(subscribers)]

    async def subscribe(s: _Subscriber) -> None:
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

    for i in range(0, len(subs), 50):
        await asyncio.gather(*(subscribe(s) for s in subs[i : i + 50]))
    live = 0
    for s in subs:
        why = s.ready.result()
        if why is None:
            live += 1
        else:
            r.errors[f"subscribe failed: {why}"] += 1

    frames = event_frames(events, client)
    pub_phase = _Phase(name, len(frames))
    publisher = _EventLane(pub_phase, url, len(frames), [], [], 0, client)
    await publisher.open()
    assert publisher.conn is not None
    before = watch.snapshot()
    t0 = now()
    interval = 1.0 / profile.fanout_rate
    for i, frame in enumerate(frames):
        delay = t0 + i * interval - now()
        if delay > 0:
            await asyncio.sleep(delay)
        eid = events.ids[i]
        t = now()
        fan.sent[eid] = t
        publisher.pending[eid] = t
        publisher.conn.send(frame)
    published_at = now()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(pub_phase.done), 30)
    accepted = pub_phase.result.ops
    expected = accepted * live
    deadline = now() + 10.0
    while fan.delivered < expected and now() < deadline:
        await asyncio.sleep(0.02)
    r.elapsed = max(fan.last, published_at) - t0
    watch.close(r, before)
    r.ops = fan.delivered
    if pub_phase.result.errors:
        for why, n in pub_phase.result.errors.items():
            r.errors[f"publish: {why}"] += n
    for why, n in pub_phase.result.notes.items():
        r.notes[f"publish: {why}"] += n
    if expected > fan.delivered:
        r.errors["not delivered within 10 s"] += expected - fan.delivered
    r.notes[f"{accepted} events published to {live} subscribers"] += 1
    publisher.close()
    for s in subs:
        s.quiet = True
        if s.conn is not None:
            s.conn.close()
    return r


# --- a whole run --------------------------------------------------------------------


async def run_load(
    url: str,
    profile: Profile,
    pid: int | None = None,
    pg_pid: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[PhaseResult]:
    """Run the profile's phases in order against `url`; events come from the cache."""
    say = progress or (lambda _msg: None)
    watch = Watch(pid, pg_pid)
    keys = Keyring(profile.seed, slugs=profile.engram_slugs)
    names = profile.phase_names()
    t = now()
    sets: dict[str, EventSet] = {}
    if "kind1" in names:
        sets["kind1"] = load_events("kind1", profile.events, keys)
    if "engram" in names:
        variant = "" if keys.slugs == Profile.engram_slugs else f"slugs{keys.slugs}"
        sets["engram"] = load_events("engram", profile.engrams, keys, variant=variant)
    for n in names:
        if n.startswith("fanout"):  # each fan-out phase publishes events of its own
            load_events("fanout", fanout_count(profile), keys, variant=n[6:])
    if "head" in names:
        _ = keys.d_tags
    say(f"events ready in {now() - t:.1f} s (cache: {cache_dir()})")
    results = []
    for name in names:
        say(f"phase {phase_title(name)} ...")
        if name in ("kind1", "engram"):
            res = await ingest_phase(name, url, sets[name], profile, watch)
        elif name == "req":
            res = await req_phase(url, keys, profile, watch)
        elif name == "head":
            res = await head_phase(url, keys, profile, watch)
        elif name.startswith("fanout"):
            subscribers = int(name[6:])
            fan = load_events("fanout", fanout_count(profile), keys, variant=str(subscribers))
            res = await fanout_phase(url, subscribers, fan, profile, watch)
        else:
            raise ValueError(f"unknown phase {name!r}")
        results.append(res)
        say(format_line(res))
    return results


def fanout_count(profile: Profile) -> int:
    return max(1, round(profile.fanout_rate * profile.fanout_seconds))


# --- output -------------------------------------------------------------------------


def fmt(value: float | None, figure: str = "") -> str:
    if value is None:
        return "-"
    if figure == "errors":
        return f"{value:.0f}"
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def format_line(r: PhaseResult) -> str:
    f = r.figures()
    return (
        f"  {phase_title(r.phase):<26} {r.ops:>8} ok in {r.elapsed:6.2f} s: "
        f"{fmt(f['ops/s'])}/s, p50 {fmt(f['p50 ms'])} ms, p99 {fmt(f['p99 ms'])} ms, "
        f"max {fmt(f['max ms'])} ms, errors {fmt(f['errors'], 'errors')}"
    )


def format_results(results: list[PhaseResult]) -> str:
    """A plain-text table of every figure, then errors and notes by reason."""
    cols = ["phase", "ops", *FIGURES]
    rows = [
        [phase_title(r.phase), str(r.ops), *(fmt(v, k) for k, v in r.figures().items())]
        for r in results
    ]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(cols)]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(cols, widths, strict=True))
        )
    ]
    for row in rows:
        lines.append(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    for r in results:
        if r.returned:
            lines.append(f"{phase_title(r.phase)}: {r.returned} events returned")
        for label, counter in (("error", r.errors), ("note", r.notes)):
            for why, n in counter.most_common():
                lines.append(f"{phase_title(r.phase)}: {label} x{n}: {why}")
    return "\n".join(lines)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_profile_args(p: argparse.ArgumentParser) -> None:
    d = Profile()
    p.add_argument("--events", type=int, default=d.events, help="kind-1 events to ingest")
    p.add_argument("--engrams", type=int, default=d.engrams, help="engram events to ingest")
    p.add_argument("--reqs", type=int, default=d.reqs, help="REQ authors queries")
    p.add_argument("--heads", type=int, default=d.heads, help="engram head fetches")
    p.add_argument("--connections", type=int, default=d.connections, help="ingest connections")
    p.add_argument("--window", type=int, default=d.window, help="EVENTs in flight per conn")
    p.add_argument("--req-connections", type=int, default=d.req_connections)
    p.add_argument("--req-window", type=int, default=d.req_window, help="REQs in flight per conn")
    p.add_argument(
        "--subscribers",
        type=_ints,
        default=d.subscribers,
        help="fan-out subscriber counts, comma-separated (default 100,1000)",
    )
    p.add_argument("--fanout-rate", type=float, default=d.fanout_rate, help="events/s published")
    p.add_argument("--fanout-seconds", type=float, default=d.fanout_seconds)
    p.add_argument(
        "--events-per-conn",
        type=int,
        default=d.events_per_conn,
        help="open a new connection after this many EVENTs on one (0: never)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="events and keys derive from it")
    p.add_argument(
        "--engram-slugs",
        type=int,
        default=d.engram_slugs,
        help="slugs per agent (16 agents): more makes a larger store of distinct engrams",
    )
    p.add_argument("--phase-timeout", type=float, default=d.phase_timeout)
    p.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        default=d.client,
        help="load-generator client: builtin (lean, one write per message, as users' clients"
        " send), pipelined (builtin joining queued frames into one write: never the"
        " headline), or the `websockets` library's",
    )
    p.add_argument(
        "--phases",
        default=",".join(PHASES),
        help=f"comma-separated subset of {','.join(PHASES)}",
    )


def profile_from_args(args: argparse.Namespace) -> Profile:
    phases = tuple(x for x in args.phases.split(",") if x)
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phase(s): {', '.join(sorted(unknown))}")
    return Profile(
        events=args.events,
        engrams=args.engrams,
        reqs=args.reqs,
        heads=args.heads,
        connections=args.connections,
        window=args.window,
        req_connections=args.req_connections,
        req_window=args.req_window,
        subscribers=tuple(args.subscribers),
        fanout_rate=args.fanout_rate,
        fanout_seconds=args.fanout_seconds,
        events_per_conn=args.events_per_conn,
        engram_slugs=args.engram_slugs,
        seed=args.seed,
        phase_timeout=args.phase_timeout,
        phases=phases,
        client=args.client,
    )


def build_parser(p: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = p or argparse.ArgumentParser(prog="python -m bench load")
    p.description = __doc__
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--url", required=True, help="relay websocket URL (ws://127.0.0.1:PORT)")
    p.add_argument("--pid", type=int, help="relay PID: report its CPU per op and RSS")
    p.add_argument("--pg-pid", type=int, help="PostgreSQL postmaster PID: report its CPU")
    add_profile_args(p)
    return p


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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    profile = profile_from_args(args)
    host = (args.url.split("//", 1)[-1].split("/", 1)[0].rsplit(":", 1)[0]).strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1") and not host.startswith("127."):
        print(f"refusing to load {args.url}: loopback only", file=sys.stderr)
        return 2
    raise_fd_limit()
    print(
        f"load {args.url} (seed {profile.seed}, phases {','.join(profile.phase_names())},"
        f" client {profile.client})"
    )
    results = run_async(run_load(args.url, profile, args.pid, args.pg_pid, print))
    print()
    print(format_results(results))
    # kind-1 events are all distinct, so a "duplicate" there means the relay had them already
    # (in the engram phase, "duplicate" also answers an older version losing to a newer one).
    dup = sum(
        n
        for r in results
        if r.phase == "kind1"
        for why, n in r.notes.items()
        if why.startswith("duplicate")
    )
    if dup:
        print(
            f"\nnote: {dup} EVENTs were already stored (same seed as an earlier run):"
            " use --seed N or a fresh relay store for meaningful ingest figures"
        )
    return 0
