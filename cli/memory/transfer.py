"""Moving a memory between relays and files: `sync` (every relay of the set gets every
head and version it lacks), `migrate` (copy to new relays, then read back), `export` and
`import_` (JSON lines of the events exactly as signed). Forgotten versions are never
carried (`MemoryRead.spreadable`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import msgspec

from cli.memory.base import MemoryBase, MemoryRead
from cli.memory.heads import HeadChecker
from cli.memory.replication import spread
from cli.memory.results import ExportReport, ImportReport, MigrateReport, RelaySync, SyncReport
from cli.nostr.errors import BadInputError
from cli.nostr.files import open_private
from cli.nostr.peer import Peer
from cli.nostr.relayset import parse_relays
from engram import merge_heads
from engram.nip01 import Event
from engram.versions import Version


def _flat(by_slug: dict[str, dict[str, Event]]) -> dict[str, Event]:
    return {i: e for events in by_slug.values() for i, e in events.items()}


class TransferOps(MemoryBase):
    """The sync, migration and backup methods of `AgentMemory`."""

    async def sync(self) -> SyncReport:
        """Give every relay of the set every head and version it lacks; idempotent."""
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            read = await self._read_all(session, checker, negentropy=True)
            held = {u: set(f.events) for u, f in read.fetched.items()}
            wanted = _flat(read.spreadable())
            relays = await spread(session, wanted, held, list(read.fetched))
            relays = {u: replace(r, method=read.methods.get(u)) for u, r in relays.items()}
            for url, reason in session.reasons().items():
                relays.setdefault(url, RelaySync(error=reason))
            report = self._report(session, checker, read.fetched, {}, read.report.incomplete)
            return SyncReport(len(read.heads), relays, report)
        finally:
            await session.close()

    async def migrate(self, to: str | Sequence[str]) -> MigrateReport:
        """Copy every head and version to the `to` relays, then read each back there by
        event id; `missing` names the slugs that did not arrive whole."""
        targets = parse_relays(to)
        session = await self._session(list(dict.fromkeys([*self.relays, *targets])))
        try:
            checker = HeadChecker(self.identity)
            sources = [u for u in self.relays if u in session.live]
            session.raise_if_none(sources)
            read = await self._read_all(session, checker, negentropy=True)
            held = {u: set(f.events) for u, f in read.fetched.items()}
            by_slug = read.spreadable()
            wanted = _flat(by_slug)
            live_targets = [u for u in targets if u in read.fetched]
            copied = await spread(session, wanted, held, live_targets)
            copied = {u: replace(r, method=read.methods.get(u)) for u, r in copied.items()}
            seckey = self.identity.seckey
            again = await session.on_each(
                lambda c: Peer(c, seckey, None).fetch_ids(list(wanted)), urls=live_targets
            )
            missing: dict[str, list[str]] = {}
            for url in targets:
                have = {e.id for e in again[url]} if url in again else set()
                missing[url] = sorted(s for s, evs in by_slug.items() if set(evs) - have)
                if url not in copied:
                    copied[url] = RelaySync(error=session.reasons().get(url, "did not answer"))
            report = self._report(
                session, checker, read.fetched, read.report.behind, read.report.incomplete
            )
            return MigrateReport(len(read.heads), copied, missing, report)
        finally:
            await session.close()

    async def export(self, path: str | Path) -> ExportReport:
        """Write every head and version (ciphertext, as signed) to `path` as JSON lines,
        0600: a backup `import_` restores, history included, forgotten versions never."""
        session = await self._session()
        try:
            read = await self._read_all(session, HeadChecker(self.identity), history=True)
        finally:
            await session.close()
        by_slug = read.spreadable()
        lines = [
            msgspec.json.encode(e) + b"\n"
            for slug in sorted(by_slug)
            for e in sorted(by_slug[slug].values(), key=lambda e: (e.created_at, e.id))
        ]
        target = Path(path)
        try:
            with open_private(target) as fh:
                fh.writelines(lines)
        except OSError as exc:
            raise BadInputError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return ExportReport(str(target), len(lines), read.report)

    async def import_(self, path: str | Path) -> ImportReport:
        """Republish the events of an export file, unchanged, to every relay of the set.

        Only events valid for this memory are sent; a head the relays already beat is
        left alone, and nothing a forget on the relays has hidden. Idempotent."""
        source = Path(path)
        try:
            raw_lines = source.read_bytes().splitlines()
        except OSError as exc:
            raise BadInputError(f"cannot read {source}: {exc.strerror or exc}") from exc
        checker = HeadChecker(self.identity)
        from_file: dict[str, list[Version]] = {}
        file_heads = []
        for line in raw_lines:
            if not line.strip():
                continue
            try:
                event = msgspec.json.decode(line, type=Event)
            except (msgspec.ValidationError, msgspec.DecodeError):
                checker.skipped["not an event"] += 1
                continue
            if (v := checker.version(event)) is not None:
                from_file.setdefault(v.slug, []).append(v)
                if (h := checker.head(event)) is not None:
                    file_heads.append({h.body.slug: h})
        session = await self._session()
        try:
            read = await self._read_all(session, checker, history=True)
            held = {u: set(f.events) for u, f in read.fetched.items()}
            heads = merge_heads([*file_heads, read.heads])
            versions = {slug: [*vs, *read.versions.get(slug, [])] for slug, vs in from_file.items()}
            combined = MemoryRead(versions, heads, 0, read.report)
            ids = {v.event.id for vs in from_file.values() for v in vs}
            wanted = {i: e for i, e in _flat(combined.spreadable()).items() if i in ids}
            relays = await spread(session, wanted, held, list(read.fetched))
            for url, reason in session.reasons().items():
                relays.setdefault(url, RelaySync(error=reason))
            report = self._report(session, checker, read.fetched, {}, read.report.incomplete)
            count = sum(len(vs) for vs in from_file.values())
            return ImportReport(count, relays, report)
        finally:
            await session.close()
