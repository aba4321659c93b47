"""What the pages show of a memory: one read of the whole memory across the relay set, as
rows, each what its slug reads as under the memory's rule (`engram.live`: owner verdicts
outrank the agent's own state; removed, denied and forgotten memories have no value).

A row carries the version that decides the slug (its id, time, the key that signed it,
agent or owner, trust, source, validity) and, for a memory that does not read as live,
its state and the reason the tombstone, denial or forget gave. Reading goes through
`AgentMemory` only, one read per page: `views()`, or `audited_views()` for the list,
whose audit column comes from the same read of the whole history.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cached_property

from cli.memory.api import AgentMemory, AuditReport, SetReport
from engram import CORE_SLUG, d_tag, extract_refs, reachability
from engram.chain import Finding
from engram.live import DENIED, LIVE, Live

CLEAN = "clean"


@dataclass(frozen=True)
class Row:
    """One slug as it reads. `value` is None unless `state` is live; `event_id` names the
    version that decides it (a revision, an owner verdict, or a plain NIP-AE head)."""

    slug: str
    value: str | None
    event_id: str
    created_at: int
    author: str  # the signing key, hex
    role: str  # "agent" or "owner"
    d: str  # the blinded address the relays already see (no content)
    trust: str | None = None  # guess | stated | confirmed | denied
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None
    audit: str | None = None  # "clean", the audit's finding kinds, or None (not audited)
    state: str = LIVE  # live | removed | denied | forgotten (engram.live)
    reason: str | None = None  # why it was removed, denied or forgotten

    @property
    def live(self) -> bool:
        return self.state == LIVE


@dataclass(frozen=True)
class Snapshot:
    """Live memories, core, and the memories that do not read as live (removed, denied,
    forgotten: `gone`, never with a value), with what the relay set said. The links
    (`edges`) and the reachability from core (`graph`) are worked out once, when a page
    first asks: each is a walk over every value."""

    live: dict[str, Row]
    core: Row | None
    gone: dict[str, Row]
    report: SetReport
    findings: dict[str, list[Finding]] = field(default_factory=dict)  # slug -> audit findings

    @property
    def complete(self) -> bool:
        """Every relay of the set answered and was read to the end. Otherwise a memory
        may be missing, or show an older version than some relay holds: the pages say
        so, nothing is reported gone for not being read, and no visit mark is taken."""
        return not self.report.failed and not self.report.incomplete

    @cached_property
    def edges(self) -> dict[str, list[str]]:
        """slug -> its value's `[[links]]` in order (core first), for every live memory."""
        rows = [*([self.core] if self.core is not None else []), *self.live.values()]
        return {r.slug: extract_refs(r.value or "") for r in rows}

    @cached_property
    def graph(self) -> tuple[list[str], list[str], list[tuple[str, str]]]:
        """Reachable, orphans, dangling `(from, to)`: `engram.reachability`, the one rule."""
        values = {s: r.value for s, r in self.live.items()}
        profile = self.core.value if self.core is not None else None
        found = reachability(profile, values)
        return found.reachable, found.orphans, found.dangling


def row_of(view: Live, conversation_key: bytes) -> Row | None:
    """`view` (what a slug reads as) as a row; None when it has no version at all."""
    version = view.version
    if version is None:
        return None
    meta = version.meta
    decider = view.denial or version  # a withheld value: the verdict says why
    return Row(
        view.slug,
        view.text,
        version.id,
        version.created_at,
        version.author,
        version.role,
        d_tag(conversation_key, view.slug),
        trust=DENIED if view.state == DENIED else meta.trust,
        source=meta.source if view.live else None,
        valid_from=meta.valid_from if view.live else None,
        valid_until=meta.valid_until if view.live else None,
        state=view.state,
        reason=None if view.live else decider.meta.reason,
    )


async def take(memory: AgentMemory, *, audit: bool = False) -> Snapshot:
    """Every slug as it reads, across the relay set, from one read: of the heads and
    verdicts, or (`audit`) of the whole history, which also gives the mutation audit of
    the whole memory and fills each row's `audit`."""
    audited: AuditReport | None = None
    if audit:
        views, audited = await memory.audited_views()
        report = audited.report
    else:
        views, report = await memory.views()
    key = memory.identity.conversation_key
    live: dict[str, Row] = {}
    gone: dict[str, Row] = {}
    core: Row | None = None
    for slug, view in views.items():
        row = row_of(view, key)
        if row is None:
            continue
        if not view.live:
            gone[slug] = row
        elif slug == CORE_SLUG:
            core = row
        else:
            live[slug] = row
    findings: dict[str, list[Finding]] = defaultdict(list)
    if audited is not None:
        for finding in audited.findings:
            findings[finding.slug].append(finding)

        def audited_row(r: Row) -> Row:
            kinds = sorted({f.kind for f in findings.get(r.slug, [])})
            return replace(r, audit=", ".join(kinds) or CLEAN)

        live = {s: audited_row(r) for s, r in live.items()}
        gone = {s: audited_row(r) for s, r in gone.items()}
        core = audited_row(core) if core is not None else None
    return Snapshot(live, core, gone, report, dict(findings))
