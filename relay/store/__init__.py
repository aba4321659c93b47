"""The store interface: what the relay needs from storage, and nothing more.

Four seams, each a Protocol: `EventWrites` (the EVENT path: save after a durable commit),
`EventReads` (REQ, COUNT, the NIP-77 set), `StoreControl` (tenants, moderation,
administration, health, expiry) and `EventBus` (live events between relay nodes).
`EventStore` is what the pipeline depends on (writes and reads); `RelayStore` is what
the app runs on (all four). Implementations: `relay.store.postgres.PostgresStore` (one
database), `relay.store.router.StoreRouter` (the relay's: tenants on their own databases)
and `relay.store.memory.MemoryStore` (the reference: a plain reading of the rules, for
tests); `tests/test_store_contract.py` holds every one of them to the same behaviour.

Raw event JSON is kept and served as is, so a stored event is serialized exactly once,
at ingest. Only relay/store/ touches asyncpg, and not here: this module, the SQL builders
(tagindex, sqlwrite, sqlread, sqlcount) and the reference store are pure.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from engram.nip01 import Event
from engram.replace import NEWER_STORED, superseded_message
from engram.replace import TIE_LOST as _TIE_LOST
from relay.config import DEFAULT_PRIVATE
from relay.filters import Filter
from relay.tenants import DEFAULT_TENANT as DEFAULT_TENANT  # re-exported: stores use it
from relay.wire import Reason

if TYPE_CHECKING:
    from relay.moderation import Moderation
    from relay.tenants import TenantConfig

T = TypeVar("T")


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


# What every store answers (the OK message after `OK <id> true|false`).
STORED = SaveResult(SaveStatus.STORED)
DUPLICATE = SaveResult(SaveStatus.DUPLICATE, Reason.DUPLICATE("already have this event"))
# a version that wins its address is stored (engram.replace: which one, in the message)
STALE = SaveResult(SaveStatus.STALE, NEWER_STORED)
TIE_LOST = SaveResult(SaveStatus.STALE, _TIE_LOST)


def stale_result(created_at: int, stored_created_at: int | None) -> SaveResult:
    """STALE or TIE_LOST for a version that lost to the stored head (engram.replace says
    which; None: the winner is not known any more)."""
    return TIE_LOST if superseded_message(created_at, stored_created_at) == _TIE_LOST else STALE


BLOCKED = SaveResult(
    SaveStatus.BLOCKED, Reason.BLOCKED("this event was deleted by its author (NIP-09 or NIP-62)")
)
CLOSED = SaveResult(SaveStatus.ERROR, Reason.ERROR("the store is closed"))


def error_result(text: str) -> SaveResult:
    """This event could not be stored: `error: <text>`."""
    return SaveResult(SaveStatus.ERROR, Reason.ERROR(text))


Saved = Callable[[SaveResult], None]  # told an event's outcome once its batch committed


class ByEnqueue:
    """`EventWrites.submit` and `save` in terms of `enqueue`, written once for every
    store (PostgreSQL's writer, the router, the reference store)."""

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        raise NotImplementedError

    def submit(
        self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT
    ) -> asyncio.Future[SaveResult]:
        """`enqueue` as a future, resolved by its `Saved` callback after the commit."""
        future: asyncio.Future[SaveResult] = asyncio.get_running_loop().create_future()

        def done(result: SaveResult) -> None:
            if not future.done():
                future.set_result(result)

        self.enqueue(event, raw, tenant, done)
        return future

    async def save(self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT) -> SaveResult:
        """Store durably; returns only after the transaction holding the event committed."""
        return await self.submit(event, raw, tenant)


class EventWrites(Protocol):
    """Writes: an event is answered only after the transaction holding it committed."""

    def enqueue(self, event: Event, raw: bytes, tenant: str, done: Saved) -> None:
        """Store without a future: `done(result)` runs on the loop, exactly once, when the
        event's batch has committed (or could not be). The relay's EVENT path uses it: a
        future per EVENT, its callback scheduled through the loop, cost ~3 us an event
        (bench/RESULTS-HISTORY.md, issue 24, fifth round)."""
        ...

    def submit(
        self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT
    ) -> asyncio.Future[SaveResult]:
        """`enqueue` as a future (resolved after the commit)."""
        ...

    async def save(self, event: Event, raw: bytes, tenant: str = DEFAULT_TENANT) -> SaveResult:
        """Store durably; returns only after the transaction holding the event committed."""
        ...


class EventReads(Protocol):
    """Reads, under the private read gate: events of a `private` kind (the tenant's;
    engrams always) only for a `viewer` who is their author or their recipient
    (engram.readers); NIP-40 expired events never; deleted ones are gone."""

    async def query(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes]:
        """Raw events matching any filter: newest first (created_at desc, id asc).

        Each filter's `limit` is already clamped by the caller and always set; it applies
        to that filter (NIP-01), and an event matching several is served once."""
        ...

    def cached(
        self,
        filters: list[Filter],
        tenant: str = DEFAULT_TENANT,
        viewer: str | None = None,
        private: frozenset[int] = DEFAULT_PRIVATE,
    ) -> list[bytes] | None:
        """What `query` would answer, when the store holds it in memory now (no I/O, no
        wait: relay.store.readcache), else None."""
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


class EventStore(EventWrites, EventReads, Protocol):
    """What the pipeline (relay.ingest, relay.reads, relay.negentropy) depends on."""

    async def close(self) -> None:
        """Stop taking writes, answer what is queued, release the connections."""
        ...


class StoreControl(Protocol):
    """What the app runs besides events: the tenant configuration it polls, NIP-86 and
    `engram tenant` changes, health for /readyz, the NIP-40 purge."""

    async def tenant_version(self) -> int:
        """Version of the tenant configuration (bumped on every change)."""
        ...

    async def load_tenants(self) -> list[TenantConfig]: ...

    async def load_moderation(self) -> dict[str, Moderation]: ...

    async def run_admin(self, tenant: str, action: Callable[[Any, Any], Awaitable[T]]) -> T:
        """`action(control, events)` on connections to the relay's database and to the one
        holding `tenant`'s events (relay.store.moderation, relay.nip86); database failures
        become StoreError."""
        ...

    async def analyze(self, tenant: str) -> None:
        """Planner statistics now, after a bulk load (`engram import`)."""
        ...

    async def purge_expired(self, now: int, batch: int = 5_000) -> int:
        """NIP-40: delete expired rows, `batch` per transaction; returns how many."""
        ...

    async def ping(self) -> bool: ...

    async def migrations_current(self) -> bool: ...


# (tenant, raw event JSON) -> deliver to this node's subscribers
Deliver = Callable[[str, bytes], None]


class EventBus(Protocol):
    """Live events between relay nodes: what one node stores or publishes reaches the
    subscribers of all. A node always serves its own subscribers at once; the bus only
    carries events between nodes. The one built here is PostgreSQL itself
    (relay.store.pgbus), so scaling out needs no new service; another transport (NATS,
    Redis) could stand in behind this interface."""

    async def prepare(self) -> None:
        """Take the starting position before the node accepts subscribers."""
        ...

    def delay(self) -> float:
        """Seconds live delivery across nodes is held back (0: current)."""
        ...

    async def run(self, deliver: Deliver) -> None:
        """Deliver other nodes' events until cancelled; survives connection loss and
        catches up afterwards (no stored event is lost, only delayed)."""
        ...

    async def publish_ephemeral(self, tenant: str, raw: bytes) -> None:
        """Carry an ephemeral (never stored) event to the other nodes, best effort."""
        ...


class RelayStore(EventStore, StoreControl, Protocol):
    """What the app (relay.app) runs on: events, control, and the live bus."""

    @property
    def bus(self) -> EventBus: ...
