"""A memory's past: `log`, `diff`, `revert`, and reading one version (`get --rev`).

Every version comes from the relays (revisions, owner verdicts, heads) and every rule of
what may be shown is `engram.live`'s: forgotten versions are never listed, a value the
owner denied is listed (its hash, never its text) and never shown; `revert` writes a new
version, never a rewrite of the past.
"""

from __future__ import annotations

import difflib

from cli.memory.base import MemoryBase, MemoryRead
from cli.memory.results import Diff, Log, VersionInfo, WriteResult
from cli.nostr.errors import BadInputError, NotFoundError
from engram import EngramError
from engram.live import (
    LIVE,
    Live,
    classify,
    resolve,
    visible,
    write_trust,
)
from engram.versions import AGENT, AGENT_TRUST, Meta, Version

NO_NEWLINE = "\\ No newline at end of file\n"


def info(version: Version, live: Live) -> VersionInfo:
    """A version as `log` lists it; `state` says whether its value may be shown."""
    meta = version.meta
    state = "value" if live.state == LIVE else live.state
    if version.text is not None and live.state != LIVE:
        state = "withheld"
    return VersionInfo(
        id=version.id,
        created_at=version.created_at,
        author=version.author,
        role=version.role,
        trust=meta.trust,
        source=meta.source,
        valid_from=meta.valid_from,
        valid_until=meta.valid_until,
        value_sha256=version.value_sha256,
        prev=meta.prev,
        state=state,
        reason=meta.reason,
        plain=version.plain,
    )


def unified(old: str, new: str, old_name: str, new_name: str) -> str:
    """A unified diff `engram mem patch` applies (with "no newline" markers)."""
    lines = []
    for line in difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), old_name, new_name
    ):
        lines.append(line)
        if not line.endswith("\n"):
            lines[-1] += "\n"
            lines.append(NO_NEWLINE)
    return "".join(lines)


class HistoryOps(MemoryBase):
    """The history methods of `AgentMemory`."""

    def _version(self, read: MemoryRead, slug: str, ref: str) -> Version:
        try:
            version = resolve(read.versions.get(slug, []), ref)
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc
        if version is None:
            raise NotFoundError(f"{slug}: no version {ref}")
        return version

    def _version_live(self, read: MemoryRead, slug: str, ref: str) -> Live:
        """What version `ref` of `slug` reads as (its value, or why it has none)."""
        version = self._version(read, slug, ref)
        return classify(slug, version, read.versions.get(slug, []))

    async def log(self, slug: str) -> Log:
        """Every version of `slug` the relay set serves, newest first: who wrote it, when,
        trust, source, validity and value hash (never a forgotten version), and the value
        of each version that may be shown (`Log.values`: never a withheld one)."""
        slug = self.slug(slug)
        log = self._log_of(await self._slug_read(slug, history=True), slug)
        if log is None:
            raise NotFoundError(f"not found: {slug} (no version)")
        return log

    @staticmethod
    def _log_of(read: MemoryRead, slug: str) -> Log | None:
        """`log` over a history read of `slug`; None when it holds no visible version."""
        every = read.versions.get(slug, [])
        lives = [(v, classify(slug, v, every)) for v in visible(every)]
        if not lives:
            return None
        versions = [info(v, lv) for v, lv in lives]
        values = {v.id: lv.text for v, lv in lives if lv.text is not None}
        return Log(slug, versions, read.report, values)

    async def diff(self, slug: str, rev1: str | None = None, rev2: str | None = None) -> Diff:
        """Unified diff: the previous version to the newest (no REV), REV1 to the newest,
        or REV1 to REV2. A removal diffs as the empty text; a withheld value is refused."""
        slug = self.slug(slug)
        read = await self._slug_read(slug, history=True)
        every = read.versions.get(slug, [])
        shown = visible(every)
        if rev1 is None:
            if len(shown) < 2:
                raise NotFoundError(f"{slug}: fewer than two versions to compare")
            old, new = shown[1], shown[0]
        else:
            old = self._version(read, slug, rev1)
            new = self._version(read, slug, rev2) if rev2 is not None else shown[0]
        texts = []
        for version in (old, new):
            lv = classify(slug, version, every)
            if version.text is not None and not lv.live:
                raise NotFoundError(
                    f"{slug}: version {version.id} is withheld (denied by the owner)"
                )
            texts.append(lv.text or "")
        text = unified(texts[0], texts[1], f"{slug}@{old.id[:12]}", f"{slug}@{new.id[:12]}")
        return Diff(
            slug, info(old, classify(slug, old, every)), info(new, classify(slug, new, every)),
            text, read.report,
        )  # fmt: skip

    async def revert(
        self,
        slug: str,
        rev: str,
        *,
        force: bool = False,
        trust: str | None = None,
        source: str | None = None,
    ) -> WriteResult:
        """A new version with version `rev`'s value and validity (the past is never
        rewritten). The same refusals as `set`; held by the owner, a correction."""
        slug = self.slug(slug)
        async with self.slug_history(slug) as opened:
            base = opened.read
            old = self._version(base, slug, rev)
            lv = classify(slug, old, base.versions.get(slug, []))
            if old.text is None:
                raise BadInputError(f"{slug}: version {old.id} holds no value ({lv.state})")
            keep = old.meta.trust if self.role == AGENT and old.meta.trust in AGENT_TRUST else None
            try:
                trust = write_trust(self.role, trust or keep)
            except EngramError as exc:
                raise BadInputError(str(exc)) from exc
            meta = Meta(
                trust=trust,
                source=source if source is not None else f"revert of {old.id}",
                valid_from=old.meta.valid_from,
                valid_until=old.meta.valid_until,
            )
            self._allowed(base, slug, old.text, force)
            return await self._publish(opened, old.text, meta)
