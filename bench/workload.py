"""The standard load profile: the phases `bench load`, `bench compare` and `bench soak`
drive a relay with (kind1, engram, req, head, fanout<S>: what each sends is in
`python -m bench load --help`), and their command-line options.

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
from bench.results import PhaseResult, format_line, phase_title
from engram import KIND_ENGRAM

PHASES = ("kind1", "engram", "req", "head", "fanout")
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


async def ingest_phase(
    name: str, url: str, events: EventSet, profile: Profile, watch: Watch
) -> PhaseResult:
    client = CLIENTS[profile.client]
    frames = event_frames(events, client)
    phase = PhaseRun(name, len(frames))
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


async def req_phase(url: str, keys: Keyring, profile: Profile, watch: Watch) -> PhaseResult:
    rng = random.Random(f"req/{profile.seed}")
    n = profile.req_connections
    per = [
        [{"authors": [rng.choice(keys.author_pubkeys)], "limit": 10} for _ in range(count)]
        for count in split(profile.reqs, n)
    ]
    phase = PhaseRun("req", profile.reqs)
    client = CLIENTS[profile.client]
    lanes = [
        ReqLane(phase, url, profile.req_window, req_items(f, "q", client), client) for f in per
    ]
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


def _events_ready(profile: Profile, keys: Keyring, names: list[str]) -> dict[str, EventSet]:
    """Sign (or read from the cache) every event the phases send, before any clock."""
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
    return sets


def fanout_count(profile: Profile) -> int:
    return max(1, round(profile.fanout_rate * profile.fanout_seconds))


# --- command-line options -------------------------------------------------------------


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
