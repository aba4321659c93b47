"""Memory given back to the system once a crowd of connections has left.

After 10,000 connections closed, the relay's RSS stayed ~55 MiB above what it was before
they came (bench crowd), although nothing of them was alive any more. Two things kept it:
CPython's free lists (up to 2,000 spare tuples of each size, and lists, dicts, floats)
hold objects scattered over pymalloc's 1 MiB arenas, none of which can be unmapped while
one block of it is in use; and glibc's malloc keeps the pages it freed. A full garbage
collection empties the free lists (27 of 58 arenas were given back by it alone), then
`malloc_trim(0)` returns the free pages of every malloc arena. Both walk the heap, so
they run only after many connections closed (at least `MIN_DROP`, and at least half of
the most open since the last time), a few seconds after the closing stopped: the
collection on the loop, the trim in a worker thread (ctypes releases the GIL around
it). Elsewhere than glibc (musl has no malloc_trim) only the collection runs.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import gc
import logging
import time
from collections.abc import Callable

log = logging.getLogger("engram.relay")

MIN_DROP = 1_000  # connections closed since the peak before a trim is considered
DELAY = 3.0  # seconds without another close before the trim runs


def _load() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim  # type: ignore[no-any-return]


class Trimmer:
    """Counts this process's connections; trims after a crowd left."""

    def __init__(self, trim: Callable[[int], int] | None, min_drop: int = MIN_DROP) -> None:
        self.trim = trim
        self.min_drop = min_drop
        self.open = 0
        self.peak = 0  # the most connections open at once since the last trim
        self.last_close = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.trims = 0  # trims run (tests, logs)

    def opened(self) -> None:
        self.open += 1
        if self.open > self.peak:
            self.peak = self.open

    def closed(self) -> None:
        self.open -= 1
        self.last_close = time.monotonic()
        if self.timer is not None:
            return
        if self.peak - self.open >= self.min_drop and self.open * 2 <= self.peak:
            self.timer = asyncio.get_running_loop().call_later(DELAY, self._due)

    def _due(self) -> None:
        """Wait until the closing has stopped for DELAY seconds, then trim."""
        loop = asyncio.get_running_loop()
        quiet = time.monotonic() - self.last_close
        if quiet < DELAY:
            self.timer = loop.call_later(DELAY - quiet, self._due)
            return
        self.peak = self.open
        self.trims += 1
        t0 = time.perf_counter()
        gc.collect()  # empties the free lists too
        log.debug(
            "full collection after connections closed: %.1f ms", (time.perf_counter() - t0) * 1e3
        )
        if self.trim is None:
            self.timer = None
            return
        loop.run_in_executor(None, self._run).add_done_callback(self._ran)

    def _run(self) -> float:
        t0 = time.perf_counter()
        assert self.trim is not None
        self.trim(0)
        return time.perf_counter() - t0

    def _ran(self, done: asyncio.Future[float]) -> None:
        self.timer = None
        if not done.cancelled() and done.exception() is None:
            log.debug("malloc_trim after connections closed: %.1f ms", done.result() * 1e3)


trimmer = Trimmer(_load())
