"""`engram mem audit`: verify every slug's hash chain across the relay set
(`engram.chain`): missing versions (naming the relay), forks, broken links, stale or
out-of-chain heads, forgotten versions still served."""

from __future__ import annotations

from cli.memory.base import MemoryBase, MemoryRead
from cli.memory.results import AuditReport
from engram.chain import audit
from engram.live import Live


class AuditOps(MemoryBase):
    """The audit methods of `AgentMemory`."""

    async def audit(self, slug: str | None = None) -> AuditReport:
        """Every finding for `slug`, or for the whole memory; `clean` when there is none.
        Relays that did not answer are named in the report (they were not audited)."""
        if slug is not None:
            slug = self.slug(slug)
            read = await self._slug_read(slug, history=True)
        else:
            read = await self._everything(history=True)
        return self._audit_of(read, slug)

    async def audited_views(self) -> tuple[dict[str, Live], AuditReport]:
        """Every slug as it reads (as `views`) and the audit of the whole memory, from one
        read of its history: for a caller that shows both (`engram review`'s list)."""
        read = await self._everything(history=True)
        return read.lives(), self._audit_of(read, None)

    @staticmethod
    def _audit_of(read: MemoryRead, slug: str | None) -> AuditReport:
        """The audit of `slug` (None: every slug) over a history read."""
        holdings = read.holdings if slug is None else {slug: read.holdings.get(slug, {})}
        findings = audit({s: h for s, h in holdings.items() if h})
        versions = {v.id for vs in read.versions.values() for v in vs if not v.head or v.plain}
        return AuditReport(findings, len(read.versions), len(versions), read.report)
