"""`python -m bench abuse`: other clients' latency while one client abuses the relay.

Issue 37, "done when": with the search flood of item 2 running within the default
per-address limits, another client's EVENT `OK` p99 stays under 50 ms; the 41 KB REQ of
item 3 is answered (or refused `invalid:`) within 50 ms; another client's REQ p99 stays
under 50 ms while 4 addresses send that REQ back to back.

A fresh embedded PostgreSQL and a real `engram serve` on it with its default settings
but for `rate.exempt_loopback = false`: every 127.0.0.x address is then a client with the
default per-address limits, as a public client is (loopback is otherwise exempt).
`ENGRAM_BENCH_RELAY_ROOT=/path/to/checkout` runs another checkout's relay with this
harness (a before/after comparison). Clients are bench.wsclient connections, one frame
per write, each from its own source address.

Each round (`--rounds`, default 3) runs, `--seconds` each:
  search quiet    the victim alone: one connection from 127.0.0.2 publishing kind-1
                  notes of 30 words, each sent when the previous one's OK came (at most
                  `--event-rate` a second), and a live subscriber from 127.0.0.3 to its
                  author: EVENT -> OK and publish -> delivery latency
  search flood    the same while the flooder, 127.0.0.1, holds `--flood-connections`
                  (default 6) x 64 live searches, `{"search": ..., "limit": 0}`: each
                  first a query of `--query-bytes` (default 500,000) of distinct words,
                  as in the issue; if the relay refuses that (`invalid:`), the longest it
                  advertises (NIP-11 `max_search_length`, `max_search_words`), made of
                  the victim's longest word and distinct others, so that every published
                  note shares a word with every live search (the worst case for an index
                  by word). Held open during the phase, closed after.
  tagreq alone    the 41 KB REQ (16 filters x 256 absent `#t` values) from 127.0.0.4,
                  `--samples` times one after another: REQ -> EOSE or CLOSED
  tagreq flood    the victim from 127.0.0.2 sends `{"authors":[its key],"limit":10}`
                  REQs one at a time (at most `--req-rate` a second), each CLOSEd after
                  its EOSE, while 4 addresses (127.0.0.11-14), one connection each, keep
                  `--in-flight` (default 4) of the 41 KB REQ in flight, the next sent as
                  soon as one is answered
For each phase: the victim's p50/p99/max and outcomes, the abusers' outcomes by reason
(numbers blanked), and relay / PostgreSQL / bench cores busy (CPU seconds of the process
trees over wall seconds) and the relay's RSS; then the median of every figure over the
rounds, and the verdicts. An answer missing `--deadline` seconds after its request is
counted as such and the client stops waiting for it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench import wsclient
from bench.lanes import raise_fd_limit, run_async
from bench.procwatch import Watch
from bench.results import reason_key, run_lines, write_results
from engram.nip01 import Event, pubkey_of, sign_event

BEGIN, END = "<!-- abuse:begin -->", "<!-- abuse:end -->"
TARGET_MS = 50.0  # issue 37, done when
FLOODER = "127.0.0.1"
VICTIM = "127.0.0.2"
SUBSCRIBER = "127.0.0.3"
TAG_ASKER = "127.0.0.4"
TAG_FLOODERS = ("127.0.0.11", "127.0.0.12", "127.0.0.13", "127.0.0.14")
SUBS_PER_CONNECTION = 64  # relay.config.Limits.max_subscriptions, the default
FILTERS, VALUES = 16, 256  # the REQ: Limits.max_filters x max_filter_values
LONGEST = "interoperability"  # the victim's longest word (see NOTE)
NOTE = (
    "notes on relay {n}: signed events travel over websockets and the store keeps them"
    " durable while agents read memory back through filters that ask for tags authors"
    " and kinds with " + LONGEST
)
NO_ANSWER = "no answer within the deadline"
LOST = "connection lost"

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)
_enc = msgspec.json.encode
now = time.perf_counter


# --- one client ------------------------------------------------------------------------------


class Peer:
    """One websocket client: answers (OK by event id, EOSE/CLOSED by subscription) resolve
    futures; live EVENTs go to `on_event(sub_id, event id, receive time)`."""

    def __init__(self, source: str, on_event: Callable[[str, str, float], None] | None = None):
        self.source = source
        self.on_event = on_event
        self.waiting: dict[str, asyncio.Future[str]] = {}
        self.conn: wsclient.WsConnection | None = None
        self.notices: Counter[str] = Counter()

    async def open(self, url: str) -> Peer:
        self.conn = await wsclient.connect(url, self.on_message, self.on_close, source=self.source)
        return self

    def on_message(self, payload: bytes) -> None:
        t = now()
        items = _frame.decode(payload)
        verb = bytes(items[0])
        if verb == b'"EVENT"' and len(items) == 3:
            if self.on_event is not None:
                ev = msgspec.json.decode(items[2])
                self.on_event(_str.decode(items[1]), ev["id"], t)
        elif verb == b'"OK"' and len(items) >= 3:
            why = _str.decode(items[3]) if len(items) > 3 else ""
            ok = msgspec.json.decode(items[2])
            self._answer("ok:" + _str.decode(items[1]), "OK true" if ok else f"OK false {why}")
        elif verb == b'"EOSE"':
            self._answer("sub:" + _str.decode(items[1]), "EOSE")
        elif verb == b'"CLOSED"':
            why = _str.decode(items[2]) if len(items) > 2 else ""
            self._answer("sub:" + _str.decode(items[1]), f"CLOSED {why}")
        elif verb == b'"NOTICE"':
            self.notices[reason_key(_str.decode(items[1]))] += 1

    def _answer(self, key: str, outcome: str) -> None:
        future = self.waiting.pop(key, None)
        if future is not None and not future.done():
            future.set_result(outcome)

    def on_close(self, reason: str) -> None:
        for future in self.waiting.values():
            if not future.done():
                future.set_result(f"{LOST}: {reason_key(reason)}")
        self.waiting.clear()

    def send(self, message: list[Any], key: str | None = None) -> asyncio.Future[str] | None:
        """Write one message (one frame, one write); with `key`, the future of its answer."""
        future = None
        if key is not None:
            future = asyncio.get_running_loop().create_future()
            self.waiting[key] = future
        if self.conn is None or self.conn.closed:
            if future is not None:
                future.set_result(f"{LOST}: before sending")
            return future
        self.conn.send(wsclient.client_frame(_enc(message)))
        return future

    async def ask(self, message: list[Any], key: str, deadline: float) -> tuple[str, float]:
        """Send and wait for the answer: (outcome, seconds)."""
        t0 = now()
        future = self.send(message, key)
        assert future is not None
        try:
            outcome = await asyncio.wait_for(future, deadline)
        except TimeoutError:
            self.waiting.pop(key, None)
            return NO_ANSWER, now() - t0
        return outcome, now() - t0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


def outcome_key(outcome: str) -> str:
    return reason_key(outcome)


# --- figures ---------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)  # ms, the victim's
    delivery: list[float] = field(default_factory=list)  # ms, publish -> live delivery
    outcomes: Counter[str] = field(default_factory=Counter)  # the victim's
    abuse: Counter[str] = field(default_factory=Counter)  # the abusers' answers
    abuse_ms: list[float] = field(default_factory=list)  # the abusers' answer latency
    relay_cores: float | None = None
    pg_cores: float | None = None
    bench_cores: float | None = None
    relay_rss_mb: float | None = None

    def pct(self, q: float, values: list[float] | None = None) -> float | None:
        s = sorted(self.latencies if values is None else values)
        return s[min(len(s) - 1, int(q * len(s)))] if s else None


def pct(values: list[float], q: float) -> float | None:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else None


class Meter:
    """CPU of the relay's and PostgreSQL's process trees and of this process, per phase."""

    def __init__(self, watch: Watch) -> None:
        self.watch = watch

    @contextlib.contextmanager
    def phase(self, phase: Phase) -> Any:
        before, t0 = self.watch.snapshot(), now()
        yield
        wall = now() - t0
        after = self.watch.snapshot()
        phase.seconds = wall
        if before[0] is not None and after[0] is not None:
            phase.relay_cores = (after[0] - before[0]) / wall
        if before[1] is not None and after[1] is not None:
            phase.pg_cores = (after[1] - before[1]) / wall
        phase.bench_cores = (after[2] - before[2]) / wall
        rss = Watch.tree_rss(self.watch.pid)
        phase.relay_rss_mb = None if rss is None else rss / 2**20


# --- the victims -----------------------------------------------------------------------------


class Publisher:
    """The victim of the search flood: notes one at a time (the next after the OK), and a
    live subscriber to their author measuring delivery."""

    def __init__(self, url: str, sk: bytes, rate: float, deadline: float) -> None:
        self.url, self.sk, self.rate, self.deadline = url, sk, rate, deadline
        self.count = 0
        self.sent: dict[str, float] = {}
        self.phase: Phase | None = None
        self.pub = Peer(VICTIM)
        self.sub = Peer(SUBSCRIBER, self.delivered)

    async def open(self, pubkey: str) -> None:
        await self.pub.open(self.url)
        await self.sub.open(self.url)
        outcome, _ = await self.sub.ask(
            ["REQ", "live", {"authors": [pubkey], "limit": 0}], "sub:live", self.deadline
        )
        if outcome != "EOSE":
            raise RuntimeError(f"the victim's subscriber was refused: {outcome}")

    def delivered(self, sub_id: str, event_id: str, t: float) -> None:
        t0 = self.sent.pop(event_id, None)
        if t0 is not None and self.phase is not None:
            self.phase.delivery.append((t - t0) * 1e3)

    def prepare(self, seconds: float) -> list[Event]:
        """The notes of one phase, signed before its clock starts."""
        out = []
        for _ in range(int(seconds * self.rate) + 2):
            self.count += 1
            content = NOTE.format(n=self.count)
            out.append(sign_event(self.sk, int(time.time()), 1, [], content, os.urandom(32)))
        return out

    async def run(self, phase: Phase, seconds: float, events: list[Event]) -> None:
        self.phase = phase
        end = now() + seconds
        gap = 1.0 / self.rate
        for ev in events:
            t = now()
            if t >= end:
                break
            self.sent[ev.id] = t
            outcome, took = await self.pub.ask(
                ["EVENT", msgspec.to_builtins(ev)], "ok:" + ev.id, self.deadline
            )
            phase.outcomes[outcome_key(outcome)] += 1
            if outcome == "OK true":
                phase.latencies.append(took * 1e3)
            else:
                self.sent.pop(ev.id, None)  # not stored: never delivered
            await asyncio.sleep(max(0.0, t + gap - now()))
        stop = now() + self.deadline  # deliveries still on their way
        while self.sent and now() < stop:
            await asyncio.sleep(0.02)
        phase.outcomes["not delivered"] += len(self.sent)
        if not phase.outcomes["not delivered"]:
            del phase.outcomes["not delivered"]
        self.sent.clear()
        self.phase = None

    def close(self) -> None:
        self.pub.close()
        self.sub.close()


class Reader:
    """The victim of the tag flood: `authors` REQs one at a time, each CLOSEd after EOSE."""

    def __init__(self, url: str, pubkey: str, rate: float, deadline: float) -> None:
        self.url, self.pubkey, self.rate, self.deadline = url, pubkey, rate, deadline
        self.peer = Peer(VICTIM)
        self.count = 0

    async def run(self, phase: Phase, seconds: float) -> None:
        if self.peer.conn is None or self.peer.conn.closed:
            self.peer = Peer(VICTIM)
            await self.peer.open(self.url)
        end = now() + seconds
        gap = 1.0 / self.rate
        while (t := now()) < end:
            self.count += 1
            sub = f"v{self.count}"
            flt = {"authors": [self.pubkey], "limit": 10}
            outcome, took = await self.peer.ask(["REQ", sub, flt], "sub:" + sub, self.deadline)
            phase.outcomes[outcome_key(outcome)] += 1
            if outcome == "EOSE":
                phase.latencies.append(took * 1e3)
                self.peer.send(["CLOSE", sub])
            await asyncio.sleep(max(0.0, t + gap - now()))

    def close(self) -> None:
        self.peer.close()


# --- the abusers -----------------------------------------------------------------------------


def limitation(url: str) -> dict[str, Any]:
    """The relay's NIP-11 `limitation` (what it says it enforces)."""
    http = "http" + url.removeprefix("ws")
    req = urllib.request.Request(http, headers={"Accept": "application/nostr+json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read()).get("limitation") or {}  # type: ignore[no-any-return]


def huge_query(n: int, size: int) -> str:
    """`size` characters of distinct words (the issue's 500 KB search)."""
    words, total, i = [], 0, 0
    while total < size:
        w = f"h{n:03d}w{i:07x}"
        words.append(w)
        total += len(w) + 1
        i += 1
    return " ".join(words)[:size]


def longest_allowed(n: int, lim: dict[str, Any]) -> str:
    """The longest query the relay advertises, sharing LONGEST (so an index by word finds
    it for every note) and otherwise of distinct words that no note has."""
    length = int(lim.get("max_search_length") or 256)
    words = int(lim.get("max_search_words") or 32)
    out = [LONGEST]
    i = 0
    while len(out) < words:
        out.append(f"a{n:03d}{i:02d}")  # shorter than LONGEST: the index keeps LONGEST
        i += 1
    return " ".join(out)[:length].rstrip()


async def search_flood(
    url: str, connections: int, query_bytes: int, deadline: float, phase: Phase
) -> list[Peer]:
    """The flooder's live searches, opened and held (see the module docstring)."""
    lim = limitation(url)
    peers = [await Peer(FLOODER).open(url) for _ in range(connections)]

    async def fill(c: int, peer: Peer) -> None:
        for s in range(SUBS_PER_CONNECTION):
            n = c * SUBS_PER_CONNECTION + s
            sub = f"s{s}"
            flt = {"search": huge_query(n, query_bytes), "limit": 0}
            outcome, took = await peer.ask(["REQ", sub, flt], "sub:" + sub, deadline)
            if outcome.startswith("CLOSED invalid:"):
                phase.abuse[f"{query_bytes:,}-byte search: {outcome_key(outcome)}"] += 1
                flt = {"search": longest_allowed(n, lim), "limit": 0}
                outcome, took = await peer.ask(["REQ", sub, flt], "sub:" + sub, deadline)
                phase.abuse[f"longest allowed search: {outcome_key(outcome)}"] += 1
            else:
                phase.abuse[f"{query_bytes:,}-byte search: {outcome_key(outcome)}"] += 1
            phase.abuse_ms.append(took * 1e3)

    await asyncio.gather(*(fill(c, p) for c, p in enumerate(peers)))
    return peers


def tag_req(rng: random.Random) -> list[dict[str, Any]]:
    """16 filters x 256 `#t` values no event has: 41 KB."""
    return [{"#t": [f"{rng.randrange(16**7):07x}" for _ in range(VALUES)]} for _ in range(FILTERS)]


class TagFlooder:
    """One address keeping `in_flight` of the 41 KB REQ in flight, back to back."""

    def __init__(self, url: str, source: str, in_flight: int, deadline: float) -> None:
        self.url, self.in_flight, self.deadline = url, in_flight, deadline
        self.peer = Peer(source)
        self.filters = tag_req(random.Random(source))
        self.frame_bytes = len(_enc(["REQ", "x", *self.filters]))
        self.running = False
        self.count = 0

    async def run(self, phase: Phase) -> None:
        await self.peer.open(self.url)
        self.running = True
        await asyncio.gather(*(self.loop(phase) for _ in range(self.in_flight)))

    async def loop(self, phase: Phase) -> None:
        while self.running:
            self.count += 1
            sub = f"t{self.count}"
            outcome, took = await self.peer.ask(
                ["REQ", sub, *self.filters], "sub:" + sub, self.deadline
            )
            phase.abuse[outcome_key(outcome)] += 1
            phase.abuse_ms.append(took * 1e3)
            if outcome == "EOSE":
                self.peer.send(["CLOSE", sub])
            elif outcome.startswith(LOST):
                return

    def close(self) -> None:
        self.running = False
        self.peer.close()


# --- a round ---------------------------------------------------------------------------------


@dataclass
class Options:
    rounds: int
    seconds: float
    samples: int
    flood_connections: int
    query_bytes: int
    in_flight: int
    event_rate: float
    req_rate: float
    deadline: float
    only: tuple[str, ...]


PHASES = ("search quiet", "search flood", "tagreq alone", "tagreq flood")


async def one_round(url: str, meter: Meter, o: Options, say: Callable[[str], None]) -> list[Phase]:
    sk = os.urandom(32)
    out: list[Phase] = []
    if "search" in o.only:
        victim = Publisher(url, sk, o.event_rate, o.deadline)
        await victim.open(pubkey_of(sk))
        try:
            quiet = Phase("search quiet")
            events = victim.prepare(o.seconds)
            with meter.phase(quiet):
                await victim.run(quiet, o.seconds, events)
            say("    " + line(quiet))
            out.append(quiet)
            flood = Phase("search flood")
            t0 = now()
            flooders = await search_flood(
                url, o.flood_connections, o.query_bytes, o.deadline, flood
            )
            say(f"    flood opened in {now() - t0:.1f} s: {dict(flood.abuse)}")
            events = victim.prepare(o.seconds)
            try:
                with meter.phase(flood):
                    await victim.run(flood, o.seconds, events)
            finally:
                for p in flooders:
                    p.close()
            say("    " + line(flood))
            out.append(flood)
        finally:
            victim.close()
    if "tagreq" in o.only:
        alone = Phase("tagreq alone")
        asker = await Peer(TAG_ASKER).open(url)
        filters = tag_req(random.Random(f"alone/{time.time()}"))
        try:
            with meter.phase(alone):
                for i in range(o.samples):
                    sub = f"a{i}"
                    outcome, took = await asker.ask(
                        ["REQ", sub, *filters], "sub:" + sub, o.deadline
                    )
                    alone.outcomes[outcome_key(outcome)] += 1
                    alone.latencies.append(took * 1e3)
                    if outcome == "EOSE":
                        asker.send(["CLOSE", sub])
        finally:
            asker.close()
        say("    " + line(alone))
        out.append(alone)
        flood = Phase("tagreq flood")
        reader = Reader(url, pubkey_of(sk), o.req_rate, o.deadline)
        flooders = [TagFlooder(url, a, o.in_flight, o.deadline) for a in TAG_FLOODERS]
        try:
            with meter.phase(flood):
                tasks = [asyncio.ensure_future(f.run(flood)) for f in flooders]
                await reader.run(flood, o.seconds)
                for f in flooders:
                    f.running = False
                await asyncio.wait(tasks, timeout=o.deadline + 1)  # the last answers
        finally:
            reader.close()
            for f in flooders:
                f.close()
            for t in tasks:
                t.cancel()
        say("    " + line(flood))
        out.append(flood)
    return out


# --- report ----------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f}"


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def line(p: Phase) -> str:
    extra = f", delivery p99 {_ms(pct(p.delivery, 0.99))} ms" if p.delivery else ""
    return (
        f"{p.name}: {len(p.latencies):,} answered, p50 {_ms(p.pct(0.5))} ms,"
        f" p99 {_ms(p.pct(0.99))} ms, max {_ms(p.pct(1.0))} ms{extra};"
        f" {dict(p.outcomes)}" + (f"; abusers {sum(p.abuse.values()):,} answers" if p.abuse else "")
    )


def median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


VICTIM_WHAT = {
    "search quiet": "victim EVENT -> OK",
    "search flood": "victim EVENT -> OK",
    "tagreq alone": "41 KB REQ -> answer",
    "tagreq flood": "victim REQ -> EOSE",
}


def report(
    rounds: list[list[Phase]], argv: list[str], server: str, o: Options, loadavg: Any
) -> str:
    lines = [
        *run_lines("abuse", argv, server, loadavg),
        "- relay: `engram serve`, default settings but `rate.exempt_loopback = false`"
        " (each 127.0.0.x address a client with the default per-address limits)",
        f"- {o.rounds} round(s) of {o.seconds:g} s phases; search flood:"
        f" {o.flood_connections} connections x {SUBS_PER_CONNECTION} searches from"
        f" {FLOODER}, {o.query_bytes:,}-byte queries (the longest allowed when refused);"
        f" tag flood: {len(TAG_FLOODERS)} addresses x {o.in_flight} of the"
        f" {FILTERS} x {VALUES}-value REQ in flight",
        "",
        "| round | phase | measured | answered | p50 ms | p99 ms | max ms | delivery p99 ms"
        " | not OK/EOSE | relay cores | PG cores | bench cores | relay RSS MB |",
        "|--:|---|---|--:|--:|--:|--:|--:|---|--:|--:|--:|--:|",
    ]
    for r, phases in enumerate(rounds, 1):
        for p in phases:
            odd = ", ".join(
                f"{k} x{n}" for k, n in p.outcomes.items() if k not in ("OK true", "EOSE")
            )
            lines.append(
                f"| {r} | {p.name} | {VICTIM_WHAT[p.name]} | {len(p.latencies):,} |"
                f" {_ms(p.pct(0.5))} | {_ms(p.pct(0.99))} | {_ms(p.pct(1.0))} |"
                f" {_ms(pct(p.delivery, 0.99))} | {odd or '0'} | {_f(p.relay_cores)} |"
                f" {_f(p.pg_cores)} | {_f(p.bench_cores)} | {_f(p.relay_rss_mb, 0)} |"
            )
    lines += [
        "",
        "Medians over the rounds:",
        "",
        "| phase | p50 ms | p99 ms | max ms | delivery p99 ms | relay cores | PG cores |"
        " relay RSS MB |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    names = [p.name for p in rounds[0]] if rounds else []
    med: dict[str, dict[str, float | None]] = {}
    for name in names:
        ps = [p for phases in rounds for p in phases if p.name == name]
        m = {
            "p50": median([p.pct(0.5) for p in ps]),
            "p99": median([p.pct(0.99) for p in ps]),
            "max": median([p.pct(1.0) for p in ps]),
            "delivery": median([pct(p.delivery, 0.99) for p in ps]),
            "relay": median([p.relay_cores for p in ps]),
            "pg": median([p.pg_cores for p in ps]),
            "rss": median([p.relay_rss_mb for p in ps]),
        }
        med[name] = m
        lines.append(
            f"| {name} | {_ms(m['p50'])} | {_ms(m['p99'])} | {_ms(m['max'])} |"
            f" {_ms(m['delivery'])} | {_f(m['relay'])} | {_f(m['pg'])} | {_f(m['rss'], 0)} |"
        )
    abuse: dict[str, Counter[str]] = {}
    for phases in rounds:
        for p in phases:
            abuse.setdefault(p.name, Counter()).update(p.abuse)
    if any(abuse.values()):
        lines += ["", "| phase | abusers' answers (all rounds) | count |", "|---|---|--:|"]
        for name, counts in abuse.items():
            for k, n in counts.most_common():
                lines.append(f"| {name} | `{k}` | {n:,} |")
    lines += ["", verdicts(med)]
    return "\n".join(lines)


def verdicts(med: dict[str, dict[str, float | None]]) -> str:
    def check(name: str, what: str) -> str | None:
        if name not in med:
            return None
        p99 = med[name]["p99"]
        ok = p99 is not None and p99 < TARGET_MS
        return f"{what}: p99 {_ms(p99)} ms, {'met' if ok else '**missed**'} (< {TARGET_MS:g} ms)"

    parts = [
        check("search flood", "another client's EVENT OK under the search flood"),
        check("tagreq alone", "the 41 KB REQ answered or refused"),
        check("tagreq flood", "another client's REQ while 4 addresses send it"),
    ]
    return "**Verdicts (issue 37, medians of the rounds)**: " + "; ".join(x for x in parts if x)


# --- the run ---------------------------------------------------------------------------------


async def run_all(
    url: str, meter: Meter, o: Options, say: Callable[[str], None]
) -> list[list[Phase]]:
    rounds = []
    for r in range(o.rounds):
        say(f"  round {r + 1} of {o.rounds}")
        rounds.append(await one_round(url, meter, o, say))
    return rounds


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(
        prog="python -m bench abuse",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0, help="each timed phase")
    ap.add_argument("--samples", type=int, default=20, help="41 KB REQs sent alone, a round")
    ap.add_argument("--flood-connections", type=int, default=6)
    ap.add_argument("--query-bytes", type=int, default=500_000)
    ap.add_argument("--in-flight", type=int, default=4, help="41 KB REQs per flooding address")
    ap.add_argument("--event-rate", type=float, default=15.0, help="the victim's EVENTs/s at most")
    ap.add_argument("--req-rate", type=float, default=40.0, help="the victim's REQs/s at most")
    ap.add_argument("--deadline", type=float, default=60.0, help="seconds without an answer")
    ap.add_argument("--only", default="search,tagreq", help="search, tagreq or both")
    ap.add_argument("--results", type=Path, help="write the report into this markdown file")
    args = ap.parse_args(argv)
    only = tuple(x.strip() for x in args.only.split(",") if x.strip())
    if not only or any(x not in ("search", "tagreq") for x in only):
        ap.error("--only takes search, tagreq or both")
    if args.rounds < 1 or args.seconds <= 0 or args.samples < 1 or args.deadline <= 0:
        ap.error("--rounds, --seconds, --samples and --deadline must be positive")
    if not 1 <= args.flood_connections <= 200 or not 1 <= args.in_flight <= 64:
        ap.error("--flood-connections 1-200, --in-flight 1-64")
    if args.event_rate <= 0 or args.req_rate <= 0 or args.query_bytes < 1:
        ap.error("--event-rate, --req-rate and --query-bytes must be positive")
    o = Options(
        args.rounds,
        args.seconds,
        args.samples,
        args.flood_connections,
        args.query_bytes,
        args.in_flight,
        args.event_rate,
        args.req_rate,
        args.deadline,
        only,
    )
    say = lambda s: print(s, flush=True)  # noqa: E731
    raise_fd_limit()
    before = os.getloadavg()
    say(f"load average before the run: {', '.join(f'{x:.2f}' for x in before)}")
    from bench.peers import Postgres, start_engram

    root = Path(tempfile.mkdtemp(prefix="engram-bench-abuse-"))
    pg = Postgres(root)
    relay = None
    try:
        dsn, _drop = pg.create_database()
        server = pg.settings()
        env = {"ENGRAM_RATE_EXEMPT_LOOPBACK": "false"}
        relay = start_engram(root / "relay", ["--database-url", dsn], env)
        say(f"engram serve (pid {relay.pid}) at {relay.url}, {server}")
        meter = Meter(Watch(relay.pid, pg.pid))
        rounds = run_async(run_all(relay.url, meter, o, say))
    finally:
        if relay is not None:
            relay.stop()
        pg.close()
        shutil.rmtree(root, ignore_errors=True)
    text = report(rounds, argv, server, o, (before, os.getloadavg()))
    print()
    print(text)
    if args.results:
        write_results(args.results, text, BEGIN, END)
        print(f"wrote {args.results}")
    return 0
