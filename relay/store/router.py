"""Tenants on their own databases: one RelayStore in front of several PostgresStores.

The relay's database (the one `database_url` names) holds the tenant configuration and
every tenant without a `database_url` of its own. A tenant with one (`engram tenant add
HOST --tenant-database-url URL`, or `engram tenant move`) has its rows there; each such
database is opened (and migrated) once, however many tenants share it, and gets its own
live bus. Every read and write is routed by the tenant key, so nothing crosses tenants;
a bus delivers a row only while its tenant is placed on that bus's database.

The placement is reloaded with the tenant configuration (`load_tenants`). A tenant
database that cannot be opened answers its tenant's requests with an error and is retried
at every configuration poll; the other tenants are not affected.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import msgspec

from engram.nip01 import Event
from relay.config import DEFAULT_PRIVATE, Settings
from relay.filters import Filter
from relay.moderation import Moderation
from relay.store import DEFAULT_TENANT, ByEnqueue, Saved, SaveResult, SaveStatus, StoreError
from relay.store.pgbase import failure
from relay.store.pgbus import RoutedBus
from relay.store.postgres import PostgresStore
from relay.tenants import TenantConfig
from relay.wire import Reason

log = logging.getLogger("relay.store")
T = TypeVar("T")

UNAVAILABLE = Reason.ERROR("this tenant's database is unavailable")
_CLOSE_UNUSED_AFTER = 30.0  # seconds a database no tenant uses stays open (in-flight work)


class StoreRouter(ByEnqueue):
    """The relay's store (relay.store.RelayStore): each tenant routed to the PostgresStore
    of its database; control on the relay's database; one live bus over them all."""

    def __init__(self, control: PostgresStore, url: str, settings: Settings) -> None:
        self.control = control
        self.url = url
        self._settings = settings
        # tenant databases get no read replicas: those belong to the relay's database
        self._tenant_settings = msgspec.structs.replace(settings, replica_urls=[])
        self._stores: dict[str, PostgresStore] = {url: control}
        self._placement: dict[str, str] = {}  # tenant key -> database URL, if not `url`
        self._failed: dict[str, str] = {}  # database URL -> why it could not be opened
        self._closing: set[asyncio.Task[None]] = set()
        self.bus = RoutedBus(self._stores, self.database_of, settings.bus_poll_seconds)

    @classmethod
    async def open(cls, url: str, settings: Settings) -> StoreRouter:
        return cls(await PostgresStore.open(url, settings), url, settings)

    @property
    def node_id(self) -> str:
        return self.control.node_id

    def database_of(self, tenant: str) -> str:
        return self._placement.get(tenant, self.url)

    def store_for(self, tenant: str) -> PostgresStore | None:
        return self._stores.get(self.database_of(tenant))

    # --- EventWrites, EventReads ---------------------------------------------------------

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        store = self.store_for(tenant)
        if store is None:
            done(SaveResult(SaveStatus.ERROR, UNAVAILABLE))
            return
        store.enqueue(event, raw, tenant, done)

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        return await self._reader(tenant).query(filters, tenant, viewer, private=private)

    def cached(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes] | None:
        store = self.store_for(tenant)
        return None if store is None else store.cached(filters, tenant, viewer, private)

    async def count(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> int:
        return await self._reader(tenant).count(filters, tenant, viewer, private=private)

    async def negentropy_items(
        self,
        f: Filter,
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        limit: int = 500_001,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> tuple[list[int], bytes]:
        return await self._reader(tenant).negentropy_items(
            f, tenant, viewer, limit, private=private
        )

    def _reader(self, tenant: str) -> PostgresStore:
        store = self.store_for(tenant)
        if store is None:
            raise StoreError(UNAVAILABLE)
        return store

    # --- StoreControl: the relay's database ----------------------------------------------

    async def tenant_version(self) -> int:
        if self._failed:  # retry unreachable tenant databases at every poll
            await self._open(set(self._failed))
        return await self.control.tenant_version()

    async def load_tenants(self) -> list[TenantConfig]:
        """The tenant configuration; places every tenant on its database first."""
        configs = await self.control.load_tenants()
        await self.place(configs)
        return configs

    async def load_moderation(self) -> dict[str, Moderation]:
        return await self.control.load_moderation()

    async def run_admin(self, tenant: str, action: Callable[[Any, Any], Awaitable[T]]) -> T:
        """`action(control, events)`: connections to the relay's database (moderation
        lists) and to the one holding the tenant's events (the same for most tenants)."""
        events = self.store_for(tenant)
        if events is None:
            raise StoreError(UNAVAILABLE)
        if events is self.control:
            return await self.control.run_admin(lambda conn: action(conn, conn))
        return await self.control.run_admin(
            lambda control: events.run_admin(lambda conn: action(control, conn))
        )

    async def ping(self) -> bool:
        return await self.control.ping()

    async def migrations_current(self) -> bool:
        return await self.control.migrations_current()

    async def analyze(self, tenant: str) -> None:
        """Planner statistics of the database that holds `tenant` (after a bulk load)."""
        store = self.store_for(tenant)
        if store is not None:  # unplaced: nothing of it was stored here
            await store.analyze()

    async def purge_expired(self, now: int, batch: int = 5_000) -> int:
        total = 0
        for store in list(self._stores.values()):
            total += await store.purge_expired(now, batch)
        return total

    async def close(self) -> None:
        for task in self._closing:
            task.cancel()
        await self.bus.stop()
        stores = list(self._stores.values())
        self._stores.clear()
        await asyncio.gather(*(s.close() for s in stores), return_exceptions=True)

    # --- placement ----------------------------------------------------------------------

    async def place(self, configs: list[TenantConfig]) -> None:
        placement = {c.host: c.database_url for c in configs if c.database_url}
        placement = {h: u for h, u in placement.items() if u != self.url}
        await self._open(set(placement.values()) - self._stores.keys())
        for host in sorted(self._placement.keys() | placement.keys()):
            if self._placement.get(host) != placement.get(host):
                where = "its own database" if host in placement else "the relay's database"
                log.info("tenant %s now on %s", host, where)
        self._placement = placement
        for url in self._stores.keys() - set(placement.values()) - {self.url}:
            task = asyncio.create_task(self._close_later(url))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _open(self, urls: set[str]) -> None:
        for url in urls:
            try:
                store = await PostgresStore.open(url, self._tenant_settings)
            except Exception as exc:
                reason = failure(exc)
                if self._failed.get(url) != reason:
                    log.error("tenant database unavailable (will retry): %s", reason)
                self._failed[url] = reason
                continue
            self._failed.pop(url, None)
            self._stores[url] = store
            self.bus.start(url, store)

    async def _close_later(self, url: str) -> None:
        await asyncio.sleep(_CLOSE_UNUSED_AFTER)
        if url in self._placement.values() or url == self.url:
            return
        store = self._stores.pop(url, None)
        if store is not None:
            self.bus.end(url)
            await store.close()
