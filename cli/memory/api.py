"""`AgentMemory`: an agent's memory (NIP-AE engrams and their history) on a relay set, as an
asyncio API.

The CLI (`engram mem …`), the MCP server and the ACP hook are thin layers over this
class; an agent framework can call it directly, without a subprocess:

    memory = AgentMemory(load_identity(None, owner_npub, None), ["ws://a:7777", "ws://b:7777"])
    await memory.set("mem/notes/x", "hello", trust="stated", source="chat 2024-05-01")
    entry = await memory.get("mem/notes/x")         # Entry(value="hello", trust="stated", …)

Reads ask every relay of the set at once, validate and decrypt every candidate locally
and let `engram.live` decide what each slug reads as (tombstones, denials, forgets and
owner corrections: one rule for every read); relays that are behind, failed or could
not be paged completely are named in each result's `report` (a `SetReport`). Writes
publish a new version to every relay and succeed when at least one accepts it. Errors
are `cli.nostr.errors` classes, one per CLI exit code, with a stable `code`.

Held with the owner's key (`identity.as_owner`), the same class writes owner verdicts:
`set`/`patch`/`revert` are corrections, `confirm` and `deny` verdicts.

The parts: reading and publishing in `cli.memory.base`, history (`log`, `diff`,
`revert`, `get --as-of/--rev`) in `cli.memory.history`, owner verdicts and forget in
`cli.memory.verdicts`, the mutation audit in `cli.memory.audit`, sync and backups in
`cli.memory.transfer`; result types in `cli.memory.results`.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from cli.memory.audit import AuditOps
from cli.memory.base import DEFAULT_TIMEOUT, MemoryBase, MemoryRead
from cli.memory.history import HistoryOps
from cli.memory.patch import PatchError, apply_patch
from cli.memory.recall_ops import RecallOps
from cli.memory.results import (
    AuditReport,
    CoreRead,
    Diff,
    Entry,
    ExportReport,
    ForgetReport,
    ImportReport,
    Inspection,
    Listing,
    LiveEntry,
    LiveSet,
    LiveView,
    Log,
    Match,
    Matches,
    MigrateReport,
    Refs,
    RelaySync,
    SetReport,
    Similar,
    SyncReport,
    VersionInfo,
    WriteResult,
    sha256_hex,
)
from cli.memory.search import compiled, search_views
from cli.memory.transfer import TransferOps
from cli.memory.verdicts import VerdictOps
from cli.nostr.errors import (
    AgentMemoryError,
    AuthError,
    BadInputError,
    BaseChangedError,
    ConflictError,
    NotFoundError,
    RefusedError,
    RelayError,
)
from cli.nostr.timeparse import format_time
from engram import CORE_SLUG, EngramError, reachability
from engram.live import Live, ended, valid_at, write_trust
from engram.versions import AGENT, Meta, Version, encode_version_body

__all__ = [
    "DEFAULT_TIMEOUT",
    "AgentMemory",
    "AgentMemoryError",
    "AuditReport",
    "AuthError",
    "BadInputError",
    "BaseChangedError",
    "ConflictError",
    "CoreRead",
    "Diff",
    "Entry",
    "ExportReport",
    "ForgetReport",
    "ImportReport",
    "Listing",
    "LiveEntry",
    "LiveSet",
    "LiveView",
    "Log",
    "Match",
    "Matches",
    "MigrateReport",
    "NotFoundError",
    "Refs",
    "RefusedError",
    "RelayError",
    "RelaySync",
    "SetReport",
    "Similar",
    "SyncReport",
    "VersionInfo",
    "WriteResult",
    "sha256_hex",
]


def _entry_of(view: LiveView) -> LiveEntry:
    fields = {f: getattr(view, f) for f in LiveEntry.__struct_fields__}
    return LiveEntry(**fields)


class AgentMemory(HistoryOps, VerdictOps, AuditOps, TransferOps, RecallOps, MemoryBase):
    """One agent's memory for one owner, on a relay set.

    `identity` says whose memory and which key is held; `role` is `agent`, or `owner`
    for the owner's key (`--agent`), whose writes are owner verdicts. Every method bounds
    its whole exchange with `timeout` seconds.
    """

    # -- what a version looks like to a reader --

    def _view(self, version: Version, now: int) -> LiveView:
        text = version.text or ""
        meta = version.meta
        return LiveView(
            slug=version.slug,
            event_id=version.id,
            created_at=version.created_at,
            trust=meta.trust,
            role=version.role,
            author=version.author,
            source=meta.source,
            valid_from=meta.valid_from,
            valid_until=meta.valid_until,
            ended=ended(meta, now),
            sha256=sha256_hex(text),
            value=text,
        )

    def _entry(
        self, read: MemoryRead, slug: str, live: Live, valid_at_t: int | None = None
    ) -> Entry:
        if not live.live or live.version is None:
            raise self._not_found(read, slug, live)
        version = live.version
        meta = version.meta
        if valid_at_t is not None and not valid_at(meta, valid_at_t):
            bounds = [("from", meta.valid_from), ("until", meta.valid_until)]
            window = " ".join(f"{w} {format_time(t)}" for w, t in bounds if t is not None)
            raise NotFoundError(f"{slug}: not valid at {format_time(valid_at_t)} (valid {window})")
        view = self._view(version, self.now())
        return Entry(
            slug,
            view.value,
            view.event_id,
            view.created_at,
            view.sha256,
            read.report,
            trust=view.trust,
            role=view.role,
            author=view.author,
            source=view.source,
            valid_from=view.valid_from,
            valid_until=view.valid_until,
            ended=view.ended,
        )

    # -- reads --

    async def get(
        self,
        slug: str,
        *,
        as_of: int | None = None,
        rev: str | None = None,
        valid_at: int | None = None,
    ) -> Entry:
        """The live value of `slug` (core: the profile); NotFoundError if absent, removed,
        denied or forgotten. `as_of`: the value at that time; `rev`: that version (by id
        or a unique prefix of 8+ hex); `valid_at`: NotFoundError unless the fact holds then."""
        slug = self.slug(slug)
        if as_of is not None and rev is not None:
            raise BadInputError("give --as-of or --rev, not both")
        if rev is not None:
            read = await self._slug_read(slug, history=True)
            return self._entry(read, slug, self._version_live(read, slug, rev), valid_at)
        read = await self._slug_read(slug, history=as_of is not None)
        return self._entry(read, slug, read.live(slug, as_of), valid_at)

    async def hash(self, slug: str) -> str:
        """sha256 (hex) of the live value's UTF-8 bytes: the `base_hash` for `patch`."""
        return (await self.get(slug)).sha256

    async def live(self, *, valid_now: bool = False) -> LiveSet:
        """Every live memory with its value (core included), through the one rule;
        `valid_now` leaves out facts not valid now (ended, or not yet begun)."""
        read = await self._everything()
        now = self.now()
        views: dict[str, LiveView] = {}
        for slug, lv in read.lives().items():
            if not lv.live or lv.version is None:
                continue
            if valid_now and not valid_at(lv.version.meta, now):
                continue
            views[slug] = self._view(lv.version, now)
        return LiveSet(views, read.report)

    async def ls(self, *, valid_now: bool = False) -> Listing:
        """Every live memory across the set (core omitted), complete (paged past each
        relay's max_limit), with its trust and validity."""
        found = await self.live(valid_now=valid_now)
        entries = [_entry_of(v) for slug, v in found.views.items() if slug != CORE_SLUG]
        return Listing(entries, found.report)

    async def views(self) -> tuple[dict[str, Live], SetReport]:
        """Every slug as it reads (`engram.live.Live`: live, removed, denied, forgotten;
        core included), with the set's report: for a caller that shows the whole memory at
        once, removed ones too (`engram review`)."""
        read = await self._everything()
        return read.lives(), read.report

    async def inspect(self, slug: str) -> Inspection:
        """One memory from one read of its history: what it reads as, every version (as
        `log`; None when it has none), its audit (as `audit(slug)`) and the set's report:
        for a caller that shows them together (`engram review`'s memory page)."""
        slug = self.slug(slug)
        read = await self._slug_read(slug, history=True)
        log, audited = self._log_of(read, slug), self._audit_of(read, slug)
        return Inspection(slug, read.live(slug), log, audited, read.report)

    async def refs(self) -> Refs:
        """Reachability from core over `[[slug]]` links: reachable, orphans, dangling
        (links to memories that do not read as live: absent, removed, denied, forgotten)."""
        read = await self._everything()
        lives = read.lives()
        core = lives.get(CORE_SLUG)
        profile = core.text if core is not None else None
        graph = reachability(profile, {slug: lv.text for slug, lv in lives.items()})
        metas = {s: lv.version.meta for s, lv in lives.items() if lv.live and lv.version}
        shown = [*graph.reachable, *graph.orphans]
        now = self.now()
        return Refs(
            profile is not None,
            graph.reachable,
            graph.orphans,
            graph.dangling,
            read.report,
            trust={s: metas[s].trust for s in shown if s in metas},
            ended=[s for s in shown if s in metas and ended(metas[s], now)],
        )

    async def search(
        self, query: str, *, regex: bool = False, limit: int = 20, valid_now: bool = False
    ) -> Matches:
        """Slugs and values matching `query` (case-insensitive), searched after local
        decryption; the query never leaves this process. A regular expression is refused
        past the limits of `cli.memory.search` (length, nesting, repeats written out);
        it is compiled and matched in a worker thread, each with a deadline."""
        pattern = await compiled(query, regex)
        if limit < 1:
            raise BadInputError("--limit must be at least 1")
        found = await self.live(valid_now=valid_now)
        # matched in a worker thread (the pattern releases the GIL), bounded in time
        hits = await asyncio.to_thread(search_views, found.views, pattern, limit)
        matches = Matches(hits)
        matches.report = found.report
        return matches

    async def core(self) -> CoreRead:
        """Read core for the fetch hook, within `timeout` in all; never raises.

        `profile` when the set yields a live core; `absent` when every relay answered and
        none holds a core candidate, or core reads as denied or forgotten (a valid verdict
        says so); `unknown` otherwise (a failure to read is never "absent").
        """
        opened = self.slug_history(CORE_SLUG, history=False)
        try:
            async with opened:
                read = opened.read
        except AgentMemoryError as exc:
            failed = opened.session.failed
            if failed and all(isinstance(e, TimeoutError) for e in failed.values()):
                names = ", ".join(self.relays)
                return CoreRead(
                    "unknown", reason=f"no answer from {names} within {self.timeout:g} s"
                )
            return CoreRead("unknown", reason=str(exc))
        except Exception as exc:  # any failure to read is "unknown", never "absent"
            # by its type only: the reason is logged, and an unexpected error's text is
            # not known to be free of decrypted content
            return CoreRead("unknown", reason=f"unexpected error: {type(exc).__name__}")
        lv = read.live(CORE_SLUG)
        if lv.live and lv.version is not None:
            meta = lv.version.meta
            return CoreRead(
                "profile", lv.text, trust=meta.trust, role=lv.version.role,
                ended=ended(meta, self.now()),
            )  # fmt: skip
        if read.report.failed:
            failed_on = "; ".join(f"{u}: {r}" for u, r in read.report.failed.items())
            return CoreRead("unknown", reason=f"not every relay answered ({failed_on})")
        if read.candidates == 0 or lv.state in ("denied", "forgotten"):
            return CoreRead("absent", reason=lv.state)
        return CoreRead(
            "unknown", reason=f"all {read.candidates} core candidate(s) failed validation"
        )

    # -- writes --

    def _meta(
        self,
        trust: str | None,
        source: str | None,
        valid_from: int | None,
        valid_until: int | None,
    ) -> Meta:
        try:
            trust = write_trust(self.role, trust)
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc
        if valid_from is not None and valid_until is not None and valid_from >= valid_until:
            raise BadInputError("--valid-from must be before --valid-until")
        return Meta(trust=trust, source=source, valid_from=valid_from, valid_until=valid_until)

    @staticmethod
    def _sized(slug: str, text: str | None, meta: Meta) -> None:
        """Refuse an unusable body before touching the network."""
        try:
            encode_version_body(slug, text, meta)
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc

    async def _write_value(
        self, slug: str, text: str, meta: Meta, *, force: bool, base_hash: str | None = None
    ) -> WriteResult:
        async with self.slug_history(slug) as opened:
            if base_hash is not None:
                current = opened.read.live(slug).text or ""
                if sha256_hex(current) != base_hash:
                    raise BaseChangedError(
                        f"{slug}: base hash mismatch: the current value hashes to "
                        f"{sha256_hex(current)}"
                    )
            self._allowed(opened.read, slug, text, force)
            return await self._publish(opened, text, meta)

    async def set(
        self,
        slug: str,
        value: str,
        *,
        trust: str | None = None,
        source: str | None = None,
        valid_from: int | None = None,
        valid_until: int | None = None,
        force: bool = False,
        base_hash: str | None = None,
    ) -> WriteResult:
        """Write `value` (for `core`: the profile) as a new version on every relay of the
        set. The agent writes trust `guess` (default) or `stated`; held by the owner this
        is a correction (`confirmed`). Refused (RefusedError) for a value a tombstone
        rejected or the owner denied, or over the owner's correction, unless `force`
        (which never overrides a denial). `base_hash`: the sha256 of the value this one
        replaces (the empty value's when there is none); another is a BaseChangedError
        (a ConflictError).

        `similar` in the result names existing memories whose cosine similarity to the
        value is at least `RecallSettings.similar` (0.60): patch or merge them rather than
        keep a near-duplicate. Nothing is refused for it."""
        slug = self.slug(slug)
        meta = self._meta(trust, source, valid_from, valid_until)
        self._sized(slug, value, meta)
        expected = base_hash.lower() if base_hash is not None else None
        result = await self._write_value(slug, value, meta, force=force, base_hash=expected)
        if slug == CORE_SLUG:
            return result
        return replace(result, similar=await self._similar(slug, value))

    async def patch(
        self,
        slug: str,
        diff: str,
        base_hash: str | None,
        *,
        dry_run: bool = False,
        trust: str | None = None,
        source: str | None = None,
        valid_from: int | None = None,
        valid_until: int | None = None,
        force: bool = False,
    ) -> WriteResult:
        """Apply a one-file unified diff exactly to the current value (absent: empty).

        `base_hash` is the sha256 the diff was made against (see `hash`); a different
        current value is a ConflictError. None skips the check. Trust, source and
        validity carry over from the current version unless given.
        """
        slug = self.slug(slug)
        expected = base_hash.lower() if base_hash is not None else None
        if expected is not None and (
            len(expected) != 64 or set(expected) - set("0123456789abcdef")
        ):
            raise BadInputError("--base-hash must be 64 hex characters (see `engram mem hash`)")
        read = await self._slug_read(slug)
        lv = read.live(slug)
        current = lv.text or ""
        if expected is not None and sha256_hex(current) != expected:
            raise BaseChangedError(
                f"{slug}: base hash mismatch: the current value hashes to {sha256_hex(current)}"
            )
        try:
            result = apply_patch(current, diff)
        except PatchError as exc:
            raise BadInputError(str(exc)) from exc
        old = lv.version.meta if lv.live and lv.version is not None else Meta()
        carried = old.trust if self.role == AGENT and old.trust in ("guess", "stated") else None
        meta = self._meta(
            trust or carried,
            source if source is not None else old.source,
            valid_from if valid_from is not None else old.valid_from,
            valid_until if valid_until is not None else old.valid_until,
        )
        self._sized(slug, result, meta)
        if dry_run:
            return WriteResult(slug, "", 0, sha256_hex(result), (), {}, read.report, value=result)
        return await self._write_value(
            slug, result, meta, force=force, base_hash=sha256_hex(current)
        )

    async def rm(self, slug: str, *, reason: str | None = None, force: bool = False) -> WriteResult:
        """Publish a tombstone that records `reason` and the sha256 of the removed value (not
        the value): a later write of that value is refused unless forced. NotFoundError
        if the slug does not read as live. Agent only: the owner denies (`deny`)."""
        slug = self.slug(slug)
        if self.role != AGENT:
            raise BadInputError("the owner does not remove memories: deny them (engram mem deny)")
        if slug == CORE_SLUG:
            raise BadInputError("core cannot be removed; to clear it run: engram mem set core ''")
        async with self.slug_history(slug) as opened:
            lv = opened.read.live(slug)
            if not lv.live or lv.text is None:
                raise self._not_found(opened.read, slug, lv)
            self._allowed(opened.read, slug, None, force)
            meta = Meta(reason=reason, rejected=(sha256_hex(lv.text),))
            self._sized(slug, None, meta)
            return await self._publish(opened, None, meta)
