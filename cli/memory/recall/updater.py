"""Keeping the recall index current from the relay set; the relays stay the truth.

`Recall` holds one memory's index for as long as its owner (a CLI run, the API object, the
MCP server, the ACP proxy) lives. Each relay is brought up to date by one of:
- `negentropy`: NIP-77 of what the index knows (its heads, and the events it has seen that
  are no head) against the relay's set: one round trip when nothing changed, and only the
  events the index lacks are fetched, whatever their created_at (a head copied in later by
  `engram mem sync`, a writer whose clock runs behind). The first call of every process,
  where the relay serves it; then every `reconcile_seconds` in the background of a
  long-running process;
- `since`: REQ paging (`cli.nostr.paging`) from a little before the newest event the relay gave
  (`slack` on a process's first call, `warm_slack` later): one round trip, what a warm call
  of a long-running process does, and a relay's first call when it does not serve NIP-77;
- `req`: everything (REQ paging), for a relay new to the cache, and every `full_every`
  seconds for a relay without NIP-77: what `since` cannot see (a write dated more than
  `slack` behind the newest) is missed for at most that long.

Every event a relay returns is hostile input: one whose id is not hex, whose created_at is
negative or absurd, or whose content is oversize is counted and dropped before anything
looks at it (`screened`); the id's hash and the signature are checked (once, by
HeadChecker) before an event is taken, remembered as seen (the cache, NIP-77) or counted
as a relay's newest. An event is decrypted only if it could change a head: one whose `d`
is a known slug's and that does not beat that slug's head is the same event again (taken
as such only with the id and created_at that were verified) or an older version, which is
verified before it is remembered. Every other event goes through
`HeadChecker` (all five validity rules) and the head rule (`engram.beats`, through
`engram.live` with the index's entry as one of the versions: the winner is kept whatever
order events come in), then
the owner's verdicts (kind 4175: denials, corrections, confirmations, forgets; few, read
whole on every refresh) go with it through `engram.live`, the rule every read of memory
goes through, which decides what a slug reads as, and so what is indexed. A whole read is
indexed page by page as it comes
(`cli.nostr.paging.fetch_all`'s `take`), so a first build of 100,000 memories never holds them
all at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cli.memory.heads import HeadChecker, as_version, memory_filters
from cli.memory.recall.cache import CacheFile
from cli.memory.recall.dense import load
from cli.memory.recall.index import Hit, Known, RecallIndex
from cli.memory.recall.settings import SETTINGS, RecallSettings
from cli.memory.results import SetReport
from cli.nostr.client import RelayClient, connect_relay, fetch_nip11, max_limit_of
from cli.nostr.errors import AuthError, RelayError
from cli.nostr.identity import Identity
from cli.nostr.paging import Fetched, fetch_all
from cli.nostr.peer import Peer, Unsupported
from cli.nostr.reconcile import reconcile_items
from cli.nostr.relayset import _reason
from engram import KIND_ENGRAM, KIND_VERDICT, Head, beats, d_tag
from engram.live import Live, live_view, valid_at
from engram.negentropy import Items
from engram.nip01 import Event, is_hex
from engram.nip44 import PAYLOAD_MAX_CHARS
from engram.versions import AGENT, Meta, Version

T = TypeVar("T")


@dataclass
class Recalled:
    """Recall's answer: hits best first (iterating it iterates them), and what the relay
    set had to say."""

    hits: list[Hit]
    report: SetReport
    changed: int = 0  # heads the index took from the relays on this call
    methods: dict[str, str] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Hit]:
        return iter(self.hits)

    def __len__(self) -> int:
        return len(self.hits)


@dataclass
class _Tally:
    """What one refresh took: heads changed, events skipped as invalid (by reason)."""

    changed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


# Why an event is skipped before any rule of the protocol looks at it (the rules' own
# reasons are cli.memory.results.SKIP_REASONS, counted by HeadChecker).
BAD_ID = "bad id"
BAD_TIME = "bad created_at"
OVERSIZE = "oversize"


def screened(events: Iterable[Event], latest: int, skipped: Counter[str]) -> list[Event]:
    """The events whose id is 64 lower-case hex (NIP-01's only form), whose created_at is
    in 0..`latest` and whose content fits a NIP-44 payload (engram.nip44: what any memory
    event carries); the others are counted in `skipped` by reason. Cheap checks only: the
    id's hash and the signature are the protocol's rule 2, checked (once) by HeadChecker
    before anything is taken from an event, or remembered of it."""
    kept = []
    for e in events:
        if not is_hex(e.id, 64):
            skipped[BAD_ID] += 1
        elif not 0 <= e.created_at <= latest:
            skipped[BAD_TIME] += 1
        elif len(e.content) > PAYLOAD_MAX_CHARS:
            skipped[OVERSIZE] += 1
        else:
            kept.append(e)
    return kept


class Recall:
    def __init__(
        self,
        identity: Identity,
        relays: Sequence[str],
        timeout: float,
        *,
        cache_dir: Path | None = None,
        settings: RecallSettings = SETTINGS,
        persist: bool = True,
        background: bool = True,
    ) -> None:
        self.identity = identity
        self.urls = list(relays)
        self.timeout = timeout
        self.settings = settings
        self.persist = persist
        self._cache_dir = cache_dir
        self.index: RecallIndex | None = None
        self.cache: CacheFile | None = None
        self.newest: dict[str, int] = {}  # relay -> newest created_at it gave us
        self.checked: dict[str, float] = {}  # relay -> when it was last read exactly
        # events seen that are no head (older versions, invalid ones): id -> created_at,
        # told to NIP-77 as known so that they are not fetched on every run
        self.seen: dict[str, int] = {}
        self.methods: dict[str, str] = {}  # relay -> how the last refresh read it
        self._last_exact = 0.0  # monotonic time of this process's last NIP-77 round
        self._dirty = False  # something the cache keeps changed besides the heads
        self._docs: dict[str, dict[str, Any]] = {}
        self._limits: dict[str, int | None] = {}
        self._slug_of_d: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._clients: dict[str, RelayClient] = {}
        self._started = False
        self._exact_task: asyncio.Future[None] | None = None
        self._save_task: asyncio.Future[None] | None = None
        self.background = background  # exact checks in the background (long-running owners)
        self.rebuilt = False  # the cache was missing or refused on load
        self._saved_newest: dict[str, int] = {}
        self._changes = 0  # changes to keep, counted; `_saved_changes`: as of the last save
        self._saved_changes = 0
        self._saving: asyncio.Future[bool] | None = None  # a save in its thread
        self.background_checks = 0  # background exact checks and saves done (a bench
        self.background_saves = 0  # reads them: calls measured across them)
        # slug -> the owner's verdicts, as last read whole (None: not read yet)
        self.verdicts: dict[str, dict[str, Version]] | None = None

    # -- loading ------------------------------------------------------------------------

    def _open(self) -> RecallIndex:
        if self.index is not None:
            return self.index
        ident = self.identity
        embedder = load(self.settings.model)
        index = RecallIndex(embedder)
        self.cache = CacheFile(
            self._cache_dir, ident.agent, ident.owner, embedder.name, ident.conversation_key
        )
        payload = self.cache.load(index) if self.persist else None
        if payload is not None:
            self.newest = {u: t for u, t in payload.relays.items() if u in self.urls}
            self._saved_newest = dict(self.newest)
            self.checked = dict(payload.checked)
            blob = payload.seen_ids
            latest = int(time.time()) + self.settings.future_max
            self.seen = {  # a time out of range: written by a version that did not check
                blob[32 * i : 32 * i + 32].hex(): at
                for i, at in enumerate(payload.seen_at)
                if 0 <= at <= latest
            }
        else:
            self.rebuilt = True
        self.index = index
        kc = ident.conversation_key
        self._slug_of_d = {d_tag(kc, slug): slug for slug in index.heads}
        return index

    # -- the exchange with the relays -----------------------------------------------------

    def _filter(self, **extra: Any) -> dict[str, Any]:
        """The agent's heads (`since` and the like in `extra`)."""
        return {**memory_filters(self.identity)[0], **extra}

    def _verdict_filter(self) -> dict[str, Any]:
        return memory_filters(self.identity)[1]

    def _could_change(self, event: Event) -> bool:
        """False for an event that cannot change a head: skipped unverified."""
        assert self.index is not None
        ds = [t[1] for t in event.tags if len(t) >= 2 and t[0] == "d"]
        slug = self._slug_of_d.get(ds[0]) if len(ds) == 1 else None
        known = self.index.heads.get(slug) if slug is not None else None
        if known is None:
            return True
        return beats(event.created_at, event.id, known.created_at, known.event_id)

    # -- connections, kept for the object's life --------------------------------------------

    async def _client(self, url: str) -> RelayClient:
        """The kept connection to `url` (made on first use), its NIP-11 known."""
        client = self._clients.get(url)
        if client is None:
            client = await connect_relay(url, self.identity.seckey, self.timeout)
            self._clients[url] = client
        await self._doc(url)
        return client

    async def _doc(self, url: str) -> None:
        """The relay's NIP-11 document and page limit, read once."""
        if url not in self._docs:
            try:
                self._docs[url] = await fetch_nip11(url, self.timeout)
            except RelayError:
                self._docs[url] = {}
            self._limits[url] = max_limit_of(self._docs[url])

    async def _on_each(
        self, step: Callable[[RelayClient], Awaitable[T]], *, own: bool = False
    ) -> tuple[dict[str, T], dict[str, str]]:
        """`step` on every relay at once within `timeout`; (answers, relay -> why not).
        A relay that fails loses its connection (the next call connects again). `own`:
        on connections of its own, closed after (a client runs one request at a time, so
        the background check never shares the calls' connections)."""

        async def separate(url: str) -> T:
            async with asyncio.timeout(self.timeout):
                await self._doc(url)
                client = await connect_relay(url, self.identity.seckey, self.timeout)
                try:
                    return await step(client)
                finally:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.close(), 1.0)

        async def one(url: str) -> T:
            if own:
                return await separate(url)
            async with asyncio.timeout(self.timeout):
                kept = self._clients.get(url)
                if kept is not None:
                    try:
                        return await step(kept)
                    except RelayError:  # a kept connection the relay has closed since
                        self._clients.pop(url, None)
                        with contextlib.suppress(Exception):
                            await asyncio.wait_for(kept.close(), 1.0)
                return await step(await self._client(url))

        results = await asyncio.gather(*(one(u) for u in self.urls), return_exceptions=True)
        answers: dict[str, T] = {}
        failed: dict[str, str] = {}
        errors: list[Exception] = []
        for url, result in zip(self.urls, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                errors.append(result)
                failed[url] = _reason(result)
                client = self._clients.pop(url, None)
                if client is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(client.close(), 1.0)
            else:
                answers[url] = result
        if not answers:
            detail = "; ".join(f"{u}: {r}" for u, r in failed.items())
            if len(self.urls) == 1 and isinstance(errors[0], AuthError | RelayError):
                raise type(errors[0])(str(errors[0]))
            auth = all(isinstance(e, AuthError) for e in errors)
            raise (AuthError if auth else RelayError)(f"no relay answered ({detail})")
        return answers, failed

    async def close(self) -> None:
        """Close the kept connections, stop the background check, and write a change
        still waiting to be saved."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 1.0)
        if self._exact_task is not None:
            self._exact_task.cancel()
        task = self._save_task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self._saving is not None and not self._saving.done():
            with contextlib.suppress(Exception):  # a save in its thread ends first: an
                await self._saving  # older file must not be renamed over the last one
        if self._changes != self._saved_changes:
            async with self._lock:
                self._save()

    # -- the exchange with the relays -------------------------------------------------------

    async def _since(self, client: RelayClient, slack: int) -> Fetched:
        newest = self.newest.get(client.url)
        flt = self._filter() if newest is None else self._filter(since=max(newest - slack, 0))
        return await fetch_all(client, flt, self._limits.get(client.url))

    async def _everything(self, client: RelayClient, tally: _Tally) -> Fetched:
        """Every event of the memory on this relay (REQ paging), an exact read if whole.
        Each page is verified and indexed as it arrives and is not kept: a first build
        never holds every event of a large memory at once (a page is indexed while the
        relay serves the next: a first build's wall time was the sum of both). The relay's
        newest event is taken only once paging is through (a read broken off halfway is not
        a base for `since`)."""
        url = client.url
        top = 0
        waiting: list[list[Event]] = []  # the page taken last, not indexed yet (one at most)
        later: asyncio.Future[None] | None = None
        failed: list[BaseException] = []

        def apply(events: list[Event]) -> None:
            nonlocal top
            checker = HeadChecker(self.identity)
            changed, newest = self._apply_events(events, checker)
            top = max(top, newest)
            tally.changed += changed
            tally.skipped.update(checker.skipped)

        def drain() -> None:
            while waiting:
                apply(waiting.pop(0))

        async def soon() -> None:
            # after the paging has asked for the next page: the relay reads it from its
            # store while this page is verified and indexed here
            await asyncio.sleep(0)
            try:
                drain()
            except Exception as exc:  # raised where the paging is awaited, as before
                failed.append(exc)

        def take(events: list[Event]) -> None:
            nonlocal later
            drain()  # the page before, if its turn has not come yet: one page waits at most
            waiting.append(events)
            later = asyncio.ensure_future(soon())

        try:
            got = await fetch_all(client, self._filter(), self._limits.get(url), take=take)
        finally:
            if later is not None and not later.done():
                later.cancel()
            drain()  # what was taken is indexed, whatever the paging did after it
        if failed:
            raise failed[0]
        if top:
            self.newest[url] = max(self.newest.get(url, 0), top)
        if got.why_incomplete(self._limits.get(url) is not None) is None:
            self.checked[url] = time.time()
            self._dirty = True
        return got

    async def _negentropy(self, client: RelayClient) -> Fetched | None:
        """NIP-77 of what the index knows against the relay; only what it lacks is
        fetched. None when the relay does not serve NIP-77 or refuses this set."""
        assert self.index is not None
        peer = Peer(client, self.identity.seckey, self._docs.get(client.url))
        if not peer.serves_negentropy:
            return None
        # copied here (C-level copies), sorted and packed in a thread: at 100,000
        # memories building the set takes over half a second, which calls must not wait for
        heads, seen = list(self.index.heads.values()), list(self.seen.items())
        items = await asyncio.to_thread(_items, heads, seen)
        try:
            ours, theirs, _ = await reconcile_items(peer, items, self._filter(), self.timeout)
        except Unsupported:
            await peer.neg_close()
            return None
        for gone in ours:  # seen events this relay no longer holds
            if self.seen.pop(gone, None) is not None:
                self._dirty = True
        got = Fetched({e.id: e for e in await peer.fetch_ids(theirs)}) if theirs else Fetched()
        self.checked[client.url] = time.time()
        return got

    async def _catch_up(
        self, client: RelayClient, first: bool, tally: _Tally, checker: HeadChecker
    ) -> tuple[Fetched, Fetched]:
        """One relay brought up to date on a call (see the module docstring): (heads, every
        owner verdict). The verdicts come first, so that heads taken page by page are
        read with them; `checker` is the call's, so that `_apply` does not check them
        again."""
        verdicts = await fetch_all(client, self._verdict_filter(), self._limits.get(client.url))
        self._take_verdicts({client.url: verdicts}, checker, whole=False)
        return await self._heads(client, first, tally), verdicts

    async def _heads(self, client: RelayClient, first: bool, tally: _Tally) -> Fetched:
        url = client.url
        s = self.settings
        if url not in self.newest:
            self.methods[url] = "req"
            return await self._everything(client, tally)
        if first:
            got = await self._negentropy(client)
            if got is not None:
                self.methods[url] = "negentropy"
                return got
            if time.time() - self.checked.get(url, 0.0) >= s.full_every:
                self.methods[url] = "req"
                return await self._everything(client, tally)
        self.methods[url] = "since"
        return await self._since(client, s.slack if first else s.warm_slack)

    async def _exact(self, client: RelayClient, tally: _Tally) -> Fetched:
        """The background check: NIP-77, or everything when a relay without it is due."""
        got = await self._negentropy(client)
        if got is not None:
            return got
        if time.time() - self.checked.get(client.url, 0.0) >= self.settings.full_every:
            return await self._everything(client, tally)
        return Fetched()

    def _apply_events(self, events: list[Event], checker: HeadChecker) -> tuple[int, int]:
        """Verify and index what could change a head among `events` (the head rule holds
        whatever order events come in: `_take` weighs each against the index's entry);
        valid events that are no head after that are remembered as seen. Invalid events
        (`screened`'s checks, then the protocol's rules through `checker`, which counts
        them) change nothing and are never remembered, cached, offered to NIP-77 or
        taken as a relay's newest. (heads changed, the newest valid event's created_at)"""
        index = self.index
        assert index is not None
        latest = int(time.time()) + self.settings.future_max
        events = screened(events, latest, checker.skipped)
        heads = checker.heads(e for e in events if self._could_change(e))
        changed = self._take(heads, checker)
        top = 0
        for e in events:
            at = index.created_at_of(e.id)
            at = self.seen.get(e.id) if at is None else at
            if at != e.created_at:  # new here (or a copy that is not what was verified)
                if checker.version(e) is None:
                    continue  # invalid: counted by the checker
                if not index.knows(e.id):
                    self.seen[e.id] = e.created_at
                    self._dirty = True
            top = max(top, e.created_at)
        if len(self.seen) > self.settings.seen_max:  # keep the newest
            kept = sorted(self.seen.items(), key=lambda kv: kv[1])[-self.settings.seen_max :]
            self.seen = dict(kept)
        return changed, top

    def _apply(
        self,
        fetched: dict[str, Fetched],
        tally: _Tally,
        verdicts: dict[str, Fetched] | None = None,
        checker: HeadChecker | None = None,
    ) -> None:
        """What the relays returned (and was not already taken page by page); with
        `verdicts`, the owner's verdicts as read whole from every relay that answered.
        One checker for all (the call's, when given): an event two relays gave, or one
        already checked on arrival, is verified once."""
        checker = checker or HeadChecker(self.identity)
        if verdicts is not None:
            self._take_verdicts(verdicts, checker, whole=True)
        for url, got in fetched.items():
            events = list(got.events.values())
            if events:
                changed, top = self._apply_events(events, checker)
                if top:
                    self.newest[url] = max(self.newest.get(url, 0), top)
                tally.changed += changed
        if verdicts is not None:  # every slug a verdict names, as the rule reads it now
            tally.changed += self._take({}, checker)
        tally.skipped.update(checker.skipped)

    def _take_verdicts(self, got: dict[str, Fetched], checker: HeadChecker, *, whole: bool) -> None:
        """The owner's verdicts: `whole`, as read from every relay that answered (they
        replace what was known: a verdict gone from the relays is gone); else added."""
        every: dict[str, dict[str, Version]] = {} if whole else dict(self.verdicts or {})
        for fetched in got.values():
            for v in checker.versions(fetched.events.values()):
                every.setdefault(v.slug, {})[v.id] = v
        self.verdicts = every

    async def refresh(self) -> tuple[SetReport, int, dict[str, str]]:
        """Bring the index up to the relays; (report, heads changed, relay -> method).

        The first call of a process reads each relay exactly (NIP-77) where it can, later
        ones ask from `warm_slack` before the newest; an exact check runs in the
        background of a long-running process when one is due."""
        async with self._lock:
            self._open()
            first = not self._started
            self.methods = {}
            tally = _Tally()
            checker = HeadChecker(self.identity)
            answers, failed = await self._on_each(
                lambda c: self._catch_up(c, first, tally, checker)
            )
            self._started = True
            fetched = {u: heads for u, (heads, _) in answers.items()}
            verdicts = {u: got for u, (_, got) in answers.items()}
            if first and all(m != "since" for m in self.methods.values()):
                self._last_exact = time.monotonic()  # every relay was just read exactly
            incomplete = {
                u: why
                for u, got in [*fetched.items(), *verdicts.items()]
                if (why := got.why_incomplete(self._limits.get(u) is not None)) is not None
                and not (got is fetched.get(u) and self.methods.get(u) == "negentropy")
            }
            self._apply(fetched, tally, verdicts, checker)
            changed = tally.changed
            if changed or self.rebuilt or self._dirty or self.newest != self._saved_newest:
                if self.rebuilt:  # a whole build: kept at once
                    self._save()
                    self.rebuilt = False
                else:
                    self._persist()
            self._maybe_check_exactly()
            report = SetReport(
                relays=tuple(self.urls),
                answered=tuple(u for u in self.urls if u in fetched),
                failed=failed,
                incomplete=incomplete,
                skipped=dict(tally.skipped),
            )
            return report, changed, dict(self.methods)

    def _maybe_check_exactly(self) -> None:
        """Start the exact check in the background when it is due: it catches what a
        `since` read cannot see (a write dated behind the newest, events copied in from
        another relay) and never delays a call."""
        due = time.monotonic() - self._last_exact >= self.settings.reconcile_seconds
        if not due or not self.background or ((t := self._exact_task) and not t.done()):
            return
        self._last_exact = time.monotonic()

        async def run() -> None:
            tally = _Tally()
            try:
                fetched, _ = await self._on_each(lambda c: self._exact(c, tally), own=True)
            except Exception:
                return
            # taken without the lock, a slice of events at a time: a call in between
            # ranks the index as it stands (each slice goes in whole, and the head rule
            # holds whatever order events come in)
            checker = HeadChecker(self.identity)
            for url, got in fetched.items():
                events = list(got.events.values())
                for at in range(0, len(events), BACKGROUND_SLICE):
                    changed, top = self._apply_events(events[at : at + BACKGROUND_SLICE], checker)
                    tally.changed += changed
                    if top:
                        self.newest[url] = max(self.newest.get(url, 0), top)
                    await asyncio.sleep(0)
            if tally.changed or self._dirty or self.newest != self._saved_newest:
                self._persist()
            self.background_checks += 1

        self._exact_task = asyncio.ensure_future(run())

    def _take(self, heads: dict[str, Head], checker: HeadChecker) -> int:
        """What each slug with a new head or a verdict reads as (`engram.live`), into the
        index; returns how many slugs changed."""
        index = self.index
        assert index is not None
        kc = self.identity.conversation_key
        verdicts = self.verdicts or {}
        changed: dict[str, Known] = {}
        for slug in {*heads, *verdicts}:
            if slug not in index.heads:
                self._slug_of_d[d_tag(kc, slug)] = slug
            versions = list(verdicts.get(slug, {}).values())
            if slug in heads:
                versions.append(as_version(checker, heads[slug]))
            prior = index.heads.get(slug)
            if prior is not None:
                versions.append(self._as_version(slug, prior))
            known = known_of(slug, live_view(slug, versions))
            if known is not None and known != prior:
                changed[slug] = known
        index.put(changed)
        return len(changed)

    def _as_version(self, slug: str, k: Known) -> Version:
        """What the index holds of a slug, as the version it came from (for the rule)."""
        ident = self.identity
        agent = k.role == AGENT
        event = Event(
            id=k.event_id, pubkey=ident.agent if agent else ident.owner,
            created_at=k.created_at, kind=KIND_ENGRAM if agent else KIND_VERDICT,
            tags=[], content="", sig="",
        )  # fmt: skip
        rev = k.version if k.version and k.version != k.event_id else None
        meta = Meta(trust=k.trust, valid_from=k.valid_from, valid_until=k.valid_until, rev=rev)
        return Version(event, slug, k.value, k.role, meta, head=agent, plain=agent and not rev)

    def _persist(self) -> None:
        """Keep a change: at once in a one-shot process (a CLI run), else within
        `save_delay` seconds, once for all the changes made meanwhile, in a thread that
        holds nothing a call needs (`_save_in_thread`): at 100,000 memories a save takes a
        fifth of a second, which a long-running process's callers must not wait for. The
        relays stay the truth: a change lost with the process is read again by the next
        one."""
        self._changes += 1
        if not self.background:
            self._save()
            return
        if self._save_task is not None and not self._save_task.done():
            return  # the running save sees `_changes` moved and saves again

        async def later() -> None:
            while True:
                await asyncio.sleep(self.settings.save_delay)
                if await self._save_in_thread():
                    return

        self._save_task = asyncio.ensure_future(later())

    async def _save_in_thread(self) -> bool:
        """One save off the event loop, without the lock: what is small (the relays'
        newest, the seen events) is copied here, the index is read in the thread, and the
        file is renamed in only if the index did not change meanwhile (its `version`);
        calls go on ranking and updating the index while it runs. True when what was
        saved is everything there was to save."""
        index, cache = self.index, self.cache
        if not self.persist or cache is None or index is None:
            return True
        version, changes = index.version, self._changes
        newest, checked, seen = dict(self.newest), dict(self.checked), dict(self.seen)

        def unchanged() -> bool:
            return index.version == version

        work = functools.partial(cache.save, index, newest, checked, seen, unchanged)
        self._saving = asyncio.get_running_loop().run_in_executor(None, work)
        saved = await asyncio.shield(self._saving)  # `close` waits for it, never cuts it
        if saved:
            self.background_saves += 1
            self._saved_newest, self._saved_changes = newest, changes
            if changes == self._changes:
                self._dirty = False
        return saved and changes == self._changes

    def _save(self) -> None:
        """A save on the event loop (a one-shot process, a whole build, closing)."""
        if self.persist and self.cache is not None and self.index is not None:
            self.cache.save(self.index, self.newest, self.checked, self.seen)
            self._saved_newest = dict(self.newest)
            self._saved_changes = self._changes
            self._dirty = False

    # -- what callers use -----------------------------------------------------------------

    async def recall(
        self, query: str, limit: int, mode: str = "fused", *, valid_now: bool = False
    ) -> Recalled:
        """The `limit` live memories best for `query`; `valid_now` leaves out facts not
        valid now (ended, or not yet begun)."""
        report, changed, methods = await self.refresh()
        assert self.index is not None
        skip: frozenset[str] = frozenset()
        if valid_now:
            now = int(time.time())
            skip = frozenset(
                slug
                for slug, k in self.index.heads.items()
                if k.value is not None and not valid_at(Meta(valid_from=k.valid_from,
                                                              valid_until=k.valid_until), now)
            )  # fmt: skip
        hits = self.index.rank(query, limit, mode, skip)
        return Recalled(hits, report, changed, methods)

    async def similar(self, slug: str, value: str) -> list[Hit]:
        """Live memories close to `value` written at `slug` (write-time hints)."""
        await self.refresh()
        assert self.index is not None
        s = self.settings
        return self.index.similar(slug, value, s.similar_limit, s.similar)

    def written(self, version: Version, event_id: str) -> None:
        """A write this process made and saw accepted (`event_id`: the head it wrote, or
        the verdict): the index takes it at once (a removal, denial or forget removes the
        slug), so the next call sees it whatever the relays say."""
        if self.index is None:
            return  # not loaded yet: the next refresh reads it from the relays
        slug = version.slug
        if slug not in self.index.heads:
            self._slug_of_d[d_tag(self.identity.conversation_key, slug)] = slug
        meta = version.meta
        known = Known(
            event_id, version.created_at, version.text, version.id, meta.trust, version.role,
            meta.valid_from, meta.valid_until,
        )  # fmt: skip
        if self.index.apply_known([(slug, known)]):
            self._persist()


BACKGROUND_SLICE = 32  # events the background check takes between two calls' turns


def _items(heads: list[Known], seen: list[tuple[str, int]]) -> Items:
    """What the index knows, as NIP-77's set: its heads and the events seen."""
    pairs = [(k.created_at, bytes.fromhex(k.event_id)) for k in heads]
    pairs += [(at, bytes.fromhex(i)) for i, at in seen]
    return Items.from_pairs(pairs)


def known_of(slug: str, live: Live) -> Known | None:
    """What the index keeps of what a slug reads as: the value only when live (core's
    too: recall never ranks it, its people resolve names), with its version, trust and
    validity."""
    v = live.version
    if v is None:
        return None
    meta = v.meta
    return Known(
        v.event.id, v.created_at, live.text, v.id, meta.trust, v.role, meta.valid_from,
        meta.valid_until,
    )  # fmt: skip
