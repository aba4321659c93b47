"""The memory list's query (filters and sort from the URL) and the rows it selects.

Pure: the snapshot and the time are arguments. Live memories and those that do not read
as live (removed, denied, forgotten) are never listed together: the second are a view of
their own (`show=gone`), rows without a value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any
from urllib.parse import urlencode

from cli.memory.review.snapshot import CLEAN, Row, Snapshot
from engram import CORE_SLUG
from engram.live import ended, valid_at
from engram.versions import TRUST_STATES, Meta

SORTS = {"slug": "slug", "newest": "newest change first", "oldest": "oldest change first"}
VALIDITY = {"": "any", "now": "holds now", "ended": "ended", "future": "not begun yet"}
BY = {"": "anyone", "agent": "the agent", "owner": "the owner"}
AUDIT = {"": "any", "clean": "clean", "problem": "a finding"}
SHOW = {"": "live memories", "gone": "removed, denied or forgotten"}
LIVE_TRUST = tuple(t for t in TRUST_STATES if t != "denied")  # a denied memory is not live


def _pick(
    params: Mapping[str, str], name: str, allowed: Mapping[str, str] | tuple[str, ...]
) -> str:
    value = params.get(name, "")
    return value if value in allowed else ""


@dataclass(frozen=True)
class ListQuery:
    """What the list shows: `q` searches (live memories only), the rest filter and sort."""

    q: str = ""
    contains: str = ""
    trust: str = ""
    validity: str = ""
    by: str = ""
    audit: str = ""
    show: str = ""
    sort: str = ""
    links: str = ""  # a slug: only the memories whose value links to it

    @classmethod
    def of(cls, params: Mapping[str, str]) -> ListQuery:
        return cls(
            q=params.get("q", "").strip(),
            contains=params.get("contains", "").strip(),
            trust=_pick(params, "trust", LIVE_TRUST),
            validity=_pick(params, "validity", VALIDITY),
            by=_pick(params, "by", BY),
            audit=_pick(params, "audit", AUDIT),
            show=_pick(params, "show", SHOW),
            sort=_pick(params, "sort", SORTS),
            links=params.get("links", "").strip(),
        )

    @property
    def gone(self) -> bool:
        return self.show == "gone"

    def url(self, **changes: str) -> str:
        """The query string of this list with `changes` (empty values left out)."""
        fields = {**asdict(self), **changes}
        return urlencode({k: v for k, v in fields.items() if v})


def _meta(row: Row) -> Meta:
    return Meta(valid_from=row.valid_from, valid_until=row.valid_until)


def ended_row(row: Row, now: int) -> bool:
    return ended(_meta(row), now)


def holds(row: Row, validity: str, now: int) -> bool:
    """Whether `row` passes the validity filter at `now` (engram.live's windows)."""
    meta = _meta(row)
    if validity == "now":
        return valid_at(meta, now)
    if validity == "ended":
        return ended(meta, now)
    if validity == "future":
        return meta.valid_from is not None and now < meta.valid_from
    return True


SORT_KEYS: dict[str, Callable[[Row], Any]] = {
    "slug": lambda r: (r.slug != CORE_SLUG, r.slug),
    "newest": lambda r: (-r.created_at, r.slug),
    "oldest": lambda r: (r.created_at, r.slug),
}


def select(snap: Snapshot, query: ListQuery, now: int, found: list[str] | None = None) -> list[Row]:
    """The rows the list shows. `found`: the slugs a search or recall returned, best first
    (then they keep that order and live memories only are listed)."""
    if query.gone:
        rows = list(snap.gone.values())
    else:
        rows = [*([snap.core] if snap.core else []), *snap.live.values()]
    if found is not None and not query.gone:
        order = {slug: i for i, slug in enumerate(found)}
        rows = sorted((r for r in rows if r.slug in order), key=lambda r: order[r.slug])
    else:
        rows.sort(key=SORT_KEYS[query.sort or "slug"])
    if query.contains:
        rows = [r for r in rows if query.contains.lower() in r.slug.lower()]
    if query.links:
        rows = [r for r in rows if query.links in snap.edges.get(r.slug, [])]
    if query.by:
        rows = [r for r in rows if r.role == query.by]
    if query.audit == "clean":
        rows = [r for r in rows if r.audit == CLEAN]
    elif query.audit == "problem":
        rows = [r for r in rows if r.audit not in (None, CLEAN)]
    if not query.gone:
        if query.trust:
            rows = [r for r in rows if r.trust == query.trust]
        if query.validity:
            rows = [r for r in rows if holds(r, query.validity, now)]
    return rows
