"""What every `AgentMemory` operation shares: the relay session, the filters of one memory,
reading it (one slug or all of it) into versions, and publishing a new version.

Reading never decides what is live: it collects valid versions (heads, revisions, owner
verdicts) and `engram.live` decides. Publishing follows NIP-AE *Writing* (a monotonic
created_at, verify-after-write: a lost race is a conflict, never a silent retry) for the
version events of `engram.versions`: an agent writes a revision and its head, the owner
one verdict.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from cli.memory.heads import HeadChecker, as_version, behind, memory_filters
from cli.memory.replication import reconciled
from cli.memory.results import SetReport, WriteResult, sha256_hex
from cli.nostr.client import is_gated
from cli.nostr.errors import (
    AuthError,
    BadInputError,
    ConflictError,
    NotFoundError,
    RefusedError,
    RelayError,
)
from cli.nostr.identity import Identity
from cli.nostr.paging import Fetched, fetch_all
from cli.nostr.relayset import RelaySession, parse_relays
from engram import (
    FUTURE_SKEW_MAX,
    KIND_ENGRAM,
    KIND_VERDICT,
    ClockConflictError,
    EngramError,
    Head,
    d_tag,
    merge_heads,
    normalize_slug,
)
from engram.chain import Holdings
from engram.live import Live, chain_link, check_write, live_view, next_created_at, visible
from engram.nip01 import Event
from engram.replace import is_superseded
from engram.versions import AGENT, OWNER, Meta, Version, build_head, build_version

if TYPE_CHECKING:  # numpy and the model load only when recall is used
    from cli.memory.recall import Recall

DEFAULT_TIMEOUT = 10.0


@dataclass
class MemoryRead:
    """A memory (or one slug of it) as read from a relay set.

    versions: slug -> the valid versions read. A current read holds each slug's head
    (the newest across the set) and every owner verdict; a history read every head,
    revision and verdict. `holdings` (history reads): slug -> relay -> what it serves.
    """

    versions: dict[str, list[Version]]
    heads: dict[str, Head]
    candidates: int
    report: SetReport
    holdings: dict[str, dict[str, Holdings]] = field(default_factory=dict)
    fetched: dict[str, Fetched] = field(default_factory=dict)
    methods: dict[str, str] = field(default_factory=dict)  # relay -> "negentropy" | "req"

    def live(self, slug: str, as_of: int | None = None) -> Live:
        return live_view(slug, self.versions.get(slug, []), as_of)

    def lives(self) -> dict[str, Live]:
        return {slug: self.live(slug) for slug in sorted(self.versions)}

    def spreadable(self) -> dict[str, dict[str, Event]]:
        """slug -> id -> event of every version any reader may still see, and the slug's
        newest head when it holds one of them: what sync, migrate and export carry
        (never a forgotten version)."""
        out: dict[str, dict[str, Event]] = {}
        for slug, versions in self.versions.items():
            ids = {v.id for v in visible(versions)}
            head = self.heads.get(slug)
            mine = out.setdefault(slug, {})
            for v in versions:
                if v.id in ids and (
                    not v.head or (head is not None and v.event.id == head.event.id)
                ):
                    mine[v.event.id] = v.event
        return out


def merge_fetched(a: Fetched, b: Fetched) -> Fetched:
    """One relay's answers to two filters, as one."""
    return Fetched(
        {**a.events, **b.events},
        a.pages + b.pages,
        [*a.stuck_at, *b.stuck_at],
        a.ignores_until or b.ignores_until,
        a.cut_off or b.cut_off,
    )


