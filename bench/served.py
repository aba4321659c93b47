"""A fresh store to measure on: an embedded PostgreSQL (default settings) with one
database and, when asked, a real `engram serve` on it; and the VACUUM ANALYZE that
follows a bulk load. `bench scale` and `bench flood` build their stores with it."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TABLES = ("events", "event_tags")


async def vacuum_analyze(admin: Any) -> float:
    """VACUUM ANALYZE of the tables (what autovacuum does shortly after a bulk load);
    returns its wall time."""
    t0 = time.perf_counter()
    for table in TABLES:
        await admin.execute(f"VACUUM ANALYZE {table}")
    return time.perf_counter() - t0


@dataclass
class Served:
    """A fresh embedded PostgreSQL with one database, and `engram serve` on it (or None)."""

    root: Path
    pg: Any  # bench.peers.Postgres
    dsn: str
    server: str  # the server's settings shown in reports
    relay: Any = None  # bench.peers.Running

    def kept(self) -> str:
        from bench.pgcluster import bin_dir

        return (
            f"{self.pg.pgdata}, PostgreSQL running: connect with {bin_dir() / 'psql'}"
            f' "{self.dsn}"; stop with kill -INT {self.pg.pid} && rm -rf {self.root}'
        )


@contextlib.contextmanager
def fresh_store(
    corpus: str, bench: str, via: str, keep: bool, say: Callable[[str], None]
) -> Iterator[Served]:
    """A fresh embedded PostgreSQL (default settings) and, with `via` "ws", a real
    `engram serve` on it; the relay is stopped on exit (callers may stop it earlier),
    PostgreSQL and the data directory too unless `keep`."""
    from bench.peers import Postgres, start_engram

    root = Path(tempfile.mkdtemp(prefix=f"engram-bench-{bench}-{corpus}-"))
    pg = Postgres(root, cleanup_mode=None if keep else "delete")
    served: Served | None = None
    try:
        dsn, _drop = pg.create_database()
        served = Served(root, pg, dsn, pg.settings())
        if via == "ws":
            served.relay = start_engram(root / "relay", ["--database-url", dsn])
            say(
                f"  {corpus}: engram serve (pid {served.relay.pid}) at {served.relay.url},"
                f" {served.server}"
            )
        yield served
    finally:
        if served is not None and served.relay is not None:
            served.relay.stop()
        if not keep:
            pg.close()
            shutil.rmtree(root, ignore_errors=True)
