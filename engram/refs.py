"""NIP-AE references (spec: *References*): `[[slug]]` links, orphans and dangling links.

A reference is a literal `[[<valid slug>]]` substring: no escaping, no markup awareness,
bare slugs are not references. Nothing here deletes anything; orphans are only reported.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import NamedTuple

from engram.slug import CORE_SLUG, SLUG_MAX_BYTES, is_valid_slug


def extract_refs(text: str) -> list[str]:
    """Valid slugs inside `[[…]]`, in first-occurrence order, without duplicates.

    The first `]]` closes a reference; an inner `[[` before it restarts the scan there,
    so `[[oops [[mem/x]]` yields `mem/x` and `[[[mem/x]]]` yields nothing (its candidate
    is `[mem/x`). Candidates that are not valid slugs (too long, upper case, …) are text.
    """
    out: list[str] = []
    seen: set[str] = set()
    i = 0
    while (start := text.find("[[", i)) != -1:
        start += 2
        close = text.find("]]", start)
        if close == -1:
            break  # no `]]` anywhere after this point: no more references
        inner = text.find("[[", start, close)
        if inner != -1:
            i = inner
            continue
        candidate = text[start:close]
        if len(candidate) <= SLUG_MAX_BYTES and candidate not in seen and is_valid_slug(candidate):
            seen.add(candidate)
            out.append(candidate)
        i = close + 2
    return out


class Reachability(NamedTuple):
    """The reference graph rooted at `core`.

    reachable: live `mem/` slugs reachable from core, in breadth-first discovery order.
    orphans: live `mem/` slugs that core does not reach, sorted.
    dangling: `(source, target)` references from any live body (core first, then reachable,
        then orphans) to a slug that is absent or tombstoned, in discovery order.
    """

    reachable: list[str]
    orphans: list[str]
    dangling: list[tuple[str, str]]


def reachability(
    core_profile: str | None, values_by_slug: Mapping[str, str | None]
) -> Reachability:
    """Walk `[[…]]` links from core over `values_by_slug` (slug -> value, None = tombstone).

    `core_profile` is None when there is no core; then every live entry is an orphan.
    A `core` key in `values_by_slug` is ignored: core is given by `core_profile`.
    """
    live = {s: v for s, v in values_by_slug.items() if v is not None and s != CORE_SLUG}
    dangling: list[tuple[str, str]] = []

    def live_targets(source: str, text: str) -> list[str]:
        """References of one body that resolve; the others are recorded as dangling."""
        targets: list[str] = []
        for target in extract_refs(text):
            if target in live or (target == CORE_SLUG and core_profile is not None):
                targets.append(target)
            else:
                dangling.append((source, target))
        return targets

    reachable: list[str] = []
    visited: set[str] = set()
    queue: deque[tuple[str, str]] = deque()
    if core_profile is not None:
        queue.append((CORE_SLUG, core_profile))
    while queue:
        source, text = queue.popleft()
        for target in live_targets(source, text):
            if target != CORE_SLUG and target not in visited:
                visited.add(target)
                reachable.append(target)
                queue.append((target, live[target]))
    orphans = sorted(live.keys() - visited)
    for slug in orphans:
        live_targets(slug, live[slug])
    return Reachability(reachable, orphans, dangling)
