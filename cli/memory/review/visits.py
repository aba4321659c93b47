"""What changed since the owner's last visit, and the mark that remembers the visit.

The mark is one small JSON file per memory `(agent, owner, side)` under the user's data
directory (`platformdirs`, e.g. ~/.local/share/engram-relay/review/), written 0600 in a
0700 directory. It holds no decrypted content: each memory is named by its blinded `d`
tag (the address every relay already sees) with the event id and time of its head.

A visit is one run of `engram review`: the mark read at start is the baseline of the
changes page for the server's life; the owner moves it on the page ("mark as seen"), and
when the server stops it is moved to the heads last shown on any page. Only a complete
read (every relay answered, each read to the end) makes a mark: a partial one would
drop the memories it missed, and the next visit would call them new.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from cli.memory.review.snapshot import Row, Snapshot
from cli.nostr.files import data_dir, open_private

MARK_VERSION = 1


def state_dir() -> Path:
    return data_dir("review")


@dataclass(frozen=True)
class Mark:
    """Heads as last seen: d tag -> (event id, created_at), and when."""

    seen_at: int
    heads: dict[str, tuple[str, int]]

    @classmethod
    def of(cls, snapshot: Snapshot, now: int) -> Mark:
        rows = [*snapshot.live.values(), *([snapshot.core] if snapshot.core else [])]
        return cls(now, {r.d: (r.event_id, r.created_at) for r in rows})


def mark_path(agent: str, owner: str, as_owner: bool, root: Path | None = None) -> Path:
    side = "owner" if as_owner else "agent"
    name = hashlib.sha256(f"{agent}:{owner}:{side}".encode()).hexdigest()[:32]
    return (root or state_dir()) / f"{name}.json"


def load(path: Path) -> Mark | None:
    """The mark, or None when there is none (or it is unreadable: then it starts over)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if data.get("version") != MARK_VERSION:
            return None
        heads = {str(d): (str(v[0]), int(v[1])) for d, v in data["heads"].items()}
        return Mark(int(data["seen_at"]), heads)
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        return None


def save(path: Path, mark: Mark) -> None:
    """Atomically, 0600 in a 0700 directory."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    data = {
        "version": MARK_VERSION,
        "seen_at": mark.seen_at,
        "heads": {d: list(v) for d, v in sorted(mark.heads.items())},
    }
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open_private(tmp) as fh:  # 0600 even over a leftover of a wider mode
            fh.write(json.dumps(data).encode())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@dataclass(frozen=True)
class Change:
    kind: str  # "new" | "changed" | "removed" | "denied" | "forgotten"
    slug: str | None  # None: a head that is gone from every relay, not even a tombstone
    row: Row | None  # what it reads as now (a removal, denial or forget: no value)


@dataclass(frozen=True)
class Changes:
    """The changes against a mark, and how many memories of the mark this read did not
    find but cannot call gone (`unread`: a relay failed or was not read to the end)."""

    items: list[Change]
    unread: int = 0


def changes(snapshot: Snapshot, mark: Mark | None) -> Changes:
    """New and changed memories (newest first), then those no longer live (removed,
    denied, forgotten), against `mark`. A memory the read did not find is gone only when
    the read is complete; otherwise it is counted in `unread`, never reported gone."""
    seen = mark.heads if mark is not None else {}
    rows = [*snapshot.live.values(), *([snapshot.core] if snapshot.core else [])]
    out = [
        Change("new" if r.d not in seen else "changed", r.slug, r)
        for r in sorted(rows, key=lambda r: (-r.created_at, r.slug))
        if seen.get(r.d, ("", 0))[0] != r.event_id
    ]
    now_live = {r.d for r in rows}
    tombs = {r.d: r for r in snapshot.gone.values()}
    unread = 0
    for d in sorted(seen):
        if d not in now_live:
            row = tombs.get(d)
            if row is None and not snapshot.complete:
                unread += 1
                continue
            out.append(Change(row.state if row else "removed", row.slug if row else None, row))
    return Changes(out, unread)