class SlugHistory:
    """One slug of a memory read on a relay session that stays open for the caller's
    writes: what `MemoryBase.slug_history` gives to `async with`. The session's
    connections and each relay's max_limit (NIP-11, asked once) serve the read, the
    write and its re-read; `session` exists before the connections do, so a caller that
    must tell a timeout from a refusal (`AgentMemory.core`) can look at `session.failed`
    after a failed entry."""

    def __init__(self, memory: MemoryBase, slug: str, history: bool) -> None:
        self.memory = memory
        self.slug = slug
        self.history = history
        self.session = RelaySession(memory.relays, memory.identity.seckey, memory.timeout)
        self.checker = HeadChecker(memory.identity)
        self.limits: dict[str, int | None] = {}
        self._read: MemoryRead | None = None

    @property
    def read(self) -> MemoryRead:
        """The slug as read on entry."""
        if self._read is None:
            raise RuntimeError("slug_history is read inside `async with`")
        return self._read

    async def reread(self) -> MemoryRead:
        """The slug read again on the same session, paged to the end (after a write)."""
        memory, history = self.memory, self.history
        return await memory._read_slug(
            self.session, self.checker, self.slug, self.limits, history=history
        )

    async def __aenter__(self) -> SlugHistory:
        try:
            await self.memory._connect(self.session)
            self.limits = await self.session.max_limits()
            self._read = await self.reread()
        except BaseException:
            await self.session.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.session.close()


