"""Pre-generated, signed benchmark events, cached in files so signing is never timed.

Everything is derived from a seed: the keys (`Keyring`), the events of each scenario, and
the cache file name (`<scenario>-<count>-s<seed>-<day>.msgpack` under bench/.cache/, or
$ENGRAM_BENCH_CACHE). The UTC day is part of the key because relays refuse events that
are too old or too far in the future, so every event's created_at sits a few days before
the day it was made (`base_time`), and a new day regenerates.

Same seed, same events: two relays driven from one cache see byte-identical EVENTs, and a
relay that already stored them answers "duplicate" (use a fresh store or another seed).
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import msgspec

from engram import Memory, build_event, conversation_key, d_tag
from engram.nip01 import pubkey_of, sign_event

BENCH_TAG = "engram-bench"
_WORDS = [
    "relay",
    "memory",
    "agent",
    "engram",
    "deploy",
    "key",
    "rotates",
    "monday",
    "note",
    "cache",
    "batch",
    "commit",
    "index",
    "query",
    "filter",
    "socket",
    "nostr",
    "event",
    "owner",
    "slug",
    "value",
    "recall",
    "remember",
    "context",
    "session",
]
_VERSION = 1


def cache_dir() -> Path:
    return Path(os.environ.get("ENGRAM_BENCH_CACHE") or Path(__file__).parent / ".cache")


def base_time(now: float | None = None) -> int:
    """Start of the UTC day, minus three days: every event time is base_time + i seconds."""
    day = int(now if now is not None else time.time()) // 86400 * 86400
    return day - 3 * 86400


def _seckey(seed: int, role: str, i: int) -> bytes:
    return hashlib.sha256(f"engram-bench/{seed}/{role}/{i}".encode()).digest()


@dataclass
class Keyring:
    """The deterministic identities of one seed."""

    seed: int
    authors: int = 1000  # kind-1 authors
    agents: int = 16  # engram writers, each with its own owner
    slugs: int = 50  # hot slugs per agent

    @cached_property
    def author_keys(self) -> list[bytes]:
        return [_seckey(self.seed, "author", i) for i in range(self.authors)]

    @cached_property
    def author_pubkeys(self) -> list[str]:
        return [pubkey_of(k) for k in self.author_keys]

    @cached_property
    def agent_keys(self) -> list[bytes]:
        return [_seckey(self.seed, "agent", i) for i in range(self.agents)]

    @cached_property
    def agent_pubkeys(self) -> list[str]:
        return [pubkey_of(k) for k in self.agent_keys]

    @cached_property
    def owner_pubkeys(self) -> list[str]:
        return [pubkey_of(_seckey(self.seed, "owner", i)) for i in range(self.agents)]

    @cached_property
    def publisher_key(self) -> bytes:
        return _seckey(self.seed, "publisher", 0)

    def slug(self, k: int) -> str:
        return f"mem/bench/s{k}"

    @cached_property
    def d_tags(self) -> list[list[str]]:
        """d tag of every (agent, hot slug): what the CLI's head fetch asks for."""
        out = []
        for a in range(self.agents):
            k_c = conversation_key(self.agent_keys[a], self.owner_pubkeys[a])
            out.append([d_tag(k_c, self.slug(k)) for k in range(self.slugs)])
        return out


@dataclass
class EventSet:
    """Signed events of one scenario: ids and compact JSON, in send order."""

    scenario: str
    seed: int
    ids: list[str] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.raw)


class _Cached(msgspec.Struct):
    version: int
    scenario: str
    seed: int
    base: int
    ids: list[str]
    raw: list[bytes]


def _text(rng: random.Random, lo: int, hi: int) -> str:
    n = rng.randint(lo, hi)
    words: list[str] = []
    size = 0
    while size < n:
        w = rng.choice(_WORDS)
        words.append(w)
        size += len(w) + 1
    return " ".join(words)[:n]


def _kind1(keys: Keyring, count: int, base: int, variant: str = "") -> EventSet:
    rng = random.Random(f"kind1/{keys.seed}")
    out = EventSet("kind1", keys.seed)
    for i in range(count):
        a = i % keys.authors
        ev = sign_event(
            keys.author_keys[a],
            base + i,
            1,
            [["t", BENCH_TAG]],
            _text(rng, 40, 280),
            rng.randbytes(32),
        )
        out.ids.append(ev.id)
        out.raw.append(msgspec.json.encode(ev))
    return out


def _engrams(keys: Keyring, count: int, base: int, variant: str = "") -> EventSet:
    """Valid kind-30174 events over agents x hot slugs; created_at rises in send order, so
    each event for an address replaces the previous head."""
    rng = random.Random(f"engram/{keys.seed}")
    out = EventSet("engram", keys.seed)
    for i in range(count):
        a = i % keys.agents
        body = Memory(slug=keys.slug(rng.randrange(keys.slugs)), value=_text(rng, 80, 400))
        ev = build_event(
            keys.agent_keys[a],
            keys.owner_pubkeys[a],
            body,
            base + i,
            rng.randbytes(32),
            rng.randbytes(32),
        )
        out.ids.append(ev.id)
        out.raw.append(msgspec.json.encode(ev))
    return out


def fanout_tag(seed: int) -> str:
    return f"{BENCH_TAG}-fanout-{seed}"


def _fanout(keys: Keyring, count: int, base: int, variant: str = "") -> EventSet:
    rng = random.Random(f"fanout/{keys.seed}/{variant}")
    out = EventSet("fanout", keys.seed)
    tag = fanout_tag(keys.seed)
    for i in range(count):
        ev = sign_event(
            keys.publisher_key, base + i, 1, [["t", tag]], _text(rng, 40, 200), rng.randbytes(32)
        )
        out.ids.append(ev.id)
        out.raw.append(msgspec.json.encode(ev))
    return out


_BUILDERS: dict[str, Callable[[Keyring, int, int, str], EventSet]] = {
    "kind1": _kind1,
    "engram": _engrams,
    "fanout": _fanout,
}


def load_events(
    scenario: str, count: int, keys: Keyring, variant: str = "", now: float | None = None
) -> EventSet:
    """The scenario's events from the cache, generating (and caching) them when missing.

    `variant` makes another set of the same scenario (e.g. one per fan-out phase).
    """
    base = base_time(now)
    day = time.strftime("%Y%m%d", time.gmtime(base))
    name = scenario + (f"_{variant}" if variant else "")
    path = cache_dir() / f"{name}-{count}-s{keys.seed}-{day}.msgpack"
    if path.exists():
        try:
            c = msgspec.msgpack.decode(path.read_bytes(), type=_Cached)
            if c.version == _VERSION and len(c.raw) == count:
                return EventSet(scenario, keys.seed, c.ids, c.raw)
        except (msgspec.DecodeError, msgspec.ValidationError, OSError):
            pass
    events = _BUILDERS[scenario](keys, count, base, variant)
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob("*.msgpack"):  # other days' files are never read again
        if not old.stem.endswith(day):
            old.unlink(missing_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(
        msgspec.msgpack.encode(_Cached(_VERSION, scenario, keys.seed, base, events.ids, events.raw))
    )
    tmp.replace(path)
    return events
