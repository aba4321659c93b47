"""Local search over decrypted memory: the relay only ever sees ciphertext, so the
query is matched here, after decryption, and never sent anywhere.

A caller's regular expression is hostile input twice over. Matching can backtrack
catastrophically (`(a|aa)+$`), and a match in CPython's `re` cannot be interrupted:
patterns are matched with the `regex` module instead, whose matches take a timeout (the
whole search gets `MATCH_SECONDS` and releases the GIL while matching, `concurrent=True`).
Compiling can blow up too: `regex` writes every counted repeat out, so
`((a{200}){200}){100}` compiles to four million nodes (seconds of CPU, a gigabyte) and
`(?:x{65535}){1000}` exhausts memory. So before anything is compiled the pattern is
parsed (Python's own `re` parser, which builds a tree and expands nothing) and refused,
naming the limit, when it is longer than `QUERY_MAX` characters, nests groups and
repeats deeper than `DEPTH_MAX`, or would stand for more than `EXPANDED_MAX` nodes once
its counted repeats are written out. Compiling and matching then run in a worker thread
with a deadline (`compiled`, `search_views` under `asyncio.to_thread`), never on the
event loop that serves other calls. Patterns use Python's `re` syntax.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from re import _parser as re_parser  # the stdlib's pattern parser: a tree, nothing expanded
from typing import Any, Protocol

import regex

from cli.nostr.errors import BadInputError

SNIPPET = 80  # characters of context shown around a match
MATCH_SECONDS = 2.0  # for matching one query against every memory
COMPILE_SECONDS = 2.0  # for compiling one (bounded) query
QUERY_MAX = 1_000  # characters of a search query, text or regular expression
DEPTH_MAX = 20  # groups and repeats nested in one another
EXPANDED_MAX = 10_000  # nodes a pattern stands for once its counted repeats are written out
_REPEATS = (re_parser.MAX_REPEAT, re_parser.MIN_REPEAT, re_parser.POSSESSIVE_REPEAT)


@dataclass(frozen=True)
class Match:
    """One search hit: a one-line snippet around the match; higher `score` ranks first;
    the version's trust and validity, as `ls` shows them."""

    slug: str
    snippet: str
    created_at: int
    event_id: str
    score: int
    trust: str | None = None
    role: str = "agent"
    valid_until: int | None = None
    ended: bool = False


class Searchable(Protocol):
    """A live memory as `AgentMemory.live` gives it (cli.memory.results.LiveView)."""

    value: str
    created_at: int
    event_id: str
    trust: str | None
    role: str
    valid_until: int | None
    ended: bool


def _one_line(text: str) -> str:
    return " ".join(text.split())