class MemoryBase:
    """One agent's memory for one owner, on a relay set: the shared plumbing.

    `identity` says whose memory and which key is held (`identity.as_owner`: the owner's
    key, which reads everything and writes owner verdicts only). Every method bounds its
    whole exchange with `timeout` seconds.

    The recall index lives as long as the object: `one_shot` (a CLI run) keeps no exact
    check running in the background and saves the index's cache at once; otherwise the
    object follows the relays in the background and saves within seconds of a change
    (`close()` writes what is still waiting).
    """

    def __init__(
        self,
        identity: Identity,
        relays: str | Sequence[str],
        *,
        timeout: float = DEFAULT_TIMEOUT,
        recall_dir: Path | None = None,
        one_shot: bool = False,
    ) -> None:
        self.identity = identity
        self.relays = parse_relays(relays)
        self.timeout = timeout
        self.recall_dir = recall_dir  # None: the user's data dir (`cli.memory.recall.cache`)
        self.one_shot = one_shot
        self._recall: Recall | None = None

    @property
    def role(self) -> str:
        """`agent` (the agent's key) or `owner` (the owner's key, `--agent`)."""
        return OWNER if self.identity.as_owner else AGENT

    @property
    def read_only(self) -> bool:
        """Kept for callers of earlier versions: no session is read-only any more (the
        owner writes verdicts); use `role`."""
        return False

    @staticmethod
    def slug(raw: str) -> str:
        """`notes/x` -> `mem/notes/x`; `core` stays; anything invalid is BadInputError."""
        try:
            return normalize_slug(raw)
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc

    @staticmethod
    def now() -> int:
        return int(time.time())

    # -- filters --

    def _filters(self, d: str | None = None, *, history: bool = False) -> list[dict[str, Any]]:
        """The agent's heads (and revisions, for history) and the owner's verdicts."""
        return memory_filters(self.identity, d, history=history)

    async def _session(self, urls: Sequence[str] | None = None) -> RelaySession:
        session = RelaySession(urls or self.relays, self.identity.seckey, self.timeout)
        await self._connect(session)
        return session

    @staticmethod
    async def _connect(session: RelaySession) -> None:
        """Connect to every relay of `session`; an error naming each when none answers."""
        await session.connect()
        session.raise_if_none(session.live)

    def _report(
        self,
        session: RelaySession,
        checker: HeadChecker,
        answered: Iterable[str],
        behind: dict[str, int] | None = None,
        incomplete: dict[str, str] | None = None,
    ) -> SetReport:
        answered = set(answered)
        return SetReport(
            relays=tuple(session.urls),
            answered=tuple(u for u in session.urls if u in answered),
            failed=session.reasons(),
            behind=behind or {},
            incomplete=incomplete or {},
            skipped=dict(checker.skipped),
        )

    # -- reads --

    def _collect(
        self,
        checker: HeadChecker,
        events_by_relay: dict[str, Iterable[Event]],
        history: bool,
    ) -> tuple[dict[str, list[Version]], dict[str, Head], dict[str, dict[str, Head]], Any]:
        """Versions per slug, merged heads, per-relay heads and (history) holdings."""
        per_relay = {url: list(events) for url, events in events_by_relay.items()}
        views = {url: checker.heads(events) for url, events in per_relay.items()}
        merged = merge_heads(views.values())
        versions: dict[str, dict[str, Version]] = {}
        holdings: dict[str, dict[str, Holdings]] = {}
        for url, events in per_relay.items():
            for event in events:
                if not history and event.kind != KIND_VERDICT:
                    continue  # current reads: heads come from the head rule below
                v = checker.version(event)
                if v is None:
                    continue
                versions.setdefault(v.slug, {})[event.id] = v
                if history:
                    held = holdings.setdefault(v.slug, {}).setdefault(url, Holdings([], []))
                    (held.heads if v.head else held.versions).append(v)
        for slug, head in merged.items():
            versions.setdefault(slug, {})[head.event.id] = as_version(checker, head)
        if history:  # a relay that answered holds nothing of a slug: say so for the audit
            for slug in versions:
                for url in per_relay:
                    holdings.setdefault(slug, {}).setdefault(url, Holdings([], []))
        out = {slug: list(vs.values()) for slug, vs in versions.items()}
        return out, merged, views, holdings

    async def _fetch(
        self,
        session: RelaySession,
        filters: list[dict[str, Any]],
        limits: dict[str, int | None],
        *,
        urls: Sequence[str] | None = None,
        negentropy: bool = False,
        methods: dict[str, str] | None = None,
        must_answer: bool = True,
        one_slug: bool = False,
    ) -> tuple[dict[str, Fetched], dict[str, str]]:
        """Every event of `filters` from every live relay (or those of `urls`), paged to
        the end past each one's max_limit through `fetch_all` (or, with `negentropy`,
        reconciled where a relay serves NIP-77): relay -> what it returned, and relay ->
        why that may be partial. No relay left is an error naming each, unless not
        `must_answer`.

        Partial: paging made no progress (the relay ignores `until`, more events share
        one second than it returns per page, or paging was cut off), or, for the whole
        memory, the relay publishes no max_limit. Without one, paging goes on until a page
        brings nothing new, which misses events only where more of them share one second
        than the relay returns per page: many slugs written at once can, but the events
        of `one_slug` cannot, as each version's created_at is above the last's (NIP-AE
        *Writing*), so such a read is not flagged for the missing max_limit alone."""
        methods = {} if methods is None else methods
        fetched: dict[str, Fetched] = {}
        for query in filters:
            if negentropy:
                got = await reconciled(
                    session, self.identity.seckey, query, limits, methods, self.timeout
                )
            else:
                got = await session.on_each(
                    lambda c, q=query: fetch_all(c, q, limits.get(c.url)), urls
                )
            for url, f in got.items():
                fetched[url] = merge_fetched(fetched[url], f) if url in fetched else f
        fetched = {u: f for u, f in fetched.items() if u in session.live}
        if must_answer:
            session.raise_if_none(fetched)
        incomplete: dict[str, str] = {}
        for url, f in fetched.items():
            if methods.get(url) == "negentropy":
                continue  # the reconciliation is exact
            why = f.why_incomplete(one_slug or limits.get(url) is not None)
            if why is not None and limits.get(url) is None and f.complete:
                note = getattr(session, "nip11_notes", {}).get(url, "no max_limit known")
                why = f"{note}; paged until nothing new came back (may be partial)"
            if why is not None:
                incomplete[url] = why
        return fetched, incomplete

    async def _read_slug(
        self,
        session: RelaySession,
        checker: HeadChecker,
        slug: str,
        limits: dict[str, int | None],
        *,
        history: bool = False,
    ) -> MemoryRead:
        """One slug from every relay, paged to the end: its head and the owner's verdicts
        (`history`: every head, revision and verdict too). A relay that could not be
        paged to the end is named in the report's `incomplete`."""
        d = d_tag(self.identity.conversation_key, slug)
        filters = self._filters(d, history=history)
        fetched, incomplete = await self._fetch(session, filters, limits, one_slug=True)
        mine = {
            url: [e for e in f.events.values() if any(t[:2] == ["d", d] for t in e.tags)]
            for url, f in fetched.items()
        }
        candidates = len({msgspec.json.encode(e) for events in mine.values() for e in events})
        versions, merged, views, holdings = self._collect(checker, mine, history)
        versions = {s: v for s, v in versions.items() if s == slug}
        merged = {s: h for s, h in merged.items() if s == slug}
        views = {u: {s: h for s, h in v.items() if s == slug} for u, v in views.items()}
        report = self._report(session, checker, fetched, behind(views, merged), incomplete)
        return MemoryRead(versions, merged, candidates, report, holdings, fetched)

    async def _read_all(
        self,
        session: RelaySession,
        checker: HeadChecker,
        *,
        history: bool = False,
        negentropy: bool = False,
    ) -> MemoryRead:
        """The whole memory from every relay, paged past each one's max_limit (or, with
        `negentropy`, reconciled where a relay serves NIP-77)."""
        limits = await session.max_limits()
        methods: dict[str, str] = {}
        filters = self._filters(history=history or negentropy)
        fetched, incomplete = await self._fetch(
            session, filters, limits, negentropy=negentropy, methods=methods
        )
        events = {url: f.events.values() for url, f in fetched.items()}
        versions, merged, views, holdings = self._collect(checker, events, history or negentropy)
        report = self._report(session, checker, fetched, behind(views, merged), incomplete)
        return MemoryRead(versions, merged, len(merged), report, holdings, fetched, methods)

    async def _everything(self, *, history: bool = False) -> MemoryRead:
        session = await self._session()
        try:
            return await self._read_all(session, HeadChecker(self.identity), history=history)
        finally:
            await session.close()

    def slug_history(self, slug: str, *, history: bool = True) -> SlugHistory:
        """`async with self.slug_history(slug) as opened:` a relay session open on the set,
        `slug` read on it (every head, revision and verdict; `history=False`: the head and
        the verdicts), paged to the end on every relay; closed on the way out. Every read
        of one slug and every write goes through it: a write decides on `opened.read`
        and publishes with `self._publish(opened, …)`."""
        return SlugHistory(self, slug, history)

    async def _slug_read(self, slug: str, *, history: bool = False) -> MemoryRead:
        """`slug` as read (see `slug_history`), for a caller that writes nothing."""
        async with self.slug_history(slug, history=history) as opened:
            return opened.read

    @staticmethod
    def _not_found(read: MemoryRead, slug: str, live: Live) -> NotFoundError:
        rejected = read.report.skipped_total
        note = f" ({rejected} invalid event(s) ignored)" if rejected else ""
        why = {
            "removed": " (removed)",
            "denied": " (denied by the owner)",
            "forgotten": " (forgotten)",
        }.get(live.state, "")
        return NotFoundError(f"not found: {slug}{why}{note}")

    # -- writes --

    def _allowed(self, read: MemoryRead, slug: str, text: str | None, force: bool) -> None:
        """RefusedError when the memory's rules refuse this write (engram.live.check_write)."""
        refusal = check_write(read.versions.get(slug, []), self.role, text, force=force)
        if refusal is not None:
            raise RefusedError(
                refusal.message(slug), refusal.version.id, refusal.reason, refusal.overridable
            )

    async def _publish(
        self, opened: SlugHistory, text: str | None, meta: Meta, *, link: bool = True
    ) -> WriteResult:
        """Publish a new version of the slug `opened` holds on every relay, then re-read
        it on every relay that accepted: it must read as this version (spec *Writing*: a
        lost race is a conflict, never a silent retry). `link`: name the chain's tip as
        `prev` (a forget starts a new history and does not). A relay whose history could
        not be read to the end is named in the result's report (`incomplete`)."""
        session, checker, base, slug = opened.session, opened.checker, opened.read, opened.slug
        versions = base.versions.get(slug, [])
        try:
            created_at = next_created_at(versions, self.now(), FUTURE_SKEW_MAX + 1)
        except ClockConflictError as exc:
            raise ConflictError(f"{slug}: {exc} (clock-poisoned head)") from None
        if link:
            prev, prev_sha = chain_link(versions)
            meta = msgspec.structs.replace(meta, prev=prev, prev_sha256=prev_sha)
        ident, role = self.identity, self.role
        try:
            version = build_version(
                ident.seckey, ident.peer, role, slug, text, meta, created_at,
                os.urandom(32), os.urandom(32),
            )  # fmt: skip
            events = [version]
            if role == AGENT:
                head_meta = msgspec.structs.replace(meta, rev=version.id)
                head = build_head(
                    ident.seckey, ident.owner, slug, text, head_meta, created_at,
                    os.urandom(32), os.urandom(32),
                )  # fmt: skip
                events.append(head)
        except EngramError as exc:
            raise BadInputError(str(exc)) from exc
        accepted, refused = await self._send(session, slug, events)
        good = await self._verify(opened, version.id, accepted, refused)
        if self._recall is not None:  # the index takes the write at once
            self._recall.written(Version(version, slug, text, role, meta), events[-1].id)
        return WriteResult(
            slug,
            version.id,
            created_at,
            sha256_hex(text) if text is not None else None,
            good,
            {u: r for u, r in refused.items() if u not in good},
            self._report(session, checker, good, incomplete=base.report.incomplete),
            role=role,
            trust=meta.trust,
            head_id=events[1].id if len(events) > 1 else None,
        )

    async def _send(
        self, session: RelaySession, slug: str, events: list[Event]
    ) -> tuple[list[str], dict[str, str]]:
        """Every event to every relay; (relays that took them all, relay -> why not)."""
        before = set(session.failed)
        answers = await session.on_each(lambda c: c.try_publish_many(events))
        # sent, then no OK before the deadline: such a relay may well hold the events
        unsure = [u for u in session.failed if u not in before]
        said_no: dict[str, str] = {}
        accepted: list[str] = []
        lost: list[str] = []
        for url, result in answers.items():
            nos = [result[e.id][1] or "no reason given" for e in events if not result[e.id][0]]
            if nos:
                said_no[url] = nos[0]
            elif any(e.kind == KIND_ENGRAM and is_superseded(result[e.id][1]) for e in events):
                # a head that wins is already there (a relay that already holds this very
                # head, as a second node of one deployment does, says "duplicate" too: that
                # is this write arriving twice, not a lost race)
                lost.append(url)
            else:
                accepted.append(url)
        refused = {u: f"refused the event: {m}" for u, m in said_no.items()}
        refused.update(session.reasons())
        for url in unsure:
            refused[url] = f"{refused[url]} after the event was sent: it MAY have been written"
        if lost:
            raise self._lost(slug, lost)
        if not accepted and unsure:
            names = ", ".join(unsure)
            raise RelayError(
                f"{slug}: no answer from {names} after the event was sent: the memory MAY "
                "have been written; read it back before writing again"
            )
        if not accepted:
            if len(session.urls) == 1 and said_no:
                message = next(iter(said_no.values()))
                gated = is_gated(message)
                raise (AuthError if gated else RelayError)(f"relay refused the event: {message}")
            if len(session.urls) == 1:
                session.raise_if_none([])  # the one relay failed: its own error
            detail = "; ".join(f"{u}: {r}" for u, r in refused.items())
            gated = all(map(is_gated, said_no.values()))
            cls = AuthError if said_no and gated and len(said_no) == len(refused) else RelayError
            raise cls(f"no relay accepted the event ({detail})")
        return accepted, refused

    def _lost(self, slug: str, relays: list[str]) -> ConflictError:
        if len(self.relays) > 1:
            where = ", ".join(relays)
            return ConflictError(
                f"{slug}: another write replaced this one on {where} (concurrent write)"
            )
        return ConflictError(f"{slug}: another write replaced this one (concurrent write)")

    async def _verify(
        self, opened: SlugHistory, version_id: str, accepted: list[str], refused: dict[str, str]
    ) -> tuple[str, ...]:
        """Re-read the slug on each relay that accepted, paged to the end (an owner's
        verdicts are many): it must read as the new version."""
        session, slug = opened.session, opened.slug
        filters = self._filters(d_tag(self.identity.conversation_key, slug))
        reread, _ = await self._fetch(
            session, filters, opened.limits, urls=accepted, must_answer=False, one_slug=True
        )
        lost: list[str] = []
        for url in accepted:
            if url not in reread:
                if url in session.failed:
                    refused[url] = f"accepted, but the re-read failed: {session.reasons()[url]}"
                continue
            events = {url: reread[url].events.values()}
            versions, *_ = self._collect(opened.checker, events, False)
            view = live_view(slug, versions.get(slug, []))
            if view.version is None or view.version.id != version_id:
                lost.append(url)
        if lost:
            raise self._lost(slug, lost)
        return tuple(u for u in accepted if u in reread)
