"""`python -m bench crowd`: a crowd of websocket connections on one relay (issue 47, item 3).

A fresh embedded PostgreSQL and a real `engram serve` on it (default settings; loopback
is exempt from the per-address limits, so one machine can be the whole crowd).
`ENGRAM_BENCH_RELAY_ROOT=/path/to/checkout` runs another checkout's relay with this
harness (a before/after comparison). The crowd is `--connections` (default 10,000)
bench.wsclient connections opened by `--workers` processes (each its share, from its own
127.0.1.x source address so that no one address runs out of ports), each connection with
one live subscription `{"kinds":[1],"#t":[<crowd tag>],"limit":0}` under its own
subscription id. One more client, the publisher (127.0.0.1), is the "other client".

Phases, in order:
  EVENT->OK quiet    the publisher alone: `--oks` kind-1 EVENTs the crowd does not match,
                     one at a time (the next after the OK) at most `--ok-rate` a second
                     (1,000 at 40/s by default, 25 s: the p99 is the 10th slowest; with
                     200, it was the 2nd, and one stall decided the verdict)
  connect storm      every worker opens its share at once (`--storm-concurrency`
                     handshakes in flight per worker): time from the start until the last
                     EOSE; per connection, connect -> EOSE
  fan-out N          the publisher sends one event the whole crowd matches; per delivery,
                     the send -> receive latency (the clocks are CLOCK_MONOTONIC, one for
                     every process of the machine); every connection must get it exactly
                     once (missing and duplicate deliveries are errors). `--fanouts` times
  EVENT->OK crowd    the quiet phase again with the crowd connected
  reconnect storm    every connection closes and opens again at once (the same
                     subscription), then one more fan-out to the new crowd
  leave              everyone closes; the relay's RSS once /metrics counts no connection
The relay's RSS (its own process, not the signature worker's or PostgreSQL's) is taken
before the crowd, with it, with the reconnected crowd and after everyone left: RSS per
connection is (with crowd - before) / connections. The verdicts are the issue's targets.
Every wait has a deadline (`--deadline`), and the run stops by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import multiprocessing
import os
import secrets
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

import msgspec
import psutil

from bench import wsclient
from bench.lanes import run_async
from bench.procwatch import Watch
from bench.results import PhaseResult, format_results, quantile, reason_key, run_lines
from bench.results import write_results as write_block
from engram.nip01 import pubkey_of, sign_event
from relay.openfiles import raise_open_files
from relay.wire import encode_event

BEGIN, END = "<!-- crowd:begin -->", "<!-- crowd:end -->"
MIB = 2**20
# issue 47, "done when"
TARGET_CONNECT_S = 60.0
TARGET_RSS_PER_CONNECTION = 16 * 1024
TARGET_FANOUT_P99_MS = 200.0
TARGET_RECROWD = 1.10
PUBLISHER = "127.0.0.1"
LEAVE_SETTLE = 8.0  # seconds after the last connection left before the RSS "after"
LOST = "connection lost"

now = time.monotonic  # CLOCK_MONOTONIC: comparable between the processes of one machine
_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_enc = msgspec.json.encode


class _Id(msgspec.Struct):
    id: str


_id = msgspec.json.Decoder(_Id)


# --- the crowd: one worker process's share of the connections ---------------------------


class Member:
    """One connection of the crowd and what it received."""

    __slots__ = ("crowd", "eose", "leaving", "opened_at", "req", "ws")

    def __init__(self, crowd: Crowd, req: bytes) -> None:
        self.crowd = crowd
        self.req = req  # the REQ frame, encoded once (the same after a reconnect)
        self.ws: wsclient.WsConnection | None = None
        self.eose: asyncio.Future[float] | None = None
        self.opened_at = 0.0
        self.leaving = False

    def on_message(self, payload: bytes) -> None:
        t = now()
        if payload.startswith(b'["EVENT"'):
            # the relay encodes an event's id first: read it where it is, and decode the
            # frame only if it is not there (the client's cost is part of each latency)
            at = payload.find(b',{"id":"')
            if at > 0 and payload[at + 72 : at + 73] == b'"':
                event_id = payload[at + 8 : at + 72].decode()
            else:
                event_id = _id.decode(_frame.decode(payload)[2]).id
            self.crowd.delivered(self, event_id, t)
        elif payload.startswith(b'["EOSE"'):
            if self.eose is not None and not self.eose.done():
                self.eose.set_result(t)
        else:
            items = _frame.decode(payload)
            self.crowd.notes[reason_key(payload[:120].decode(errors="replace"))] += 1
            if bytes(items[0]) == b'"CLOSED"' and self.eose is not None and not self.eose.done():
                self.eose.set_exception(ConnectionError("CLOSED instead of EOSE"))

    def on_close(self, reason: str) -> None:
        if not self.leaving:
            self.crowd.errors[f"{LOST}: {reason_key(reason)}"] += 1
        if self.eose is not None and not self.eose.done():
            self.eose.set_exception(ConnectionError(reason))


class Crowd:
    """`count` connections from `source`, each with one live subscription."""

    def __init__(self, url: str, count: int, source: str, tag: str, name: str) -> None:
        self.url = url
        self.source = source
        self.members = [
            Member(
                self,
                wsclient.client_frame(
                    _enc(["REQ", f"{name}-{i}", {"kinds": [1], "#t": [tag], "limit": 0}])
                ),
            )
            for i in range(count)
        ]
        self.seen: dict[str, list[float]] = {}  # event id -> receive times
        self.got: dict[str, set[int]] = {}  # event id -> members that got it: duplicates show
        self.duplicates: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.notes: collections.Counter[str] = collections.Counter()

    def delivered(self, member: Member, event_id: str, t: float) -> None:
        got = self.got.setdefault(event_id, set())
        if id(member) in got:
            self.duplicates[event_id] += 1
            return
        got.add(id(member))
        self.seen.setdefault(event_id, []).append(t)

    def live(self) -> int:
        return sum(1 for m in self.members if m.ws is not None and not m.ws.closed)

    async def open_all(self, concurrency: int, deadline: float) -> dict[str, Any]:
        """Open every connection and subscribe (at most `concurrency` waiting for their
        EOSE at once): per connection the connect -> EOSE seconds, and the moment the
        last EOSE came."""
        slots = asyncio.Semaphore(concurrency)
        times: list[float] = []
        last = 0.0
        failed: collections.Counter[str] = collections.Counter()
        loop = asyncio.get_running_loop()

        async def one(m: Member) -> None:
            nonlocal last
            async with slots:
                m.leaving = False
                m.opened_at = now()
                m.eose = loop.create_future()
                try:
                    m.ws = await wsclient.connect(
                        self.url, m.on_message, m.on_close, timeout=deadline, source=self.source
                    )
                    m.ws.send(m.req)
                    t = await asyncio.wait_for(m.eose, deadline)
                except (OSError, TimeoutError, wsclient.WsError) as exc:
                    failed[reason_key(str(exc) or type(exc).__name__)] += 1
                    return
                times.append(t - m.opened_at)
                last = max(last, t)

        await asyncio.gather(*(one(m) for m in self.members))
        return {"times": times, "last": last, "failed": failed}

    def close_all(self) -> int:
        n = 0
        for m in self.members:
            m.leaving = True
            if m.ws is not None and not m.ws.closed:
                m.ws.close()
                n += 1
            m.ws = None
        return n

    async def expect(self, event_id: str, deadline: float) -> dict[str, Any]:
        """Until every live connection got `event_id` (or the deadline): receive times."""
        end = now() + deadline
        want = self.live()
        while len(self.seen.get(event_id, ())) < want and now() < end:
            await asyncio.sleep(0.01)
        times = self.seen.pop(event_id, [])
        self.got.pop(event_id, None)  # what comes after the deadline is not counted
        return {
            "times": times,
            "missing": max(0, want - len(times)),
            "duplicates": self.duplicates.pop(event_id, 0),
        }

    def report(self) -> dict[str, Any]:
        errors, notes = dict(self.errors), dict(self.notes)
        self.errors.clear()
        self.notes.clear()
        return {"errors": errors, "notes": notes}


async def _serve(pipe: Pipe, crowd: Crowd) -> None:
    """Run the coordinator's commands until it says `quit` (or goes away)."""
    loop = asyncio.get_running_loop()
    while True:
        try:
            command, *args = await loop.run_in_executor(None, pipe.recv)
        except EOFError:
            command, args = "quit", []
        if command == "quit":
            crowd.close_all()
            return
        if command == "open":
            answer = await crowd.open_all(*args)
        elif command == "reopen":
            crowd.close_all()
            answer = await crowd.open_all(*args)
        elif command == "expect":
            answer = await crowd.expect(*args)
        elif command == "close":
            answer = {"closed": crowd.close_all()}
        else:
            answer = {"error": f"unknown command {command!r}"}
        answer.update(crowd.report())
        pipe.send(answer)


