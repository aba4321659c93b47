"""The mutation audit: each slug's versions form a hash chain (each names its predecessor's
id and value hash); across a relay set every relay should hold every version, and each
relay's head should be the newest agent version (docs/NIP-AE-HISTORY.md, *Audit*).

Findings, one per problem:
- `missing`: a version one relay holds and another lacks (naming the one that lacks it),
  or a predecessor (or a head's revision) that no relay serves;
- `fork`: two versions name the same predecessor (or both start the history):
  concurrent writers;
- `broken`: a link whose hash does not match its predecessor's value, or a version not
  newer than its predecessor, or a head that differs from the revision it names;
- `stale_head`: a relay's head is not the newest agent version (or it has none);
- `out_of_chain`: a head written without a version over an existing history (a plain
  NIP-AE head older than the first version is where history starts: clean);
- `undeleted`: a forgotten version still served.

Pure: the caller reads each relay and passes what each holds.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import NamedTuple

import msgspec

from engram.head import head_key
from engram.live import newest, older, visible
from engram.versions import AGENT, Version

KINDS = ("missing", "fork", "broken", "stale_head", "out_of_chain", "undeleted")


class Finding(NamedTuple):
    """One problem: `version` is the version id concerned (None when none is), `relay`
    the relay concerned (None: the whole set)."""

    kind: str
    slug: str
    version: str | None
    relay: str | None
    detail: str


class Holdings(NamedTuple):
    """What one relay serves of one slug: its revisions and verdicts, and every head."""

    versions: list[Version]
    heads: list[Version]


def _short(vid: str | None) -> str:
    return vid[:12] if vid else "(none)"


def _same_content(head: Version, rev: Version) -> bool:
    """A head copies its revision: the same value and members (but `rev`), same time."""
    return (
        head.text == rev.text
        and head.created_at == rev.created_at
        and msgspec.structs.replace(head.meta, rev=None) == rev.meta
    )


def audit_slug(slug: str, holdings: dict[str, Holdings]) -> list[Finding]:
    """Every finding for one slug across the relays that answered (`holdings`)."""
    out: list[Finding] = []
    union: dict[str, Version] = {}
    for h in holdings.values():
        for v in h.versions:
            union.setdefault(v.id, v)
    heads = [hv for h in holdings.values() for hv in h.heads]
    shown = [v for v in visible([*union.values(), *heads]) if not v.head]
    shown_ids = {v.id for v in shown}
    mark = next((v for v in shown if v.meta.forget), None)
    # forgotten versions (and heads holding a forgotten value) still served
    if mark is not None:
        for url, h in holdings.items():
            for v in h.versions:
                if older(v, mark):
                    out.append(Finding("undeleted", slug, v.id, url, "forgotten version"))
            for hv in h.heads:
                if older(hv, mark) and hv.text is not None:
                    out.append(Finding("undeleted", slug, hv.event.id, url, "forgotten head"))
    # every version on every relay
    for v in shown:
        for url, h in holdings.items():
            if all(x.id != v.id for x in h.versions):
                out.append(Finding("missing", slug, v.id, url, "version not served here"))
    # links: predecessors exist, hashes match, time moves forward; no two children
    children: dict[str | None, list[Version]] = defaultdict(list)
    for v in shown:
        if v is mark:
            continue  # a forget starts the history again
        children[v.meta.prev].append(v)
        if v.meta.prev is None:
            continue
        prev = union.get(v.meta.prev)
        if prev is None:
            out.append(
                Finding(
                    "missing",
                    slug,
                    v.meta.prev,
                    None,
                    f"predecessor of {_short(v.id)}, served by no relay",
                )
            )
        elif v.meta.prev_sha256 != prev.value_sha256:
            out.append(
                Finding("broken", slug, v.id, None, f"hash of {_short(prev.id)} does not match")
            )
        elif not older(prev, v):
            out.append(
                Finding(
                    "broken", slug, v.id, None, f"not newer than its predecessor {_short(prev.id)}"
                )
            )
    roots = len(children.get(None, [])) + (1 if mark is not None else 0)
    for prev, kids in children.items():
        if len(kids) > 1 or (prev is None and roots > 1):
            names = ", ".join(_short(k.id) for k in sorted(kids, key=lambda k: k.id))
            base = f"predecessor {_short(prev)}" if prev else "no predecessor"
            out.append(Finding("fork", slug, prev, None, f"{names} all name {base}"))
    out.extend(_heads(slug, holdings, union, shown_ids, shown, mark))
    return out


def _heads(
    slug: str,
    holdings: dict[str, Holdings],
    union: dict[str, Version],
    shown_ids: set[str],
    shown: list[Version],
    mark: Version | None,
) -> Iterable[Finding]:
    agent_newest = newest(v for v in shown if v.role == AGENT)
    first = shown[-1] if shown else None
    for url, h in holdings.items():
        head = min(h.heads, key=lambda v: head_key(v.created_at, v.event.id), default=None)
        if head is None:
            if agent_newest is not None:
                yield Finding(
                    "stale_head",
                    slug,
                    agent_newest.id,
                    url,
                    f"no head; the newest agent version is {_short(agent_newest.id)}",
                )
            continue
        if mark is not None and older(head, mark):
            if agent_newest is not None:
                yield Finding("stale_head", slug, head.event.id, url, "head older than the forget")
            continue
        if head.plain:
            if first is not None and not older(head, first):
                yield Finding(
                    "out_of_chain",
                    slug,
                    head.event.id,
                    url,
                    "head written without a version over an existing history",
                )
            continue
        rev = union.get(head.id)
        if rev is None or head.id not in shown_ids:
            yield Finding(
                "missing",
                slug,
                head.id,
                None,
                f"revision copied by {url}'s head, served by no relay",
            )
        elif not _same_content(head, rev):
            yield Finding("broken", slug, head.id, url, "head differs from the revision it names")
        elif agent_newest is not None and rev.id != agent_newest.id:
            yield Finding(
                "stale_head",
                slug,
                rev.id,
                url,
                f"head is {_short(rev.id)}, the newest agent version is {_short(agent_newest.id)}",
            )


def audit(slugs: dict[str, dict[str, Holdings]]) -> list[Finding]:
    """slug -> relay -> holdings: every finding, slugs in order."""
    return [f for slug in sorted(slugs) for f in audit_slug(slug, slugs[slug])]


__all__ = ["KINDS", "Finding", "Holdings", "audit", "audit_slug"]
