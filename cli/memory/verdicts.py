"""Owner verdicts and forgetting: `confirm`, `deny` (the owner's key alone, `--agent`), and
`forget` (either key: a history barrier, then NIP-09 deletion of what that key signed,
then a check of what every relay still serves).

A verdict is a version of kind 4175, signed by the owner and readable by agent and owner
only; `engram.live` makes it outrank the agent's own state.
"""

from __future__ import annotations

import os

from cli.memory.base import MemoryBase, MemoryRead
from cli.memory.results import ForgetReport, WriteResult, sha256_hex
from cli.nostr.errors import BadInputError, BaseChangedError, NotFoundError
from cli.nostr.relayset import RelaySession
from engram import CORE_SLUG, KIND_ENGRAM, KIND_REVISION, KIND_VERDICT
from engram.chain import audit_slug
from engram.live import CONFIRMED, DENIED, rejections
from engram.nip01 import Event
from engram.versions import DELETION_IDS_MAX, OWNER, Meta, build_deletions

__all__ = ["VerdictOps"]


def owner_only(what: str) -> str:
    return (
        f"only the owner can {what}: hold the owner's key and name the agent with --agent "
        "(the agent's own key never writes verdicts)"
    )


class VerdictOps(MemoryBase):
    """The verdict and forget methods of `AgentMemory`."""

    def _owner(self, what: str) -> None:
        if self.role != OWNER:
            raise BadInputError(owner_only(what))

    async def _verdict(
        self,
        slug: str,
        make: str,
        *,
        source: str | None,
        reason: str | None,
        base_hash: str | None,
    ) -> WriteResult:
        slug = self.slug(slug)
        async with self.slug_history(slug) as opened:
            lv = opened.read.live(slug)
            if not lv.live or lv.version is None or lv.text is None:
                raise self._not_found(opened.read, slug, lv)
            if base_hash is not None and sha256_hex(lv.text) != base_hash.lower():
                raise BaseChangedError(
                    f"{slug}: the value changed since it was read (now version "
                    f"{lv.version.id}); nothing was {make}"
                )
            old = lv.version.meta
            if make == CONFIRMED:
                text: str | None = lv.text
                meta = Meta(
                    trust=CONFIRMED,
                    source=source,
                    valid_from=old.valid_from,
                    valid_until=old.valid_until,
                )
            else:
                text = None
                meta = Meta(trust=DENIED, reason=reason, rejected=(sha256_hex(lv.text),))
            return await self._publish(opened, text, meta)

    async def confirm(
        self, slug: str, *, source: str | None = None, base_hash: str | None = None
    ) -> WriteResult:
        """The owner confirms the live value: a verdict (trust `confirmed`) with that value,
        which the agent then needs force to write over. `base_hash`: the sha256 of the
        value the owner saw; another live value is a BaseChangedError (nothing written)."""
        self._owner("confirm")
        return await self._verdict(slug, CONFIRMED, source=source, reason=None, base_hash=base_hash)

    async def deny(
        self, slug: str, *, reason: str | None = None, base_hash: str | None = None
    ) -> WriteResult:
        """The owner denies the live value: the slug reads as absent, and the agent can
        never write that value again (only the owner can, by correcting to it).
        `base_hash` as for `confirm`."""
        self._owner("deny")
        return await self._verdict(slug, DENIED, source=None, reason=reason, base_hash=base_hash)

    async def forget(self, slug: str, *, reason: str | None = None) -> ForgetReport:
        """Forget `slug`: write a forget (every older version is hidden from every read,
        and the values it had stay rejected), ask every relay to delete the versions this
        key signed (NIP-09), then read every relay again: `still_serving` names those that
        serve any forgotten version (including the other key's, which only it can delete)."""
        slug = self.slug(slug)
        if slug == CORE_SLUG:
            raise BadInputError("core cannot be forgotten; write a new profile instead")
        async with self.slug_history(slug) as opened:
            base, session = opened.read, opened.session
            versions = base.versions.get(slug, [])
            if not versions:
                raise NotFoundError(f"not found: {slug} (nothing to forget)")
            hashes = set(rejections(versions))  # rejections outlive the forgotten history
            if (current := base.live(slug).text) is not None:
                hashes.add(sha256_hex(current))
            meta = Meta(forget=True, reason=reason, rejected=tuple(sorted(hashes)))
            mine = self._signed_by_me(base, slug)
            written = await self._publish(opened, None, meta, link=False)
            deletions = await self._delete(session, mine)
            again = await opened.reread()
            still = self._still_serving(again, slug)
            incomplete = {**base.report.incomplete, **again.report.incomplete}
            report = self._report(session, opened.checker, session.live, incomplete=incomplete)
            return ForgetReport(slug, written, deletions, len(mine), still, report)

    def _signed_by_me(self, read: MemoryRead, slug: str) -> list[Event]:
        kinds = {KIND_VERDICT} if self.role == OWNER else {KIND_ENGRAM, KIND_REVISION}
        me = self.identity.me
        seen = {
            v.event.id: v.event
            for v in read.versions.get(slug, [])
            if v.event.kind in kinds and v.event.pubkey == me
        }
        for holdings in read.holdings.get(slug, {}).values():
            for v in [*holdings.versions, *holdings.heads]:
                if v.event.kind in kinds and v.event.pubkey == me:
                    seen[v.event.id] = v.event
        return list(seen.values())

    async def _delete(self, session: RelaySession, events: list[Event]) -> str:
        """NIP-09 requests for `events` to every live relay; the first request's id."""
        if not events:
            return ""
        aux = [os.urandom(32) for _ in range(len(events) // DELETION_IDS_MAX + 1)]
        requests = build_deletions(self.identity.seckey, events, self.now(), aux)
        await session.on_each(lambda c: c.try_publish_many(requests))
        return requests[0].id

    @staticmethod
    def _still_serving(again: MemoryRead, slug: str) -> dict[str, list[str]]:
        """relay -> forgotten version (or head) ids it still serves, in a fresh read."""
        out: dict[str, list[str]] = {url: [] for url in again.holdings.get(slug, {})}
        for finding in audit_slug(slug, again.holdings.get(slug, {})):
            if finding.kind == "undeleted" and finding.relay and finding.version:
                out.setdefault(finding.relay, []).append(finding.version)
        return out
