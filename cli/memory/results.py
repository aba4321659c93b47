"""The results of `AgentMemory` calls: plain frozen data, with what each says about the
relay set (`SetReport`). No I/O; the CLI and the MCP server format them."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from cli.memory.search import Match
from engram.chain import Finding
from engram.live import Live

SKIP_REASONS = {
    1: "bad envelope",
    2: "bad signature",
    3: "undecryptable",
    4: "slug mismatch",
    5: "bad body",
}


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- results ----------------------------------------------------------------------------


@dataclass(frozen=True)
class SetReport:
    """What a result says about the relay set, besides its answer.

    failed: relay -> why it did not take part (connection, timeout, refusal).
    behind: relay -> how many slugs it holds an older head for, or none (`engram mem sync`).
    incomplete: relay -> why its listing may be partial (paging made no progress).
    skipped: reason -> events that failed verification, validation or decryption.
    """

    relays: tuple[str, ...] = ()
    answered: tuple[str, ...] = ()
    failed: dict[str, str] = field(default_factory=dict)
    behind: dict[str, int] = field(default_factory=dict)
    incomplete: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values())

    def skipped_line(self) -> str | None:
        """`3 events skipped: 2 bad signature, 1 undecryptable`, or None."""
        if not self.skipped_total:
            return None
        parts = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
        noun = "event" if self.skipped_total == 1 else "events"
        return f"{self.skipped_total} {noun} skipped: {parts}"

    def warnings(self) -> list[str]:
        """One line per thing worth telling the user, for stderr."""
        lines = [f"{url}: {reason}" for url, reason in self.failed.items()]
        lines += [
            f"{url}: listing may be incomplete: {why}" for url, why in self.incomplete.items()
        ]
        if self.behind:
            names = ", ".join(
                f"{url} ({n} slug{'s' if n != 1 else ''})" for url, n in self.behind.items()
            )
            lines.append(f"relays behind the newest heads: {names}; run `engram mem sync`")
        if (line := self.skipped_line()) is not None:
            lines.append(line)
        return lines

    def as_json(self) -> dict[str, Any]:
        return {
            "relays": list(self.relays),
            "answered": list(self.answered),
            "failed": self.failed,
            "behind": self.behind,
            "incomplete": self.incomplete,
            "skipped": {"total": self.skipped_total, **self.skipped},
        }


class LiveEntry(msgspec.Struct, frozen=True):
    """One memory as it reads now (`ls`, `--json` members): the live version's id (a
    revision, an owner verdict, or a plain NIP-AE head), who wrote it (`role` agent or
    owner, `author` the key), its trust and source, its validity window and whether
    that has `ended`, and its value's sha256."""

    slug: str
    event_id: str
    created_at: int
    trust: str | None
    role: str
    author: str
    source: str | None
    valid_from: int | None
    valid_until: int | None
    ended: bool
    sha256: str


class LiveView(LiveEntry, frozen=True):
    """A `LiveEntry` with its value: what `AgentMemory.live` returns (for recall)."""

    value: str = ""


@dataclass(frozen=True)
class Entry:
    """A memory (or core's profile) as read: its text, the version that holds it (its
    id, who wrote it, trust, source, validity) and what the relays said."""

    slug: str
    value: str
    event_id: str
    created_at: int
    sha256: str
    report: SetReport
    trust: str | None = None
    role: str = "agent"
    author: str = ""
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None
    ended: bool = False

    def as_json(self) -> dict[str, Any]:
        """`get --json`: the value and the members `log --json` gives each version."""
        return {
            "slug": self.slug,
            "value": self.value,
            "id": self.event_id,
            "created_at": self.created_at,
            "author": self.author,
            "role": self.role,
            "trust": self.trust,
            "source": self.source,
            "valid_from": self.valid_from,
            "valid_until": self.valid_until,
            "ended": self.ended,
            "value_sha256": self.sha256,
        }


@dataclass(frozen=True)
class WriteResult:
    """A published write. `accepted` relays hold it as their head (verified by re-reading);
    `refused` names the others with their reason. A dry-run patch has `event_id` "" and
    carries the text it would have written in `value`."""

    slug: str
    event_id: str
    created_at: int
    sha256: str | None
    accepted: tuple[str, ...]
    refused: dict[str, str]
    report: SetReport
    value: str | None = None
    similar: tuple[Similar, ...] = ()  # write-time hints (`set`): close existing memories
    role: str = "agent"
    trust: str | None = None
    head_id: str | None = None  # the agent's NIP-AE head written with the version


@dataclass(frozen=True)
class Similar:
    """An existing memory close to a value just written: patch or merge it rather than
    keep a near-duplicate. `score` is the cosine similarity of the two (1.0: the same)."""

    slug: str
    score: float
    created_at: int
    event_id: str


@dataclass(frozen=True)
class Listing:
    """Live memories (core, removed, denied and forgotten ones omitted), sorted by slug."""

    entries: list[LiveEntry]
    report: SetReport


