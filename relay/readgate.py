"""Fair share of the store's read slots: per connection and per IP.

The store runs at most `read_concurrency` statements at once for the whole relay
(relay.store.readbatch). Without a bound per client, one connection (or one address with
many connections) sending costly REQs back to back holds every slot and everyone else's
REQs queue behind it. Here a connection may have `reads_per_connection` store reads in
flight and an address `reads_per_ip`; past that its next REQ/COUNT waits for one of its
own to finish, while other clients go straight through; and the store's slots themselves
go round-robin over the addresses with reads waiting (relay.store.readbatch), so the next
free one is another client's if it waits. Waiters are bounded too: a
connection has at most `in_flight_max` tasks (relay.transport), so nothing here grows
without bound; an address's entry is dropped when nothing of it holds or waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Protocol

from relay.store.readbatch import READ_CLIENT


class _Reader(Protocol):
    ip: str
    reads: asyncio.Semaphore | None


class ReadGate:
    def __init__(self, per_connection: int, per_ip: int) -> None:
        self.per_connection = max(1, per_connection)
        self.per_ip = max(1, per_ip)
        self._ips: dict[str, tuple[asyncio.Semaphore, list[int]]] = {}

    def addresses(self) -> int:
        """Addresses with reads in flight or waiting (for tests and /metrics)."""
        return len(self._ips)

    @contextlib.asynccontextmanager
    async def hold(self, reader: _Reader) -> AsyncIterator[None]:
        """A read slot of the connection and of its address, for one store read."""
        own = reader.reads
        if own is None:
            own = reader.reads = asyncio.Semaphore(self.per_connection)
        entry = self._ips.get(reader.ip)
        if entry is None:
            entry = self._ips[reader.ip] = (asyncio.Semaphore(self.per_ip), [0])
        sem, users = entry
        users[0] += 1
        try:
            async with own, sem:
                token = READ_CLIENT.set(reader.ip)  # the store's slots go round-robin by it
                try:
                    yield
                finally:
                    READ_CLIENT.reset(token)
        finally:
            users[0] -= 1
            if not users[0]:
                del self._ips[reader.ip]
