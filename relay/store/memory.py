"""MemoryStore: the reference EventStore, the rules read plainly over Python lists.

What it is for: an oracle. `tests/test_store_contract.py` runs one suite over it, over
PostgresStore and over StoreRouter, so the SQL (an INSERT that states the replace rule,
anti-joins for deletions, a planner that picks an index per filter) is checked against a
reading of the rules a reviewer can follow line by line. The relay never serves from it.

Each rule comes from its one home: kind classes (engram.kinds), the head rule
(engram.head.beats, engram.replace), who may read a private event (engram.readers), filter matching
(relay.filters.matches), NIP-40 expiry (relay.validate.expiration_of), the `d` of an
address (relay.store.tagindex), what cannot be a row and the deletion targets of a
NIP-09 request (relay.store.sqlwrite), and the answers themselves (relay.store).
Everything is answered at once: there is no batch, so a write "commits" when it is made.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from engram.head import beats
from engram.kinds import KIND_DELETION
from engram.nip01 import Event
from engram.nip62 import KIND_GIFT_WRAP, KIND_VANISH
from engram.readers import parties
from relay.config import DEFAULT_PRIVATE, MEMORY_KINDS
from relay.filters import Filter, matches
from relay.store import (
    BLOCKED,
    CLOSED,
    DEFAULT_TENANT,
    DUPLICATE,
    STORED,
    ByEnqueue,
    Saved,
    SaveResult,
    SaveStatus,
    stale_result,
)
from relay.store.sqlwrite import RowError, deletion_targets, encode_row
from relay.store.tagindex import address_d
from relay.validate import expiration_of

Address = tuple[str, int, str]  # (pubkey, kind, d as relay.store.tagindex encodes it)


@dataclass
class _Tenant:
    """One tenant's events and what its authors deleted."""

    events: dict[str, tuple[Event, bytes]] = field(default_factory=dict)  # id -> (event, raw)
    heads: dict[Address, str] = field(default_factory=dict)  # address -> id of its head
    deleted_ids: set[tuple[str, str]] = field(default_factory=set)  # (id, author)
    deleted_addresses: dict[Address, int] = field(default_factory=dict)  # -> up to created_at
    vanished: dict[str, int] = field(default_factory=dict)  # author -> up to created_at


