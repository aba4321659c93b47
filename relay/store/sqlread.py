"""The read planner: Filter -> one parameterized SELECT per REQ.

Pure (no I/O, no asyncpg): relay.store.pgreader runs what this builds, on the read slots
(relay.store.readbatch) or a replica. `Params` and its `conditions` (a filter as WHERE
terms, the private read gate included) are shared with the COUNT and NIP-77 builders
(relay.store.sqlcount). SQL is only ever built from fixed fragments; every value travels
as a `$n` parameter. Tag values are encoded by relay.store.tagindex, as they were stored.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from engram.nip01 import is_hex
from relay.config import DEFAULT_PRIVATE, KIND_ENGRAM
from relay.filters import Filter
from relay.store.tagindex import index_value, tag_key

_INT4_MAX = 2**31 - 1

SELECT_COLUMNS = "raw, created_at, id"
_ORDER = "ORDER BY created_at DESC, id"

# NIP-50: the words of a row's searchable content. `words` holds them for every row stored
# since migration 0012 (the parse is done once, at insert); older rows are parsed when
# tested. The partial index events_words is built on this very expression.
SEARCH_WORDS = "coalesce(words, to_tsvector('simple', content))"


class Params:
    """Positional parameters; $1 is the tenant. The viewer is added on first use only,
    since Postgres rejects a statement that is sent a parameter it never references.
    `private`: the kinds the read gate serves only to their parties (the tenant's)."""

    def __init__(
        self,
        tenant: str,
        viewer: str | None,
        now: int | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> None:
        self.values: list[Any] = [tenant]
        self.now = now
        self.private = private
        self.viewer = bytes.fromhex(viewer) if viewer is not None and is_hex(viewer, 64) else None
        self._viewer_pos = 0  # 1-based position once added

    def add(self, value: Any) -> str:
        self.values.append(value)
        return f"${len(self.values)}"

    def viewer_ref(self) -> str | None:
        if self.viewer is None:
            return None
        if not self._viewer_pos:
            self.add(self.viewer)
            self._viewer_pos = len(self.values)
        return f"${self._viewer_pos}::bytea"

    def conditions(
        self, f: Filter, author_ref: str | None = None, bounded: bool = False
    ) -> list[str] | None:
        """_conditions, leaving no unreferenced parameter behind when it returns None."""
        mark = len(self.values)
        conds = _conditions(f, self, author_ref, bounded or f.ids is not None)
        if conds is None:
            del self.values[mark:]
            if self._viewer_pos > mark:
                self._viewer_pos = 0
        return conds


def eq(column: str, ref: str, cast: str, n: int) -> str:
    """`column = $n` for one value, else `column = ANY($n)` (the parameter holds a list).

    One value must be a plain equality: an index scan under `= ANY(...)` does not return
    rows in index order, so `ORDER BY created_at DESC ... LIMIT n` would read and sort
    every row of the author; and PostgreSQL costs the generic plan of the ANY form so
    far above the custom one that it re-plans on every execution (measured: 160 vs 75
    us of PostgreSQL CPU per `authors` REQ)."""
    if n == 1:
        return f"{column} = {ref}::{cast}"
    return f"{column} = ANY({ref}::{cast}[])"


def kinds_of(f: Filter) -> list[int] | None:
    """The distinct kinds a filter names that a stored row can have (int4), in order;
    None when it names none (an empty list: it names only kinds nothing can have)."""
    if f.kinds is None:
        return None
    return [k for k in dict.fromkeys(f.kinds) if 0 <= k <= _INT4_MAX]


def kind_in(column: str, kinds: Iterable[int], negate: bool = False) -> str:
    """`column` (not) among `kinds` given as literals: the tenant's private kinds are
    integers from its configuration, never client input, and a statement keeps scalar
    parameters only (readbatch needs that) and plans on the constants."""
    listed = sorted(kinds)
    text = ", ".join(str(int(k)) for k in listed)
    if len(listed) == 1:
        return f"{column} {'<>' if negate else '='} {text}"
    return f"{column} {'NOT IN' if negate else 'IN'} ({text})"


def one_or_all(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values


def tag_match(column: str, ref: str, n: int) -> str:
    """`column` (an event_tags `tag`) is the hash of the tag key in parameter `ref`, or of
    one of the `n` keys it holds as an array: the one spelling of the tag index's match,
    for REQ, COUNT and the NIP-77 set (relay.store.tagindex encodes the keys)."""
    if n == 1:
        return f"{column} = tag_hash({ref}::text)"
    return f"{column} = ANY(ARRAY(SELECT tag_hash(k) FROM unnest({ref}::text[]) k))"


def span_refs(f: Filter, p: Params) -> tuple[str | None, str | None]:
    """The parameters of a filter's `since` and `until` (added in that order), or None."""
    since = None if f.since is None else p.add(f.since)
    until = None if f.until is None else p.add(f.until)
    return since, until


def span(column: str, refs: tuple[str | None, str | None]) -> list[str]:
    """NIP-01's time span on `column` (inclusive at both ends), from `span_refs`: one
    spelling for events and event_tags, so a row and its index entries agree."""
    since, until = refs
    terms = [] if since is None else [f"{column} >= {since}::int8"]
    if until is not None:
        terms.append(f"{column} <= {until}::int8")
    return terms


def _tag_ids(ref: str, n: int) -> str:
    """Ids of the tenant's events carrying the tag key(s) in parameter `ref`, by hash."""
    return f"SELECT x.id FROM event_tags x WHERE x.tenant = $1 AND {tag_match('x.tag', ref, n)}"


def _conditions(
    f: Filter, p: Params, author_ref: str | None = None, bounded: bool = False
) -> list[str] | None:
    """WHERE terms for one filter (without tenant), or None if it can match nothing.

    `bounded`: something else (ids, or a driving scan of event_tags) already limits the
    rows read, so tag terms only recheck the row's own `tagvals`."""
    if f.since is not None and f.until is not None and f.since > f.until:
        return None
    conds: list[str] = []
    if f.ids is not None:
        ids = [bytes.fromhex(i) for i in dict.fromkeys(f.ids) if is_hex(i, 64)]
        if not ids:
            return None
        conds.append(eq("id", p.add(one_or_all(ids)), "bytea", len(ids)))
    if f.authors is not None:
        authors = [bytes.fromhex(a) for a in dict.fromkeys(f.authors) if is_hex(a, 64)]
        if not authors:
            return None
        if author_ref is not None:  # one author per scan (see _per_author, build_query)
            conds.append(f"pubkey = {author_ref}")
        else:
            conds.append(eq("pubkey", p.add(one_or_all(authors)), "bytea", len(authors)))
    kinds = kinds_of(f)
    if kinds is not None:
        if not kinds:
            return None
        conds.append(eq("kind", p.add(one_or_all(kinds)), "int4", len(kinds)))
    engram_only = kinds is not None and set(kinds) == {KIND_ENGRAM}
    for name, values in f.tags.items():
        if len(name) != 1:
            raise ValueError(f"tag filter names are single characters, got {name!r}")
        if not values:
            return None
        if name == "d" and engram_only:
            # A stored engram has exactly one `d` tag (encode_row refuses others), so
            # `#d` is its `d` column: the CLI's head fetch becomes one probe of the
            # address index instead of a scan of every engram of the author.
            ds = list(dict.fromkeys(index_value(v) for v in values))
            conds.append(eq("d", p.add(one_or_all(ds)), "text", len(ds)))
            continue
        keys = list(dict.fromkeys(tag_key(name, v) for v in values))
        if len(keys) == 1:  # a scalar parameter: the statement can be batched (readbatch)
            ref = p.add(keys[0])
            conds.append(f"tagvals && ARRAY[{ref}::text]")
        else:
            ref = p.add(keys)
            conds.append(f"tagvals && {ref}::text[]")
        if not bounded:
            # nothing else bounds the rows read: find them through event_tags (one index
            # range per value); the `tagvals` term above rechecks the hash's finds
            conds.append(f"id IN ({_tag_ids(ref, len(keys))})")
    conds.extend(span("created_at", span_refs(f, p)))
    if f.search is not None:
        # NIP-50; the expression and predicate match the partial index events_words
        conds.append(
            f"kind <> {KIND_ENGRAM} AND {SEARCH_WORDS}"
            f" @@ websearch_to_tsquery('simple', {p.add(f.search)}::text)"
        )
    if p.now is not None:  # NIP-40: expired events are never served
        conds.append(f"(expires_at IS NULL OR expires_at > {p.add(p.now)}::int8)")
    # The private read gate (engrams and the tenant's private kinds: their author or
    # recipient only, relay.policy), in SQL so LIMIT counts right; the kinds as literals
    # (_kind_in).
    private = p.private if kinds is None else p.private.intersection(kinds)
    if private:
        public = kind_in("kind", private, negate=True)
        v = p.viewer_ref()
        conds.append(public if v is None else f"({public} OR pubkey = {v} OR owner = {v})")
    return conds


def _one_address(f: Filter) -> bool:
    """The engram head fetch: one kind-30174 address (author, `d`), at most one row."""
    return (
        f.ids is None
        and f.kinds is not None
        and set(f.kinds) == {KIND_ENGRAM}
        and f.authors is not None
        and len(set(f.authors)) == 1
        and len(set(f.tags.get("d") or ())) == 1
    )


# Several authors: up to this many are read as merged per-author index scans, more
# through one LATERAL probe per author (see build_query); and at most MERGE_BRANCHES_MAX
# such scans in one REQ, whatever its filters: each is planned on its own (16 filters of
# 32 authors cost PostgreSQL 30 ms of planning), the LATERAL form once for any count.
MERGE_AUTHORS_MAX = 32
MERGE_BRANCHES_MAX = 64
_AUTHOR = "{author}"  # stands for the author of one per-author scan while building


def _driving_tag(f: Filter) -> str | None:
    """The tag name whose event_tags ranges drive a limited filter's scan, else None.

    Ids bound the scan by themselves; an engram `#d` is its address column (see
    _conditions). Otherwise the first tag name drives: each of its values is one range
    of event_tags_time read newest-first, so the scan reads about `limit` entries per
    value (plus the rows the other conditions turn down), and an absent value costs one
    probe, whatever the planner's statistics say about the value."""
    if f.ids is not None or f.limit is None:
        return None
    engram_only = f.kinds is not None and set(f.kinds) == {KIND_ENGRAM}
    if f.tags.get("d") and not engram_only:
        # a `d` names addresses: a few events each, where another tag of the same filter
        # (an engram's owner `p`) can stand on every event of an author; driven by `p`,
        # one slug's paged history read ran into the 10 s query timeout at 10,000 engrams
        return "d"
    for name, values in f.tags.items():
        if values and not (name == "d" and engram_only):
            return name
    return None


def _tag_driven(f: Filter, name: str, p: Params, scan_max: int) -> str | None:
    """The SELECT of a filter driven by tag `name` (see _driving_tag), or None.

    One newest-first range per value, each cut at `scan_max` entries (the rows a REQ may
    read however selective its other conditions are) and at `limit` matches, merged and
    deduplicated (an event may carry several of the values). Several values travel as
    ONE array parameter, each range read in a LATERAL subquery over its `unnest`: the
    statement has one shape whatever the count, so planning it costs the same for 2
    values as for 256 (a UNION ALL branch per value cost PostgreSQL ~2.5 ms of planning
    per 16 values, 0.8 s for a REQ of 16 filters x 256 values, issue 37)."""
    conds = p.conditions(f, bounded=True)
    if conds is None:
        return None
    where = " AND ".join(["tenant = $1", "id = x.id", *conds])
    within = "".join(f" AND {t}" for t in span("created_at", span_refs(f, p)))
    limit = p.add(f.limit)
    cap = p.add(scan_max)
    # the kind is in each entry (0026): entries of other kinds are dropped before their
    # event row is read, still among the first `scan_max` entries (the bound stays rows
    # of the index read)
    of_kinds = ""
    kinds = kinds_of(f)
    if kinds:  # never empty here: p.conditions returned None for that
        of_kinds = " WHERE " + eq("y.kind", p.add(one_or_all(kinds)), "int4", len(kinds))
    keys = list(dict.fromkeys(tag_key(name, v) for v in f.tags[name]))
    # one value: a scalar parameter (readbatch batches the statement); several: the array
    tag = tag_match("tag", p.add(keys[0]), 1) if len(keys) == 1 else "tag = tag_hash(k.key)"
    branch = (
        f"SELECT e.raw, e.created_at, e.id FROM (SELECT created_at, id FROM (SELECT"
        f" created_at, id, kind FROM event_tags"
        f" WHERE tenant = $1 AND {tag}{within}"
        f" ORDER BY created_at DESC, id LIMIT {cap}::int8) y{of_kinds}) x"
        f" CROSS JOIN LATERAL (SELECT {SELECT_COLUMNS} FROM events WHERE {where}) e"
        f" ORDER BY x.created_at DESC, x.id LIMIT {limit}::int8"
    )
    if len(keys) == 1:
        return branch
    return (
        f"SELECT DISTINCT ON (created_at, id) {SELECT_COLUMNS} FROM"
        f" unnest({p.add(keys)}::text[]) AS k(key) CROSS JOIN LATERAL ({branch}) u"
        f" {_ORDER} LIMIT {limit}::int8"
    )


def _search_walk_first(f: Filter, p: Params, walk: int, window: int) -> str | None:
    """The SELECT of a limited search with no ids, authors or tags, or None.

    Which plan is cheap depends on how common the words are, and the statistics can make
    any word look common (one word on every row pulls every estimate up), so the data
    decides: first the newest `walk` rows (of the filter's kinds and time span) are
    tested against their stored words; a word that fills `limit` there is common, and
    that is the answer. Only if it does not, the word's posting list in the GIN index is
    read (search_newest, migration 0027: within the newest `window` rows first, then, if
    they hold fewer than `limit` matches, all of it; search_matches, 0014, keeps the
    newest `limit` the reader may see) and those rows are served: a rare or absent word
    costs its matches, a mid-frequency one the window, never a walk of the table."""
    search = f.search
    conds = p.conditions(msgspec.structs.replace(f, search=None), bounded=True)
    if conds is None or search is None:
        return None
    where = " AND ".join(["tenant = $1", *conds])
    q_ref = p.add(search)
    words = f"{SEARCH_WORDS} @@ websearch_to_tsquery('simple', {q_ref}::text)"
    limit = p.add(f.limit)
    kinds = kinds_of(f) or None
    found = (
        f"SELECT search_newest($1, {q_ref}::text, {p.add(kinds)}::int4[],"
        f" {p.add(f.since)}::int8, {p.add(f.until)}::int8, {p.add(sorted(p.private))}::int4[],"
        f" {p.add(p.viewer)}::bytea, {p.add(p.now)}::int8, {limit}::int4,"
        f" {p.add(window)}::int4)"
    )
    return (
        f"WITH w AS MATERIALIZED (SELECT {SELECT_COLUMNS} FROM (SELECT {SELECT_COLUMNS},"
        f" kind, words, content FROM events WHERE {where} {_ORDER} LIMIT {p.add(walk)}::int8) s"
        f" WHERE kind <> {KIND_ENGRAM} AND {words} {_ORDER} LIMIT {limit}::int8)"
        f" SELECT {SELECT_COLUMNS} FROM w WHERE (SELECT count(*) FROM w) >= {limit}::int8"
        f" UNION ALL (SELECT {SELECT_COLUMNS} FROM events WHERE (SELECT count(*) FROM w)"
        f" < {limit}::int8 AND {where} AND id = ANY(ARRAY({found}))"
        f" AND kind <> {KIND_ENGRAM} AND {words} {_ORDER} LIMIT {limit}::int8)"
    )


def _per_author(f: Filter) -> list[bytes] | None:
    """The distinct authors of a limited filter naming several (and no ids), else None."""
    if f.authors is None or f.ids is not None or f.limit is None or len(f.authors) < 2:
        return None
    authors = [bytes.fromhex(a) for a in dict.fromkeys(f.authors) if is_hex(a, 64)]
    return authors if len(authors) > 1 else None


# Rows a REQ may read (per tag value, or per searched word's matches) however selective
# its other conditions are; and the newest rows a search tests before it asks the index.
SCAN_MAX = 50_000
SEARCH_WALK = 1_000
SEARCH_WINDOW = 20_000


# The columns of an author's prefix (relay.store.readcache.Row): what the cache applies
# NIP-40 and the private read gate with.
PREFIX_COLUMNS = "raw, created_at, id, kind, owner, expires_at"


def build_prefix(
    tenant: str, author: bytes, kinds: tuple[int, ...] | None, n: int, now: int
) -> tuple[str, list[Any]]:
    """The newest `n` events of one author (of `kinds`, or every kind) not expired at
    `now`, private kinds included, in the store's order: what relay.store.readcache
    keeps, and answers REQs from under the same rules as `_conditions`. Scalar
    parameters for one kind or none, so concurrent fills run as one statement."""
    p = Params(tenant, None, now, frozenset())
    f = Filter(authors=[author.hex()], kinds=None if kinds is None else list(kinds))
    conds = p.conditions(f)
    if conds is None:
        raise ValueError("a prefix names an author and kinds a row can have")
    where = " AND ".join(["tenant = $1", *conds])
    limit = p.add(n)
    return (
        f"SELECT {PREFIX_COLUMNS} FROM events WHERE {where} {_ORDER} LIMIT {limit}::int8",
        p.values,
    )


def build_query(
    filters: list[Filter],
    tenant: str,
    viewer: str | None = None,
    now: int | None = None,
    private: frozenset[int] = DEFAULT_PRIVATE,
    scan_max: int = SCAN_MAX,
    search_walk: int = SEARCH_WALK,
    search_window: int = SEARCH_WINDOW,
) -> tuple[str, list[Any]] | None:
    """SELECT raw, created_at, id for the filters, or None if none can match.

    One sub-select per filter, each `ORDER BY created_at DESC, id LIMIT n` on its own
    (NIP-01: limit applies per filter), joined with UNION ALL: one round trip. Rows of
    different filters may repeat and are not globally ordered; the caller merges.
    Values travel as array parameters, so the statement's size, and PostgreSQL's cost of
    planning it, do not grow with their count (the per-author merge is bounded per REQ).
    """
    p = Params(tenant, viewer, now, private)
    parts: list[str] = []
    merge_budget = MERGE_BRANCHES_MAX
    for f in filters:
        if f.limit == 0:
            continue
        name = None if _one_address(f) else _driving_tag(f)
        if name is not None:
            select = _tag_driven(f, name, p, scan_max)
            if select is not None:
                parts.append(select)
            continue
        if f.search is not None and f.limit is not None and f.ids is None and not f.authors:
            select = _search_walk_first(f, p, search_walk, search_window)
            if select is not None:
                parts.append(select)
            continue
        authors = _per_author(f)
        # one address is at most one row of the address index: its tag terms (the head
        # fetch's `#p`) only recheck that row, never read event_tags (a plan that hashed
        # every entry of the agent's key cost 8 ms a fetch at 20,000 engrams)
        conds = p.conditions(f, None if authors is None else _AUTHOR, bounded=_one_address(f))
        if conds is None:
            continue
        where = " AND ".join(["tenant = $1", *conds])
        if _one_address(f):
            # At most one row (the unique address index): no ORDER BY or LIMIT, which
            # would let the planner prefer an ordered scan of every engram of the author
            # (it did, as a generic plan on a store without statistics: 550 us a fetch).
            parts.append(f"SELECT {SELECT_COLUMNS} FROM events WHERE {where}")
            continue
        limit = "" if f.limit is None else f" LIMIT {p.add(f.limit)}::int8"
        select = f"SELECT {SELECT_COLUMNS} FROM events WHERE {where} {_ORDER}{limit}"
        if authors is not None and len(authors) <= min(MERGE_AUTHORS_MAX, merge_budget):
            merge_budget -= len(authors)
            # One newest-first index scan per author, merged (Merge Append) and cut at
            # `limit`: about limit + authors rows are read, however long the histories
            # (bench scale, 20 authors at 1M events: 0.6 ms of PostgreSQL CPU, against
            # 2 ms for LATERAL below, which reads limit rows of every author).
            subs = [select.replace(_AUTHOR, f"{p.add(a)}::bytea") for a in authors]
            select = (
                f"SELECT {SELECT_COLUMNS} FROM ({' UNION ALL '.join(f'({x})' for x in subs)})"
                f" u {_ORDER}{limit}"
            )
        elif authors is not None:
            # Many authors (one statement text per count above would not pay): newest
            # `limit` of each author (one ordered index probe each), then the newest
            # `limit` of those, bounded by authors x limit, not by the histories.
            select = (
                f"SELECT {SELECT_COLUMNS} FROM unnest({p.add(authors)}::bytea[]) AS a(pk)"
                f" CROSS JOIN LATERAL ({select.replace(_AUTHOR, 'a.pk')}) e {_ORDER}{limit}"
            )
        parts.append(select)
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0], p.values
    return " UNION ALL ".join(f"({s})" for s in parts), p.values
