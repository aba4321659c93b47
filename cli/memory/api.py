"""`AgentMemory`: an agent's memory (NIP-AE engrams) on a relay set, as an asyncio API.

The CLI (`engram mem …`) is a thin layer over this class; an agent framework can call it
directly, without a subprocess:

    memory = AgentMemory(load_identity(None, owner_npub, None), ["ws://a:7777", "ws://b:7777"])
    await memory.set("mem/notes/x", "hello")
    entry = await memory.get("mem/notes/x")         # Entry(value="hello", sha256=…, …)

Reads ask every relay of the set at once, validate and decrypt every candidate locally
and pick the head across all of them; relays that are behind, failed or could not be
paged completely are named in each result's `report` (a `SetReport`). Writes publish one
signed event to every relay; they succeed when at least one relay accepts it. Errors are
`cli.errors` classes, one per CLI exit code, with a stable `code`.

This module is the API only: result types are in `cli.memory.results`, head checking in
`cli.memory.heads` (over `engram.head`), replication in `cli.memory.replication`.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from cli.errors import (
    AgentMemoryError,
    AuthError,
    BadInputError,
    ConflictError,
    NotFoundError,
    RelayError,
)
from cli.identity import Identity
from cli.memory.heads import HeadChecker, behind
from cli.memory.patch import PatchError, apply_patch
from cli.memory.replication import reconciled, spread
from cli.memory.results import (
    CoreRead,
    Entry,
    ExportReport,
    ImportReport,
    Listing,
    Match,
    Matches,
    MigrateReport,
    Refs,
    RelaySync,
    SetReport,
    Similar,
    SyncReport,
    WriteResult,
    sha256_hex,
)
from cli.memory.search import compile_query, search_heads
from cli.paging import Fetched, fetch_all
from cli.peer import Peer
from cli.relayset import RelaySession, parse_relays
from engram import (
    CORE_SLUG,
    FUTURE_SKEW_MAX,
    KIND_ENGRAM,
    Body,
    ClockConflictError,
    Core,
    EngramError,
    Head,
    Memory,
    Tombstone,
    body_text,
    build_event,
    d_tag,
    encode_body,
    listing,
    merge_heads,
    monotonic_created_at,
    normalize_slug,
    reachability,
)
from engram.nip01 import Event

if TYPE_CHECKING:  # numpy and the model load only when recall is used
    from cli.memory.recall import Recall, Recalled

__all__ = [
    "AgentMemory",
    "AgentMemoryError",
    "AuthError",
    "BadInputError",
    "ConflictError",
    "CoreRead",
    "Entry",
    "ExportReport",
    "ImportReport",
    "Listing",
    "Match",
    "Matches",
    "MigrateReport",
    "NotFoundError",
    "Refs",
    "RelayError",
    "RelaySync",
    "SetReport",
    "Similar",
    "SyncReport",
    "WriteResult",
    "sha256_hex",
]

DEFAULT_TIMEOUT = 10.0


@dataclass
class _Read:
    """Heads merged across the relays that answered, and the per-relay views."""

    merged: dict[str, Head]
    views: dict[str, dict[str, Head]]
    candidates: int
    report: SetReport
    methods: dict[str, str] = field(default_factory=dict)  # relay -> "negentropy" | "req"


# --- the API ----------------------------------------------------------------------------


class AgentMemory:
    """One agent's memory for one owner, on a relay set.

    `identity` says whose memory and which key is held (`identity.as_owner`: an owner's
    session reading its agent's memory, which is `read_only`). Every method bounds its
    whole exchange with `timeout` seconds.
    """

    def __init__(
        self,
        identity: Identity,
        relays: str | Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        recall_dir: Path | None = None,
    ) -> None:
        self.identity = identity
        self.relays = parse_relays(relays)
        self.timeout = timeout
        self.recall_dir = recall_dir  # None: the user's data dir (`cli.memory.recall.cache`)
        self._recall: Recall | None = None

    @property
    def read_only(self) -> bool:
        return self.identity.as_owner

    # -- helpers --

    def _filter(self, **extra: Any) -> dict[str, Any]:
        ident = self.identity
        return {"kinds": [KIND_ENGRAM], "authors": [ident.agent], "#p": [ident.owner], **extra}

    @staticmethod
    def slug(raw: str) -> str:
        """`notes/x` -> `mem/notes/x`; `core` stays; anything invalid is BadInputError."""
        try:
            return normalize_slug(raw)
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc

    async def _session(self, urls: Sequence[str] | None = None) -> RelaySession:
        session = RelaySession(urls or self.relays, self.identity.seckey, self.timeout)
        await session.connect()
        session.raise_if_none(session.live)
        return session

    def _report(
        self,
        session: RelaySession,
        checker: HeadChecker,
        answered: Iterable[str],
        behind: dict[str, int] | None = None,
        incomplete: dict[str, str] | None = None,
    ) -> SetReport:
        return SetReport(
            relays=tuple(session.urls),
            answered=tuple(u for u in session.urls if u in set(answered)),
            failed=session.reasons(),
            behind=behind or {},
            incomplete=incomplete or {},
            skipped=dict(checker.skipped),
        )

    async def _read_slug(self, session: RelaySession, checker: HeadChecker, slug: str) -> _Read:
        d = d_tag(self.identity.conversation_key, slug)
        query = self._filter(**{"#d": [d]})
        answers = await session.on_each(lambda c: c.query(query))
        session.raise_if_none(answers)
        candidates = {
            msgspec.json.encode(e): e
            for events in answers.values()
            for e in events
            if any(t[:2] == ["d", d] for t in e.tags)
        }
        views = {
            url: {s: h for s, h in checker.heads(events).items() if s == slug}
            for url, events in answers.items()
        }
        merged = merge_heads(views.values())
        report = self._report(session, checker, answers, behind(views, merged))
        return _Read(merged, views, len(candidates), report)

    async def _read_all(
        self, session: RelaySession, checker: HeadChecker, *, negentropy: bool = False
    ) -> tuple[_Read, dict[str, Fetched]]:
        """Every event of the memory from every relay, validated; heads merged.

        Each relay is paged with REQ, or with `negentropy`, reconciled where it serves
        NIP-77 (`cli.memory.replication.reconciled`)."""
        limits = await session.max_limits()
        query = self._filter()
        methods: dict[str, str] = {}
        if negentropy:
            fetched = await reconciled(
                session, self.identity.seckey, query, limits, methods, self.timeout
            )
        else:
            fetched = await session.on_each(lambda c: fetch_all(c, query, limits.get(c.url)))
        session.raise_if_none(fetched)
        views = {url: checker.heads(f.events.values()) for url, f in fetched.items()}
        merged = merge_heads(views.values())
        incomplete: dict[str, str] = {}
        for url, f in fetched.items():
            if methods.get(url) == "negentropy":
                continue  # the reconciliation is exact
            why = f.why_incomplete(limits.get(url) is not None)
            if why is not None and limits.get(url) is None and f.complete:
                note = getattr(session, "nip11_notes", {}).get(url, "no max_limit known")
                why = f"{note}; paged until nothing new came back (may be partial)"
            if why is not None:
                incomplete[url] = why
        report = self._report(session, checker, fetched, behind(views, merged), incomplete)
        return _Read(merged, views, len(merged), report, methods), fetched

    def _entry(self, read: _Read, slug: str) -> Entry:
        head = read.merged.get(slug)
        text = body_text(head.body) if head is not None else None
        if head is None or text is None:
            rejected = read.report.skipped_total
            note = f" ({rejected} invalid event(s) ignored)" if rejected else ""
            raise NotFoundError(f"not found: {slug}{note}")
        return Entry(
            slug, text, head.event.id, head.event.created_at, sha256_hex(text), read.report
        )

    def _writable(self) -> None:
        if self.read_only:
            raise BadInputError("writes are agent-only: the owner key can read but not write")

    @staticmethod
    def _body(slug: str, text: str | None) -> Body:
        if text is None:
            if slug == CORE_SLUG:
                raise BadInputError(
                    "core cannot be removed; to clear it run: engram mem set core ''"
                )
            return Tombstone(slug=slug)
        body: Body = Core(profile=text) if slug == CORE_SLUG else Memory(slug=slug, value=text)
        try:
            encode_body(body)  # refuse an oversized body before touching the network
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc
        return body

    async def _write(
        self, session: RelaySession, checker: HeadChecker, body: Body, base: _Read
    ) -> WriteResult:
        """Publish `body` over the newest head of the set, then re-read it on every relay
        that accepted (spec *Writing*: a lost race is a conflict, never a silent retry)."""
        prior = base.merged.get(body.slug)
        try:
            created_at = monotonic_created_at(
                int(time.time()),
                prior.event.created_at if prior else None,
                max_skew=FUTURE_SKEW_MAX + 1,
            )
        except ClockConflictError as exc:
            raise ConflictError(f"{body.slug}: {exc} (clock-poisoned head)") from None
        ident = self.identity
        try:
            event = build_event(
                ident.seckey, ident.owner, body, created_at, os.urandom(32), os.urandom(32)
            )
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc
        before = set(session.failed)
        answers = await session.on_each(lambda c: c.try_publish_many([event]))
        # sent, then no OK before the deadline: such a relay may well hold the event
        unsure = [u for u in session.failed if u not in before]
        said_no: dict[str, str] = {}
        accepted: list[str] = []
        lost: list[str] = []
        for url, result in answers.items():
            ok, message = result[event.id]
            if not ok:
                said_no[url] = message or "no reason given"
            elif message.startswith("duplicate:"):
                lost.append(url)
            else:
                accepted.append(url)
        refused = {u: f"refused the event: {m}" for u, m in said_no.items()}
        refused.update(session.reasons())
        for url in unsure:
            refused[url] = f"{refused[url]} after the event was sent: it MAY have been written"
        if not accepted and not lost and unsure:
            names = ", ".join(unsure)
            raise RelayError(
                f"{body.slug}: no answer from {names} after the event was sent: the memory MAY "
                "have been written; read it back before writing again"
            )
        if not accepted and not lost:
            if len(session.urls) == 1 and said_no:
                message = next(iter(said_no.values()))
                gated = message.startswith(("auth-required:", "restricted:"))
                raise (AuthError if gated else RelayError)(f"relay refused the event: {message}")
            if len(session.urls) == 1:
                session.raise_if_none([])  # the one relay failed: its own error
            detail = "; ".join(f"{u}: {r}" for u, r in refused.items())
            gated = all(m.startswith(("auth-required:", "restricted:")) for m in said_no.values())
            cls = AuthError if said_no and gated and len(said_no) == len(refused) else RelayError
            raise cls(f"no relay accepted the event ({detail})")
        # verify-after-write on every relay that accepted
        d = d_tag(ident.conversation_key, body.slug)
        reread = await session.on_each(
            lambda c: c.query(self._filter(**{"#d": [d]})), urls=accepted
        )
        for url in accepted:
            if url not in reread:
                continue  # it failed the re-read: named in refused below
            view = checker.heads(reread[url]).get(body.slug)
            if view is None or view.event.id != event.id:
                lost.append(url)
        for url in accepted:
            if url not in reread and url in session.failed:
                refused[url] = f"accepted, but the re-read failed: {session.reasons()[url]}"
        if lost:
            names = ", ".join(lost)
            raise ConflictError(
                f"{body.slug}: another write replaced this one on {names} (concurrent write)"
                if len(self.relays) > 1
                else f"{body.slug}: another write replaced this one (concurrent write)"
            )
        good = tuple(u for u in accepted if u in reread)
        if self._recall is not None:
            self._recall.written(body, event.id, created_at)
        text = body_text(body)
        report = self._report(session, checker, good)
        return WriteResult(
            body.slug,
            event.id,
            created_at,
            sha256_hex(text) if text is not None else None,
            good,
            {u: r for u, r in refused.items() if u not in good},
            report,
        )

    # -- reads --

    async def get(self, slug: str) -> Entry:
        """The live value of `slug` (core: the profile). NotFoundError if absent or removed."""
        slug = self.slug(slug)
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            return self._entry(await self._read_slug(session, checker, slug), slug)
        finally:
            await session.close()

    async def hash(self, slug: str) -> str:
        """sha256 (hex) of the live value's UTF-8 bytes: the `base_hash` for `patch`."""
        return (await self.get(slug)).sha256

    async def ls(self) -> Listing:
        """Every live memory across the set, complete (paged past each relay's max_limit)."""
        read = await self._everything()
        return Listing(listing(read.merged), read.report)

    async def refs(self) -> Refs:
        """Reachability from core over `[[slug]]` links: reachable, orphans, dangling."""
        read = await self._everything()
        core = read.merged.get(CORE_SLUG)
        profile = core.body.profile if core is not None and isinstance(core.body, Core) else None
        values = {slug: body_text(h.body) for slug, h in read.merged.items()}
        graph = reachability(profile, values)
        return Refs(
            profile is not None, graph.reachable, graph.orphans, graph.dangling, read.report
        )

    async def search(self, query: str, *, regex: bool = False, limit: int = 20) -> Matches:
        """Slugs and values matching `query` (case-insensitive), searched after local
        decryption; the query never leaves this process."""
        pattern = compile_query(query, regex)
        if limit < 1:
            raise BadInputError("--limit must be at least 1")
        read = await self._everything()
        # matched in a worker thread (the pattern releases the GIL), bounded in time
        found = await asyncio.to_thread(search_heads, read.merged, pattern, limit)
        matches = Matches(found)
        matches.report = read.report
        return matches

    async def heads(self) -> tuple[dict[str, Head], SetReport]:
        """Every head across the set (memories, tombstones, core), merged, with the set's
        report: for a caller that shows the whole memory at once (`engram review`)."""
        read = await self._everything()
        return read.merged, read.report

    def recaller(self) -> Recall:
        """This object's recall index (loaded on first use, then kept current)."""
        if self._recall is None:
            from cli.memory.recall import Recall

            self._recall = Recall(
                self.identity, self.relays, self.timeout, cache_dir=self.recall_dir
            )
        return self._recall

    async def close(self) -> None:
        """Close the connections the recall index keeps (other calls keep none)."""
        if self._recall is not None:
            await self._recall.close()

    async def recall(self, query: str, limit: int = 10) -> Recalled:
        """The live memories most relevant to `query`, best first (`Recalled.hits`).

        Ranked on this machine (BM25 and a packaged embedding model, fused): the query and
        the scores never leave it. The index is cached encrypted under the user's data dir
        and brought up to the relays first (`cli.memory.recall.updater`)."""
        if not query.strip():
            raise BadInputError("the recall query is empty")
        if limit < 1:
            raise BadInputError("--limit must be at least 1")
        return await self.recaller().recall(query, limit)

    async def _similar(self, slug: str, value: str) -> tuple[Similar, ...]:
        """Write-time hints: existing memories close to `value`; none if the index cannot
        be read in time (a hint never fails a write)."""
        try:
            hits = await asyncio.wait_for(self.recaller().similar(slug, value), self.timeout)
        except Exception:
            return ()
        return tuple(Similar(h.slug, round(h.score, 4), h.created_at, h.event_id) for h in hits)

    async def _everything(self) -> _Read:
        session = await self._session()
        try:
            read, _ = await self._read_all(session, HeadChecker(self.identity))
            return read
        finally:
            await session.close()

    async def core(self) -> CoreRead:
        """Read core for the fetch hook, within `timeout` in all; never raises.

        `profile` when any relay yields a valid core (the newest across those that
        answered); `absent` only when every relay answered and none holds a core
        candidate; `unknown` otherwise (a failure to read is never "absent").
        """
        session = RelaySession(self.relays, self.identity.seckey, self.timeout)
        try:
            await session.connect()
            checker = HeadChecker(self.identity)
            try:
                read = await self._read_slug(session, checker, CORE_SLUG)
            except AgentMemoryError as exc:
                if session.failed and all(
                    isinstance(e, TimeoutError) for e in session.failed.values()
                ):
                    names = ", ".join(self.relays)
                    return CoreRead(
                        "unknown", reason=f"no answer from {names} within {self.timeout:g} s"
                    )
                return CoreRead("unknown", reason=str(exc))
            head = read.merged.get(CORE_SLUG)
            if head is not None and isinstance(head.body, Core):
                return CoreRead("profile", head.body.profile)
            if read.report.failed:
                failed = "; ".join(f"{u}: {r}" for u, r in read.report.failed.items())
                return CoreRead("unknown", reason=f"not every relay answered ({failed})")
            if read.candidates == 0:
                return CoreRead("absent")
            return CoreRead(
                "unknown", reason=f"all {read.candidates} core candidate(s) failed validation"
            )
        except Exception as exc:  # any failure to read is "unknown", never "absent"
            return CoreRead("unknown", reason=f"{type(exc).__name__}: {exc}")
        finally:
            await session.close()

    # -- writes --

    async def set(self, slug: str, value: str) -> WriteResult:
        """Write `value` (for `core`: the profile) on every relay of the set.

        `similar` in the result names existing memories whose cosine similarity to the
        value is at least `RecallSettings.similar` (0.80): patch or merge them rather than
        keep a near-duplicate. Nothing is refused for it."""
        self._writable()
        slug = self.slug(slug)
        body = self._body(slug, value)
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            base = await self._read_slug(session, checker, slug)
            result = await self._write(session, checker, body, base)
        finally:
            await session.close()
        if slug == CORE_SLUG:
            return result
        return replace(result, similar=await self._similar(slug, value))

    async def patch(
        self, slug: str, diff: str, base_hash: str | None, *, dry_run: bool = False
    ) -> WriteResult:
        """Apply a one-file unified diff exactly to the current value (absent: empty).

        `base_hash` is the sha256 the diff was made against (see `hash`); a different
        current value is a ConflictError. None skips the check.
        """
        self._writable()
        slug = self.slug(slug)
        expected = base_hash.lower() if base_hash is not None else None
        if expected is not None and (
            len(expected) != 64 or set(expected) - set("0123456789abcdef")
        ):
            raise BadInputError("--base-hash must be 64 hex characters (see `engram mem hash`)")
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            base = await self._read_slug(session, checker, slug)
            head = base.merged.get(slug)
            current = (body_text(head.body) if head is not None else None) or ""
            if expected is not None and sha256_hex(current) != expected:
                raise ConflictError(
                    f"{slug}: base hash mismatch: the current value hashes to {sha256_hex(current)}"
                )
            try:
                result = apply_patch(current, diff)
            except PatchError as exc:
                raise BadInputError(str(exc)) from exc
            body = self._body(slug, result)
            if dry_run:
                return WriteResult(
                    slug, "", 0, sha256_hex(result), (), {}, base.report, value=result
                )
            return await self._write(session, checker, body, base)
        finally:
            await session.close()

    async def rm(self, slug: str) -> WriteResult:
        """Publish a tombstone; NotFoundError if the slug is already absent."""
        self._writable()
        slug = self.slug(slug)
        body = self._body(slug, None)
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            base = await self._read_slug(session, checker, slug)
            self._entry(base, slug)  # raises NotFoundError
            return await self._write(session, checker, body, base)
        finally:
            await session.close()

    # -- sync, migration, backup --

    async def sync(self) -> SyncReport:
        """Give every relay of the set every head (memories, tombstones, core); idempotent."""
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            read, fetched = await self._read_all(session, checker, negentropy=True)
            held = {u: set(f.events) for u, f in fetched.items()}
            relays = await spread(session, read.merged, held, list(fetched))
            relays = {u: replace(r, method=read.methods.get(u)) for u, r in relays.items()}
            for url, reason in session.reasons().items():
                relays.setdefault(url, RelaySync(error=reason))
            report = self._report(session, checker, fetched, {}, read.report.incomplete)
            return SyncReport(len(read.merged), relays, report)
        finally:
            await session.close()

    async def migrate(self, to: str | Sequence[str]) -> MigrateReport:
        """Copy every head to the `to` relays, then read each back there by event id."""
        targets = parse_relays(to)
        session = await self._session(list(dict.fromkeys([*self.relays, *targets])))
        try:
            checker = HeadChecker(self.identity)
            sources = [u for u in self.relays if u in session.live]
            session.raise_if_none(sources)
            read, fetched = await self._read_all(session, checker, negentropy=True)
            held = {u: set(f.events) for u, f in fetched.items()}
            live_targets = [u for u in targets if u in fetched]
            copied = await spread(session, read.merged, held, live_targets)
            copied = {u: replace(r, method=read.methods.get(u)) for u, r in copied.items()}
            # read back: every head's event id must now be on every target
            heads = [h.event.id for h in read.merged.values()]
            seckey = self.identity.seckey
            again = await session.on_each(
                lambda c: Peer(c, seckey, None).fetch_ids(heads), urls=live_targets
            )
            missing: dict[str, list[str]] = {}
            for url in targets:
                have = {e.id for e in again[url]} if url in again else set()
                missing[url] = sorted(s for s, h in read.merged.items() if h.event.id not in have)
                if url not in copied:
                    copied[url] = RelaySync(error=session.reasons().get(url, "did not answer"))
            report = self._report(
                session, checker, fetched, read.report.behind, read.report.incomplete
            )
            return MigrateReport(len(read.merged), copied, missing, report)
        finally:
            await session.close()

    async def export(self, path: str | Path) -> ExportReport:
        """Write every head event (ciphertext, as signed) to `path` as JSON lines."""
        session = await self._session()
        try:
            checker = HeadChecker(self.identity)
            read, _ = await self._read_all(session, checker)
        finally:
            await session.close()
        lines = [msgspec.json.encode(h.event) + b"\n" for _, h in sorted(read.merged.items())]
        target = Path(path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.writelines(lines)
        except OSError as exc:
            raise BadInputError(f"cannot write {target}: {exc.strerror or exc}") from exc
        return ExportReport(str(target), len(lines), read.report)

    async def import_(self, path: str | Path) -> ImportReport:
        """Republish the events of an export file, unchanged, to every relay of the set.

        Only events valid for this memory are sent; a head the relays already beat is
        left alone. Idempotent."""
        source = Path(path)
        try:
            raw_lines = source.read_bytes().splitlines()
        except OSError as exc:
            raise BadInputError(f"cannot read {source}: {exc.strerror or exc}") from exc
        checker = HeadChecker(self.identity)
        from_file: dict[str, Head] = {}
        file_views: list[dict[str, Head]] = []
        for line in raw_lines:
            if not line.strip():
                continue
            try:
                event = msgspec.json.decode(line, type=Event)
            except (msgspec.ValidationError, msgspec.DecodeError):
                checker.skipped["not an event"] += 1
                continue
            if (h := checker.head(event)) is not None:
                file_views.append({h.body.slug: h})
        from_file = merge_heads(file_views)
        session = await self._session()
        try:
            read, fetched = await self._read_all(session, checker)
            held = {u: set(f.events) for u, f in fetched.items()}
            merged = merge_heads([from_file, read.merged])
            mine = {s: h for s, h in merged.items() if s in from_file}
            relays = await spread(session, mine, held, list(fetched))
            for url, reason in session.reasons().items():
                relays.setdefault(url, RelaySync(error=reason))
            report = self._report(session, checker, fetched, {}, read.report.incomplete)
            return ImportReport(len(from_file), relays, report)
        finally:
            await session.close()