def worker_main(pipe: Pipe, url: str, count: int, source: str, tag: str, name: str) -> None:
    """A crowd worker process: its share of the connections, driven over `pipe`."""
    raise_open_files()

    async def run() -> None:
        await _serve(pipe, Crowd(url, count, source, tag, name))

    try:
        run_async(run())
    finally:
        pipe.close()


class Workers:
    """The crowd's worker processes and the commands the coordinator gives them."""

    def __init__(self, url: str, connections: int, workers: int, tag: str) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.pipes: list[Pipe] = []
        self.procs: list[Any] = []
        for w in range(workers):
            share = connections // workers + (1 if w < connections % workers else 0)
            ours, theirs = ctx.Pipe()
            source = f"127.0.1.{w + 1}"
            proc = ctx.Process(
                target=worker_main,
                args=(theirs, url, share, source, tag, f"w{w}"),
                daemon=True,
            )
            proc.start()
            theirs.close()
            self.pipes.append(ours)
            self.procs.append(proc)

    async def ask(self, *command: Any, timeout: float) -> list[dict[str, Any]]:
        """Send `command` to every worker and gather their answers."""
        loop = asyncio.get_running_loop()
        for pipe in self.pipes:
            pipe.send(command)

        def answer(pipe: Pipe) -> dict[str, Any]:
            if not pipe.poll(timeout):
                raise TimeoutError(f"a crowd worker did not answer {command[0]!r}")
            result: dict[str, Any] = pipe.recv()
            return result

        return list(
            await asyncio.gather(*(loop.run_in_executor(None, answer, p) for p in self.pipes))
        )

    def stop(self) -> None:
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send(("quit",))
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)


