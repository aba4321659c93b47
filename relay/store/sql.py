"""Pure storage encoding: event -> row columns, and Filter -> parameterized SQL.

No I/O and no asyncpg: everything here is unit-testable without a database. Both sides
of the tag index live in this one module on purpose, because the write side (`tagvals`,
`d`) and the read side (`#x` filters) must encode a value identically or queries miss.

SQL is only ever built from fixed fragments; every value travels as a `$n` parameter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import msgspec

from engram.nip01 import Event, is_hex
from engram.nip62 import KIND_GIFT_WRAP, KIND_VANISH
from engram.readers import recipient
from relay.config import DEFAULT_PRIVATE, KIND_ENGRAM, MEMORY_KINDS
from relay.filters import Filter
from relay.validate import expiration_of, is_addressable, is_ephemeral, is_replaceable

# A tag value longer than this (UTF-8 bytes) is indexed by its hash: a btree/GIN entry
# must fit in a third of a page (~2.7 KB), and another Postgres relay crashed on inserts
# of long tag values for exactly this reason.
INDEX_VALUE_MAX = 200
# Marks the hashed form. A genuine value starting with it is hashed too, so the two
# forms can never collide. NUL (which Postgres text rejects) also forces the hash.
_HASHED = "\x01"
_INT4_MAX = 2**31 - 1
_INT8 = 2**63

SELECT_COLUMNS = "raw, created_at, id"
_ORDER = "ORDER BY created_at DESC, id"

# NIP-50: the words of a row's searchable content. `words` holds them for every row stored
# since migration 0012 (the parse is done once, at insert); older rows are parsed when
# tested. The partial index events_words is built on this very expression.
SEARCH_WORDS = "coalesce(words, to_tsvector('simple', content))"

# `content` is stored empty and `sig` not at all since migration 0015: `raw` is what is
# served, and search reads `words`, parsed here from the content parameter (a copy of
# both in every row cost ~270 bytes an event on disk and in the WAL).
_COLUMNS = (
    "tenant, id, pubkey, created_at, kind, d, owner, tagvals, content, raw, expires_at,"
    " origin, words"
)
_UNNEST = (
    "SELECT t.tenant, t.id, t.pubkey, t.created_at, t.kind, t.d, t.owner, t.tagvals::text[],"
    " '', t.raw, t.expires_at, $12::text, to_tsvector('simple', t.content)"
    " FROM unnest($1::text[], $2::bytea[], $3::bytea[], $4::int8[], $5::int4[], $6::text[],"
    " $7::bytea[], $8::text[], $9::text[], $10::bytea[], $11::int8[])"
    " WITH ORDINALITY AS t(tenant, id, pubkey, created_at, kind, d, owner, tagvals, content,"
    " raw, expires_at, ord)"
)
# Rows are inserted (and locked) in the caller's order, sorted by key or address, even
# through the anti-joins below: concurrent batches then lock in one order and cannot
# deadlock each other.
_IN_ORDER = " ORDER BY t.ord"

# The live bus: a wake-up after committed batches (never the event: payloads cap at 8000
# bytes; its payload is the writer's origin, so a node is not woken by its own batches),
# then every node reads the rows of transactions that finished since it last read. Sent
# after the commit, never in the batch's own transaction (PostgresStore._wake_nodes).
BUS_CHANNEL = "engram_events"

# NIP-09: an event its author deleted never comes back (`a` deletions cover versions up
# to the request's created_at). Filtered inside the insert, so the common batch is one
# round trip; the caller tells BLOCKED from DUPLICATE only for rows that did not go in.
# NIP-62: after a request to vanish, nothing of the author up to its created_at comes
# back, nor a gift wrap p-tagging them; the requests themselves are never blocked.
_NOT_VANISHED = (
    " NOT EXISTS (SELECT 1 FROM vanished v WHERE v.tenant = t.tenant"
    f" AND v.pubkey = t.pubkey AND t.created_at <= v.until AND t.kind <> {KIND_VANISH})"
    f" AND (t.kind <> {KIND_GIFT_WRAP} OR NOT EXISTS (SELECT 1 FROM vanished w"
    " WHERE w.tenant = t.tenant AND w.ptag = ANY(t.tagvals::text[]) AND t.created_at <= w.until))"
)
_NOT_DELETED_ID = (
    " WHERE NOT EXISTS (SELECT 1 FROM deleted_events x WHERE x.tenant = t.tenant"
    " AND x.id = t.id AND x.pubkey = t.pubkey) AND" + _NOT_VANISHED
)
_NOT_DELETED_ADDRESS = (
    " AND NOT EXISTS (SELECT 1 FROM deleted_addresses y WHERE y.tenant = t.tenant"
    " AND y.pubkey = t.pubkey AND y.kind = t.kind AND y.d = t.d AND t.created_at <= y.until)"
)


# Regular events: an existing (tenant, id) means DUPLICATE; RETURNING names the new rows.
INSERT_REGULAR = (
    f"INSERT INTO events ({_COLUMNS}) {_UNNEST}{_NOT_DELETED_ID}{_IN_ORDER}"
    " ON CONFLICT (tenant, id) DO NOTHING RETURNING tenant, id"
)

# Replaceable/addressable events: the replace rule as ONE statement against the unique
# address index, so two writers can never both win (spec: newest created_at, ties to the
# lowest id). SQL must state the rule itself (a bytea `<` is the bytes order that
# `engram.head.beats` uses on raw ids); tests/test_store_postgres.py races writers and
# checks every stored head against `engram.head.select_head`. The caller guarantees one
# row per address per statement, otherwise Postgres raises "ON CONFLICT DO UPDATE
# command cannot affect row a second time".
INSERT_REPLACEABLE = (
    f"INSERT INTO events ({_COLUMNS}) {_UNNEST}{_NOT_DELETED_ID}{_NOT_DELETED_ADDRESS}"
    f"{_IN_ORDER} ON CONFLICT (tenant, pubkey, kind, d) WHERE d IS NOT NULL DO UPDATE SET"
    " id = excluded.id, created_at = excluded.created_at, owner = excluded.owner,"
    " tagvals = excluded.tagvals, content = excluded.content, sig = NULL,"
    " raw = excluded.raw, expires_at = excluded.expires_at, origin = excluded.origin,"
    " words = excluded.words,"
    " xid = pg_current_xact_id()"
    " WHERE excluded.created_at > events.created_at"
    " OR (excluded.created_at = events.created_at AND excluded.id < events.id)"
    " RETURNING tenant, id"
)

# The stored head of each given address ($1 is the index of the event in the batch): its
# id tells DUPLICATE from STALE, its created_at which kind of STALE (engram.replace).
SELECT_HEADS = (
    "SELECT t.i, e.id, e.created_at FROM unnest($1::int4[], $2::text[], $3::bytea[],"
    " $4::int4[], $5::text[]) AS t(i, tenant, pubkey, kind, d)"
    " JOIN events e ON e.tenant = t.tenant AND e.pubkey = t.pubkey AND e.kind = t.kind"
    " AND e.d = t.d"
)

# Which of the given (tenant, id) pairs are stored.
SELECT_PRESENT = (
    "SELECT e.tenant, e.id FROM unnest($1::text[], $2::bytea[]) AS t(tenant, id)"
    " JOIN events e ON e.tenant = t.tenant AND e.id = t.id"
)


# NIP-09: which events of a batch were deleted earlier by their author ($1 is the index
# of the event in the batch). An `a` deletion covers versions up to its created_at; a
# NIP-62 request to vanish covers everything of its author up to its created_at.
SELECT_DELETED = (
    "SELECT t.i FROM unnest($1::int4[], $2::text[], $3::bytea[], $4::bytea[], $5::int4[],"
    " $6::text[], $7::int8[], $8::text[]) AS t(i, tenant, id, pubkey, kind, d, created_at,"
    " tagvals)"
    " WHERE EXISTS (SELECT 1 FROM deleted_events x WHERE x.tenant = t.tenant"
    " AND x.id = t.id AND x.pubkey = t.pubkey)"
    " OR (t.d IS NOT NULL AND EXISTS (SELECT 1 FROM deleted_addresses y"
    " WHERE y.tenant = t.tenant AND y.pubkey = t.pubkey AND y.kind = t.kind AND y.d = t.d"
    " AND t.created_at <= y.until))"
    " OR NOT (" + _NOT_VANISHED + ")"
)

# NIP-09 `e` targets: remember them, delete the author's own (never a deletion request).
DELETE_IDS = (
    "WITH t AS (SELECT * FROM unnest($1::text[], $2::bytea[], $3::bytea[])"
    " AS t(tenant, id, pubkey)),"
    " remembered AS (INSERT INTO deleted_events SELECT tenant, id, pubkey FROM t"
    " ON CONFLICT DO NOTHING)"
    " DELETE FROM events e USING t WHERE e.tenant = t.tenant AND e.id = t.id"
    f" AND e.pubkey = t.pubkey AND e.kind <> 5 AND e.kind <> {KIND_VANISH}"
)

# NIP-62: remember the request (the latest wins), then delete the author's events up to
# it (never a request to vanish) and the gift wraps p-tagging the author; two statements
# so each can use its index (author and time; the gift wraps' `p` ranges of event_tags).
VANISH = (
    "INSERT INTO vanished (tenant, pubkey, until)"
    " SELECT * FROM unnest($1::text[], $2::bytea[], $3::int8[])"
    " ON CONFLICT (tenant, pubkey) DO UPDATE SET until = greatest(vanished.until, excluded.until)"
)
VANISH_AUTHOR = (
    "DELETE FROM events e USING unnest($1::text[], $2::bytea[], $3::int8[]) AS t(tenant,"
    " pubkey, until) WHERE e.tenant = t.tenant AND e.pubkey = t.pubkey"
    f" AND e.created_at <= t.until AND e.kind <> {KIND_VANISH}"
)
VANISH_GIFT_WRAPS = (
    "DELETE FROM events e USING unnest($1::text[], $2::text[], $3::int8[]) AS t(tenant,"
    " p, until), event_tags x WHERE x.tenant = t.tenant AND x.tag = tag_hash(t.p)"
    " AND x.created_at <= t.until AND e.tenant = x.tenant AND e.id = x.id"
    f" AND e.kind = {KIND_GIFT_WRAP} AND e.tagvals && ARRAY[t.p]"
)

# NIP-09 `a` targets: every version of the author's address up to the request's time.
DELETE_ADDRESSES = (
    "WITH t AS (SELECT * FROM unnest($1::text[], $2::bytea[], $3::int4[], $4::text[],"
    " $5::int8[]) AS t(tenant, pubkey, kind, d, until)),"
    " remembered AS (INSERT INTO deleted_addresses SELECT * FROM t"
    " ON CONFLICT (tenant, pubkey, kind, d)"
    " DO UPDATE SET until = greatest(deleted_addresses.until, excluded.until))"
    " DELETE FROM events e USING t WHERE e.tenant = t.tenant AND e.pubkey = t.pubkey"
    " AND e.kind = t.kind AND e.d = t.d AND e.created_at <= t.until"
)

BUS_XMIN = "SELECT pg_snapshot_xmin(pg_current_snapshot())::text"
# `held`: other nodes' committed rows lie beyond the snapshot's xmin, i.e. a transaction
# still running holds them back (a long transaction delays live delivery across nodes;
# /metrics; the tail reads again soon, relay.store.pgbus).
# Rows of other nodes only ($2 is this node's origin): a node's own rows were delivered
# when it stored them, and reading them back cost PostgreSQL and the relay a copy of
# every ingested event (a tail runs after every committed batch).
BUS_TAIL = (
    "WITH snap AS (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS hi)"
    " SELECT snap.hi::text, e.tenant, e.raw, e.origin,"
    " EXISTS (SELECT 1 FROM events h WHERE h.xid >= snap.hi"
    " AND h.origin IS DISTINCT FROM $2::text) AS held FROM snap"
    " LEFT JOIN events e ON e.xid >= $1::text::xid8 AND e.xid < snap.hi"
    " AND e.origin IS DISTINCT FROM $2::text"
    " ORDER BY e.xid, e.created_at, e.id"
)

PURGE_EXPIRED = (
    "DELETE FROM events WHERE ctid = ANY(ARRAY(SELECT ctid FROM events"
    " WHERE expires_at IS NOT NULL AND expires_at <= $1 LIMIT $2))"
)

KIND_DELETION = 5


# --- write side -----------------------------------------------------------------------


def index_value(value: str) -> str:
    """The indexable form of a tag value: itself, or a marked SHA-256 when too long.

    Injective (up to SHA-256 collisions): values that are long, contain NUL, or start
    with the marker are hashed; everything else is stored verbatim.
    """
    if (len(value) > INDEX_VALUE_MAX // 4 and len(value.encode()) > INDEX_VALUE_MAX) or (
        "\x00" in value or value.startswith(_HASHED)
    ):
        return _HASHED + hashlib.sha256(value.encode()).hexdigest()
    return value


def tag_key(name: str, value: str) -> str:
    """One `tagvals` element: single-character tag name, ':', indexable value."""
    return name + ":" + index_value(value)


def event_tagvals(tags: list[list[str]]) -> list[str]:
    """Index keys of every tag with a one-character name and a value (what `#x` reads)."""
    keys = [tag_key(t[0], t[1]) for t in tags if len(t) >= 2 and len(t[0]) == 1]
    return list(dict.fromkeys(keys)) if len(keys) > 1 else keys


def address_d(kind: int, tags: list[list[str]]) -> str | None:
    """The `d` column: NULL for regular events, '' for replaceable kinds, the indexable
    form of the first `d` tag value (or '') for addressable kinds."""
    if is_replaceable(kind):
        return ""
    if is_addressable(kind):
        for t in tags:
            if t and t[0] == "d":
                return index_value(t[1]) if len(t) >= 2 else ""
        return ""
    return None


def owner_column(tags: list[list[str]]) -> bytes | None:
    """The `owner` column: the event's recipient (engram.readers: its first `p` tag), as
    bytes. Kept for every kind, so a kind a tenant makes private later is readable by
    its recipients at once; the read gate (`_conditions`) compares it to the viewer."""
    to = recipient(tags)
    return None if to is None else bytes.fromhex(to)


def pg_text_array(values: list[str]) -> str:
    """A Postgres array literal (passed as a parameter, cast with ::text[] in SQL).

    Needed because unnest() cannot carry a ragged per-row array; values never hold NUL
    (index_value hashes those), and quoting escapes backslash and double quote.
    """
    if not values:
        return "{}"
    return '{"' + '","'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in values) + '"}'


# (id, pubkey, created_at, kind, d, owner, tagvals literal, content, raw, expires_at)
Row = tuple[bytes, bytes, int, int, str | None, bytes | None, str, str, bytes, int | None]
ROW_NULLABLE = frozenset({4, 5, 9})  # the Row fields that may be None: d, owner, expires_at


def deletion_targets(event: Event) -> tuple[list[bytes], list[tuple[int, str]]]:
    """NIP-09 request targets that belong to its author: `e` ids and `a` (kind, d).

    An `a` naming another pubkey is ignored: nobody deletes someone else's events.
    """
    ids: list[bytes] = []
    addrs: list[tuple[int, str]] = []
    for t in event.tags:
        if len(t) < 2:
            continue
        if t[0] == "e" and is_hex(t[1], 64):
            ids.append(bytes.fromhex(t[1]))
        elif t[0] == "a":
            kind_s, _, rest = t[1].partition(":")
            pubkey, _, d = rest.partition(":")
            if kind_s.isdigit() and len(kind_s) <= 5 and pubkey == event.pubkey:
                kind = int(kind_s)
                if is_replaceable(kind) or is_addressable(kind):
                    addrs.append((kind, "" if is_replaceable(kind) else index_value(d)))
    return ids, addrs


class RowError(ValueError):
    """An event that cannot become a row; str() is the OK message (`invalid: ...`)."""


def encode_row(event: Event, raw: bytes, search_kinds: frozenset[int] | None = None) -> Row:
    """The column values of one event; raises RowError.

    `content` is what the full-text index parses (into `words`): empty for engrams
    (ciphertext) and, when `search_kinds` is given, for every kind not in it.
    """
    kind, created_at, tags = event.kind, event.created_at, event.tags
    if is_ephemeral(kind):
        raise RowError("invalid: ephemeral events (kinds 20000-29999) are not stored")
    if not 0 <= kind <= _INT4_MAX:
        raise RowError("invalid: kind out of range")
    if not -_INT8 <= created_at < _INT8:
        raise RowError("invalid: created_at out of range")
    if not (is_hex(event.id, 64) and is_hex(event.pubkey, 64) and is_hex(event.sig, 128)):
        raise RowError("invalid: id, pubkey and sig must be lower-case hex")
    if kind == KIND_ENGRAM and sum(1 for t in tags if t and t[0] == "d") != 1:
        # ingest already refuses these (validate_engram_envelope); the read side relies on it
        raise RowError("invalid: agent-engram event must carry exactly one d tag")
    content = event.content
    if kind in MEMORY_KINDS or (search_kinds is not None and kind not in search_kinds):
        content = ""  # never searched (engram ciphertext): `raw` keeps the event
    elif "\x00" in content:  # Postgres text cannot hold NUL; `raw` keeps the exact event
        content = content.replace("\x00", "")
    return (
        bytes.fromhex(event.id),
        bytes.fromhex(event.pubkey),
        created_at,
        kind,
        address_d(kind, tags),
        owner_column(tags),
        pg_text_array(event_tagvals(tags)),
        content,
        bytes(raw),
        expiration_of(tags),
    )


# --- read side ------------------------------------------------------------------------


class _Params:
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


def _eq(column: str, ref: str, cast: str, n: int) -> str:
    """`column = $n` for one value, else `column = ANY($n)` (the parameter holds a list).

    One value must be a plain equality: an index scan under `= ANY(...)` does not return
    rows in index order, so `ORDER BY created_at DESC ... LIMIT n` would read and sort
    every row of the author; and PostgreSQL costs the generic plan of the ANY form so
    far above the custom one that it re-plans on every execution (measured: 160 vs 75
    us of PostgreSQL CPU per `authors` REQ)."""
    if n == 1:
        return f"{column} = {ref}::{cast}"
    return f"{column} = ANY({ref}::{cast}[])"


def _kinds(f: Filter) -> list[int] | None:
    """The distinct kinds a filter names that a stored row can have (int4), in order;
    None when it names none (an empty list: it names only kinds nothing can have)."""
    if f.kinds is None:
        return None
    return [k for k in dict.fromkeys(f.kinds) if 0 <= k <= _INT4_MAX]


def _kind_in(column: str, kinds: Iterable[int], negate: bool = False) -> str:
    """`column` (not) among `kinds` given as literals: the tenant's private kinds are
    integers from its configuration, never client input, and a statement keeps scalar
    parameters only (readbatch needs that) and plans on the constants."""
    listed = sorted(kinds)
    text = ", ".join(str(int(k)) for k in listed)
    if len(listed) == 1:
        return f"{column} {'<>' if negate else '='} {text}"
    return f"{column} {'NOT IN' if negate else 'IN'} ({text})"


def _one_or_all(values: list[Any]) -> Any:
    return values[0] if len(values) == 1 else values


def _tag_ids(ref: str, n: int) -> str:
    """Ids of the tenant's events carrying the tag key(s) in parameter `ref`, by hash."""
    if n == 1:
        return (
            f"SELECT x.id FROM event_tags x WHERE x.tenant = $1 AND x.tag = tag_hash({ref}::text)"
        )
    return (
        "SELECT x.id FROM event_tags x WHERE x.tenant = $1"
        f" AND x.tag = ANY(ARRAY(SELECT tag_hash(k) FROM unnest({ref}::text[]) k))"
    )


