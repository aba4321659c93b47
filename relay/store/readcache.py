"""An author's newest events in memory: the REQ `{"authors":[k], "limit":n}` without a
round trip to PostgreSQL.

What is kept: per (tenant, author, kinds named), a prefix of the author's history, newest
first in the store's order (created_at DESC, id), as PostgreSQL returned it
(relay.store.sqlread.build_prefix): each row's raw JSON with the columns the read rules
need (created_at, id, kind, owner, expires_at). It holds every kind the key names, private
ones included; the rules are applied to it at every answer, exactly as the statement
would (relay.store.sqlread._conditions): NIP-40 against the clock of the REQ, and the
private read gate (the tenant's private kinds only to their author or recipient) against
the REQ's viewer. A prefix answers a filter when it holds `limit` rows the viewer may
read, or the whole history (fewer rows than it asked for); otherwise the store answers.

Kept consistent with every change the node can see, before that change is acknowledged
or sent live (the promise a read replica gives, relay.store.replicas):
- this node's writes: a regular event the writer stored goes into its author's
  prefixes where it falls in the store's order (`stored`: the author's next REQ is
  still answered here); any other event of a committed batch (a replacement, a NIP-09
  deletion: the author's own events; one not stored) forgets its author, and a NIP-62
  request to vanish the whole tenant (it also deletes gift wraps other keys wrote to
  the author);
- other nodes' writes: the bus forgets the same for every row it reads, before it hands
  them on; the cache is used only while the bus is current (a tail read not held back by
  a running transaction within the last two polls), never by a store without one;
- deletions no event carries (NIP-86 bans, a ban swept after a reload, any admin action):
  the whole cache is forgotten after every administrative action;
- what nothing announces (rows pruned by retention or `engram prune`): a prefix is
  read again within `read_cache_seconds` (after half to all of it, spread over the
  authors; one that answers past half of its time is read again in the background,
  so a hot author is not a miss for its age).
A fill that a change overtakes (the change is seen while the fill's statement runs) is
dropped, not installed. Bounded by `read_cache_bytes` over all tenants, least recently
used authors first.

Pure: no I/O, no clock (the caller passes the times); relay.store.pgreader runs the fills.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Iterable
from typing import Any

from engram.kinds import KIND_DELETION, is_regular
from engram.nip01 import is_hex
from engram.nip62 import KIND_VANISH
from relay.filters import Filter
from relay.store.sqlread import kinds_of

# (raw, created_at, id, kind, owner, expires_at): build_prefix's columns, in its order
Row = tuple[bytes, int, bytes, int, bytes | None, int | None]
KindsKey = tuple[int, ...] | None  # the kinds a prefix holds (sorted), None: every kind

# The most rows one prefix holds (a larger `limit` reads the store, unless the prefix is
# the author's whole history), and the most authors one filter may name to be answered
# here (each is a prefix, and a fill each when missing).
PREFIX_ROWS_MAX = 500
AUTHORS_MAX = 8
# Bytes counted per row on top of its raw JSON: the tuple, its ints, id and owner.
ROW_OVERHEAD = 240


class Prefix:
    """The newest `asked` rows of one author (of the key's kinds) when it was filled."""

    __slots__ = (
        "asked",
        "complete",
        "expires",
        "generation",
        "kinds",
        "raws",
        "refresh",
        "rows",
        "size",
        "until",
    )

    def __init__(
        self, rows: list[Row], asked: int, refresh: float, until: float, generation: int
    ) -> None:
        self.generation = generation  # of its tenant (ReadCache.forget_tenant)
        self.refresh = refresh  # read again in the background after this (ReadCache.due)
        self.rows = rows
        self.raws = [r[0] for r in rows]
        self.asked = asked
        self.complete = len(rows) < asked  # the whole history (of these kinds)
        self.until = until  # read again after this (ReadCache.put)
        self.size = sum(len(r) for r in self.raws) + ROW_OVERHEAD * (len(rows) + 1)
        # what the rules look at, over all rows: when the first of them expires, and
        # which kinds they are (none private to the viewer: every row is shown)
        self.expires = min((r[5] for r in rows if r[5] is not None), default=None)
        self.kinds = frozenset(r[3] for r in rows)

    def all_shown(self, now: int, private: frozenset[int], party: bool) -> bool:
        """Every row may be served to this viewer now (no NIP-40 expiry has passed, no
        private kind but to its party)."""
        return (self.expires is None or self.expires > now) and (
            party or self.kinds.isdisjoint(private)
        )


class Fill:
    """One fill in flight: installed by `ReadCache.put` only if nothing about its author
    changed meanwhile (`stale`) and its tenant was not forgotten (`generation`)."""

    __slots__ = ("author", "generation", "kinds", "n", "stale", "tenant")

    def __init__(
        self, tenant: str, author: bytes, kinds: KindsKey, n: int, generation: int
    ) -> None:
        self.tenant, self.author, self.kinds, self.n = tenant, author, kinds, n
        self.generation = generation
        self.stale = False


class Need(tuple[bytes, KindsKey, int]):
    """A prefix to (re)fill before a filter can be answered: (author, kinds, rows)."""

    __slots__ = ()


class Needs(list[Need]):
    """The prefixes to fill before `ReadCache.answer` can answer."""

    __slots__ = ()


class Plan:
    """What one cacheable filter needs: its distinct authors and kinds key."""

    __slots__ = ("authors", "kinds", "limit")

    def __init__(self, authors: list[bytes], kinds: KindsKey, limit: int) -> None:
        self.authors, self.kinds, self.limit = authors, kinds, limit


def plan(f: Filter) -> Plan | None:
    """The filter as prefixes to read, or None if the cache cannot answer its shape:
    authors (1 to AUTHORS_MAX) and a limit (1 to PREFIX_ROWS_MAX), optionally kinds,
    since and until; never ids, tags or search."""
    if (
        f.authors is None
        or f.ids is not None
        or f.tags
        or f.search is not None
        or f.limit is None
        or not 0 < f.limit <= PREFIX_ROWS_MAX
    ):
        return None
    if len(f.authors) == 1:  # the commonest
        authors = [bytes.fromhex(f.authors[0])] if is_hex(f.authors[0], 64) else []
    else:
        authors = [bytes.fromhex(a) for a in dict.fromkeys(f.authors) if is_hex(a, 64)]
    if not authors or len(authors) > AUTHORS_MAX:
        return None
    kinds = kinds_of(f)
    if kinds is not None and not kinds:
        return None  # matches nothing: the planner says so
    return Plan(authors, None if kinds is None else tuple(sorted(kinds)), f.limit)


def plan_all(filters: list[Filter]) -> list[Plan] | None:
    """Each filter's plan, or None if one of them cannot be answered here."""
    plans = []
    for f in filters:
        p = plan(f)
        if p is None:
            return None
        plans.append(p)
    return plans


def _newest_first(row: Row) -> tuple[int, bytes]:
    """The store's order: created_at DESC, then the id's bytes."""
    return -row[1], row[2]


class ReadCache:
    """Prefixes of authors' histories, least recently used first (see the module)."""

    def __init__(self, budget_bytes: int, max_age: float) -> None:
        self.budget = budget_bytes
        self.max_age = max_age
        self.size = 0
        self._authors: OrderedDict[tuple[str, bytes], dict[KindsKey, Prefix]] = OrderedDict()
        self._fills: dict[tuple[str, bytes], list[Fill]] = {}
        self._generations: dict[str, int] = {}  # per tenant: forget_tenant's count
        # prefixes past their `refresh` that answered since the caller last looked: the
        # caller reads them again in the background (relay.store.pgreader), so a hot
        # author is never a miss for its age
        self.due: list[tuple[str, Need, Prefix]] = []
        self.hits = 0  # REQs answered here (tests and /metrics)
        self.fills = 0  # prefixes installed
        self.joined = 0  # stored events put into prefixes (`stored`; tests)

    def __len__(self) -> int:
        return len(self._authors)

    # --- answers ----------------------------------------------------------------------

    def answer(
        self,
        plans: list[Plan],
        filters: list[Filter],
        tenant: str,
        viewer: bytes | None,
        now: int,
        clock: float,
        private: frozenset[int],
    ) -> list[bytes] | Needs | None:
        """The raw events of the filters (each its plan), in the store's order; else the
        prefixes to fill first (Needs), or None when only the store can answer (a prefix
        too short for the rows the viewer may read)."""
        if len(plans) == 1 and len(plans[0].authors) == 1:
            return self._one_author(plans[0], filters[0], tenant, viewer, now, clock, private)
        per_filter: list[list[Row]] = []
        needs: dict[tuple[bytes, KindsKey], int] = {}  # the most rows each prefix needs
        for p, f in zip(plans, filters, strict=True):
            rows: list[Row] = []
            for author in p.authors:
                prefix = self._prefix(tenant, author, p, clock)
                got = (
                    prefix
                    if isinstance(prefix, Need)
                    else self._rows(prefix, author, p, f, viewer, now, private)
                )
                if got is None:
                    return None
                if isinstance(got, Need):
                    key = (author, p.kinds)
                    needs[key] = max(needs.get(key, 0), got[2])
                elif not needs:
                    rows.extend(got)
            if len(p.authors) > 1 and not needs:
                rows.sort(key=_newest_first)
                del rows[p.limit :]
            per_filter.append(rows)
        if needs:
            return Needs(Need((a, k, n)) for (a, k), n in needs.items())
        self.hits += 1
        if len(per_filter) == 1:
            return [r[0] for r in per_filter[0]]
        merged = {r[2]: r for rows in per_filter for r in rows}  # one event, several filters
        return [r[0] for r in sorted(merged.values(), key=_newest_first)]

    def _one_author(
        self,
        p: Plan,
        f: Filter,
        tenant: str,
        viewer: bytes | None,
        now: int,
        clock: float,
        private: frozenset[int],
    ) -> list[bytes] | Needs | None:
        """`answer` for the commonest REQ, one filter of one author: when every row of
        the prefix is shown and no time span is asked, its first `limit` as they are."""
        author = p.authors[0]
        prefix = self._prefix(tenant, author, p, clock)
        if isinstance(prefix, Need):
            return Needs((prefix,))
        if f.since is None and f.until is None and prefix.all_shown(now, private, viewer == author):
            raws = prefix.raws
            if len(raws) < p.limit and not prefix.complete:  # asked for fewer than this
                return Needs((Need((author, p.kinds, p.limit)),))
            self.hits += 1
            return raws[: p.limit]
        got = self._rows(prefix, author, p, f, viewer, now, private)
        if got is None or isinstance(got, Need):
            return None if got is None else Needs((got,))
        self.hits += 1
        return [r[0] for r in got]

    def _prefix(self, tenant: str, author: bytes, p: Plan, clock: float) -> Prefix | Need:
        """The author's prefix of the plan's kinds, or the fill it needs first."""
        entry = self._authors.get((tenant, author))
        prefix = None if entry is None else entry.get(p.kinds)
        if (
            prefix is None
            or clock > prefix.until
            or prefix.generation != self._generations.get(tenant, 0)
        ):
            return Need((author, p.kinds, p.limit))
        self._authors.move_to_end((tenant, author))
        if clock > prefix.refresh:  # still served; read again before it may not be
            prefix.refresh = math.inf  # once (`later` puts it back)
            self.due.append((tenant, Need((author, p.kinds, prefix.asked)), prefix))
        return prefix

    @staticmethod
    def later(prefix: Prefix) -> None:
        """A due prefix not read again now: handed on again by the next answer."""
        prefix.refresh = 0.0

    def _rows(
        self,
        prefix: Prefix,
        author: bytes,
        p: Plan,
        f: Filter,
        viewer: bytes | None,
        now: int,
        private: frozenset[int],
    ) -> list[Row] | Need | None:
        """One author's rows for the filter: at most `limit`, those the viewer may read."""
        party = viewer == author  # the author reads its own private kinds
        since, until, limit = f.since, f.until, p.limit
        out: list[Row] = []
        for row in prefix.rows:
            created_at = row[1]
            if since is not None and created_at < since:
                return out  # older rows are all before `since`
            if until is not None and created_at > until:
                continue
            expires_at = row[5]
            if expires_at is not None and expires_at <= now:
                continue  # NIP-40
            if row[3] in private and not party and (viewer is None or row[4] != viewer):
                continue  # the private read gate: author or recipient only
            out.append(row)
            if len(out) == limit:
                return out
        if prefix.complete:
            return out
        if prefix.asked < limit:
            return Need((author, p.kinds, limit))
        return None

    # --- fills ------------------------------------------------------------------------

    def begin(self, tenant: str, need: Need) -> Fill:
        """A fill about to read the store: `put` installs its rows unless a change to the
        author is seen before then."""
        author, kinds, n = need
        fill = Fill(tenant, author, kinds, n, self._generations.get(tenant, 0))
        self._fills.setdefault((tenant, author), []).append(fill)
        return fill

    def end(self, fill: Fill) -> None:
        """The fill is over (installed or failed): no longer in flight."""
        key = (fill.tenant, fill.author)
        fills = self._fills.get(key)
        if fills is not None:
            if fill in fills:
                fills.remove(fill)
            if not fills:
                del self._fills[key]

    def put(self, fill: Fill, rows: Iterable[Any], clock: float) -> None:
        """Install the rows a fill read (build_prefix's columns), unless it is stale."""
        self.end(fill)
        generation = self._generations.get(fill.tenant, 0)
        if fill.stale or fill.generation != generation or self.budget <= 0:
            return
        # served for between half and all of max_age, spread over the authors (by their
        # key's first byte), so the prefixes filled together are not all read again in
        # the same moment; read again in the background after half of that
        span = self.max_age * (0.5 + fill.author[0] / 510)
        rows_ = [tuple(r) for r in rows]
        prefix = Prefix(rows_, fill.n, clock + span / 2, clock + span, generation)  # type: ignore[arg-type]
        if prefix.size > self.budget // 4:
            return  # one author may not take the cache
        key = (fill.tenant, fill.author)
        entry = self._authors.get(key)
        if entry is None:
            entry = self._authors[key] = {}
        else:
            self._authors.move_to_end(key)
            old = entry.get(fill.kinds)
            if old is not None:
                self.size -= old.size
        entry[fill.kinds] = prefix
        self.size += prefix.size
        self.fills += 1
        self._evict()

    def _evict(self) -> None:
        """The least recently used authors go until the cache fits its budget."""
        while self.size > self.budget and self._authors:
            _, evicted = self._authors.popitem(last=False)
            self.size -= sum(x.size for x in evicted.values())

    # --- changes ----------------------------------------------------------------------

    def changed(self, tenant: str, author: bytes, kind: int) -> None:
        """An event of `author` was stored (or a row of it seen on the bus): forget what
        it may have changed, before it is acknowledged or sent live."""
        if kind == KIND_VANISH:  # also deletes gift wraps of other authors to this one
            self.forget_tenant(tenant)
            return
        key = (tenant, author)
        entry = self._authors.pop(key, None)
        if entry is not None:
            self.size -= sum(x.size for x in entry.values())
        self._overtake(key)

    def _overtake(self, key: tuple[str, bytes]) -> None:
        """The author's fills in flight are not installed: their statement may have run
        before the change."""
        fills = self._fills.get(key)
        if fills is not None:
            for fill in fills:
                fill.stale = True

    def stored(self, tenant: str, author: bytes, row: Row) -> None:
        """This node stored an event of `author` (`row`: build_prefix's columns), before
        it is acknowledged or sent live. A regular kind other than a deletion changes no
        other row: it goes into each of the author's prefixes whose kinds hold it, where
        it falls in the store's order (a prefix of `asked` rows keeps its newest `asked`;
        one it is older than every row of is left as it is). Anything else is `changed`.
        Fills of the author in flight are dropped either way: their statement may have
        run before the commit."""
        kind = row[3]
        if kind in (KIND_DELETION, KIND_VANISH) or not is_regular(kind):
            self.changed(tenant, author, kind)
            return
        key = (tenant, author)
        self._overtake(key)
        entry = self._authors.get(key)
        if entry is None:
            return
        order = _newest_first(row)
        for kinds, old in list(entry.items()):
            if kinds is not None and kind not in kinds:
                continue
            rows = old.rows
            if not old.complete and rows and _newest_first(rows[-1]) < order:
                continue  # older than its every row: not among the author's newest `asked`
            i = bisect_left(rows, order, key=_newest_first)
            new_rows = [*rows[:i], row, *rows[i:]]
            del new_rows[old.asked :]
            # a prefix being read again in the background (refresh at infinity) is due
            # again: that read, begun before the commit, was just dropped
            refresh = old.refresh if old.refresh != math.inf else 0.0
            new = Prefix(new_rows, old.asked, refresh, old.until, old.generation)
            self.size -= old.size
            if new.size > self.budget // 4:  # one author may not take the cache (`put`)
                del entry[kinds]
                continue
            entry[kinds] = new
            self.size += new.size
            self.joined += 1
        if not entry:
            del self._authors[key]
        self._evict()

    def forget_tenant(self, tenant: str) -> None:
        """Every prefix of the tenant, and its fills in flight, no longer count: at once,
        whatever their number (a request to vanish may come from anyone); the bytes they
        hold go as the least recently used."""
        self._generations[tenant] = self._generations.get(tenant, 0) + 1

    def clear(self) -> None:
        """Forget everything, the fills in flight too (after an administrative action)."""
        self._authors.clear()
        self.size = 0
        for fills in self._fills.values():
            for fill in fills:
                fill.stale = True
