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
from collections import deque
from typing import Any, Protocol

from relay.store.readbatch import READ_CLIENT


class Slots:
    """A counting semaphore of one loop's tasks. asyncio.Semaphore looks the running loop
    up on every wait, and that is a getpid() system call: ~5 % of the relay's CPU per
    REQ when a connection keeps more reads in flight than `reads_per_connection`
    (bench/RESULTS-HISTORY.md, issue 24). A release hands the slot straight to the oldest waiter."""

    __slots__ = ("_free", "_waiters")

    def __init__(self, n: int) -> None:
        self._free = n
        # made on the first wait: every connection that ever read holds a Slots, and an
        # empty deque is 760 bytes (a crowd of 10,000 subscribers, bench crowd)
        self._waiters: deque[asyncio.Future[None]] | None = None

    async def acquire(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = loop.create_future()
        if self._waiters is None:
            self._waiters = deque()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # the slot came as the task was cancelled: pass it on
            elif self._waiters is not None:
                with contextlib.suppress(ValueError):
                    self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1


class _Reader(Protocol):
    ip: str
    reads: Slots | None


class ReadGate:
    def __init__(self, per_connection: int, per_ip: int) -> None:
        self.per_connection = max(1, per_connection)
        self.per_ip = max(1, per_ip)
        self._ips: dict[str, list[Any]] = {}  # address -> [its Slots, holders and waiters]
        self._loop: asyncio.AbstractEventLoop | None = None

    def addresses(self) -> int:
        """Addresses with reads in flight or waiting (for tests and /metrics)."""
        return len(self._ips)

    def hold(self, reader: _Reader) -> _Hold:
        """`async with gate.hold(reader)`: a read slot of the connection and of its
        address, for one store read."""
        return _Hold(self, reader)

    def _leave(self, ip: str, entry: list[Any]) -> None:
        entry[1] -= 1
        if not entry[1]:
            del self._ips[ip]


class _Hold:
    """One read's slots (a class, not an async generator: this runs for every REQ)."""

    __slots__ = ("_entry", "_gate", "_own", "_reader", "_token")

    def __init__(self, gate: ReadGate, reader: _Reader) -> None:
        self._gate = gate
        self._reader = reader

    async def __aenter__(self) -> None:
        gate, reader = self._gate, self._reader
        loop = gate._loop
        if loop is None:
            loop = gate._loop = asyncio.get_running_loop()
        own = reader.reads
        if own is None:
            own = reader.reads = Slots(gate.per_connection)
        entry = gate._ips.get(reader.ip)
        if entry is None:
            entry = gate._ips[reader.ip] = [Slots(gate.per_ip), 0]
        entry[1] += 1
        try:
            await own.acquire(loop)
            try:
                await entry[0].acquire(loop)
            except BaseException:
                own.release()
                raise
        except BaseException:
            gate._leave(reader.ip, entry)
            raise
        self._own, self._entry = own, entry
        self._token = READ_CLIENT.set(reader.ip)  # the store's slots go round-robin by it

    async def __aexit__(self, *exc: object) -> None:
        READ_CLIENT.reset(self._token)
        self._entry[0].release()
        self._own.release()
        self._gate._leave(self._reader.ip, self._entry)
