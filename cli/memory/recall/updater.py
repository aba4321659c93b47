"""Keeping the recall index current from the relay set; the relays stay the truth.

`Recall` holds one memory's index for as long as its owner (a CLI run, the API object, the
MCP server, the ACP proxy) lives. Its first call loads the encrypted cache and checks each
relay exactly: NIP-77 negentropy of the index's heads against the relay where the relay
serves it (only the events the index lacks cross the network), else REQ paging from a
little before the newest event seen (`since`, with `cli.paging`'s guards), or everything
when the relay is new to the cache. Later calls ask each relay only for what is newer than
the newest it gave (`since`), and check exactly again every `reconcile_seconds`.

An event is verified and decrypted only if it could change a head: one whose `d` is a known
slug's and that does not beat that slug's head (the same event again, or an older version)
is skipped unverified, since nothing is taken from it. Every other event goes through
`HeadChecker` (all five validity rules) and the head rule (`engram.merge_heads`), exactly
as `ls` reads. The owner's verdicts (kind 4175: denials, corrections, confirmations,
forgets; few) are read whole on every refresh, and `engram.live` — the rule every read
of memory goes through — decides from a slug's head and its verdicts what it reads as,
and so what is indexed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from cli.client import RelayClient, connect_relay, fetch_nip11, max_limit_of
from cli.errors import AuthError, RelayError
from cli.identity import Identity
from cli.memory.heads import HeadChecker, as_version
from cli.memory.recall.cache import CacheFile
from cli.memory.recall.dense import load
from cli.memory.recall.index import Hit, Known, RecallIndex
from cli.memory.recall.settings import SETTINGS, RecallSettings
from cli.memory.results import SetReport
from cli.paging import Fetched, fetch_all
from cli.peer import Peer, Unsupported
from cli.reconcile import reconcile_items
from cli.relayset import _reason
from engram import CORE_SLUG, KIND_ENGRAM, KIND_VERDICT, Head, beats, d_tag, merge_heads
from engram.live import Live, live_view, valid_at
from engram.negentropy import Items
from engram.nip01 import Event
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
        self.checked = 0.0
        self._docs: dict[str, dict[str, Any]] = {}
        self._limits: dict[str, int | None] = {}
        self._slug_of_d: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self._clients: dict[str, RelayClient] = {}
        self._started = False
        self._exact_task: asyncio.Future[None] | None = None
        self.background = background  # exact checks in the background (long-running owners)
        self.rebuilt = False  # the cache was missing or refused on load
        self._saved_newest: dict[str, int] = {}
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
            self._saved_newest = dict(payload.relays)
            self.checked = payload.checked
        else:
            self.rebuilt = True
        self.index = index
        kc = ident.conversation_key
        self._slug_of_d = {d_tag(kc, slug): slug for slug in index.heads}
        return index

    # -- the exchange with the relays -----------------------------------------------------

    def _filter(self, **extra: Any) -> dict[str, Any]:
        ident = self.identity
        return {"kinds": [KIND_ENGRAM], "authors": [ident.agent], "#p": [ident.owner], **extra}

    def _verdict_filter(self) -> dict[str, Any]:
        ident = self.identity
        return {"kinds": [KIND_VERDICT], "authors": [ident.owner], "#p": [ident.agent]}

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
        client = self._clients.get(url)
        if client is None:
            client = await connect_relay(url, self.identity.seckey, self.timeout)
            self._clients[url] = client
        if url not in self._docs:
            try:
                self._docs[url] = await fetch_nip11(url, self.timeout)
            except RelayError:
                self._docs[url] = {}
            self._limits[url] = max_limit_of(self._docs[url])
        return client

    async def _on_each(
        self, step: Callable[[RelayClient], Awaitable[T]], *, own: bool = False
    ) -> tuple[dict[str, T], dict[str, str]]:
        """`step` on every relay at once within `timeout`; (answers, relay -> why not).
        A relay that fails loses its connection (the next call connects again). `own`:
        on connections of its own, closed after (a client runs one request at a time, so
        the background check never shares the calls' connections)."""

        async def separate(url: str) -> T:
            async with asyncio.timeout(self.timeout):
                await self._client(url)  # NIP-11 known
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
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.close(), 1.0)
        if self._exact_task is not None:
            self._exact_task.cancel()

    # -- the exchange with the relays -------------------------------------------------------

    async def _since(self, client: RelayClient, slack: int) -> tuple[Fetched, Fetched]:
        """(heads since the newest seen, every owner verdict)."""
        newest = self.newest.get(client.url)
        flt = self._filter() if newest is None else self._filter(since=max(newest - slack, 0))
        limit = self._limits.get(client.url)
        heads = await fetch_all(client, flt, limit)
        return heads, await fetch_all(client, self._verdict_filter(), limit)

    async def _exact(self, client: RelayClient) -> Fetched:
        """NIP-77 of the index's heads against the relay; only what it lacks is fetched."""
        assert self.index is not None
        peer = Peer(client, self.identity.seckey, self._docs.get(client.url))
        if not peer.serves_negentropy:
            return Fetched()
        items = Items.from_pairs(
            (k.created_at, bytes.fromhex(k.event_id)) for k in self.index.heads.values()
        )
        try:
            _, extra, _ = await reconcile_items(peer, items, self._filter(), self.timeout)
        except Unsupported:
            await peer.neg_close()
            return Fetched()
        return Fetched({e.id: e for e in await peer.fetch_ids(extra)})

    def _apply(
        self,
        fetched: dict[str, Fetched],
        checker: HeadChecker,
        verdicts: dict[str, Fetched] | None = None,
    ) -> int:
        """Take new heads (and, when `verdicts` were read, the owner's verdicts, whole)."""
        views = []
        for url, got in fetched.items():
            events = list(got.events.values())
            if events:
                self.newest[url] = max(self.newest.get(url, 0), *(e.created_at for e in events))
            views.append(checker.heads(e for e in events if self._could_change(e)))
        if verdicts is not None:
            every: dict[str, dict[str, Version]] = {}
            for got in verdicts.values():
                for v in checker.versions(got.events.values()):
                    every.setdefault(v.slug, {})[v.id] = v
            self.verdicts = every
        return self._take(merge_heads(views), checker)

    async def refresh(self) -> tuple[SetReport, int, dict[str, str]]:
        """Bring the index up to the relays; (report, heads changed, relay -> method).

        The first call of a process asks from `slack` seconds before the newest event the
        cache has seen (everything, for a relay new to the cache), later ones from
        `warm_slack`; an exact NIP-77 check runs in the background when one is due."""
        async with self._lock:
            self._open()
            first = not self._started
            slack = self.settings.slack if first else self.settings.warm_slack
            methods = {u: ("since" if u in self.newest else "req") for u in self.urls}
            answers, failed = await self._on_each(lambda c: self._since(c, slack))
            self._started = True
            fetched = {u: heads for u, (heads, _) in answers.items()}
            verdicts = {u: got for u, (_, got) in answers.items()}
            incomplete = {
                u: why
                for u, got in [*fetched.items(), *verdicts.items()]
                if (why := got.why_incomplete(self._limits.get(u) is not None)) is not None
            }
            checker = HeadChecker(self.identity)
            changed = self._apply(fetched, checker, verdicts)
            if changed or self.rebuilt or self.newest != self._saved_newest:
                self._save()
                self.rebuilt = False
            self._maybe_check_exactly()
            report = SetReport(
                relays=tuple(self.urls),
                answered=tuple(u for u in self.urls if u in fetched),
                failed=failed,
                incomplete=incomplete,
                skipped=dict(checker.skipped),
            )
            return report, changed, methods

    def _maybe_check_exactly(self) -> None:
        """Start the exact check (NIP-77) in the background when it is due: it catches a
        writer whose clock runs far behind, or events copied in from another relay, and
        never delays a call (a relay may take seconds to list a large memory)."""
        due = time.time() - self.checked >= self.settings.reconcile_seconds
        if not due or not self.background or ((t := self._exact_task) and not t.done()):
            return

        async def run() -> None:
            try:
                fetched, failed = await self._on_each(self._exact, own=True)
            except Exception:
                return
            async with self._lock:
                self._apply(fetched, HeadChecker(self.identity))
                if not failed:
                    self.checked = time.time()
                self._save()

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

    def _save(self) -> None:
        if self.persist and self.cache is not None and self.index is not None:
            self.cache.save(self.index, self.newest, self.checked)
            self._saved_newest = dict(self.newest)

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
        value = version.text if slug != CORE_SLUG else None
        known = Known(
            event_id, version.created_at, value, version.id, meta.trust, version.role,
            meta.valid_from, meta.valid_until,
        )  # fmt: skip
        if self.index.apply_known([(slug, known)]):
            self._save()


def known_of(slug: str, live: Live) -> Known | None:
    """What the index keeps of what a slug reads as: the value only when live (and not
    core, which recall never ranks), with its version, trust and validity."""
    v = live.version
    if v is None:
        return None
    meta = v.meta
    value = live.text if slug != CORE_SLUG else None
    return Known(
        v.event.id, v.created_at, value, v.id, meta.trust, v.role, meta.valid_from,
        meta.valid_until,
    )  # fmt: skip