# --- the other client ---------------------------------------------------------------------


class Publisher:
    """The other client: EVENTs one at a time, each answer's latency."""

    def __init__(self) -> None:
        self.ws: wsclient.WsConnection | None = None
        self.waiting: dict[str, asyncio.Future[str]] = {}

    async def open(self, url: str) -> Publisher:
        self.ws = await wsclient.connect(url, self.on_message, self.on_close, source=PUBLISHER)
        return self

    def on_message(self, payload: bytes) -> None:
        items = _frame.decode(payload)
        if bytes(items[0]) == b'"OK"' and len(items) >= 3:
            ok = msgspec.json.decode(items[2])
            why = _str.decode(items[3]) if len(items) > 3 else ""
            future = self.waiting.pop(_str.decode(items[1]), None)
            if future is not None and not future.done():
                future.set_result("" if ok else f"OK false: {why}")

    def on_close(self, reason: str) -> None:
        for future in self.waiting.values():
            if not future.done():
                future.set_result(f"{LOST}: {reason_key(reason)}")
        self.waiting.clear()

    def send(self, frame: bytes, event_id: str) -> asyncio.Future[str]:
        future: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.waiting[event_id] = future
        assert self.ws is not None
        if self.ws.closed:
            future.set_result(f"{LOST}: before sending")
        self.ws.send(frame)
        return future

    async def answer(self, future: asyncio.Future[str], event_id: str, deadline: float) -> str:
        try:
            return await asyncio.wait_for(future, deadline)
        except TimeoutError:
            self.waiting.pop(event_id, None)
            return "no answer within the deadline"

    def close(self) -> None:
        if self.ws is not None:
            self.ws.close()


class Notes:
    """Signed EVENT frames, made before any clock starts."""

    def __init__(self) -> None:
        self.key = secrets.token_bytes(32)
        self.author = pubkey_of(self.key)
        self.n = 0

    def frame(self, tag: str) -> tuple[bytes, str]:
        self.n += 1
        text = f"crowd note {self.n}: a kind-1 note of ordinary length for the bench " * 2
        ev = sign_event(self.key, int(time.time()), 1, [["t", tag]], text, os.urandom(32))
        return wsclient.client_frame(b'["EVENT",' + encode_event(ev) + b"]"), ev.id


# --- the run ------------------------------------------------------------------------------


