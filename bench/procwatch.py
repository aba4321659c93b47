"""CPU seconds and RSS of the processes a bench drives: the relay's process tree, the
PostgreSQL postmaster's tree (pg_ctl starts it outside the relay's), and the bench's own
process, so every report can say how many cores each was busy."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from bench.results import PhaseResult

# (relay tree CPU, postmaster tree CPU, this process's CPU) at one moment, in seconds
Snapshot = tuple[float | None, float | None, float]


class Watch:
    """CPU seconds and RSS of a relay's process tree (and a postmaster's tree)."""

    def __init__(self, pid: int | None = None, pg_pid: int | None = None) -> None:
        self.pid = pid
        self.pg_pid = pg_pid

    @staticmethod
    def _tree(pid: int | None) -> list[psutil.Process] | None:
        """The process and its live descendants (None if it is gone or not given)."""
        if pid is None:
            return None
        try:
            procs = [psutil.Process(pid)]
            return procs + procs[0].children(recursive=True)
        except psutil.Error:
            return None

    @staticmethod
    def tree_cpu(pid: int | None) -> float | None:
        """user+system of the process and its live descendants, plus reaped children."""
        procs = Watch._tree(pid)
        if procs is None:
            return None
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    @staticmethod
    def tree_rss(pid: int | None) -> int | None:
        procs = Watch._tree(pid)
        if procs is None:
            return None
        total = 0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
        return total

    def snapshot(self) -> Snapshot:
        return self.tree_cpu(self.pid), self.tree_cpu(self.pg_pid), time.process_time()

    def since(self, before: Snapshot) -> Snapshot:
        """CPU seconds of the relay, PostgreSQL and this process since `before` (None
        where a tree was not given or is gone)."""
        after = self.snapshot()
        relay = after[0] - before[0] if before[0] is not None and after[0] is not None else None
        pg = after[1] - before[1] if before[1] is not None and after[1] is not None else None
        return relay, pg, after[2] - before[2]

    def close(self, result: PhaseResult, before: Snapshot) -> None:
        """Fill `result`'s CPU figures (since `before`) and the relay's RSS now."""
        relay, pg, gen = self.since(before)
        if relay is not None:
            result.relay_cpu = relay
        if pg is not None:
            result.pg_cpu = pg
        result.gen_cpu = gen
        result.rss = self.tree_rss(self.pid)
