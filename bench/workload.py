"""The load profiles: the phases `bench load`, `bench compare` and `bench soak` drive a
relay with (kind1, engram, req, probe, head, fanout<S>: what each sends is in `python -m
bench load --help`), and their command-line options.

`--profile` picks a preset (`PROFILES`), each option given on the command line overrides
it: `standard` (the burst of every phase, the defaults of `Profile`), `sustained` (issue
47: 200,000 realistic kind-1 EVENTs, 100 in flight on each of 8 connections, each
connection replaced after 5,000 EVENTs, CPU and latency per 100,000 answers) and `reads`
(issue 48: 40,000 realistic notes stored, then `authors` REQs with 8 x 8 open and a
probe of 2,000 with 8 x 1).

`run_load(url, profile, pid, pg_pid)` runs the profile's phases in order and returns a
`PhaseResult` per phase; events come from bench.events' file cache, signed before any
clock starts, and every connection is open (and authenticated) before it too. A phase
is a few lanes (bench.lanes) timed by `drive`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from bench.events import EventSet, Keyring, cache_dir, fanout_tag, load_events
from bench.lanes import (
    CLIENTS,
    EventLane,
    FanOut,
    PhaseRun,
    ReqLane,
    drive,
    event_frames,
    now,
    open_all,
    req_items,
    split,
)
from bench.procwatch import Watch
from bench.results import PhaseResult, count_label, format_line, phase_title
from engram import KIND_ENGRAM

PHASES = ("kind1", "engram", "req", "probe", "head", "fanout")  # every phase, in run order
STANDARD_PHASES = ("kind1", "engram", "req", "head", "fanout")
CONTENTS = ("synthetic", "realistic")
_enc = msgspec.json.encode


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
    phases: tuple[str, ...] = STANDARD_PHASES
    client: str = "builtin"  # a key of CLIENTS
    content: str = "synthetic"  # kind-1 events: bench.events' ("synthetic") or "realistic"
    chunk: int = 0  # measure ingest per this many answers too (0: the whole phase only)
    probe_reqs: int = 2000  # the probe phase: REQs, on req_connections...
    probe_window: int = 1  # ...each with this many in flight
    name: str = "standard"  # the preset this profile started from

    def phase_names(self) -> list[str]:
        out: list[str] = []
        for p in self.phases:
            if p == "fanout":
                out.extend(f"fanout{s}" for s in self.subscribers)
            else:
                out.append(p)
        return out

    def describe(self) -> str:
        """What each phase of this profile sends, in one line for a report's header."""
        parts = []
        per_conn = (
            f", a fresh connection every {self.events_per_conn:,} EVENTs"
            if self.events_per_conn
            else ""
        )
        chunks = f"; CPU and latency per {count_label(self.chunk)} answers" if self.chunk else ""
        ingest = f"{self.connections} connections x {self.window} in flight{per_conn}{chunks}"
        if "kind1" in self.phases:
            parts.append(f"ingest {self.events:,} kind-1 EVENTs ({self.content_text()}), {ingest}")
        if "engram" in self.phases:
            parts.append(f"ingest {self.engrams:,} engram EVENTs, {ingest}")
        reads = f"{self.req_connections} connections x {self.req_window} in flight"
        if "req" in self.phases:
            parts.append(f'{self.reqs:,} REQ {{"authors":[k],"limit":10}}, {reads}')
        if "probe" in self.phases:
            parts.append(
                f"probe: {self.probe_reqs:,} of the same REQ, {self.req_connections}"
                f" connections x {self.probe_window} in flight"
            )
        if "head" in self.phases:
            parts.append(f"{self.heads:,} engram head fetches (NIP-42 AUTH), {reads}")
        if "fanout" in self.phases:
            subs = ",".join(map(str, self.subscribers))
            parts.append(
                f"fan-out to {subs} subscribers at {self.fanout_rate:g} events/s for"
                f" {self.fanout_seconds:g} s"
            )
        return f"{self.name}: " + "; ".join(parts)

    def content_text(self) -> str:
        if self.content == "realistic":
            return (
                "realistic: ~200-byte contents of a Zipf vocabulary, a Zipf `t` tag, 1,000 authors"
            )
        return "synthetic: 40-280 characters of 25 words, one `t` tag for all, 1,000 authors"


# The presets of `--profile`; an option given on the command line overrides its value.
PROFILES: dict[str, dict[str, Any]] = {
    "standard": {},
    # issue 47: long enough to mean something; LocalRelay stops acknowledging after 6,000
    # EVENTs on one connection, so no connection carries more than 5,000 (for every relay)
    "sustained": {
        "events": 200_000,
        "content": "realistic",
        "connections": 8,
        "window": 100,
        "events_per_conn": 5000,
        "chunk": 100_000,
        "phases": ("kind1",),
        "phase_timeout": 1800.0,
    },
    # issue 48: 40,000 notes of 1,000 authors stored, then the REQ rate with 8 x 8 open
    # and a probe of single REQs (8 x 1)
    "reads": {
        "events": 40_000,
        "content": "realistic",
        "events_per_conn": 5000,
        "reqs": 30_000,
        "req_connections": 8,
        "req_window": 8,
        "probe_reqs": 2000,
        "probe_window": 1,
        "phases": ("kind1", "req", "probe"),
        "phase_timeout": 600.0,
    },
}


