"""The write side in SQL: an event as a row, and the statements that store it.

Pure (no I/O, no asyncpg): the group-commit writer (relay.store.pgwriter) runs these.
SQL is only ever built from fixed fragments; every value travels as a `$n` parameter.
The tag index's encoding is relay.store.tagindex, shared with the read side.
"""

from __future__ import annotations

from collections.abc import Sequence

from engram.kinds import KIND_DELETION, is_addressable, is_ephemeral, is_replaceable
from engram.nip01 import Event, is_hex
from engram.nip62 import KIND_GIFT_WRAP, KIND_VANISH
from engram.readers import recipient
from relay.config import KIND_ENGRAM, MEMORY_KINDS
from relay.store.tagindex import address_d, event_tagvals, index_value
from relay.validate import expiration_of
from relay.wire import Reason

_INT4_MAX = 2**31 - 1
_INT8 = 2**63

# `content` is stored empty and `sig` not at all since migration 0015: `raw` is what is
# served, and search reads `words`, parsed here from the content parameter (a copy of
# both in every row cost ~270 bytes an event on disk and in the WAL).
_COLUMNS = (
    "tenant, id, pubkey, created_at, kind, d, owner, tagvals, content, raw, expires_at,"
    " origin, words"
)
# The batch's columns (`insert_parameters`): the always-present ones as a few values for
# the whole batch, not an array element per row and column: asyncpg spent ~1 us of the
# relay's CPU on each array element (~10 us an event over 11 arrays; issue 47), where a
# text array literal or a concatenation costs it one copy. Ids and pubkeys are the
# concatenation of their 32 bytes, raw the concatenation of the events (each its length,
# $13); tenants, created_at, kind, tag keys and content are array literals parsed by
# PostgreSQL (pg_text_array). `d`, `owner` and `expires_at`, NULL on most rows, stay arrays.
_UNNEST = (
    "SELECT t.tenant, t.id, t.pubkey, t.created_at, t.kind, t.d, t.owner, t.tagvals::text[],"
    " '', t.raw, t.expires_at, $12::text, to_tsvector('simple', t.content)"
    " FROM (SELECT u.*, substr($2::bytea, u.ord::int4 * 32 - 31, 32) AS id,"
    " substr($3::bytea, u.ord::int4 * 32 - 31, 32) AS pubkey,"
    " substr($10::bytea, u.start, u.len) AS raw"
    " FROM unnest($1::text::text[], $4::text::int8[], $5::text::int4[], $6::text[],"
    " $7::bytea[], $8::text::text[], $9::text::text[], $13::text::int4[], $14::text::int4[],"
    " $11::int8[]) WITH ORDINALITY AS u(tenant, created_at, kind, d, owner, tagvals, content,"
    " start, len, expires_at, ord)) AS t"
)
# Rows are inserted (and locked) in the caller's order, sorted by key or address, even
# through the anti-joins below: concurrent batches then lock in one order and cannot
# deadlock each other.
_IN_ORDER = " ORDER BY t.ord"

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
    f" AND e.pubkey = t.pubkey AND e.kind <> {KIND_DELETION} AND e.kind <> {KIND_VANISH}"
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

# The search index's pending list (GIN fastupdate: new entries are appended to a list,
# then merged into the index in bulk) merged now, by a statement of its own. Otherwise the
# insert that grows the list past gin_pending_list_limit merges it inside its batch, which
# then waits 0.6-1.3 s for its commit (issue 47); an insert that finds a merge running
# leaves the list to it, so a merge here never blocks the batches.
CLEAN_SEARCH_PENDING = "SELECT gin_clean_pending_list('events_words'::regclass)"

PURGE_EXPIRED = (
    "DELETE FROM events WHERE ctid = ANY(ARRAY(SELECT ctid FROM events"
    " WHERE expires_at IS NOT NULL AND expires_at <= $1 LIMIT $2))"
)


def owner_column(tags: list[list[str]]) -> bytes | None:
    """The `owner` column: the event's recipient (engram.readers: its first `p` tag), as
    bytes. Kept for every kind, so a kind a tenant makes private later is readable by
    its recipients at once; the read gate (relay.store.sqlread) compares it to the viewer."""
    to = recipient(tags)
    return None if to is None else bytes.fromhex(to)


def pg_text_array(values: Sequence[str]) -> str:
    """A Postgres array literal (passed as a parameter, cast with ::text[] in SQL).

    Needed because unnest() cannot carry a ragged per-row array; values never hold NUL
    (index_value hashes those), and quoting escapes backslash and double quote.
    """
    if not values:
        return "{}"
    return '{"' + '","'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in values) + '"}'


# (id, pubkey, created_at, kind, d, owner, tagvals literal, content, raw, expires_at)
Row = tuple[bytes, bytes, int, int, str | None, bytes | None, str, str, bytes, int | None]


def _int_array(values: Sequence[int]) -> str:
    return "{" + ",".join(map(str, values)) + "}"


def _nullable(values: tuple[object, ...]) -> list[object]:
    """A column NULL on most rows, as an array: empty when NULL on every row (unnest()
    pads a shorter array with NULLs, and asyncpg spends ~0.3 us on each NULL element)."""
    return [] if values.count(None) == len(values) else list(values)


def insert_parameters(tenants: list[str], rows: list[Row], origin: str) -> list[object]:
    """The parameters of INSERT_REGULAR and INSERT_REPLACEABLE for `rows`, in order, each
    of `tenants` (see _UNNEST for their form)."""
    ids, pubkeys, created, kinds, ds, owners, tagvals, contents, raws, expires = zip(
        *rows, strict=True
    )
    lengths = [len(r) for r in raws]
    starts, at = [], 1
    for n in lengths:
        starts.append(at)
        at += n
    return [
        pg_text_array(tenants),
        b"".join(ids),
        b"".join(pubkeys),
        _int_array(created),
        _int_array(kinds),
        _nullable(ds),
        _nullable(owners),
        pg_text_array(tagvals),
        pg_text_array(contents),
        b"".join(raws),
        _nullable(expires),
        origin,
        _int_array(starts),
        _int_array(lengths),
    ]


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
        raise RowError(Reason.INVALID("ephemeral events (kinds 20000-29999) are not stored"))
    if not 0 <= kind <= _INT4_MAX:
        raise RowError(Reason.INVALID("kind out of range"))
    if not -_INT8 <= created_at < _INT8:
        raise RowError(Reason.INVALID("created_at out of range"))
    if not (is_hex(event.id, 64) and is_hex(event.pubkey, 64) and is_hex(event.sig, 128)):
        raise RowError(Reason.INVALID("id, pubkey and sig must be lower-case hex"))
    if kind == KIND_ENGRAM and sum(1 for t in tags if t and t[0] == "d") != 1:
        # ingest already refuses these (validate_engram_envelope); the read side relies on it
        raise RowError(Reason.INVALID("agent-engram event must carry exactly one d tag"))
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
