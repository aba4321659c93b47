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
as `ls` reads, then `engram.is_live` decides what is indexed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cli.identity import Identity
from cli.memory.heads import HeadChecker
from cli.memory.recall.cache import CacheFile
from cli.memory.recall.dense import load
from cli.memory.recall.index import Hit, Known, RecallIndex, live_value
from cli.memory.recall.settings import SETTINGS, RecallSettings
from cli.memory.results import SetReport
from cli.paging import Fetched, fetch_all
from cli.peer import Peer, Unsupported
from cli.reconcile import reconcile_items
from cli.relayset import RelaySession
from engram import KIND_ENGRAM, Body, Head, beats, d_tag, merge_heads
from engram.negentropy import Items
from engram.nip01 import Event

NEG_TIMEOUT = 10.0


@dataclass
class Recalled:
    """Recall's answer: hits best first, and what the relay set had to say."""

    hits: list[Hit]
    report: SetReport
    changed: int = 0  # heads the index took from the relays on this call
    methods: dict[str, str] = field(default_factory=dict)


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
        self.rebuilt = False  # the cache was missing or refused on load
        self._saved_newest: dict[str, int] = {}

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
            self.checked = 0.0  # a new process checks exactly once
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

    def _could_change(self, event: Event) -> bool:
        """False for an event that cannot change a head: skipped unverified."""
        assert self.index is not None
        ds = [t[1] for t in event.tags if len(t) >= 2 and t[0] == "d"]
        slug = self._slug_of_d.get(ds[0]) if len(ds) == 1 else None
        known = self.index.heads.get(slug) if slug is not None else None
        if known is None:
            return True
        return beats(event.created_at, event.id, known.created_at, known.event_id)

    async def _pull(
        self, session: RelaySession, exact: bool, methods: dict[str, str]
    ) -> tuple[dict[str, Fetched], dict[str, str]]:
        assert self.index is not None
        if exact or any(u not in self._limits for u in session.live):
            self._limits.update(await session.max_limits())
            self._docs.update(getattr(session, "nip11_docs", {}))
        items: Items | None = None
        incomplete: dict[str, str] = {}

        async def one(client: Any) -> Fetched:
            nonlocal items
            url = client.url
            limit = self._limits.get(url)
            newest = self.newest.get(url)
            if newest is None:
                methods[url] = "req"
                got = await fetch_all(client, self._filter(), limit)
            elif not exact:
                methods[url] = "since"
                since = max(newest - self.settings.warm_slack, 0)
                got = await fetch_all(client, self._filter(since=since), limit)
            else:
                peer = Peer(client, self.identity.seckey, self._docs.get(url))
                got = None
                if peer.serves_negentropy:
                    if items is None:
                        items = Items.from_pairs(
                            (k.created_at, bytes.fromhex(k.event_id))
                            for k in self.index.heads.values()  # type: ignore[union-attr]
                        )
                    try:
                        _, extra, _ = await reconcile_items(
                            peer, items, self._filter(), min(NEG_TIMEOUT, self.timeout)
                        )
                        got = Fetched({e.id: e for e in await peer.fetch_ids(extra)})
                        methods[url] = "negentropy"
                    except Unsupported:
                        await peer.neg_close()
                if got is None:
                    methods[url] = "req"
                    since = max(newest - self.settings.slack, 0)
                    got = await fetch_all(client, self._filter(since=since), limit)
            if methods[url] != "negentropy":
                why = got.why_incomplete(limit is not None)
                if why is not None:
                    incomplete[url] = why
            return got

        fetched = await session.on_each(one)
        session.raise_if_none(fetched)
        return fetched, incomplete

    async def refresh(self) -> tuple[SetReport, int, dict[str, str]]:
        """Bring the index up to the relays; (report, heads changed, relay -> method)."""
        async with self._lock:
            self._open()
            exact = time.time() - self.checked >= self.settings.reconcile_seconds
            session = RelaySession(self.urls, self.identity.seckey, self.timeout)
            methods: dict[str, str] = {}
            try:
                await session.connect()
                session.raise_if_none(session.live)
                fetched, incomplete = await self._pull(session, exact, methods)
            finally:
                await session.close()
            checker = HeadChecker(self.identity)
            views = []
            for url, got in fetched.items():
                events = list(got.events.values())
                if events:
                    newest = max(e.created_at for e in events)
                    self.newest[url] = max(self.newest.get(url, 0), newest)
                else:
                    self.newest.setdefault(url, 0)
                views.append(checker.heads(e for e in events if self._could_change(e)))
            merged = merge_heads(views)
            changed = self._take(list(merged.values()))
            if exact and not session.failed:
                self.checked = time.time()
            if changed or self.rebuilt or self.newest != self._saved_newest:
                self._save()
                self.rebuilt = False
            report = SetReport(
                relays=tuple(self.urls),
                answered=tuple(u for u in self.urls if u in fetched),
                failed=session.reasons(),
                incomplete=incomplete,
                skipped=dict(checker.skipped),
            )
            return report, changed, methods

    def _take(self, heads: list[Head]) -> int:
        assert self.index is not None
        kc = self.identity.conversation_key
        for h in heads:
            if h.body.slug not in self.index.heads:
                self._slug_of_d[d_tag(kc, h.body.slug)] = h.body.slug
        return self.index.apply(heads)

    def _save(self) -> None:
        if self.persist and self.cache is not None and self.index is not None:
            self.cache.save(self.index, self.newest, self.checked)
            self._saved_newest = dict(self.newest)

    # -- what callers use -----------------------------------------------------------------

    async def recall(self, query: str, limit: int, mode: str = "fused") -> Recalled:
        report, changed, methods = await self.refresh()
        assert self.index is not None
        hits = self.index.rank(query, limit, mode)
        return Recalled(hits, report, changed, methods)

    async def similar(self, text: str, exclude: str) -> list[Hit]:
        """Live memories close to `text` (write-time hints), the slug written excluded."""
        await self.refresh()
        assert self.index is not None
        s = self.settings
        return self.index.similar(text, s.similar_limit, s.similar, exclude)

    def written(self, body: Body, event_id: str, created_at: int) -> None:
        """A write this process made and saw accepted: the index takes it at once (a
        tombstone removes the slug), so the next call sees it whatever the relays say."""
        if self.index is None:
            return  # not loaded yet: the next refresh reads it from the relays
        slug = body.slug
        if slug not in self.index.heads:
            self._slug_of_d[d_tag(self.identity.conversation_key, slug)] = slug
        live = live_value(body)
        if self.index.apply_known([(slug, Known(event_id, created_at, live))]):
            self._save()