@dataclass(frozen=True)
class LiveSet:
    """Every live memory with its value, core included (slug "core"): the read `ls`,
    `search` and recall share."""

    views: dict[str, LiveView]
    report: SetReport


class VersionInfo(msgspec.Struct, frozen=True):
    """One version in `log` (`--json` members). `state`: `value`, `removed` (a
    tombstone), `denied` (an owner's denial), `forgotten` (a forget), or `withheld` (a
    value the owner denied: listed, never shown). `plain`: a NIP-AE head written without
    the extension."""

    id: str
    created_at: int
    author: str
    role: str
    trust: str | None
    source: str | None
    valid_from: int | None
    valid_until: int | None
    value_sha256: str | None
    prev: str | None
    state: str
    reason: str | None
    plain: bool


@dataclass(frozen=True)
class Log:
    """A slug's versions, newest first (forgotten ones never listed); iterating a Log
    iterates its versions. `values`: version id -> its value, for the versions whose
    `state` is `value` only (never a withheld, removed or forgotten one): what a history
    page shows and diffs without a read per version."""

    slug: str
    versions: list[VersionInfo]
    report: SetReport
    values: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[VersionInfo]:
        return iter(self.versions)

    def __len__(self) -> int:
        return len(self.versions)


@dataclass(frozen=True)
class Diff:
    """A unified diff from version `old` to version `new` (empty when equal)."""

    slug: str
    old: VersionInfo
    new: VersionInfo
    text: str
    report: SetReport


@dataclass(frozen=True)
class AuditReport:
    """`engram mem audit`: every finding (engram.chain.Finding) across the set."""

    findings: list[Finding]
    slugs: int
    versions: int
    report: SetReport

    @property
    def clean(self) -> bool:
        return not self.findings


@dataclass(frozen=True)
class Inspection:
    """One memory from one read of its history (`AgentMemory.inspect`): what it reads as
    (`engram.live.Live`), its versions (`log`, None when it has none), its audit, and
    what the relay set said."""

    slug: str
    live: Live
    log: Log | None
    audit: AuditReport
    report: SetReport


@dataclass(frozen=True)
class ForgetReport:
    """`engram mem forget`: the forget written, the NIP-09 request sent, and relay ->
    the version ids it still serves afterwards (`ok` when none does)."""

    slug: str
    forget: WriteResult
    deletion_id: str
    deleted: int
    still_serving: dict[str, list[str]]
    report: SetReport

    @property
    def ok(self) -> bool:
        return not any(self.still_serving.values())


@dataclass(frozen=True)
class Refs:
    """Reachability from core: reachable slugs, orphans and dangling `(from, to)` links."""

    has_core: bool
    reachable: list[str]
    orphans: list[str]
    dangling: list[tuple[str, str]]
    report: SetReport
    trust: dict[str, str | None] = field(default_factory=dict)  # live slug -> its trust
    ended: list[str] = field(default_factory=list)  # live slugs whose validity has ended


class Matches(list[Match]):
    """The search hits (a list) plus the `report` of the reads behind them."""

    report: SetReport


@dataclass(frozen=True)
class RelaySync:
    """What a sync, migration or import did on one relay."""

    published: int = 0
    up_to_date: int = 0
    refused: dict[str, str] = field(default_factory=dict)  # event id -> reason
    error: str | None = None
    method: str | None = None  # how its holdings were learnt: "negentropy" or "req"

    def line(self) -> str:
        if self.error is not None:
            return f"failed: {self.error}"
        text = f"{self.published} republished, {self.up_to_date} already there"
        text += f", {len(self.refused)} refused" if self.refused else ""
        return text + (f" (via {self.method})" if self.method else "")


@dataclass(frozen=True)
class SyncReport:
    heads: int
    relays: dict[str, RelaySync]
    report: SetReport

    @property
    def ok(self) -> bool:
        return all(r.error is None and not r.refused for r in self.relays.values())


@dataclass(frozen=True)
class MigrateReport:
    """`missing`: target -> slugs whose head could not be read back there."""

    heads: int
    targets: dict[str, RelaySync]
    missing: dict[str, list[str]]
    report: SetReport

    @property
    def ok(self) -> bool:
        return not any(self.missing.values())


@dataclass(frozen=True)
class ExportReport:
    path: str
    heads: int
    report: SetReport


@dataclass(frozen=True)
class ImportReport:
    events: int  # valid events in the file
    relays: dict[str, RelaySync]
    report: SetReport  # `skipped` counts the file's invalid lines and events


@dataclass(frozen=True)
class CoreRead:
    """The fetch hook's three outcomes: `profile` (a valid core was read), `absent`
    (every relay answered and none holds a core candidate), `unknown` (anything else:
    never teach the agent it has no memory because a read failed)."""

    status: Literal["profile", "absent", "unknown"]
    profile: str | None = None
    reason: str = ""
    trust: str | None = None
    role: str = "agent"
    ended: bool = False