async def ingest_phase(
    name: str, url: str, events: EventSet, profile: Profile, watch: Watch
) -> PhaseResult:
    client = CLIENTS[profile.client]
    frames = event_frames(events, client)
    phase = PhaseRun(name, len(frames), profile.chunk)
    n = profile.connections
    lanes = [
        EventLane(
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
    await open_all(lanes)
    await drive(phase, lanes, watch, profile.phase_timeout)
    return phase.result


async def req_phase(
    url: str, keys: Keyring, profile: Profile, watch: Watch, name: str = "req"
) -> PhaseResult:
    """`{"authors":[k],"limit":10}` REQs, k drawn from the kind-1 authors: `reqs` of them
    with `req_window` open on each connection ("req"), or `probe_reqs` with
    `probe_window` open ("probe": a REQ's latency when the relay is not queueing)."""
    rng = random.Random(f"{name}/{profile.seed}")
    n = profile.req_connections
    total, window = (
        (profile.reqs, profile.req_window)
        if name == "req"
        else (profile.probe_reqs, profile.probe_window)
    )
    per = [
        [{"authors": [rng.choice(keys.author_pubkeys)], "limit": 10} for _ in range(count)]
        for count in split(total, n)
    ]
    phase = PhaseRun(name, total)
    client = CLIENTS[profile.client]
    prefix = "q" if name == "req" else "p"
    lanes = [ReqLane(phase, url, window, req_items(f, prefix, client), client) for f in per]
    await open_all(lanes)
    await drive(phase, lanes, watch, profile.phase_timeout)
    return phase.result


async def head_phase(url: str, keys: Keyring, profile: Profile, watch: Watch) -> PhaseResult:
    """The CLI's head fetch, each connection authenticated as one agent."""
    rng = random.Random(f"head/{profile.seed}")
    n = profile.req_connections
    phase = PhaseRun("head", profile.heads)
    lanes = []
    for i, count in enumerate(split(profile.heads, n)):
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
            ReqLane(phase, url, profile.req_window, req_items(filters, "h", client), client)
        )
    await open_all(lanes)
    outcomes = await asyncio.gather(
        *(lane.authenticate(keys.agent_keys[i % keys.agents]) for i, lane in enumerate(lanes))
    )
    for why in outcomes:
        if why:
            phase.result.notes[why] += 1
    await drive(phase, lanes, watch, profile.phase_timeout)
    return phase.result


async def fanout_phase(
    url: str, subscribers: int, events: EventSet, profile: Profile, watch: Watch
) -> PhaseResult:
    """S subscribers of one filter; a publisher sends `rate` events/s; publish -> delivery."""
    name = f"fanout{subscribers}"
    fan = FanOut(name)
    r = fan.result
    client = CLIENTS[profile.client]
    req = client.frame(
        _enc(["REQ", "fan", {"kinds": [1], "#t": [fanout_tag(profile.seed)], "limit": 0}])
    )
    live = await fan.subscribe(url, subscribers, client, req)
    frames = event_frames(events, client)
    pub_phase = PhaseRun(name, len(frames))
    publisher = EventLane(pub_phase, url, len(frames), [], [], 0, client)
    await publisher.open()
    before = watch.snapshot()
    t0, published_at = await _publish_paced(publisher, fan, frames, events.ids, profile)
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
    fan.close()
    return r


async def _publish_paced(
    publisher: EventLane, fan: FanOut, frames: list[bytes], ids: list[str], profile: Profile
) -> tuple[float, float]:
    """Send `frames` at `fanout_rate` per second, noting each one's time for the OK and
    for delivery; returns when sending started and ended."""
    assert publisher.conn is not None
    t0 = now()
    interval = 1.0 / profile.fanout_rate
    for i, frame in enumerate(frames):
        delay = t0 + i * interval - now()
        if delay > 0:
            await asyncio.sleep(delay)
        eid = ids[i]
        t = now()
        fan.sent[eid] = t
        publisher.pending[eid] = t
        publisher.conn.send(frame)
    return t0, now()


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
    sets = _events_ready(profile, keys, names)
    say(f"events ready in {now() - t:.1f} s (cache: {cache_dir()})")
    results = []
    for name in names:
        say(f"phase {phase_title(name)} ...")
        if name in ("kind1", "engram"):
            res = await ingest_phase(name, url, sets[name], profile, watch)
        elif name in ("req", "probe"):
            res = await req_phase(url, keys, profile, watch, name)
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


def _events_ready(profile: Profile, keys: Keyring, names: list[str]) -> dict[str, EventSet]:
    """Sign (or read from the cache) every event the phases send, before any clock."""
    sets: dict[str, EventSet] = {}
    if "kind1" in names:
        sets["kind1"] = kind1_events(profile, keys)
    if "engram" in names:
        variant = "" if keys.slugs == Profile.engram_slugs else f"slugs{keys.slugs}"
        sets["engram"] = load_events("engram", profile.engrams, keys, variant=variant)
    for n in names:
        if n.startswith("fanout"):  # each fan-out phase publishes events of its own
            load_events("fanout", fanout_count(profile), keys, variant=n[6:])
    if "head" in names:
        _ = keys.d_tags
    return sets


def kind1_events(profile: Profile, keys: Keyring) -> EventSet:
    """The kind-1 events of the profile's content (from the cache, made when missing)."""
    if profile.content == "realistic":
        from bench.corpus import live_notes

        return live_notes(profile.seed, profile.events, keys.authors)
    return load_events("kind1", profile.events, keys)


def fanout_count(profile: Profile) -> int:
    return max(1, round(profile.fanout_rate * profile.fanout_seconds))


# --- command-line options -------------------------------------------------------------


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


def add_profile_args(p: argparse.ArgumentParser) -> None:
    """The profile's options; each defaults to the `--profile` preset's value (shown here
    as the standard profile's)."""
    d = Profile()
    p.add_argument(
        "--profile",
        choices=sorted(PROFILES),
        default="standard",
        help="preset: standard (a burst of every phase), sustained (issue 47: 200,000"
        " realistic kind-1 EVENTs, a fresh connection every 5,000, figures per 100k),"
        " reads (issue 48: 40,000 notes, then REQs 8 x 8 and a probe 8 x 1); options"
        " given override the preset",
    )
    add = _optional(p)
    add("--events", int, d.events, "kind-1 events to ingest")
    add("--engrams", int, d.engrams, "engram events to ingest")
    add("--reqs", int, d.reqs, "REQ authors queries")
    add("--heads", int, d.heads, "engram head fetches")
    add("--connections", int, d.connections, "ingest connections")
    add("--window", int, d.window, "EVENTs in flight per connection")
    add("--req-connections", int, d.req_connections, "REQ (and probe) connections")
    add("--req-window", int, d.req_window, "REQs in flight per connection")
    add("--probe-reqs", int, d.probe_reqs, "REQs of the probe phase")
    add("--probe-window", int, d.probe_window, "probe REQs in flight per connection")
    add(
        "--subscribers",
        _ints,
        ",".join(map(str, d.subscribers)),
        "fan-out subscriber counts, comma-separated",
    )
    add("--fanout-rate", float, d.fanout_rate, "events/s published")
    add("--fanout-seconds", float, d.fanout_seconds, "seconds of publishing")
    add(
        "--events-per-conn",
        int,
        d.events_per_conn,
        "open a new connection after this many EVENTs on one (0: never)",
    )
    add("--seed", int, d.seed, "events and keys derive from it")
    add(
        "--engram-slugs",
        int,
        d.engram_slugs,
        "slugs per agent (16 agents): more makes a larger store of distinct engrams",
    )
    add("--phase-timeout", float, d.phase_timeout, "seconds a phase may take")
    p.add_argument(
        "--content",
        choices=CONTENTS,
        help="kind-1 events: synthetic (bench.events: short texts of 25 words, one `t` value"
        " for all) or realistic (bench.corpus.live_notes: ~200-byte contents of a Zipf"
        f" vocabulary, a Zipf `t` tag); default: {d.content}",
    )
    add(
        "--chunk-events",
        int,
        d.chunk,
        "report ingest CPU (relay and PostgreSQL) and latency per this many answers too"
        " (0: the whole phase only)",
    )
    p.add_argument(
        "--client",
        choices=sorted(CLIENTS),
        help="load-generator client: builtin (lean, one write per message, as users' clients"
        " send), pipelined (builtin joining queued frames into one write: never the"
        " headline), or the `websockets` library's; default: builtin",
    )
    p.add_argument(
        "--phases",
        help=f"comma-separated subset of {','.join(PHASES)}; default: {','.join(STANDARD_PHASES)}",
    )


def _optional(p: argparse.ArgumentParser) -> Callable[[str, Any, Any, str], None]:
    """An option without a default of its own: None when not given, so the preset's
    value applies (its help names the standard profile's)."""

    def add(flag: str, kind: Any, standard: Any, what: str) -> None:
        p.add_argument(flag, type=kind, help=f"{what} (standard: {standard})")

    return add


# option -> Profile field, where they differ
_FIELDS = {"chunk_events": "chunk"}


def profile_from_args(args: argparse.Namespace) -> Profile:
    values: dict[str, Any] = {**PROFILES[args.profile], "name": args.profile}
    for field_name in Profile.__dataclass_fields__:
        option = next((o for o, f in _FIELDS.items() if f == field_name), field_name)
        given = getattr(args, option, None)
        if given is None or field_name in ("name", "phases"):
            continue
        values[field_name] = tuple(given) if field_name == "subscribers" else given
    if args.phases is not None:
        values["phases"] = tuple(x for x in args.phases.split(",") if x)
    phases = values.get("phases", STANDARD_PHASES)
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise SystemExit(f"unknown phase(s): {', '.join(sorted(unknown))}")
    return Profile(**values)