class MemoryStore(ByEnqueue):
    """EventStore (relay.store) in memory: the reference implementation."""

    def __init__(
        self,
        search_kinds: frozenset[int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._search_kinds = search_kinds
        self._clock = clock
        self._tenants: dict[str, _Tenant] = {}
        self._batch: list[tuple[Event, bytes, str, Saved]] = []
        self._closed = False

    # --- EventWrites --------------------------------------------------------------------

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        if self._closed:
            done(CLOSED)
            return
        try:
            encode_row(event, raw)  # what cannot be a row is refused at once, as in Postgres
        except RowError as exc:
            done(SaveResult(SaveStatus.ERROR, str(exc)))
            return
        self._batch.append((event, bytes(raw), tenant, done))
        if len(self._batch) == 1:
            asyncio.get_running_loop().call_soon(self._commit)

    def _commit(self) -> None:
        """One batch: what was enqueued in one loop iteration, taken as the group-commit
        writer takes it. An address's in-batch winner goes in and the others lose to it
        (never stored, then replaced); a repeated id answers as its first did; NIP-09 and
        NIP-62 requests apply after the batch's inserts; then every caller is answered."""
        batch, self._batch = self._batch, []
        results: list[SaveResult | None] = [None] * len(batch)
        first: dict[tuple[str, str], int] = {}
        winners: dict[tuple[str, Address], Event] = {}
        for i, (event, _raw, tenant, _done) in enumerate(batch):
            if first.setdefault((tenant, event.id), i) != i:
                continue
            d = address_d(event.kind, event.tags)
            if d is not None:
                w = winners.setdefault((tenant, (event.pubkey, event.kind, d)), event)
                if beats(event.created_at, event.id, w.created_at, w.id):
                    winners[(tenant, (event.pubkey, event.kind, d))] = event
        losers: list[int] = []
        for i, (event, raw, tenant, _done) in enumerate(batch):
            if first[(tenant, event.id)] != i:
                continue
            d = address_d(event.kind, event.tags)
            if d is not None and winners[(tenant, (event.pubkey, event.kind, d))] is not event:
                losers.append(i)
            else:
                results[i] = self._insert(event, raw, self._tenant(tenant), d)
        for i in losers:  # against what the batch left stored
            event, _raw, tenant, _done = batch[i]
            results[i] = self._lost(event, self._tenant(tenant), address_d(event.kind, event.tags))
        for i, (event, _raw, tenant, _done) in enumerate(batch):
            j = first[(tenant, event.id)]
            if j != i:
                results[i] = DUPLICATE if results[j] is STORED else results[j]
            elif results[i] is STORED and event.kind == KIND_DELETION:
                _delete(event, self._tenant(tenant))
            elif results[i] is STORED and event.kind == KIND_VANISH:
                _vanish(event, self._tenant(tenant))
        for (_event, _raw, _tenant, done), result in zip(batch, results, strict=True):
            assert result is not None
            done(result)

    def _tenant(self, key: str) -> _Tenant:
        return self._tenants.setdefault(key, _Tenant())

    def _insert(self, event: Event, raw: bytes, t: _Tenant, d: str | None) -> SaveResult:
        """Store one event (the batch's winner of its address), or say why not."""
        if _blocked(event, t, d):
            return BLOCKED
        if d is None:
            if event.id in t.events:
                return DUPLICATE
            t.events[event.id] = (event, raw)
            return STORED
        address = (event.pubkey, event.kind, d)
        head_id = t.heads.get(address)
        if head_id is not None:
            head = t.events[head_id][0]
            if not beats(event.created_at, event.id, head.created_at, head.id):
                return self._lost(event, t, d)
            del t.events[head_id]
        t.heads[address] = event.id
        t.events[event.id] = (event, raw)
        return STORED

    @staticmethod
    def _lost(event: Event, t: _Tenant, d: str | None) -> SaveResult:
        """Why a version of an address was not kept: deleted, the stored head itself, or
        beaten by it (engram.replace says which way)."""
        if _blocked(event, t, d):
            return BLOCKED
        head_id = t.heads.get((event.pubkey, event.kind, d or ""))
        if head_id == event.id:
            return DUPLICATE
        head = None if head_id is None else t.events[head_id][0]
        return stale_result(event.created_at, None if head is None else head.created_at)

    # --- EventReads ---------------------------------------------------------------------

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        visible = self._visible(tenant, viewer, private)
        chosen: dict[str, tuple[Event, bytes]] = {}
        for f in filters:
            hits = [x for x in visible if self._matches(f, x[0])]
            chosen.update((x[0].id, x) for x in hits[: f.limit])
        return [raw for _e, raw in sorted(chosen.values(), key=_newest_first)]

    def cached(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes] | None:
        return None  # the reference answers every read through `query`

    async def count(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> int:
        visible = self._visible(tenant, viewer, private)
        return sum(1 for e, _raw in visible if any(self._matches(f, e) for f in filters))

    async def negentropy_items(
        self,
        f: Filter,
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        limit: int = 500_001,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> tuple[list[int], bytes]:
        visible = self._visible(tenant, viewer, private)
        hits = [e for e, _raw in visible if e.created_at >= 0 and self._matches(f, e)]
        hits.sort(key=lambda e: (e.created_at, e.id))
        hits = hits[:limit]
        return [e.created_at for e in hits], b"".join(bytes.fromhex(e.id) for e in hits)

    def _visible(
        self, tenant: str, viewer: str | None, private: frozenset[int]
    ) -> list[tuple[Event, bytes]]:
        """The tenant's events this viewer may read, not expired, newest first."""
        t = self._tenants.get(tenant)
        if t is None:
            return []
        now = int(self._clock())
        out = []
        for e, raw in t.events.values():
            expires = expiration_of(e.tags)
            if expires is not None and expires <= now:
                continue
            if e.kind in private and viewer not in parties(e.pubkey, e.tags):
                continue
            out.append((e, raw))
        out.sort(key=_newest_first)
        return out

    def _matches(self, f: Filter, e: Event) -> bool:
        """`relay.filters.matches`; a search never finds what the store keeps unsearched
        (memory kinds, kinds outside `search_kinds`)."""
        if f.search is not None and (
            e.kind in MEMORY_KINDS
            or (self._search_kinds is not None and e.kind not in self._search_kinds)
        ):
            return False
        return matches(f, e)

    async def close(self) -> None:
        """Answer what is queued, then refuse writes."""
        self._closed = True
        if self._batch:
            self._commit()


def _newest_first(x: tuple[Event, bytes]) -> tuple[int, str]:
    return -x[0].created_at, x[0].id


def _blocked(event: Event, t: _Tenant, d: str | None) -> bool:
    """Deleted by its author (NIP-09: the id, or the address up to the request's time),
    or covered by its author's request to vanish, or a gift wrap to someone who vanished
    (NIP-62); requests to vanish are never blocked."""
    if (event.id, event.pubkey) in t.deleted_ids:
        return True
    if d is not None:
        until = t.deleted_addresses.get((event.pubkey, event.kind, d))
        if until is not None and event.created_at <= until:
            return True
    if event.kind == KIND_VANISH:
        return False
    until = t.vanished.get(event.pubkey)
    if until is not None and event.created_at <= until:
        return True
    return event.kind == KIND_GIFT_WRAP and any(
        len(tag) >= 2
        and tag[0] == "p"
        and tag[1] in t.vanished
        and event.created_at <= t.vanished[tag[1]]
        for tag in event.tags
    )


def _delete(request: Event, t: _Tenant) -> None:
    """NIP-09: remember the targets, delete the author's own events they name (never a
    deletion request or a request to vanish)."""
    ids, addresses = deletion_targets(request)
    author = request.pubkey
    for raw_id in ids:
        target = raw_id.hex()
        t.deleted_ids.add((target, author))
        found = t.events.get(target)
        if (
            found
            and found[0].pubkey == author
            and found[0].kind not in (KIND_DELETION, KIND_VANISH)
        ):
            _drop(t, found[0])
    for kind, d in addresses:
        address = (author, kind, d)
        t.deleted_addresses[address] = max(
            t.deleted_addresses.get(address, request.created_at), request.created_at
        )
        head_id = t.heads.get(address)
        if head_id is not None and t.events[head_id][0].created_at <= request.created_at:
            _drop(t, t.events[head_id][0])


def _vanish(request: Event, t: _Tenant) -> None:
    """NIP-62: remember the request (the latest counts), delete the author's events up to
    it (never a request to vanish) and the gift wraps p-tagging the author."""
    author, until = request.pubkey, request.created_at
    t.vanished[author] = max(t.vanished.get(author, until), until)
    until = t.vanished[author]
    for e, _raw in list(t.events.values()):
        if e.created_at > until:
            continue
        own = e.pubkey == author and e.kind != KIND_VANISH
        wrap = e.kind == KIND_GIFT_WRAP and any(
            len(tag) >= 2 and tag[0] == "p" and tag[1] == author for tag in e.tags
        )
        if own or wrap:
            _drop(t, e)


def _drop(t: _Tenant, e: Event) -> None:
    del t.events[e.id]
    d = address_d(e.kind, e.tags)
    if d is not None and t.heads.get((e.pubkey, e.kind, d)) == e.id:
        del t.heads[(e.pubkey, e.kind, d)]