def snippet(text: str, start: int, end: int, width: int = SNIPPET) -> str:
    """A one-line excerpt of `text` around `[start, end)`, with … where it was cut."""
    pad = max((width - (end - start)) // 2, 10)
    lo, hi = max(start - pad, 0), min(end + pad, len(text))
    return ("…" if lo else "") + _one_line(text[lo:hi]) + ("…" if hi < len(text) else "")


def compile_query(query: str, is_regex: bool) -> regex.Pattern[str]:
    """The case-insensitive pattern for `query` (a literal text unless `is_regex`), within
    the limits above (BadInputError naming the limit otherwise). Blocking: call it through
    `compiled` from async code."""
    if not query:
        raise BadInputError("the search query is empty")
    if len(query) > QUERY_MAX:
        raise BadInputError(
            f"the search query is {len(query):,} characters long; at most {QUERY_MAX:,}"
        )
    if is_regex:
        check_pattern(query)
    try:
        return regex.compile(query if is_regex else regex.escape(query), regex.IGNORECASE)
    except regex.error as exc:
        raise BadInputError(f"invalid regular expression: {exc}") from exc


async def compiled(
    query: str, is_regex: bool, seconds: float = COMPILE_SECONDS
) -> regex.Pattern[str]:
    """`compile_query` in a worker thread, given `seconds` (BadInputError past them): the
    event loop goes on serving other calls meanwhile."""
    try:
        return await asyncio.wait_for(asyncio.to_thread(compile_query, query, is_regex), seconds)
    except TimeoutError:
        raise BadInputError(
            f"the regular expression did not compile within {seconds:g} s: simplify it"
        ) from None


def check_pattern(pattern: str) -> None:
    """BadInputError unless `pattern` parses (Python `re` syntax) within `DEPTH_MAX` and
    `EXPANDED_MAX`; nothing is compiled or expanded to find out."""
    try:
        tree = re_parser.parse(pattern, re.IGNORECASE)
    except re.error as exc:
        raise BadInputError(f"invalid regular expression: {exc}") from exc
    except RecursionError:
        raise BadInputError(
            f"the regular expression nests groups and repeats more than {DEPTH_MAX} deep"
        ) from None
    expanded(tree)


def expanded(tree: Any, depth: int = 0) -> int:
    """How many nodes the parsed pattern `tree` stands for once every counted repeat is
    written out (an unbounded repeat counts its minimum, at least once): what `regex`
    builds when it compiles. BadInputError as soon as it passes `EXPANDED_MAX`, or the
    nesting passes `DEPTH_MAX`."""
    if depth > DEPTH_MAX:
        raise BadInputError(
            f"the regular expression nests groups and repeats more than {DEPTH_MAX} deep"
        )
    total = 0
    for op, av in tree:
        if op in _REPEATS:
            low, high, item = av
            times = max(low if high == re_parser.MAXREPEAT else high, 1)
            total += times * expanded(item, depth + 1)
        else:
            total += 1 + sum(expanded(sub, depth + 1) for sub in _inner(av))
        if total > EXPANDED_MAX:
            raise BadInputError(
                "the regular expression repeats too much: written out, its counted repeats "
                f"come to more than {EXPANDED_MAX:,} elements; simplify it"
            )
    return total


def _inner(av: Any) -> Iterator[Any]:
    """The subpatterns inside one node's argument (a group's, a branch's, an assertion's,
    a conditional's), wherever that node's shape keeps them."""
    if isinstance(av, re_parser.SubPattern):
        yield av
    elif isinstance(av, list | tuple):
        for x in av:
            yield from _inner(x)


def search_views(
    views: Mapping[str, Searchable],
    pattern: regex.Pattern[str],
    limit: int,
    seconds: float = MATCH_SECONDS,
) -> list[Match]:
    """Live memories (core included) whose slug or text matches, best first.

    Score: a match in the slug counts 10, each match in the text 1 (up to 10); ties go
    to the newer entry, then the slug. Matching stops after `seconds` (BadInputError).
    """
    end = time.monotonic() + seconds

    def left() -> float:
        return max(end - time.monotonic(), 0.001)

    try:
        return _search(views, pattern, limit, left)
    except TimeoutError as exc:
        raise BadInputError(
            f"the regular expression did not finish matching within {seconds:g} s "
            "(it backtracks too much): simplify it"
        ) from exc


def _search(
    views: Mapping[str, Searchable],
    pattern: regex.Pattern[str],
    limit: int,
    left: Callable[[], float],
) -> list[Match]:
    found: list[Match] = []
    for slug, view in views.items():
        text = view.value
        in_slug = pattern.search(slug, timeout=left(), concurrent=True) is not None
        hits = []
        for hit in pattern.finditer(text, timeout=left(), concurrent=True):
            hits.append(hit)
            if len(hits) > 10:
                break  # the score counts at most 10
        if not in_slug and not hits:
            continue
        score = (10 if in_slug else 0) + min(len(hits), 10)
        if hits:
            shown = snippet(text, hits[0].start(), hits[0].end())
        else:
            shown = _one_line(text[:SNIPPET]) + ("…" if len(text) > SNIPPET else "")
        found.append(
            Match(
                slug,
                shown,
                view.created_at,
                view.event_id,
                score,
                view.trust,
                view.role,
                view.valid_until,
                view.ended,
            )
        )
    found.sort(key=lambda m: (-m.score, -m.created_at, m.slug))
    return found[:limit]
