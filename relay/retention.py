"""Retention: prune events older than a configured age, in the background, in batches.

The `[retention]` settings table turns it on (off by default):

    [retention]
    older_than = "90d"   # empty (the default) = retention off
    kinds = [1, 7]        # optional: only these kinds
    include_replaceable = false  # also prune old replaceable/addressable heads
    interval = "1h"       # time between passes
    batch = 5000          # rows per DELETE transaction

The relay runs one pass at start-up and then every `interval`, on its own connection
(not the ingest pool), holding a PostgreSQL advisory lock so that of several relays on
one database only one prunes at a time. Each pass deletes with the same store function
as `engram prune` (`relay.store.maintenance.prune`), `batch` rows per transaction with a
short pause between batches, so ingest and queries are never blocked for long.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relay.durations import parse_duration
from relay.store import maintenance as m

if TYPE_CHECKING:
    import asyncpg

    from relay.config import Retention, Settings

log = logging.getLogger("engram.retention")

BATCH_PAUSE = 0.05  # seconds between two DELETE batches of a background pass


@dataclass(frozen=True)
class RetentionPolicy:
    """A parsed `[retention]` table."""

    older_than: int  # seconds
    selection: m.Selection
    interval: float  # seconds between passes
    batch: int

    @classmethod
    def from_settings(cls, r: Retention) -> RetentionPolicy | None:
        """The policy, or None when retention is off (no `older_than`)."""
        if not r.older_than:
            return None
        return cls(
            older_than=parse_duration(r.older_than),
            selection=m.Selection(
                tuple(r.kinds) if r.kinds is not None else None, r.include_replaceable
            ),
            interval=float(parse_duration(r.interval)),
            batch=r.batch,
        )

    def cutoff(self, now: float) -> int:
        """Events with created_at strictly before this are pruned."""
        return int(now) - self.older_than


async def prune_pass(
    conn: asyncpg.Connection, policy: RetentionPolicy, now: float
) -> dict[str, int] | None:
    """One pass over every tenant: tenant -> events deleted; None if another relay
    holds the retention lock (it is running a pass right now)."""
    if not await m.try_retention_lock(conn):
        return None
    cutoff = policy.cutoff(now)

    async def pause(_: int) -> None:
        await asyncio.sleep(BATCH_PAUSE)

    tenants = await m.list_tenants(conn)
    done = await m.prune_tenants(conn, tenants, cutoff, policy.selection, policy.batch, pause)
    # The lock is a session lock: released when the caller closes the connection.
    return {t: n for t, (n, _) in done.items()}


async def run(
    database_url: str,
    policy: RetentionPolicy,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
) -> None:
    """Prune now, then every `policy.interval`, until cancelled; failures are logged."""
    import asyncpg

    while True:
        try:
            conn = await asyncpg.connect(database_url, timeout=10)
            try:
                done = await prune_pass(conn, policy, clock())
            finally:
                await conn.close()
            if done is None:
                log.debug("retention: another relay is pruning; skipped this pass")
            elif sum(done.values()):
                log.info(
                    "retention: pruned %d events older than %ds (%s): %s",
                    sum(done.values()),
                    policy.older_than,
                    policy.selection.describe(),
                    ", ".join(f"{t} {n}" for t, n in sorted(done.items()) if n),
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the database may be away; try again next interval
            log.warning("retention pass failed: %s: %s", type(exc).__name__, exc)
        await sleep(policy.interval)


def start(settings: Settings, database_url: str) -> asyncio.Task[None] | None:
    """Start the background task if `[retention]` is configured; None when it is off."""
    policy = RetentionPolicy.from_settings(settings.retention)
    if policy is None:
        return None
    log.info(
        "retention on: pruning %s older than %ds every %gs, %d per batch",
        policy.selection.describe(),
        policy.older_than,
        policy.interval,
        policy.batch,
    )
    return asyncio.create_task(run(database_url, policy), name="engram-retention")


async def stop(task: asyncio.Task[None] | None) -> None:
    """Cancel the task started by `start` and wait for it (its connection closes)."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
