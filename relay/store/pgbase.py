"""What the parts of PostgresStore share: the pool, the node's id, the read replicas,
and what a lost database looks like.

PostgresStore (relay.store.postgres) is its parts mixed together, one module per seam:
writes (relay.store.pgwriter), reads (pgreader), control (pgcontrol) and the rows of the
live bus (pgbus). A mixin's method is found through the class, like any method: the split
costs the EVENT and REQ paths nothing.
"""

from __future__ import annotations

from typing import Any

import asyncpg

# What a lost or broken database connection raises. InternalClientError ("cannot switch to
# state 12; another operation (2) is in progress"): a pooled connection that had read the
# server's termination notice (PostgreSQL shut down or restarted) but not yet its closed
# socket; the pool drops it on release, so the next try gets a fresh one. Uncaught, it
# ended the live tail's task for good (seen by deploy/test-image: outage, then SIGTERM).
DB_ERRORS = (
    OSError,
    TimeoutError,
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
)
# What the administrative paths catch (tenant configuration, moderation, admin actions).
ADMIN_ERRORS = (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError)

ACQUIRE_TIMEOUT = 30.0  # seconds to wait for a pooled connection


def failure(exc: BaseException) -> str:
    """A database failure for a log line or an `error:` reason (bounded)."""
    return f"{type(exc).__name__}: {exc}"[:200]


class PostgresBase:
    """The state every part reads; PostgresStore.__init__ sets it."""

    _pool: asyncpg.Pool
    node_id: str  # `origin` of the rows this process stores (the bus skips its own)
    replicas: Any = None  # a relay.store.replicas.ReplicaSet when read replicas are set
