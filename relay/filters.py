"""NIP-01 filters: parse a filter object strictly, and match events against it.

Sans-I/O. `matches` is the one matcher everything else trusts: the live fan-out uses it,
and the Postgres query path is tested against it.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from engram.nip01 import Event, all_hex, is_hex
from relay.config import MEMORY_KINDS, Limits
from relay.wire import PlainFilter

_decode_obj = msgspec.json.Decoder(dict[str, Any])
_MAX_INT = 2**63 - 1
_WORD = re.compile(r"\w+")  # a word of a NIP-50 query or of content, live (see words_match)


class FilterError(ValueError):
    """An invalid filter; the message is the reason after `invalid: `."""


class Filter(msgspec.Struct, kw_only=True):
    ids: list[str] | None = None
    authors: list[str] | None = None
    kinds: list[int] | None = None
    tags: dict[str, list[str]] = msgspec.field(default_factory=dict)  # "e" -> values of "#e"
    since: int | None = None
    until: int | None = None
    limit: int | None = None
    search: str | None = None


def _hex_list(name: str, value: Any, limits: Limits) -> list[str]:
    if not isinstance(value, list):
        raise FilterError(f"{name} must be an array")
    if len(value) > limits.max_filter_values:
        raise FilterError(f"too many {name} (max {limits.max_filter_values})")
    for v in value:
        if not isinstance(v, str) or not is_hex(v, 64):
            raise FilterError(f"{name} must be 64-character lower-case hex strings")
    return value


def _int(name: str, value: Any, lo: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= _MAX_INT:
        raise FilterError(f"{name} must be a non-negative integer")
    return value


def _search(value: Any, limits: Limits) -> str:
    """A NIP-50 query within the advertised bounds: refused here, before the fan-out keeps
    it or PostgreSQL parses it (a NUL cannot be sent as text; 50,000 words overflowed
    PostgreSQL's stack; a long query cost every published event its matching)."""
    if not isinstance(value, str):
        raise FilterError("search must be a string")
    if len(value) > limits.max_search_length:
        raise FilterError(f"search longer than {limits.max_search_length} characters")
    if "\x00" in value:
        raise FilterError("search must not contain NUL")
    if len(_WORD.findall(value)) > limits.max_search_words:
        raise FilterError(f"search has more than {limits.max_search_words} words")
    return value


def parse_filter(raw: bytes | dict[str, Any], limits: Limits) -> Filter:
    """A Filter from a raw JSON object (bytes) or an already-decoded dict."""
    if isinstance(raw, bytes | bytearray | memoryview):
        try:
            obj = _decode_obj.decode(raw)
        except msgspec.ValidationError as exc:
            raise FilterError("filter must be a JSON object") from exc
        except (msgspec.DecodeError, RecursionError) as exc:
            raise FilterError("filter is not valid JSON") from exc
    else:
        obj = raw
    f = Filter()
    for key, value in obj.items():
        if key == "ids":
            f.ids = _hex_list("ids", value, limits)
        elif key == "authors":
            f.authors = _hex_list("authors", value, limits)
        elif key == "kinds":
            if not isinstance(value, list):
                raise FilterError("kinds must be an array")
            if len(value) > limits.max_filter_values:
                raise FilterError(f"too many kinds (max {limits.max_filter_values})")
            f.kinds = [_int("kinds", k) for k in value]
            if any(k > 65535 for k in f.kinds):
                raise FilterError("kinds must be between 0 and 65535")
        elif key in ("since", "until", "limit"):
            setattr(f, key, _int(key, value))
        elif key == "search":
            f.search = _search(value, limits)
        elif len(key) == 2 and key[0] == "#" and key[1].isascii() and key[1].isalpha():
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise FilterError(f"{key} must be an array of strings")
            if len(value) > limits.max_filter_values:
                raise FilterError(f"too many {key} values (max {limits.max_filter_values})")
            f.tags[key[1]] = value
        else:
            raise FilterError(f"unknown filter field {key[:20]!r}")
    return f


# --- the fast path: a filter without tags, decoded in one C call (relay.wire) ----------


UNPLANNED = object()  # SharedFilters.plans before the read cache plans them


class SharedFilters(list[Filter]):
    """A REQ's filters as relay.reqmemo remembers them: parsed, authorized, clamped, and
    shared by every REQ of the same text for the same tenant and viewer. Never changed
    once made: what the fan-out (`keys`, `match_key`) and the read cache (`plans`) work
    out of them is kept here by them, the first time, for the next REQ."""

    __slots__ = ("keys", "match_key", "plans")

    def __init__(self, filters: list[Filter]) -> None:
        super().__init__(filters)
        self.keys: Any = None  # relay.fanout: the index keys and the match key
        self.match_key: Any = None
        self.plans: Any = UNPLANNED  # relay.store.readcache.plan_all's answer


def from_plain(p: PlainFilter, limits: Limits) -> Filter | None:
    """`parse_filter`'s Filter for a decoded PlainFilter, or None when parse_filter would
    refuse it (the caller parses it that way then, for the error)."""
    most = limits.max_filter_values
    ids, authors, kinds = p.ids, p.authors, p.kinds
    if ids is not None and (len(ids) > most or not all_hex(ids, 64)):
        return None
    if authors is not None and (len(authors) > most or not all_hex(authors, 64)):
        return None
    if kinds is not None and len(kinds) > most:
        return None
    if p.search is not None:
        try:
            _search(p.search, limits)
        except FilterError:
            return None
    return Filter(
        ids=p.ids,
        authors=p.authors,
        kinds=p.kinds,
        since=p.since,
        until=p.until,
        limit=p.limit,
        search=p.search,
    )


def query_words(query: str) -> tuple[str, ...]:
    r"""The distinct words of a NIP-50 query as the live matcher reads them (lower-cased
    `\w+` runs), longest first (likely the rarest: `words_match` tests it first, and
    relay.fanout indexes a live search under it). Tokenized once per subscription."""
    return tuple(sorted(set(_WORD.findall(query.lower())), key=lambda w: (-len(w), w)))


def content_words(event: Event) -> frozenset[str]:
    """The words of an event's content, as `query_words` reads a query (once per event)."""
    return frozenset(_WORD.findall(event.content.lower()))


def words_match(terms: tuple[str, ...], event: Event, words: frozenset[str] | None = None) -> bool:
    """NIP-50 for live events: every word of the query (`terms`, from `query_words`) is a
    word of the content (`words`, from `content_words`, computed here if not given).

    The stored path uses PostgreSQL full text ('simple' configuration); this agrees with
    it on plain word queries. Engram content (heads, revisions, verdicts) is ciphertext
    and never matches.
    """
    if event.kind in MEMORY_KINDS:
        return False
    if not terms:
        return True
    if words is None:
        words = content_words(event)
    return all(w in words for w in terms)


def restrict_search(f: Filter, search_kinds: frozenset[int] | None) -> None:
    """A NIP-50 filter matches only searchable kinds (Settings.search_kinds), stored and
    live alike: its `kinds` become their intersection (empty: it matches nothing)."""
    if f.search is not None and search_kinds is not None:
        kinds = search_kinds if f.kinds is None else search_kinds.intersection(f.kinds)
        f.kinds = sorted(kinds)


def matches(
    f: Filter,
    event: Event,
    terms: tuple[str, ...] | None = None,
    words: frozenset[str] | None = None,
) -> bool:
    """NIP-01 semantics: every given field must match; within a field any value may.

    `terms`: the filter's search words (`query_words(f.search)`), when the caller keeps
    them; `words`: the event's (`content_words`), when the caller computed them once."""
    if f.ids is not None and event.id not in f.ids:
        return False
    if f.authors is not None and event.pubkey not in f.authors:
        return False
    if f.kinds is not None and event.kind not in f.kinds:
        return False
    if f.since is not None and event.created_at < f.since:
        return False
    if f.until is not None and event.created_at > f.until:
        return False
    for letter, values in f.tags.items():
        if not any(len(t) >= 2 and t[0] == letter and t[1] in values for t in event.tags):
            return False
    if f.search is None:
        return True
    return words_match(query_words(f.search) if terms is None else terms, event, words)


def matches_any(
    filters: list[Filter],
    event: Event,
    terms: list[tuple[str, ...] | None] | None = None,
    words: frozenset[str] | None = None,
) -> bool:
    """`matches` for any of `filters`; `terms`, if given, holds each filter's search
    words (None for a filter without search)."""
    if terms is None:
        return any(matches(f, event, None, words) for f in filters)
    return any(matches(f, event, t, words) for f, t in zip(filters, terms, strict=True))


def value_count(f: Filter) -> int:
    """The ids, authors, kinds and tag values a filter names (Limits.max_req_values)."""
    n = sum(map(len, f.tags.values())) if f.tags else 0
    if f.ids is not None:
        n += len(f.ids)
    if f.authors is not None:
        n += len(f.authors)
    if f.kinds is not None:
        n += len(f.kinds)
    return n


def match_key(f: Filter) -> tuple[Any, ...]:
    """Everything `matches` reads of a filter (not `limit`), hashable: filters with equal
    keys give equal verdicts for any event. Kept beside `matches`, which it mirrors."""
    ids, authors, kinds = f.ids, f.authors, f.kinds  # (built for every REQ: no calls)
    return (
        None if ids is None else tuple(ids),
        None if authors is None else tuple(authors),
        None if kinds is None else tuple(kinds),
        tuple(sorted((letter, tuple(values)) for letter, values in f.tags.items()))
        if f.tags
        else (),
        f.since,
        f.until,
        f.search,
    )
