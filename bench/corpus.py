"""The corpora of `bench scale`: signed, seeded event streams and the values its REQs ask for.

Two corpora, both deterministic from a seed:
  realistic  kinds 1 (notes), 6 (reposts), 7 (reactions), 3 (contact lists), 0 (metadata)
             and 30023 (articles); authors with Zipf popularity (1,000 at 10k events,
             growing to 10,000 from 1M); content words from a Zipf vocabulary of 20,000;
             `t` tags from 50,000 hashtags, `p` tags from five times as many people as
             authors, and `e` tags to recent notes or to a few long-lived popular ones, all
             with Zipf popularity.
  skewed     the realistic mix, plus a few words in every note and one hashtag and one
             `p` value on every event: the data of a bot-heavy or single-community relay,
             and data that anyone can publish.

While it generates, the stream counts the events that carry each word and tag value
(a replaced contact list, profile or article stops counting), and at each store size
picks the values the REQs use from those counts: a common value (top 5), a mid-frequency
value (0.1-1 % of the events; the closest values when none is in that band), a rare one
(1 to 5 events; the rarest when none) and an absent one (never used). Nothing is tuned.

Events are signed (`engram.nip01.sign_event`, ~0.2 ms each: a million take minutes), so
they are made once and cached under bench/.cache/ (or $ENGRAM_BENCH_CACHE), one file per
loaded chunk, keyed by corpus, seed, sizes and chunk. created_at runs 10 s apart from a
fixed date in 2020 (10M events end in 2023), regular events jittered by up to 5 minutes,
so cached events never become future events and a relay with default limits takes them.

`live_notes` makes the realistic kind-1 traffic of `bench compare`/`load --content
realistic`: notes of bench.events' 1,000 authors with ~200-byte contents of the same Zipf
vocabulary and one `t` tag of its hashtags, timed over the days before today as live
traffic arrives (signed and cached the same way, one file per day).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import contextlib
import hashlib
import itertools
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from bench.events import EventSet, Keyring, base_time, cache_dir
from engram.kinds import is_regular
from engram.nip01 import event_id, pubkey_of, sign_event

CORPORA = ("realistic", "skewed")
KIND_MIX = {1: 60, 6: 8, 7: 20, 3: 3, 0: 2, 30023: 4}  # weights
REGULAR = frozenset(k for k in KIND_MIX if is_regular(k))  # every event kept (1, 6, 7)
WORDS = 20_000  # content vocabulary
HASHTAGS = 50_000
PEOPLE_PER_AUTHOR = 5  # `p` values: authors first, then people who never post
RECENT_NOTES = 5_000  # replies, reposts and reactions mostly point at recent notes...
HOT_NOTES = 2_000  # ...and a fifth of them at a few notes that stay popular
SKEW_WORDS = ("gm", "nostr", "bitcoin")  # skewed: in every note
SKEW_TAG = "nostr"  # skewed: a `t` value on every event
SKEW_P = hashlib.sha256(b"engram-bench-scale/skewed-p").hexdigest()  # and a `p` value
BASE_TIME = 1_600_000_000  # 2020-09-13: 10M events 10 s apart end in 2023
SPACING = 10
JITTER = 300
CHUNK = 100_000  # events per measured (and cached) ingest chunk
LIVE_CONTENT = (160, 240)  # bytes of a live note's content (live_notes): ~200
LIVE_SPAN = 216_000  # seconds the live notes' created_at spans (2.5 days)
DEFAULT_SIZES = (10_000, 100_000, 1_000_000)  # store sizes `bench scale` steps through
_VERSION = 1

# What each REQ shape asks for; the value classes are picked from the counts.
TAG_SHAPES = ("search", "#e", "#p", "#t")
CLASSES = ("common", "mid", "rare", "absent")
SHAPES = (
    *(f"{s} {c}" for s in TAG_SHAPES for c in CLASSES),
    "ids",
    "authors",
    "kinds",
    "feed 20",
    "COUNT",
)


# (secret key, created_at, kind, tags, content, BIP-340 aux): sign_event's arguments
Spec = tuple[bytes, int, int, list[list[str]], str, bytes]


def sign(spec: Spec) -> bytes:
    """One signed event as compact JSON (run in worker processes: signing is the cost)."""
    return msgspec.json.encode(sign_event(*spec))


def authors_for(size: int) -> int:
    return min(10_000, max(1_000, size // 100))


class Zipf:
    """Draws ranks 0..n-1 with P(k) ~ 1/(k+1)^s (bisect over cumulative weights)."""

    def __init__(self, n: int, s: float, rng: random.Random) -> None:
        self.rng = rng
        self.cum = list(itertools.accumulate(1.0 / (k + 1) ** s for k in range(n)))

    def __call__(self) -> int:
        return bisect.bisect_left(self.cum, self.rng.random() * self.cum[-1])


class Picks(msgspec.Struct):
    """The values the REQs of one store size use, and how many events carry each."""

    size: int
    values: dict[str, list[Any]]  # shape -> values (a str, or a list of authors for feeds)
    matches: dict[str, list[int]]  # shape -> events carrying each value (tag/search shapes)


class Meta(msgspec.Struct):
    version: int
    corpus: str
    seed: int
    bounds: list[int]  # chunk ends
    picks: list[Picks]
    seconds: float  # generation time


class _Chunk(msgspec.Struct):
    ids: list[str]
    raw: list[bytes]


def bounds_for(sizes: list[int], chunk: int = CHUNK) -> list[int]:
    """Chunk ends: every store size and every multiple of `chunk` below the largest."""
    top = max(sizes)
    return sorted(set(sizes) | set(range(chunk, top, chunk)))


@dataclass
class Generator:
    """The event stream of one corpus; counts what the REQs will pick from."""

    corpus: str
    seed: int
    stream: str = "scale"  # names the random stream: another stream draws other values
    made: int = 0
    seckeys: list[bytes] = field(default_factory=list)
    pubkeys: list[str] = field(default_factory=list)
    people: list[str] = field(default_factory=list)
    notes: list[tuple[str, str]] = field(default_factory=list)  # recent (id, author), a ring
    hot: list[tuple[str, str]] = field(default_factory=list)
    counts: dict[str, Counter[str]] = field(default_factory=dict)
    by_author: Counter[str] = field(default_factory=Counter)
    ids: list[str] = field(default_factory=list)  # reservoir of regular events' ids
    reacted: list[str] = field(default_factory=list)  # reservoir of reaction targets
    ids_seen: int = 0
    reacted_seen: int = 0
    # replaceable/addressable address -> what its current version counts as
    current: dict[tuple[str, int, str], list[tuple[str, str]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.corpus not in CORPORA:
            raise ValueError(f"unknown corpus {self.corpus!r} (one of {', '.join(CORPORA)})")
        self.rng = random.Random(f"{self.stream}/{self.corpus}/{self.seed}")
        self.skewed = self.corpus == "skewed"
        self.counts = {s: Counter() for s in TAG_SHAPES}
        self._kinds = list(KIND_MIX)
        self._kind_cum = list(itertools.accumulate(KIND_MIX.values()))
        self._words = Zipf(WORDS, 1.0, self.rng)
        self._tags = Zipf(HASHTAGS, 1.0, self.rng)
        self._recent = Zipf(RECENT_NOTES, 1.0, self.rng)
        self._hot = Zipf(HOT_NOTES, 1.0, self.rng)
        self._authors: Zipf | None = None
        self._people: Zipf | None = None

    def grow_authors(self, n: int) -> None:
        while len(self.seckeys) < n:
            i = len(self.seckeys)
            key = hashlib.sha256(f"engram-bench-scale/{self.seed}/author/{i}".encode()).digest()
            self.seckeys.append(key)
            self.pubkeys.append(pubkey_of(key))
        others = [
            hashlib.sha256(f"engram-bench-scale/{self.seed}/person/{i}".encode()).hexdigest()
            for i in range(n * (PEOPLE_PER_AUTHOR - 1))
        ]
        self.people = self.pubkeys[:n] + others
        self._authors = Zipf(n, 0.9, self.rng)
        self._people = Zipf(len(self.people), 1.0, self.rng)

    # -- parts of events -----------------------------------------------------------------

    def _text(self, n: int) -> list[str]:
        return [f"w{self._words()}" for _ in range(n)]

    def _person(self) -> str:
        assert self._people is not None
        return self.people[self._people()]

    def _note(self) -> tuple[str, str] | None:
        """A note to reply to, repost or react to: recent, or one of the popular ones."""
        if self.hot and self.rng.random() < 0.2:
            return self.hot[self._hot() % len(self.hot)]
        if not self.notes:
            return None
        k = self._recent()
        return self.notes[-1 - k] if k < len(self.notes) else self.notes[0]

    @staticmethod
    def _sample(pool: list[str], value: str, seen: int, rng: random.Random) -> None:
        if len(pool) < 200:
            pool.append(value)
        elif (j := rng.randrange(seen)) < 200:
            pool[j] = value

    # -- one event -----------------------------------------------------------------------

    def event(self) -> tuple[str, Spec]:
        """The next event: its id and what `sign` needs to sign it."""
        assert self._authors is not None
        rng = self.rng
        self.made += 1
        kind = self._kinds[bisect.bisect_left(self._kind_cum, rng.random() * self._kind_cum[-1])]
        a = self._authors()
        author = self.pubkeys[a]
        created_at = BASE_TIME + self.made * SPACING
        if kind in REGULAR:  # arrival order roughly follows created_at, as relays see it
            created_at += rng.randrange(-JITTER, JITTER)
        tags: list[list[str]] = []
        words: list[str] = []
        content = ""
        d = ""
        if kind == 1:
            words = self._text(rng.randrange(6, 20))
            if self.skewed:
                words += list(SKEW_WORDS)
            if rng.random() < 0.4:
                tags.append(["t", f"topic{self._tags()}"])
            if rng.random() < 0.2 and (note := self._note()) is not None:
                tags += [["e", note[0]], ["p", note[1]]]
            elif rng.random() < 0.3:
                tags.append(["p", self._person()])
            content = " ".join(words)
        elif kind in (6, 7):
            note = self._note()
            if note is None:  # no note yet: a note instead
                kind = 1
                words = self._text(8) + (list(SKEW_WORDS) if self.skewed else [])
                content = " ".join(words)
            else:
                tags += [["e", note[0]], ["p", note[1]]]
                content = "+" if kind == 7 else ""
                if kind == 7:
                    self.reacted_seen += 1
                    self._sample(self.reacted, note[0], self.reacted_seen, rng)
        elif kind == 3:
            tags = [["p", self._person()] for _ in range(rng.randrange(10, 60))]
        elif kind == 0:
            words = self._text(8)
            content = msgspec.json.encode({"name": author[:8], "about": " ".join(words)}).decode()
        else:  # 30023
            d = f"article-{rng.randrange(100)}"
            tags = [["d", d]] + [["t", f"topic{self._tags()}"] for _ in range(rng.randrange(1, 4))]
            words = self._text(rng.randrange(40, 120))
            content = " ".join(words)
        if self.skewed:
            tags += [["t", SKEW_TAG], ["p", SKEW_P]]
        eid = event_id(author, created_at, kind, tags, content)
        self._count(eid, author, kind, d, tags, words)
        return eid, (self.seckeys[a], created_at, kind, tags, content, rng.randbytes(32))

    def _count(
        self, eid: str, author: str, kind: int, d: str, tags: list[list[str]], words: list[str]
    ) -> None:
        carried = {(f"#{t[0]}", t[1]) for t in tags if t[0] in "ept"}
        carried |= {("search", w) for w in words}
        if kind in REGULAR:
            self.ids_seen += 1
            self._sample(self.ids, eid, self.ids_seen, self.rng)
            if kind == 1:
                self.notes.append((eid, author))
                if len(self.notes) > 2 * RECENT_NOTES:
                    del self.notes[:RECENT_NOTES]
                if len(self.hot) < HOT_NOTES and self.rng.random() < 0.005:
                    self.hot.append((eid, author))
        else:  # the previous version of this address stops counting
            for shape, value in self.current.pop((author, kind, d), ()):
                c = self.counts[shape]
                c[value] -= 1
                if c[value] <= 0:
                    del c[value]
            self.current[(author, kind, d)] = list(carried)
        for shape, value in carried:
            self.counts[shape][value] += 1
        self.by_author[author] += 1

    def live_note(self, author_key: bytes, created_at: int) -> Spec:
        """A kind-1 note of ~200 bytes (LIVE_CONTENT) of the Zipf vocabulary with one `t`
        tag of the Zipf hashtags: the traffic relay load tools send, in this corpus's
        words (not counted: no REQ of `bench scale` asks for it)."""
        rng = self.rng
        target = rng.randint(*LIVE_CONTENT)
        words: list[str] = []
        size = -1
        while size < target:
            words.append(f"w{self._words()}")
            size += len(words[-1]) + 1
        tags = [["t", f"topic{self._tags()}"]]
        return (author_key, created_at, 1, tags, " ".join(words), rng.randbytes(32))

    # -- what the REQs ask for -----------------------------------------------------------

    def picks(self, size: int) -> Picks:
        """Values of every shape at this size, chosen from the counts (seeded, not tuned)."""
        rng = random.Random(f"picks/{self.corpus}/{self.seed}/{size}")
        values: dict[str, list[Any]] = {}
        matches: dict[str, list[int]] = {}
        for shape in TAG_SHAPES:
            for cls, chosen in classify(self.counts[shape], size, rng).items():
                values[f"{shape} {cls}"] = [v for v, _ in chosen]
                matches[f"{shape} {cls}"] = [n for _, n in chosen]
            values[f"{shape} absent"] = [absent(shape, i) for i in range(20)]
            matches[f"{shape} absent"] = [0] * 20
        authors = list(self.by_author)
        weights = [self.by_author[a] for a in authors]
        values["ids"] = list(self.ids)
        values["authors"] = rng.choices(authors, weights, k=200)
        values["kinds"] = [[1]]
        values["feed 20"] = [
            list(dict.fromkeys(rng.choices(authors, weights, k=60)))[:20] for _ in range(50)
        ]
        values["COUNT"] = list(self.reacted) or [absent("#e", 0)]
        return Picks(size, values, matches)


def absent(shape: str, i: int) -> str:
    """The i-th value of `shape` (search or #e/#p/#t) that no event of any corpus carries."""
    if shape == "search":
        return f"w{WORDS + 1 + i}"
    if shape == "#t":
        return f"topic{HASHTAGS + 1 + i}"
    return hashlib.sha256(f"absent-{shape[1:]}/{i}".encode()).hexdigest()


def classify(
    counter: Counter[str], events: int, rng: random.Random
) -> dict[str, list[tuple[str, int]]]:
    """common (top 5), mid (0.1-1 % of events, else the nearest), rare (1-5 events, else
    the rarest): up to 20 values each, with their counts."""
    ranked = counter.most_common()
    common, rest = ranked[:5], ranked[5:]
    lo, hi = max(2.0, events * 0.001), max(2.0, events * 0.01)
    mid = [x for x in rest if lo <= x[1] <= hi]
    if not mid and rest:
        target = math.sqrt(lo * hi)
        mid = sorted(rest, key=lambda x: (abs(math.log(x[1] / target)), x[0]))[:20]
    rare = [x for x in rest if x[1] <= 5]
    if not rare:
        rare = rest[-20:]
    pick = lambda xs: rng.sample(xs, min(20, len(xs)))  # noqa: E731
    return {"common": common, "mid": pick(mid), "rare": pick(rare)}


# --- the cache ----------------------------------------------------------------------


@dataclass
class Prepared:
    """A corpus on disk: its chunk files and the picks of every size."""

    corpus: str
    directory: Path
    meta: Meta

    def chunks(self, upto: int | None = None) -> Iterator[tuple[int, int, EventSet]]:
        """(start, end, events) of every chunk (up to the store size `upto`), read one at
        a time."""
        start = 0
        for end in self.meta.bounds:
            if upto is not None and end > upto:
                return
            c = msgspec.msgpack.decode(
                (self.directory / _chunk_name(end)).read_bytes(), type=_Chunk
            )
            yield start, end, EventSet(self.corpus, self.meta.seed, c.ids, c.raw)
            start = end

    def picks(self, size: int) -> Picks:
        return next(p for p in self.meta.picks if p.size == size)


def _chunk_name(end: int) -> str:
    return f"upto-{end:010d}.msgpack"


def corpus_dir(corpus: str, seed: int, sizes: list[int], chunk: int) -> Path:
    key = "_".join(str(s) for s in sorted(sizes))
    return cache_dir() / f"scale-{corpus}-s{seed}-n{key}-c{chunk}-v{_VERSION}"


def _read_meta(directory: Path) -> Meta | None:
    try:
        meta = msgspec.msgpack.decode((directory / "meta.msgpack").read_bytes(), type=Meta)
    except (msgspec.DecodeError, msgspec.ValidationError, OSError):
        return None
    return meta if meta.version == _VERSION else None


def cached(corpus: str, seed: int, size: int, chunk: int = CHUNK) -> Prepared | None:
    """A corpus already in the cache, whatever sizes it was made for, that has picks at
    `size` and every chunk file up to it (the one with the fewest events when several
    have): `bench flood` loads part of what `bench scale` signed."""
    found: list[tuple[int, Prepared]] = []
    for directory in cache_dir().glob(f"scale-{corpus}-s{seed}-n*-c{chunk}-v{_VERSION}"):
        meta = _read_meta(directory)
        if meta is None or meta.corpus != corpus or meta.seed != seed:
            continue
        if size not in {p.size for p in meta.picks}:
            continue
        if all((directory / _chunk_name(e)).exists() for e in meta.bounds if e <= size):
            found.append((max(meta.bounds), Prepared(corpus, directory, meta)))
    return min(found, key=lambda x: (x[0], str(x[1].directory)))[1] if found else None


def prepare(
    corpus: str, seed: int, sizes: list[int], chunk: int = CHUNK, say: Callable[[str], None] = print
) -> Prepared:
    """The corpus from the cache, generating and signing it first when missing."""
    directory = corpus_dir(corpus, seed, sizes, chunk)
    meta_path = directory / "meta.msgpack"
    meta = _read_meta(directory) if meta_path.exists() else None
    if meta is not None and all((directory / _chunk_name(e)).exists() for e in meta.bounds):
        return Prepared(corpus, directory, meta)
    directory.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    gen = Generator(corpus, seed)
    steps = sorted(set(sizes))
    bounds = bounds_for(steps, chunk)
    picks: list[Picks] = []
    start = 0
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count() or 1) as pool:
        for end in bounds:
            gen.grow_authors(authors_for(next(s for s in steps if s >= end)))
            made = [gen.event() for _ in range(end - start)]
            ids = [i for i, _ in made]
            raw = list(pool.map(sign, [spec for _, spec in made], chunksize=500))
            if any(r[7:71] != i.encode() for i, r in zip(ids, raw, strict=True)):
                raise RuntimeError("a signed event's id differs from the generator's")
            _write(directory / _chunk_name(end), _Chunk(ids, raw))
            if end in steps:
                picks.append(gen.picks(end))
            say(f"  {corpus}: {end:,} events signed and cached ({time.monotonic() - t0:.0f} s)")
            start = end
    meta = Meta(_VERSION, corpus, seed, bounds, picks, time.monotonic() - t0)
    _write(meta_path, meta)
    return Prepared(corpus, directory, meta)


