"""Live fan-out: a subscription index and publish-once delivery.

Each filter is indexed under one field (ids, else authors, else one tag, else one word of
its NIP-50 search, else kinds, else "everything"), so publishing costs a few dict lookups
plus a full `matches` on the candidates only, independent of how many non-matching
subscriptions exist. A search is tokenized once, when it subscribes, and an event's
content once per publish: a live search whose words the event lacks costs nothing (a
search under "everything" re-tokenized its whole query for every event, issue 37). The event's
JSON is encoded once; within one publish, subscriptions with equal filters share one
`matches` verdict and equal subscription ids one frame (a popular filter is usually
held by many connections: matching each was a quarter of the relay's CPU with 1,000
subscribers).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable
from typing import Protocol

from engram.nip01 import Event
from relay import metrics
from relay.config import DEFAULT_PRIVATE, MEMORY_KINDS
from relay.filters import (
    Filter,
    SharedFilters,
    content_words,
    match_key,
    matches_any,
    query_words,
)
from relay.policy import readers
from relay.wire import Reason, closed, event_frame, sub_prefix

IndexKey = tuple[Hashable, ...]
_ALL: IndexKey = ("*",)
PENDING_MAX = 10_000  # live events buffered per subscription while its stored read runs
PENDING_BYTES_MAX = 8 * 1024 * 1024  # ... and their bytes; past either the REQ is CLOSED


class Subscriber(Protocol):
    """What fan-out needs from a connection: who it is and a non-blocking send."""

    @property
    def authed(self) -> str | None: ...

    def send(self, frame: bytes) -> None: ...


class Subscription:
    """One REQ. While its stored results are being read it is `pending`: live events are
    buffered (bounded) and flushed after EOSE, so nothing published meanwhile is lost."""

    __slots__ = (
        "conn",
        "filters",
        "keys",
        "match_class",
        "match_key",
        "pending",
        "pending_bytes",
        "prefix",
        "sub_id",
        "terms",
        "words",
    )

    def __init__(self, conn: Subscriber, sub_id: str, filters: list[Filter], pending: bool) -> None:
        self.conn = conn
        self.sub_id = sub_id
        self.filters = filters
        self.prefix = sub_prefix(sub_id)
        self.words: list[str] = []  # index words of the filters indexed by their search
        shared = filters if type(filters) is SharedFilters else None  # relay.reqmemo's
        if shared is not None and shared.keys is not None:  # worked out by an earlier REQ
            self.terms = None  # (never a search)
            self.keys: list[IndexKey] = shared.keys  # shared, never changed
            self.match_key: tuple[Hashable, ...] = shared.match_key
        elif len(filters) == 1 and filters[0].search is None:  # the commonest REQ
            self.terms = None
            self.keys = _index_keys(filters[0])
            self.match_key = (match_key(filters[0]),)
        else:
            # each filter's search words (None: no search), tokenized once; None: no search
            terms = [None if f.search is None else query_words(f.search) for f in filters]
            self.terms = terms if any(t is not None for t in terms) else None
            self.keys = []
            for f, t in zip(filters, terms, strict=True):
                if t and _by_word(f):
                    self.words.append(t[0])  # the longest: likely the rarest
                else:
                    self.keys += _index_keys(f)
            self.match_key = tuple(map(match_key, filters))
        if shared is not None and shared.keys is None:  # kept for the next REQ of the text
            shared.keys, shared.match_key = self.keys, self.match_key
        self.match_class = 0  # set by FanOut.subscribe: equal match_key, equal class
        self.pending: list[tuple[str, bytes]] | None = [] if pending else None
        self.pending_bytes = 0


def _by_word(f: Filter) -> bool:
    """A search filter is indexed under a word of its query unless ids, authors or a tag
    index it (more selective, and exact); a query without words matches every content."""
    return f.ids is None and f.authors is None and not f.tags


def _index_keys(f: Filter) -> list[IndexKey]:
    if f.ids is not None:
        return [("i", v) for v in f.ids]
    if f.authors is not None:
        return [("a", v) for v in f.authors]
    if f.tags:
        letter, values = next(iter(f.tags.items()))
        return [("t", letter, v) for v in values]
    if f.kinds is not None:
        return [("k", k) for k in f.kinds]
    return [_ALL]


def _event_keys(event: Event) -> list[IndexKey]:
    keys: list[IndexKey] = [("i", event.id), ("a", event.pubkey), ("k", event.kind), _ALL]
    for tag in event.tags:
        if len(tag) >= 2 and len(tag[0]) == 1:
            keys.append(("t", tag[0], tag[1]))
    return keys


class FanOut:
    def __init__(self) -> None:
        self._count = 0  # subscriptions, every connection's
        # index key -> the subscriptions under it (the objects: publish reaches each one
        # without a lookup)
        self._index: defaultdict[IndexKey, set[Subscription]] = defaultdict(set)
        # id(connection) -> its subscriptions by id (one lookup finds a REQ's, counts a
        # connection's, and drops them all when it goes)
        self._by_conn: dict[int, dict[str, Subscription]] = {}
        # match_key -> [class number, subscriptions holding it]: publish compares small
        # ints, never hashes a filter (an `authors` list of hundreds) per candidate
        self._classes: dict[Hashable, list[int]] = {}
        self._next_class = 0
        self._words: defaultdict[str, set[Subscription]] = defaultdict(set)  # search word
        self._searches = 0  # subscriptions with a search
        self._searches_by_conn: defaultdict[int, int] = defaultdict(int)

    def __len__(self) -> int:
        return self._count

    @property
    def searches(self) -> int:
        """Subscriptions with a NIP-50 search, every connection's."""
        return self._searches

    def count_for(self, conn: Subscriber) -> int:
        return len(self._by_conn.get(id(conn), ()))

    def searches_for(self, conn: Subscriber) -> int:
        """The connection's subscriptions with a search."""
        return self._searches_by_conn.get(id(conn), 0)

    def has(self, conn: Subscriber, sub_id: str) -> bool:
        subs = self._by_conn.get(id(conn))
        return subs is not None and sub_id in subs

    def get(self, conn: Subscriber, sub_id: str) -> Subscription | None:
        subs = self._by_conn.get(id(conn))
        return None if subs is None else subs.get(sub_id)

    def subscribe(
        self, conn: Subscriber, sub_id: str, filters: list[Filter], pending: bool = False
    ) -> Subscription:
        """Add (or replace) a subscription."""
        subs = self._by_conn.get(id(conn))
        if subs is not None and sub_id in subs:
            self.unsubscribe(conn, sub_id)
            subs = self._by_conn.get(id(conn))  # gone if that was the connection's last
        if subs is None:
            subs = self._by_conn[id(conn)] = {}
        sub = Subscription(conn, sub_id, filters, pending)
        subs[sub_id] = sub
        self._count += 1
        entry = self._classes.get(sub.match_key)
        if entry is None:
            self._next_class += 1
            entry = self._classes[sub.match_key] = [self._next_class, 0]
        entry[1] += 1
        sub.match_class = entry[0]
        for key in sub.keys:
            self._index[key].add(sub)
        for word in sub.words:
            self._words[word].add(sub)
        if sub.terms is not None:
            self._searches += 1
            self._searches_by_conn[id(conn)] += 1
        return sub

    def is_current(self, sub: Subscription) -> bool:
        subs = self._by_conn.get(id(sub.conn))
        return subs is not None and subs.get(sub.sub_id) is sub

    def go_live(self, sub: Subscription, already_sent: set[str]) -> None:
        """After EOSE: flush what was published during the stored read, minus repeats."""
        pending, sub.pending = sub.pending, None
        for event_id, frame in pending or ():
            if event_id not in already_sent:
                sub.conn.send(frame)

    def unsubscribe(self, conn: Subscriber, sub_id: str) -> bool:
        subs = self._by_conn.get(id(conn))
        sub = None if subs is None else subs.pop(sub_id, None)
        if sub is None:
            return False
        if not subs:  # its last one
            del self._by_conn[id(conn)]
        self._count -= 1
        entry = self._classes[sub.match_key]
        entry[1] -= 1
        if not entry[1]:
            del self._classes[sub.match_key]
        for key in sub.keys:
            bucket = self._index.get(key)
            if bucket is not None:
                bucket.discard(sub)
                if not bucket:
                    del self._index[key]
        for word in sub.words:
            found = self._words.get(word)
            if found is not None:
                found.discard(sub)
                if not found:
                    del self._words[word]
        if sub.terms is not None:
            self._searches -= 1
            left = self._searches_by_conn[id(conn)] - 1
            if left:
                self._searches_by_conn[id(conn)] = left
            else:
                del self._searches_by_conn[id(conn)]
        return True

    def drop_connection(self, conn: Subscriber) -> None:
        for sub_id in list(self._by_conn.get(id(conn), ())):
            self.unsubscribe(conn, sub_id)

    def publish(self, event: Event, raw: bytes, private: frozenset[int] = DEFAULT_PRIVATE) -> int:
        """Deliver to every matching subscription that may see the event (of a `private`
        kind: its author's and recipient's only); returns the number of frames sent."""
        if not self._count:  # the common case under ingest: nobody subscribed here
            return 0
        candidates: set[Subscription] = set()
        index = self._index
        for key in _event_keys(event):
            bucket = index.get(key)
            if bucket:
                candidates |= bucket
        # the content's words, once, when a live search is indexed by a word (a search
        # indexed otherwise reads them only if its candidate comes up); agent memory is
        # ciphertext that no search matches (relay.filters.words_match)
        words: frozenset[str] | None = None
        if self._words and event.kind not in MEMORY_KINDS:
            words = content_words(event)
            by_word = self._words
            if len(words) <= len(by_word):
                for word in words:
                    bucket = by_word.get(word)
                    if bucket:
                        candidates |= bucket
            else:  # fewer searched words than words in the content
                for word, bucket in by_word.items():
                    if word in words:
                        candidates |= bucket
        sent = 0
        only = readers(event, private)  # None: anyone
        verdicts: dict[int, bool] = {}  # match_class -> matches_any
        frames: dict[bytes, bytes] = {}  # prefix -> frame
        for sub in candidates:
            if only is not None and sub.conn.authed not in only:
                continue
            verdict = verdicts.get(sub.match_class)
            if verdict is None:
                verdict = verdicts[sub.match_class] = matches_any(
                    sub.filters, event, sub.terms, words
                )
            if verdict:
                frame = frames.get(sub.prefix)
                if frame is None:
                    frame = frames[sub.prefix] = event_frame(sub.prefix, raw)
                if sub.pending is None:
                    sub.conn.send(frame)
                elif len(sub.pending) < PENDING_MAX and sub.pending_bytes < PENDING_BYTES_MAX:
                    sub.pending.append((event.id, frame))
                    sub.pending_bytes += len(frame)
                else:
                    self.overflow(sub)
                    continue
                sent += 1
        return sent

    def overflow(self, sub: Subscription) -> None:
        """Too many live events arrived while the stored read ran: rather than drop some
        silently, close the subscription with a reason (the client may subscribe again,
        with `since`) and count it."""
        self.unsubscribe(sub.conn, sub.sub_id)
        sub.pending = None
        metrics.pending_overflow()
        sub.conn.send(
            closed(
                sub.sub_id,
                Reason.ERROR(
                    "too many live events arrived while stored ones were read; subscribe again"
                ),
            )
        )
