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
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import msgspec

from cli.client import RelayClient
from cli.errors import (
    AgentMemoryError,
    AuthError,
    BadInputError,
    ConflictError,
    NotFoundError,
    RelayError,
)
from cli.identity import Identity
from cli.paging import Fetched, fetch_all
from cli.patch import PatchError, apply_patch
from cli.relayset import RelaySession, parse_relays
from cli.search import Match, search_heads
from cli.sync import FETCH_CHUNK, Peer, Unsupported, reconcile_items
from engram import (
    CORE_SLUG,
    FUTURE_SKEW_MAX,
    KIND_ENGRAM,
    Body,
    ClockConflictError,
    Core,
    EngramError,
    Head,
    InvalidEngramError,
    ListingEntry,
    Memory,
    Tombstone,
    body_text,
    build_event,
    d_tag,
    encode_body,
    listing,
    monotonic_created_at,
    normalize_slug,
    reachability,
    select_head,
    validate_and_decrypt,
)
from engram.negentropy import Items
from engram.nip01 import Event

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
    "SyncReport",
    "WriteResult",
    "sha256_hex",
]

DEFAULT_TIMEOUT = 10.0
NEG_OPEN_TIMEOUT = 20.0  # seconds for a relay's first negentropy answer, then REQ paging
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


@dataclass(frozen=True)
class Entry:
    """A live memory (or core's profile): its text and the event that holds it."""

    slug: str
    value: str
    event_id: str
    created_at: int
    sha256: str
    report: SetReport


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


@dataclass(frozen=True)
class Listing:
    """Live memories (core and tombstones omitted), sorted by slug."""

    entries: list[ListingEntry]
    report: SetReport


@dataclass(frozen=True)
class Refs:
    """Reachability from core: reachable slugs, orphans and dangling `(from, to)` links."""

    has_core: bool
    reachable: list[str]
    orphans: list[str]
    dangling: list[tuple[str, str]]
    report: SetReport


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


# --- validation -------------------------------------------------------------------------


class _Checker:
    """Validates each distinct event once (a tampered copy is a distinct event) and
    counts the invalid ones by reason."""

    def __init__(self, ident: Identity) -> None:
        self._ident = ident
        self._seen: dict[bytes, Head | None] = {}
        self.skipped: Counter[str] = Counter()

    def head(self, event: Event) -> Head | None:
        key = msgspec.json.encode(event)
        if key in self._seen:
            return self._seen[key]
        ident = self._ident
        try:
            body = validate_and_decrypt(event, ident.agent, ident.owner, ident.conversation_key)
        except InvalidEngramError as exc:
            self.skipped[SKIP_REASONS.get(exc.rule, "invalid")] += 1
            result = None
        else:
            result = Head(event, body)
        self._seen[key] = result
        return result

    def heads(self, events: Iterable[Event]) -> dict[str, Head]:
        """slug -> head among `events` (spec: *Head selection*).

        A valid event's slug re-derives to its `d` (rule 4), so grouping by `d` is grouping
        by slug: each group is tried newest first (ties: lowest id) and the first valid
        event is the head. Older versions are never decrypted, which keeps a relay that
        returns every historical version as cheap as one that keeps only heads; every
        event tried and found invalid is counted.
        """
        groups: dict[str, list[Event]] = {}
        for event in events:
            ds = [t[1] for t in event.tags if len(t) >= 2 and t[0] == "d"]
            groups.setdefault(ds[0] if len(ds) == 1 else "", []).append(event)
        out: dict[str, Head] = {}
        for d, group in groups.items():
            group.sort(key=lambda e: (-e.created_at, e.id))
            for event in group:
                if (h := self.head(event)) is not None:
                    out[h.body.slug] = h
                    if d:
                        break
        return out


async def _fetch_ids(peer: Peer, ids: list[str]) -> list[Event]:
    """The events with these ids that the relay serves, asked for a chunk at a time."""
    out: list[Event] = []
    for k in range(0, len(ids), FETCH_CHUNK):
        out += await peer.fetch(ids[k : k + FETCH_CHUNK])
    return out


def _pick(heads: list[Head]) -> Head:
    best = select_head(h.event for h in heads)
    return next(h for h in heads if h.event is best)


def _merge(views: Iterable[dict[str, Head]]) -> dict[str, Head]:
    groups: dict[str, list[Head]] = {}
    for view in views:
        for slug, head in view.items():
            groups.setdefault(slug, []).append(head)
    return {slug: _pick(group) for slug, group in groups.items()}


