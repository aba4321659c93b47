"""What the pages show of a memory: one read of the whole memory across the relay set, as
rows, each what its slug reads as under the memory's rule (`engram.live`: owner verdicts
outrank the agent's own state; removed, denied and forgotten memories have no value).

A row carries the version that decides the slug (its id, time, the key that signed it,
agent or owner, trust, source, validity). Reading goes through `AgentMemory` only.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cli.memory.api import AgentMemory, SetReport
from engram import CORE_SLUG, d_tag, extract_refs, reachability


@dataclass(frozen=True)
class Row:
    """One slug as it reads. `value` is None for a removed, denied or forgotten memory;
    `event_id` names the version that decides it (a revision, an owner verdict, or a
    plain NIP-AE head)."""

    slug: str
    value: str | None
    event_id: str
    created_at: int
    author: str  # the signing key, hex
    role: str  # "agent" or "owner"
    d: str  # the blinded address the relays already see (no content)
    trust: str | None = None  # issue 39: guess | stated | confirmed | denied
    source: str | None = None
    valid_from: int | None = None
    valid_until: int | None = None
    audit: str | None = None  # issue 39: "clean" or what `audit` found


@dataclass(frozen=True)
class Snapshot:
    """Live memories, core and removed (also denied, forgotten) memories, with what the
    relay set said."""

    live: dict[str, Row]
    core: Row | None
    removed: dict[str, Row]
    report: SetReport
    edges: dict[str, list[str]] = field(default_factory=dict)  # slug -> [[refs]] in order

    def referenced_by(self, slug: str) -> list[str]:
        """Slugs (core first) whose value links to `slug`."""
        return [source for source, targets in self.edges.items() if slug in targets]

    def refs_of(self, slug: str) -> list[tuple[str, bool]]:
        """`[[links]]` of `slug`, each with whether it resolves to a live memory."""
        return [(t, t in self.live or t == CORE_SLUG) for t in self.edges.get(slug, [])]

    def graph(self) -> tuple[list[str], list[str], list[tuple[str, str]]]:
        """Reachable, orphans, dangling `(from, to)`: `engram.reachability`, the one rule."""
        values = {s: r.value for s, r in self.live.items()}
        profile = self.core.value if self.core is not None else None
        found = reachability(profile, values)
        return found.reachable, found.orphans, found.dangling


async def take(memory: AgentMemory) -> Snapshot:
    """Every slug as it reads, across the relay set (one read)."""
    views, report = await memory.views()
    ident = memory.identity
    live: dict[str, Row] = {}
    removed: dict[str, Row] = {}
    core: Row | None = None
    for slug, view in views.items():
        version = view.version
        if version is None:
            continue
        meta = version.meta
        value = view.text
        row = Row(
            slug,
            value,
            version.id,
            version.created_at,
            version.author,
            version.role,
            d_tag(ident.conversation_key, slug),
            trust=meta.trust,
            source=meta.source,
            valid_from=meta.valid_from,
            valid_until=meta.valid_until,
        )
        if slug == CORE_SLUG:
            core = row if value is not None else None
        elif value is None:
            removed[slug] = row
        else:
            live[slug] = row
    edges = {s: extract_refs(r.value or "") for s, r in live.items()}
    if core is not None:
        edges = {CORE_SLUG: extract_refs(core.value or ""), **edges}
    return Snapshot(live, core, removed, report, edges)