def _write(path: Path, value: Any) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(msgspec.msgpack.encode(value))
    tmp.replace(path)


# --- live traffic: realistic kind-1 notes for bench load and compare --------------------


def live_notes(seed: int, count: int, authors: int = 1000, now: float | None = None) -> EventSet:
    """`count` signed kind-1 notes of `authors` authors in turn (bench.events.Keyring's
    keys of `seed`, so the REQ phases ask for the authors that wrote), each with ~200
    bytes of the realistic corpus's Zipf words and one of its Zipf hashtags as a `t` tag.
    created_at rises through the LIVE_SPAN seconds after bench.events.base_time (three
    days before today), jittered like the corpus's regular events: in arrival order,
    roughly, and never in the future. Signed in worker processes and cached per day
    (the same events all day; `bench load`'s older days' files are removed as it makes
    new ones, and so are this function's)."""
    base = base_time(now)
    day = time.strftime("%Y%m%d", time.gmtime(base))
    prefix = "kind1_realistic-"
    path = cache_dir() / f"{prefix}{count}-s{seed}-a{authors}-{day}.msgpack"
    with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError, OSError):
        got = msgspec.msgpack.decode(path.read_bytes(), type=_Chunk)
        if len(got.raw) == count:
            return EventSet("kind1", seed, got.ids, got.raw)
    keys = Keyring(seed, authors=authors).author_keys
    gen = Generator("realistic", seed, stream="live")
    step = LIVE_SPAN / max(1, count)
    specs: list[Spec] = []
    for i in range(count):
        t = base + int(i * step) + gen.rng.randrange(-JITTER, JITTER)
        specs.append(gen.live_note(keys[i % authors], min(max(t, base), base + LIVE_SPAN)))
    pubkeys = {k: pubkey_of(k) for k in keys}
    ids = [event_id(pubkeys[s[0]], s[1], s[2], s[3], s[4]) for s in specs]
    with concurrent.futures.ProcessPoolExecutor(min(4, os.cpu_count() or 1)) as pool:
        raw = list(pool.map(sign, specs, chunksize=500))
    if any(r[7:71] != i.encode() for i, r in zip(ids, raw, strict=True)):
        raise RuntimeError("a signed event's id differs from the generator's")
    path.parent.mkdir(parents=True, exist_ok=True)
    for old in path.parent.glob(f"{prefix}*.msgpack"):  # other days' are never read again
        if not old.stem.endswith(day):
            old.unlink(missing_ok=True)
    _write(path, _Chunk(ids, raw))
    return EventSet("kind1", seed, ids, raw)
