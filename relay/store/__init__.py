"""The store interface: what the pipeline needs from storage, and nothing more.

Only `relay.store.postgres` touches asyncpg. Raw event JSON is kept and served as is,
so a stored event is serialized exactly once, at ingest.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable
from typing import Protocol

import msgspec

from engram.nip01 import Event
from relay.config import DEFAULT_PRIVATE
from relay.filters import Filter

DEFAULT_TENANT = "default"


class SaveStatus(enum.Enum):
    STORED = "stored"  # new row, or it replaced an older head: fan it out
    DUPLICATE = "duplicate"  # exact id already stored
    STALE = "stale"  # lost the replaceable/addressable race: an equal-or-newer head exists
    BLOCKED = "blocked"  # its author deleted it (NIP-09): refused for good
    ERROR = "error"  # this event could not be stored (message says why)


class StoreError(Exception):
    """The store could not answer a read (database unreachable); str() is the reason,
    already prefixed `error: `. Writes never raise: they answer SaveStatus.ERROR."""


class SaveResult(msgspec.Struct, frozen=True):
    status: SaveStatus
    message: str = ""


Saved = Callable[[SaveResult], None]  # told an event's outcome once its batch committed


def submit_to(
    enqueue: Callable[[Event, bytes, str, Saved], None], event: Event, raw: bytes, tenant: str
) -> asyncio.Future[SaveResult]:
    """`EventStore.submit` by its `enqueue`: a future resolved by the `Saved` callback."""
    future: asyncio.Future[SaveResult] = asyncio.get_running_loop().create_future()

    def done(result: SaveResult) -> None:
        if not future.done():
            future.set_result(result)

    enqueue(event, raw, tenant, done)
    return future


class EventStore(Protocol):
    async def save(self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT) -> SaveResult:
        """Store durably; returns only after the transaction holding the event committed."""
        ...

    def submit(
        self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT
    ) -> asyncio.Future[SaveResult]:
        """`save` as a future (resolved after the commit)."""
        ...

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        """`save` without a future: `done(result)` runs on the loop, exactly once, when the
        event's batch has committed (or could not be). The relay's EVENT path uses it: a
        future per EVENT, its callback scheduled through the loop, cost ~3 us an event
        (bench/RESULTS.md, issue 24, fifth round)."""
        ...

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        """Raw events matching any filter: newest first (created_at desc, id asc).

        Each filter's `limit` is already clamped by the caller and always set. Events of
        a `private` kind (the tenant's; engrams always) are returned only when `viewer`
        is their author or their recipient (engram.readers).
        """
        ...

    async def count(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> int:
        """NIP-45: distinct events matching any filter (limits ignored), same gate."""
        ...

    async def negentropy_items(
        self,
        f: Filter,
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        limit: int = 500_001,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> tuple[list[int], bytes]:
        """NIP-77: (created_at list, concatenated 32-byte ids) of at most `limit` events
        matching `f`, in (created_at, id) order, under the same gate as `query`."""
        ...

    async def close(self) -> None: ...