@dataclass
class Options:
    connections: int
    workers: int
    fanouts: int
    oks: int
    ok_rate: float
    storm_concurrency: int
    deadline: float


@dataclass
class Report:
    phases: list[PhaseResult] = field(default_factory=list)
    rss: dict[str, int] = field(default_factory=dict)  # moment -> relay RSS bytes
    storm_seconds: dict[str, float] = field(default_factory=dict)
    connected: dict[str, int] = field(default_factory=dict)


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _connections(port: int) -> float | None:
    """The relay's open websocket connections (every tenant), from /metrics."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            lines = r.read().decode().splitlines()
    except OSError:
        return None
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("engram_connections{")
    )


async def _settle(seconds: float = 1.5) -> None:
    await asyncio.sleep(seconds)


def _merge(answers: list[dict[str, Any]], result: PhaseResult) -> None:
    for a in answers:
        for why, n in a.get("errors", {}).items():
            result.errors[why] += n
        for why, n in a.get("notes", {}).items():
            result.notes[why] += n
        for why, n in a.get("failed", {}).items():
            result.errors[f"not connected: {why}"] += n


async def _oks(pub: Publisher, notes: Notes, o: Options, name: str, watch: Watch) -> PhaseResult:
    """EVENT -> OK of kind-1 notes nobody in the crowd subscribed to."""
    result = PhaseResult(name)
    frames = [notes.frame("elsewhere") for _ in range(o.oks)]
    gap = 1.0 / o.ok_rate
    before, t0 = watch.snapshot(), now()
    for frame, event_id in frames:
        start = now()
        future = pub.send(frame, event_id)
        outcome = await pub.answer(future, event_id, o.deadline)
        took = now() - start
        if outcome:
            result.errors[reason_key(outcome)] += 1
        else:
            result.ops += 1
            result.latencies.append(took)
        await asyncio.sleep(max(0.0, gap - took))
    result.elapsed = now() - t0
    _close(watch, result, before)
    return result


def _close(watch: Watch, result: PhaseResult, before: Any) -> None:
    """The phase's CPU figures, and the relay's own RSS (not its signature worker's)."""
    watch.close(result, before)
    if watch.pid is not None:
        result.rss = _rss(watch.pid)


async def _storm(
    crowd: Workers, command: str, o: Options, name: str, watch: Watch
) -> tuple[PhaseResult, float]:
    """Open (or close and reopen) every connection: the phase, and the seconds from the
    command until the last EOSE."""
    result = PhaseResult(name)
    before, t0 = watch.snapshot(), now()
    answers = await crowd.ask(command, o.storm_concurrency, o.deadline, timeout=o.deadline * 4 + 60)
    for a in answers:
        result.latencies += a["times"]
        result.ops += len(a["times"])
    last = max((a["last"] for a in answers if a["times"]), default=now())
    result.elapsed = last - t0
    _merge(answers, result)
    _close(watch, result, before)
    return result, last - t0


async def _fanout(
    pub: Publisher, crowd: Workers, notes: Notes, tag: str, o: Options, name: str, watch: Watch
) -> PhaseResult:
    """One event to the whole crowd: per delivery, send -> receive."""
    result = PhaseResult(name)
    frame, event_id = notes.frame(tag)
    before = watch.snapshot()
    t0 = now()
    future = pub.send(frame, event_id)
    answers = await crowd.ask("expect", event_id, o.deadline, timeout=o.deadline + 60)
    outcome = await pub.answer(future, event_id, o.deadline)
    if outcome:
        result.errors[f"publisher: {reason_key(outcome)}"] += 1
    last = t0
    for a in answers:
        result.latencies += [t - t0 for t in a["times"]]
        result.ops += len(a["times"])
        if a["missing"]:
            result.errors["delivery missing"] += a["missing"]
        if a["duplicates"]:
            result.errors["delivered twice"] += a["duplicates"]
        last = max([last, *a["times"]])
    result.elapsed = last - t0
    _merge(answers, result)
    _close(watch, result, before)
    return result


async def run(url: str, pid: int, o: Options, say: Callable[[str], None]) -> Report:
    report = Report()
    port = int(url.rsplit(":", 1)[1])
    watch = Watch(pid)
    tag = "crowd-" + secrets.token_hex(4)
    notes = Notes()
    pub = await Publisher().open(url)
    crowd = Workers(url, o.connections, o.workers, tag)
    try:
        await _oks(pub, notes, Options(**{**o.__dict__, "oks": 20}), "warm-up", watch)
        report.phases.append(await _oks(pub, notes, o, "EVENT->OK quiet", watch))
        say(f"  EVENT->OK without the crowd: {_line(report.phases[-1])}")
        await _settle()
        report.rss["before"] = _rss(pid)
        phase, took = await _storm(crowd, "open", o, "connect storm", watch)
        report.phases.append(phase)
        report.storm_seconds["connect"], report.connected["connect"] = took, phase.ops
        say(f"  connect storm: {phase.ops} of {o.connections} subscribed in {took:.1f} s")
        await _settle()
        report.rss["crowd"] = _rss(pid)
        say(f"  relay RSS {report.rss['before'] / MIB:.0f} -> {report.rss['crowd'] / MIB:.0f} MiB")
        for i in range(o.fanouts):
            phase = await _fanout(pub, crowd, notes, tag, o, f"fan-out {i + 1}", watch)
            report.phases.append(phase)
            say(f"  fan-out {i + 1}: {_line(phase)}")
            await asyncio.sleep(0.5)
        report.phases.append(await _oks(pub, notes, o, "EVENT->OK crowd", watch))
        say(f"  EVENT->OK with the crowd: {_line(report.phases[-1])}")
        phase, took = await _storm(crowd, "reopen", o, "reconnect storm", watch)
        report.phases.append(phase)
        report.storm_seconds["reconnect"], report.connected["reconnect"] = took, phase.ops
        say(f"  reconnect storm: {phase.ops} of {o.connections} subscribed in {took:.1f} s")
        await _settle()
        report.rss["crowd again"] = _rss(pid)
        phase = await _fanout(pub, crowd, notes, tag, o, "fan-out after", watch)
        report.phases.append(phase)
        say(f"  fan-out after the reconnect: {_line(phase)}")
        await crowd.ask("close", timeout=o.deadline)
        end = now() + o.deadline
        while now() < end and (_connections(port) or 0) > 1:  # the publisher's is left
            await asyncio.sleep(0.2)
        await _settle(LEAVE_SETTLE)  # the relay gives memory back a few seconds later
        report.rss["after"] = _rss(pid)
    finally:
        pub.close()
        crowd.stop()
    return report


def _line(r: PhaseResult) -> str:
    f = r.figures()
    errors = sum(r.errors.values())
    p50, p99, top = (f[k] for k in ("p50 ms", "p99 ms", "max ms"))
    ms = "ms" if p50 is not None else ""
    return (
        f"{r.ops} ok, p50 {p50 or 0:.1f} {ms}, p99 {p99 or 0:.1f} {ms}, max {top or 0:.1f} {ms},"
        f" errors {errors}"
    )


def summary(report: Report, o: Options) -> list[str]:
    """The RSS figures and the issue's verdicts, as lines."""
    rss = report.rss
    lines = [
        "relay RSS: "
        + ", ".join(f"{k} {v / MIB:.1f} MiB" for k, v in rss.items())
        + (f"; {o.connections:,} connections" if o.connections else "")
    ]
    per = None
    if "crowd" in rss and "before" in rss and o.connections:
        per = (rss["crowd"] - rss["before"]) / o.connections
        lines.append(f"RSS per connection: {per / 1024:.1f} KiB")
    ratio = rss["crowd again"] / rss["crowd"] if "crowd again" in rss and "crowd" in rss else None
    if ratio is not None:
        lines.append(f"RSS reconnected crowd / first crowd: {ratio:.3f}")
    if "after" in rss and "before" in rss:
        lines.append(
            f"RSS after everyone left: {(rss['after'] - rss['before']) / MIB:+.1f} MiB"
            " over the RSS before the crowd"
        )
    by = {p.phase: p for p in report.phases}
    fanouts = [p for p in report.phases if p.phase.startswith("fan-out")]
    worst = max((quantile(p.latencies, 0.99) or 0.0 for p in fanouts), default=0.0) * 1e3
    missed = sum(p.errors["delivery missing"] + p.errors["delivered twice"] for p in fanouts)
    quiet, busy = by.get("EVENT->OK quiet"), by.get("EVENT->OK crowd")
    q99 = quantile(quiet.latencies, 0.99) if quiet else None
    b99 = quantile(busy.latencies, 0.99) if busy else None

    def verdict(ok: bool) -> str:
        return "yes" if ok else "NO"

    connect = report.storm_seconds.get("connect")
    all_in = report.connected.get("connect") == o.connections
    lines.append(
        f"target: all connect within {TARGET_CONNECT_S:.0f} s:"
        f" {verdict(all_in and connect is not None and connect <= TARGET_CONNECT_S)}"
    )
    if per is not None:
        lines.append(
            f"target: RSS <= {TARGET_RSS_PER_CONNECTION // 1024} KiB per connection:"
            f" {verdict(per <= TARGET_RSS_PER_CONNECTION)}"
        )
    lines.append(
        f"target: fan-out p99 <= {TARGET_FANOUT_P99_MS:.0f} ms (worst {worst:.0f} ms), every"
        f" delivery made: {verdict(worst <= TARGET_FANOUT_P99_MS and not missed and bool(fanouts))}"
    )
    if q99 is not None and b99 is not None:
        bound = max(1.5 * q99, q99 + 0.005)
        lines.append(
            f"target: EVENT->OK p99 with the crowd {b99 * 1e3:.1f} ms <= max(1.5x, +5 ms) of"
            f" {q99 * 1e3:.1f} ms: {verdict(b99 <= bound)}"
        )
    again = report.connected.get("reconnect") == o.connections
    lines.append(
        f"target: reconnect storm succeeds and RSS <= {TARGET_RECROWD:.2f}x:"
        f" {verdict(again and ratio is not None and ratio <= TARGET_RECROWD)}"
    )
    return lines


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m bench crowd",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--connections", type=int, default=10_000)
    ap.add_argument("--workers", type=int, default=4, help="client processes")
    ap.add_argument("--fanouts", type=int, default=5, help="fan-outs to the first crowd")
    ap.add_argument("--oks", type=int, default=1000, help="EVENTs of each EVENT->OK phase")
    ap.add_argument("--ok-rate", type=float, default=40.0, help="EVENT->OK phases' EVENTs/s")
    ap.add_argument("--storm-concurrency", type=int, default=250, help="per worker")
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds any wait may take")
    ap.add_argument("--url", help="a running relay instead of a fresh one (needs --pid)")
    ap.add_argument("--pid", type=int, help="the running relay's process id (its RSS)")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the relay")
    ap.add_argument("--results", type=Path, help="write the report into this markdown file")
    args = ap.parse_args(argv)
    if args.connections < 1 or not 1 <= args.workers <= 64 or args.fanouts < 1:
        ap.error("--connections and --fanouts must be positive, --workers 1-64")
    if args.oks < 1 or args.ok_rate <= 0 or args.storm_concurrency < 1 or args.deadline <= 0:
        ap.error("--oks, --ok-rate, --storm-concurrency and --deadline must be positive")
    if bool(args.url) != bool(args.pid):
        ap.error("--url and --pid go together")
    o = Options(
        args.connections,
        min(args.workers, args.connections),
        args.fanouts,
        args.oks,
        args.ok_rate,
        args.storm_concurrency,
        args.deadline,
    )
    say = lambda s: print(s, flush=True)  # noqa: E731
    _, limit = raise_open_files()  # and each worker process its own
    say(f"open-files limit of this process: {limit}")
    load_before = os.getloadavg()
    served: Any = contextlib.nullcontext(None)
    if not args.url:
        from bench.served import fresh_store

        served = fresh_store("crowd", "crowd", "store", False, say)
    server = "a running relay"
    with served as store:
        if store is not None:
            from bench.peers import start_engram

            env = dict(kv.split("=", 1) for kv in args.env)
            store.relay = start_engram(store.root / "relay", ["--database-url", store.dsn], env)
            say(f"engram serve (pid {store.relay.pid}) at {store.relay.url}, {store.server}")
            url, pid, server = store.relay.url, store.relay.pid, store.server
        else:
            url, pid = args.url, args.pid
        report = run_async(run(url, pid, o, say))
    table = format_results(report.phases)
    lines = [
        *run_lines("crowd", argv, server, (load_before, os.getloadavg())),
        "",
        "```",
        table,
        "```",
        "",
        *(f"- {line}" for line in summary(report, o)),
    ]
    text = "\n".join(lines)
    print(text)
    if args.results:
        write_block(args.results, text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
