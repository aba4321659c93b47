"""Outgoing queues: byte accounting, stall detection and a relay-wide budget.

A subscriber that is *behind* (reading, but slower than a burst) and one that has
*stopped* (its socket takes nothing) look alike to a fixed-size queue. Here they are told
apart by progress: a queue is stalled when nothing has left it for `stall_seconds`; only
then is the connection dropped. Two byte bounds still hold whatever the reader does: a
per-connection cap, and a budget for the queued output of every connection of this
process together, which, once reached, drops the connections furthest behind first.

No sockets here: the transport subclasses `OutputQueue` with the writer that drains it.
Every queued frame is charged its length plus `FRAME_OVERHEAD`, so many small frames are
bounded as surely as a few large ones.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import logging
import time
import weakref
from collections.abc import Callable

from relay import metrics

log = logging.getLogger("engram.transport")

FRAME_OVERHEAD = 64  # bytes charged per queued frame besides its payload (object, slot)
BACKPRESSURE_BYTES = 1024 * 1024  # stored REQ results wait while this much is queued


class Drop(enum.Enum):
    """Why a connection was dropped as a slow consumer (the metrics label)."""

    STALLED = "stalled"  # nothing left its queue for slow_consumer_seconds
    CAP = "cap"  # its queue reached send_queue_bytes
    BUDGET = "budget"  # the relay's queued output reached send_queue_budget_bytes


_NOTICES = {
    Drop.STALLED: "not reading; disconnecting",
    Drop.CAP: "too far behind reading; disconnecting",
    Drop.BUDGET: "too far behind reading while the relay is short of memory; disconnecting",
}


_NONE: tuple[bytes, ...] = ()  # an empty queue that never held anything: no deque yet


class OutputQueue:
    """One connection's queued output, charged to a shared `OutputBudget`.

    Most connections of a crowd never queue a frame (the socket takes them at once), so
    what only a queue that waits needs is made when it first waits: the deque of frames
    (760 bytes empty), and the events the writer task and bulk senders await (about
    1 KiB each). `dropped_hook` tells the transport when the reader was dropped.
    """

    __slots__ = (
        "_ready",
        "_room",
        "budget",
        "dropped",
        "frames",
        "max_bytes",
        "queued_bytes",
        "since",
    )

    def __init__(self, budget: OutputBudget, max_bytes: int) -> None:
        self.budget = budget
        self.max_bytes = max_bytes
        self.frames: collections.deque[bytes] | tuple[bytes, ...] = _NONE
        self.queued_bytes = 0
        self.since = 0.0  # monotonic time the queue last shrank or stopped being empty
        self.dropped: Drop | None = None
        self._ready: asyncio.Event | None = None  # frames to write (the writer task's)
        self._room: asyncio.Event | None = None  # space freed for `wait_room`
        budget.queues.add(self)

    @staticmethod
    def cost(frame: bytes) -> int:
        return len(frame) + FRAME_OVERHEAD

    def push(self, frame: bytes) -> None:
        """Queue a frame (non-blocking); over the connection's cap the reader is dropped.
        An empty queue always takes one frame, however large: it must be deliverable."""
        if self.dropped is not None:
            return
        cost = len(frame) + FRAME_OVERHEAD
        frames = self.frames
        if frames and self.queued_bytes + cost > self.max_bytes:
            self.drop(Drop.CAP)
            return
        if not frames:
            self.since = time.monotonic()
            if frames is _NONE:
                frames = self.frames = collections.deque()
        frames.append(frame)  # type: ignore[union-attr]
        self.queued_bytes += cost
        if self._ready is not None:
            self._ready.set()
        budget = self.budget
        if self.queued_bytes > budget.peak_connection:
            budget.peak_connection = self.queued_bytes
        budget.charge(cost)

    def pop(self) -> bytes:
        """The next frame for the writer: the queue shrank, so the reader is reading."""
        frames = self.frames
        frame = frames.popleft()  # type: ignore[union-attr]
        if not frames:  # back to no deque: an idle connection holds none
            self.frames = _NONE
        cost = len(frame) + FRAME_OVERHEAD
        self.queued_bytes -= cost
        self.budget.release(cost)
        self.since = time.monotonic()
        if self._room is not None:
            self._room.set()
        return frame

    async def wait_frames(self) -> None:
        """Until there is a frame to write, or the connection was dropped."""
        while not self.frames and self.dropped is None:
            if self._ready is None:
                self._ready = asyncio.Event()
            self._ready.clear()
            await self._ready.wait()

    def has_room(self, size: int) -> bool:
        """Whether bulk output of `size` bytes may be queued now (see `wait_room`)."""
        return (
            self.dropped is not None
            or not self.frames
            or self.queued_bytes + size <= min(BACKPRESSURE_BYTES, self.max_bytes)
        )

    async def wait_room(self, size: int) -> None:
        """Backpressure for bulk output (stored results): wait while the queue holds more
        than `BACKPRESSURE_BYTES`, far below the cap, so a bulk read never trips it."""
        while not self.has_room(size):
            if self._room is None:
                self._room = asyncio.Event()
            self._room.clear()
            await self._room.wait()

    def drop(self, why: Drop) -> None:
        """Give up on this reader: free its queue at once, count it, tell the transport."""
        if self.dropped is not None:
            return
        self.dropped = why
        frames = len(self.frames)
        log.warning("slow consumer dropped (%s, %d bytes queued)", why.value, self.queued_bytes)
        metrics.slow_consumer(frames, why.value)
        self.budget.release(self.queued_bytes)
        self.frames = _NONE
        self.queued_bytes = 0
        self.budget.queues.discard(self)
        if self._room is not None:
            self._room.set()
        if self._ready is not None:
            self._ready.set()
        self.dropped_hook()

    def dropped_hook(self) -> None:
        """Called once the reader was dropped (the transport says goodbye)."""

    def notice(self) -> str:
        return _NOTICES[self.dropped or Drop.STALLED]

    def close(self) -> None:
        """The connection ended: return whatever it still had queued to the budget."""
        self.budget.release(self.queued_bytes)
        self.queued_bytes = 0
        self.frames = _NONE
        self.budget.queues.discard(self)


class OutputBudget:
    """The queued output of every connection of this process, and the sweep that drops
    stalled readers. One per relay (see `budget_for`)."""

    def __init__(
        self, limit: int, stall_seconds: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.limit = limit
        self.stall_seconds = stall_seconds
        self.clock = clock
        self.queues: set[OutputQueue] = set()
        self.total = 0
        self.peak_total = 0  # the most ever queued at once (metrics, tests, benchmarks)
        self.peak_connection = 0  # the most one connection ever had queued
        self._sweeper: asyncio.Task[None] | None = None
        metrics.watch_output(self)

    def charge(self, cost: int) -> None:
        self.total += cost
        if self.total > self.peak_total:
            self.peak_total = self.total
        if self.total > self.limit:
            self.shed()

    def release(self, cost: int) -> None:
        self.total -= cost

    def shed(self) -> None:
        """Over budget: drop the connections furthest behind until back under it."""
        for queue in sorted(self.queues, key=lambda q: q.queued_bytes, reverse=True):
            if self.total <= self.limit:
                return
            queue.drop(Drop.BUDGET)

    def sweep(self) -> None:
        """Drop every connection whose queue has not shrunk for `stall_seconds`."""
        cutoff = self.clock() - self.stall_seconds
        for queue in [q for q in self.queues if q.frames and q.since < cutoff]:
            queue.drop(Drop.STALLED)

    def start(self) -> None:
        """Run the sweep while connections exist (restarted by the next connection)."""
        if self._sweeper is None or self._sweeper.done():
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    async def _sweep_forever(self) -> None:
        every = max(0.05, min(1.0, self.stall_seconds / 4))
        while self.queues:
            await asyncio.sleep(every)
            with contextlib.suppress(Exception):
                self.sweep()


_budgets: weakref.WeakKeyDictionary[object, OutputBudget] = weakref.WeakKeyDictionary()


def budget_for(owner: object, limit: int, stall_seconds: float) -> OutputBudget:
    """The budget shared by `owner`'s connections (the transport passes its Relay),
    created on first use; its sweep is running on return."""
    budget = _budgets.get(owner)
    if budget is None:
        budget = _budgets[owner] = OutputBudget(limit, stall_seconds)
    budget.start()
    return budget
