"""The live bus: events stored or published on one relay node reach subscribers on all.

One small interface, so another transport (NATS, Redis) could stand in later; the one
built here is PostgreSQL itself (`relay.store.pgbus`), so scaling out needs no new service.
A node always serves its own subscribers at once; the bus only carries events between
nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

# (tenant, raw event JSON) -> deliver to this node's subscribers
Deliver = Callable[[str, bytes], None]


class EventBus(Protocol):
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