def _behind(views: dict[str, dict[str, Head]], merged: dict[str, Head]) -> dict[str, int]:
    out: dict[str, int] = {}
    for url, view in views.items():
        n = sum(
            1
            for slug, h in merged.items()
            if (v := view.get(slug)) is None or v.event.id != h.event.id
        )
        if n:
            out[url] = n
    return out


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
        self, identity: Identity, relays: str | Sequence[str], *, timeout: float = DEFAULT_TIMEOUT
    ) -> None:
        self.identity = identity
        self.relays = parse_relays(relays)
        self.timeout = timeout

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
        checker: _Checker,
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

    async def _read_slug(self, session: RelaySession, checker: _Checker, slug: str) -> _Read:
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
        merged = _merge(views.values())
        report = self._report(session, checker, answers, _behind(views, merged))
        return _Read(merged, views, len(candidates), report)

    async def _read_all(
        self, session: RelaySession, checker: _Checker, *, negentropy: bool = False
    ) -> tuple[_Read, dict[str, Fetched]]:
        """Every event of the memory from every relay, validated; heads merged.

        Each relay is paged with REQ, or with `negentropy`, reconciled where it serves
        NIP-77 (`_reconciled`)."""
        limits = await session.max_limits()
        query = self._filter()
        methods: dict[str, str] = {}
        if negentropy:
            fetched = await self._reconciled(session, query, limits, methods)
        else:
            fetched = await session.on_each(lambda c: fetch_all(c, query, limits.get(c.url)))
        session.raise_if_none(fetched)
        views = {url: checker.heads(f.events.values()) for url, f in fetched.items()}
        merged = _merge(views.values())
        incomplete: dict[str, str] = {}
        for url, f in fetched.items():
            if methods.get(url) == "negentropy":
                continue  # the reconciliation is exact
            if f.ignores_until:
                incomplete[url] = "the relay ignores `until`, so paging cannot go further back"
            elif f.stuck_at:
                seconds = ", ".join(str(s) for s in f.stuck_at[:3])
                incomplete[url] = (
                    f"more events share one second ({seconds}) than the relay returns per page"
                )
            elif limits.get(url) is None:
                note = getattr(session, "nip11_notes", {}).get(url, "no max_limit known")
                incomplete[url] = f"{note}; paged until nothing new came back (may be partial)"
        report = self._report(session, checker, fetched, _behind(views, merged), incomplete)
        return _Read(merged, views, len(merged), report, methods), fetched

    async def _reconciled(
        self,
        session: RelaySession,
        query: dict[str, Any],
        limits: dict[str, int | None],
        methods: dict[str, str],
    ) -> dict[str, Fetched]:
        """What every relay holds of the memory, each distinct event downloaded once.

        Heads are chosen after decryption, so the memory itself is still read: with REQ
        paging from the relays NIP-11 says lack NIP-77 (or from the first relay when none
        says so). Every other relay is reconciled with negentropy (NIP-77) against the
        events read so far: the ids it lacks tell which heads to give it, and only the
        events it alone holds are fetched, by id. A relay that turns negentropy down (NEG-ERR,
        a NOTICE, no answer) is paged with REQ instead.
        """
        docs: dict[str, dict[str, Any]] = getattr(session, "nip11_docs", {})
        seckey = self.identity.seckey
        peers = {u: Peer(session.clients[u], seckey, docs.get(u)) for u in session.live}
        paged = [u for u, p in peers.items() if p.serves_negentropy is False] or session.live[:1]
        fetched = await session.on_each(lambda c: fetch_all(c, query, limits.get(c.url)), paged)
        methods.update(dict.fromkeys(fetched, "req"))
        known = {i: e for f in fetched.values() for i, e in f.events.items()}
        items = Items.from_pairs((e.created_at, bytes.fromhex(i)) for i, e in known.items())
        wait = min(NEG_OPEN_TIMEOUT, self.timeout)

        async def one(client: RelayClient) -> Fetched:
            peer = peers[client.url]
            try:
                lacks, extra, _ = await reconcile_items(peer, items, query, wait)
            except Unsupported:
                await peer.neg_close()
                methods[client.url] = "req"
                return await fetch_all(client, query, limits.get(client.url))
            absent = set(lacks)
            out = Fetched({i: e for i, e in known.items() if i not in absent})
            out.events.update((e.id, e) for e in await _fetch_ids(peer, extra))
            methods[client.url] = "negentropy"
            return out

        rest = [u for u in session.live if u not in paged]
        fetched.update(await session.on_each(one, rest))
        return fetched

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
        self, session: RelaySession, checker: _Checker, body: Body, base: _Read
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
        answers = await session.on_each(lambda c: c.try_publish_many([event]))
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
            checker = _Checker(self.identity)
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
        try:
            pattern = re.compile(query if regex else re.escape(query), re.IGNORECASE)
        except re.error as exc:
            raise BadInputError(f"invalid regular expression: {exc}") from exc
        if not query:
            raise BadInputError("the search query is empty")
        if limit < 1:
            raise BadInputError("--limit must be at least 1")
        read = await self._everything()
        matches = Matches(search_heads(read.merged, pattern, limit))
        matches.report = read.report
        return matches

    async def _everything(self) -> _Read:
        session = await self._session()
        try:
            read, _ = await self._read_all(session, _Checker(self.identity))
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
            checker = _Checker(self.identity)
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
        """Write `value` (for `core`: the profile) on every relay of the set."""
        self._writable()
        slug = self.slug(slug)
        body = self._body(slug, value)
        session = await self._session()
        try:
            checker = _Checker(self.identity)
            base = await self._read_slug(session, checker, slug)
            return await self._write(session, checker, body, base)
        finally:
            await session.close()

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
            checker = _Checker(self.identity)
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
            checker = _Checker(self.identity)
            base = await self._read_slug(session, checker, slug)
            self._entry(base, slug)  # raises NotFoundError
            return await self._write(session, checker, body, base)
        finally:
            await session.close()

    # -- sync, migration, backup --

    async def _spread(
        self,
        session: RelaySession,
        heads: dict[str, Head],
        held: dict[str, set[str]],
        urls: Sequence[str],
    ) -> dict[str, RelaySync]:
        """Republish each head event, exactly as signed, to each relay that lacks it."""
        out: dict[str, RelaySync] = {}
        wanted = {h.event.id: h.event for h in heads.values()}
        missing = {u: [e for i, e in wanted.items() if i not in held.get(u, set())] for u in urls}
        answers = await session.on_each(
            lambda c: c.try_publish_many(missing[c.url]), urls=[u for u in urls if missing[u]]
        )
        reasons = session.reasons()
        for url in urls:
            if url in reasons:
                out[url] = RelaySync(error=reasons[url])
                continue
            results = answers.get(url, {})
            refused = {
                i: m
                for i, (ok, m) in results.items()
                if not ok or m.startswith("duplicate: a newer")
            }
            out[url] = RelaySync(
                published=len(results) - len(refused),
                up_to_date=len(wanted) - len(missing[url]),
                refused=refused,
            )
        return out

    async def sync(self) -> SyncReport:
        """Give every relay of the set every head (memories, tombstones, core); idempotent."""
        session = await self._session()
        try:
            checker = _Checker(self.identity)
            read, fetched = await self._read_all(session, checker, negentropy=True)
            held = {u: set(f.events) for u, f in fetched.items()}
            relays = await self._spread(session, read.merged, held, list(fetched))
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
            checker = _Checker(self.identity)
            sources = [u for u in self.relays if u in session.live]
            session.raise_if_none(sources)
            read, fetched = await self._read_all(session, checker, negentropy=True)
            held = {u: set(f.events) for u, f in fetched.items()}
            live_targets = [u for u in targets if u in fetched]
            copied = await self._spread(session, read.merged, held, live_targets)
            copied = {u: replace(r, method=read.methods.get(u)) for u, r in copied.items()}
            # read back: every head's event id must now be on every target
            heads = [h.event.id for h in read.merged.values()]
            seckey = self.identity.seckey
            again = await session.on_each(
                lambda c: _fetch_ids(Peer(c, seckey, None), heads), urls=live_targets
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
            checker = _Checker(self.identity)
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
        checker = _Checker(self.identity)
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
        from_file = _merge(file_views)
        session = await self._session()
        try:
            read, fetched = await self._read_all(session, checker)
            held = {u: set(f.events) for u, f in fetched.items()}
            merged = _merge([from_file, read.merged])
            mine = {s: h for s, h in merged.items() if s in from_file}
            relays = await self._spread(session, mine, held, list(fetched))
            for url, reason in session.reasons().items():
                relays.setdefault(url, RelaySync(error=reason))
            report = self._report(session, checker, fetched, {}, read.report.incomplete)
            return ImportReport(len(from_file), relays, report)
        finally:
            await session.close()