def _conditions(
    f: Filter, p: _Params, author_ref: str | None = None, bounded: bool = False
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
        conds.append(_eq("id", p.add(_one_or_all(ids)), "bytea", len(ids)))
    if f.authors is not None:
        authors = [bytes.fromhex(a) for a in dict.fromkeys(f.authors) if is_hex(a, 64)]
        if not authors:
            return None
        if author_ref is not None:  # one author per scan (see _per_author, build_query)
            conds.append(f"pubkey = {author_ref}")
        else:
            conds.append(_eq("pubkey", p.add(_one_or_all(authors)), "bytea", len(authors)))
    kinds = _kinds(f)
    if kinds is not None:
        if not kinds:
            return None
        conds.append(_eq("kind", p.add(_one_or_all(kinds)), "int4", len(kinds)))
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
            conds.append(_eq("d", p.add(_one_or_all(ds)), "text", len(ds)))
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
    if f.since is not None:
        conds.append(f"created_at >= {p.add(f.since)}::int8")
    if f.until is not None:
        conds.append(f"created_at <= {p.add(f.until)}::int8")
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
        public = _kind_in("kind", private, negate=True)
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
    for name, values in f.tags.items():
        if values and not (name == "d" and engram_only):
            return name
    return None


def _tag_driven(f: Filter, name: str, p: _Params, scan_max: int) -> str | None:
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
    span = ""
    if f.since is not None:
        span += f" AND created_at >= {p.add(f.since)}::int8"
    if f.until is not None:
        span += f" AND created_at <= {p.add(f.until)}::int8"
    limit = p.add(f.limit)
    cap = p.add(scan_max)
    # the kind is in each entry (0026): entries of other kinds are dropped before their
    # event row is read, still among the first `scan_max` entries (the bound stays rows
    # of the index read)
    of_kinds = ""
    kinds = _kinds(f)
    if kinds:  # never empty here: p.conditions returned None for that
        of_kinds = " WHERE " + _eq("y.kind", p.add(_one_or_all(kinds)), "int4", len(kinds))
    keys = list(dict.fromkeys(tag_key(name, v) for v in f.tags[name]))
    # one value: a scalar parameter (readbatch batches the statement); several: the array
    tag = f"tag_hash({p.add(keys[0])}::text)" if len(keys) == 1 else "tag_hash(k.key)"
    branch = (
        f"SELECT e.raw, e.created_at, e.id FROM (SELECT created_at, id FROM (SELECT"
        f" created_at, id, kind FROM event_tags"
        f" WHERE tenant = $1 AND tag = {tag}{span}"
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


def _search_walk_first(f: Filter, p: _Params, walk: int, window: int) -> str | None:
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
    kinds = _kinds(f) or None
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
    p = _Params(tenant, viewer, now, private)
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


def _count_tag(f: Filter) -> str | None:
    """The tag name of a filter that COUNT reads from event_tags alone, else None: one
    single-character tag name, optional kinds, since and until; no ids, authors or
    search (those need the event row, or another index, to decide a match)."""
    if f.ids is not None or f.authors is not None or f.search is not None or len(f.tags) != 1:
        return None
    name = next(iter(f.tags))
    return name if len(name) == 1 else None


class _TagCount(msgspec.Struct):
    """One filter's part of a COUNT read from event_tags (see _tag_count): conditions
    on the entries `x` and, the same, on the event rows `e`."""

    public: str | None  # entries of the filter's kinds that are not private
    public_row: str | None  # the same on a row (to take out the expired ones)
    several: bool  # several values: an event may have an entry for each
    private: str | None  # the private ones the viewer may read: entries joined to rows


def _tag_count_part(f: Filter, name: str, p: _Params) -> _TagCount | None:
    """The conditions of one filter naming one tag, or None if it matches nothing."""
    if f.since is not None and f.until is not None and f.since > f.until:
        return None
    kinds = _kinds(f)
    if kinds is not None and not kinds:
        return None
    keys = list(dict.fromkeys(tag_key(name, v) for v in f.tags[name]))
    if not keys:
        return None
    mark = len(p.values)
    ref = p.add(_one_or_all(keys))
    if len(keys) == 1:
        span = [f"x.tenant = $1 AND x.tag = tag_hash({ref}::text)"]
        row = [f"e.tagvals && ARRAY[{ref}::text]"]
    else:
        span = [
            f"x.tenant = $1 AND x.tag = ANY(ARRAY(SELECT tag_hash(k) FROM unnest({ref}::text[]) k))"
        ]
        row = [f"e.tagvals && {ref}::text[]"]
    if f.since is not None:
        since = p.add(f.since)
        span.append(f"x.created_at >= {since}::int8")
        row.append(f"e.created_at >= {since}::int8")
    if f.until is not None:
        until = p.add(f.until)
        span.append(f"x.created_at <= {until}::int8")
        row.append(f"e.created_at <= {until}::int8")
    private = sorted(p.private if kinds is None else p.private.intersection(kinds))
    public: list[str] | None = None  # the kind condition of the public part, if any
    if kinds is None:
        public = [_kind_in("{t}.kind", private, negate=True)] if private else []
    elif shown := [k for k in kinds if k not in p.private]:
        public = [_eq("{t}.kind", p.add(_one_or_all(shown)), "int4", len(shown))]
    gated: str | None = None
    v = p.viewer_ref() if private else None
    if v is not None:  # without a viewer no private event is counted, as in _conditions
        gated = " AND ".join(
            [
                *span,
                _kind_in("x.kind", private),
                "e.tenant = $1 AND e.id = x.id",
                f"(e.pubkey = {v} OR e.owner = {v})",
                *row,  # the row is read anyway: no hash collision gets counted here
            ]
        )
        if p.now is not None:
            gated += f" AND (e.expires_at IS NULL OR e.expires_at > {p.add(p.now)}::int8)"
    if public is None and gated is None:  # private kinds only, and no viewer
        del p.values[mark:]  # Postgres refuses a parameter that nothing references
        return None
    entries = rows = None
    if public is not None:
        entries = " AND ".join([*span, *(c.format(t="x") for c in public)])
        rows = " AND ".join([*row, *(c.format(t="e") for c in public)])
    return _TagCount(public=entries, public_row=rows, several=len(keys) > 1, private=gated)


def _tag_count(filters: list[Filter], p: _Params) -> str | None:
    """The COUNT of filters that each name one tag (see _count_tag), from event_tags, or
    None if none can match.

    The entries of each value are read from event_tags_time with an index-only scan (the
    kind is included in the index, migration 0026), so the count costs the value's index
    entries, never one heap row per match (`{"kinds":[7],"#e":[a popular note]}` at 1M
    events read every reaction's event row before). Events matched by several values or
    several filters are counted once (UNION); deleted events have no entries (the
    triggers of 0013). NIP-40 expired events keep their entries until the purge deletes
    their rows, so those that match are counted from the tenant's expired rows (the
    partial index events_expires: a few rows, between two purges) and subtracted: no
    join, so no plan can probe the expired rows once per entry. Private kinds are
    counted from their rows, only those the viewer may read (their author or recipient).

    Approximate by design, as NIP-45 allows: entries are keyed by a 64-bit hash of the tag
    key and the index-only part does not recheck the event's `tagvals` (a REQ does), so an
    event carrying another value whose hash equals a counted one's would be counted too:
    a chance of about 2^-64 for each pair of distinct values."""
    parts = []
    for f in filters:
        name = _count_tag(f)
        assert name is not None
        part = _tag_count_part(f, name, p)
        if part is not None:
            parts.append(part)
    public = [c for c in parts if c.public is not None]
    gated = [c.private for c in parts if c.private is not None]
    counts: list[tuple[str, str]] = []  # (sign, SELECT count)
    if public:
        if len(public) == 1 and not public[0].several:  # one value: one entry an event
            counts.append(("+", f"SELECT count(*) FROM event_tags x WHERE {public[0].public}"))
        else:  # an event may have an entry for each value, or match several filters
            select = "SELECT DISTINCT x.id" if len(public) == 1 else "SELECT x.id"
            union = " UNION ".join(f"{select} FROM event_tags x WHERE {c.public}" for c in public)
            counts.append(("+", f"SELECT count(*) FROM ({union}) u"))
        if p.now is not None:
            matching = " OR ".join(f"({c.public_row})" for c in public)
            counts.append(
                (
                    "-",
                    "SELECT count(*) FROM events e WHERE e.tenant = $1"
                    f" AND e.expires_at IS NOT NULL AND e.expires_at <= {p.add(p.now)}::int8"
                    f" AND ({matching})",
                )
            )
    if gated:
        union = " UNION ALL ".join(
            f"SELECT e.id FROM event_tags x, events e WHERE {w}" for w in gated
        )
        counts.append(("+", f"SELECT count(DISTINCT g.id) FROM ({union}) g"))
    if not counts:
        return None
    if len(counts) == 1:
        return counts[0][1]
    return "SELECT " + " ".join(f"{sign} ({c})" for sign, c in counts).removeprefix("+ ")


def build_count(
    filters: list[Filter],
    tenant: str,
    viewer: str | None = None,
    now: int | None = None,
    private: frozenset[int] = DEFAULT_PRIVATE,
) -> tuple[str, list[Any]] | None:
    """SELECT count(*) of distinct events matching any filter, or None if none can match.

    NIP-45 counts every match, so `limit` is ignored here. When every filter names one
    tag and nothing the index lacks, the count is read from event_tags (_tag_count);
    otherwise from `events`, tag conditions finding their rows through event_tags.
    """
    p = _Params(tenant, viewer, now, private)
    if filters and all(_count_tag(f) is not None for f in filters):
        text = _tag_count(filters, p)
        return None if text is None else (text, p.values)
    ors: list[str] = []
    for f in filters:
        conds = p.conditions(f)
        if conds is None:
            continue
        ors.append("(" + (" AND ".join(conds) or "TRUE") + ")")
    if not ors:
        return None
    return f"SELECT count(*) FROM events WHERE tenant = $1 AND ({' OR '.join(ors)})", p.values


def build_items(
    f: Filter,
    tenant: str,
    viewer: str | None,
    now: int,
    limit: int,
    private: frozenset[int] = DEFAULT_PRIVATE,
) -> tuple[str, list[Any]] | None:
    """NIP-77: (count, ids concatenated, created_at array) of at most `limit` events
    matching `f`, in (created_at, id) order, or None if none can match.

    The same conditions as REQ (private read gate, NIP-40 expiry; deleted rows are gone);
    the filter's own `limit` is ignored, as a negentropy set is the whole match. One
    row: the ids as one bytea, the timestamps as one array.

    Which index is read is fixed here, not left to the planner, because a whole set is
    read right after it was written (a first sync, an agent's new engrams) when the
    statistics still call it one row: ids or authors bound the scan (the author index;
    tags recheck the row's `tagvals`), else the first tag's entries in event_tags drive
    it (one probe of `events` by key per entry). Left to the planner, the engram filter
    (kinds 30174, the agent, `#p` the owner) became a nested loop that read the owner's
    whole range of event_tags for every engram: 50M index entries for 10,000 engrams, a
    NEG-OPEN that timed out after 10 s."""
    p = _Params(tenant, viewer, now, private)
    conds = p.conditions(f, bounded=True)
    if conds is None:
        return None
    where = " AND ".join(["tenant = $1", "created_at >= 0", *conds])
    name = None
    if f.ids is None and f.authors is None:
        name = next((n for n, values in f.tags.items() if values), None)
    if name is None:
        select = f"SELECT created_at, id FROM events WHERE {where}"
    else:
        keys = list(dict.fromkeys(tag_key(name, v) for v in f.tags[name]))
        tag = (
            f"tag = tag_hash({p.add(keys[0])}::text)"
            if len(keys) == 1
            else f"tag = ANY(ARRAY(SELECT tag_hash(k) FROM unnest({p.add(keys)}::text[]) k))"
        )
        span = ""
        if f.since is not None:
            span += f" AND created_at >= {p.add(f.since)}::int8"
        if f.until is not None:
            span += f" AND created_at <= {p.add(f.until)}::int8"
        kinds = _kinds(f)
        if kinds:  # never empty here: p.conditions returned None for that
            span += " AND " + _eq("kind", p.add(_one_or_all(kinds)), "int4", len(kinds))
        # an event carrying several of the values has an entry for each: DISTINCT
        select = (
            f"SELECT e.created_at, e.id FROM (SELECT DISTINCT id FROM event_tags"
            f" WHERE tenant = $1 AND {tag}{span}) x"
            f" CROSS JOIN LATERAL (SELECT created_at, id FROM events WHERE {where}"
            " AND id = x.id) e"
        )
    return (
        "SELECT count(*), coalesce(string_agg(id, ''::bytea ORDER BY created_at, id), ''::bytea),"
        " coalesce(array_agg(created_at ORDER BY created_at, id), '{}'::int8[])"
        f" FROM ({select} ORDER BY created_at, id LIMIT {p.add(limit)}::int8) s"
    ), p.values
