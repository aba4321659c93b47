"""COUNT (NIP-45) and the NIP-77 set read: Filter -> one parameterized SELECT.

Pure (no I/O, no asyncpg): relay.store.pgreader runs them. They share the read planner's
filter conditions and private read gate (relay.store.sqlread) and the tag index's
encoding (relay.store.tagindex).
"""

from __future__ import annotations

from typing import Any

import msgspec

from relay.config import DEFAULT_PRIVATE
from relay.filters import Filter
from relay.store.sqlread import (
    Params,
    eq,
    kind_in,
    kinds_of,
    one_or_all,
    span,
    span_refs,
    tag_match,
)
from relay.store.tagindex import tag_key


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


def _tag_count_part(f: Filter, name: str, p: Params) -> _TagCount | None:
    """The conditions of one filter naming one tag, or None if it matches nothing."""
    if f.since is not None and f.until is not None and f.since > f.until:
        return None
    kinds = kinds_of(f)
    if kinds is not None and not kinds:
        return None
    keys = list(dict.fromkeys(tag_key(name, v) for v in f.tags[name]))
    if not keys:
        return None
    mark = len(p.values)
    ref = p.add(one_or_all(keys))
    entry = [f"x.tenant = $1 AND {tag_match('x.tag', ref, len(keys))}"]
    row = [f"e.tagvals && ARRAY[{ref}::text]" if len(keys) == 1 else f"e.tagvals && {ref}::text[]"]
    refs = span_refs(f, p)
    entry.extend(span("x.created_at", refs))
    row.extend(span("e.created_at", refs))
    private = sorted(p.private if kinds is None else p.private.intersection(kinds))
    public: list[str] | None = None  # the kind condition of the public part, if any
    if kinds is None:
        public = [kind_in("{t}.kind", private, negate=True)] if private else []
    elif shown := [k for k in kinds if k not in p.private]:
        public = [eq("{t}.kind", p.add(one_or_all(shown)), "int4", len(shown))]
    gated: str | None = None
    v = p.viewer_ref() if private else None
    if v is not None:  # without a viewer no private event is counted, as in sqlread
        gated = " AND ".join(
            [
                *entry,
                kind_in("x.kind", private),
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
        entries = " AND ".join([*entry, *(c.format(t="x") for c in public)])
        rows = " AND ".join([*row, *(c.format(t="e") for c in public)])
    return _TagCount(public=entries, public_row=rows, several=len(keys) > 1, private=gated)


def _tag_count(filters: list[Filter], p: Params) -> str | None:
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
    p = Params(tenant, viewer, now, private)
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
    p = Params(tenant, viewer, now, private)
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
        terms = [tag_match("tag", p.add(one_or_all(keys)), len(keys))]
        terms.extend(span("created_at", span_refs(f, p)))
        kinds = kinds_of(f)
        if kinds:  # never empty here: p.conditions returned None for that
            terms.append(eq("kind", p.add(one_or_all(kinds)), "int4", len(kinds)))
        # an event carrying several of the values has an entry for each: DISTINCT
        select = (
            f"SELECT e.created_at, e.id FROM (SELECT DISTINCT id FROM event_tags"
            f" WHERE tenant = $1 AND {' AND '.join(terms)}) x"
            f" CROSS JOIN LATERAL (SELECT created_at, id FROM events WHERE {where}"
            " AND id = x.id) e"
        )
    return (
        "SELECT count(*), coalesce(string_agg(id, ''::bytea ORDER BY created_at, id), ''::bytea),"
        " coalesce(array_agg(created_at ORDER BY created_at, id), '{}'::int8[])"
        f" FROM ({select} ORDER BY created_at, id LIMIT {p.add(limit)}::int8) s"
    ), p.values
