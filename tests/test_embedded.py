"""The embedded PostgreSQL's own settings: written once per cluster, applied from its
first start, and the operator's to change afterwards."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import asyncpg

from relay.store.embedded import (
    TUNING_FILE,
    drop_stale_pid_file,
    memory_bytes,
    start_server,
    tuning,
    write_tuning,
)

MB = 2**20


def test_shared_buffers_follow_memory_within_bounds() -> None:
    assert "shared_buffers = 128MB" in tuning(512 * MB)  # never below PostgreSQL's default
    assert "shared_buffers = 512MB" in tuning(4096 * MB)  # an eighth
    assert "shared_buffers = 1024MB" in tuning(64 * 1024 * MB)  # capped
    assert memory_bytes() > 0


def test_written_once_then_the_operators(tmp_path: Path) -> None:
    conf = tmp_path / "postgresql.conf"
    assert not write_tuning(tmp_path)  # not a cluster (yet): nothing written
    conf.write_text("port = 5432\n")
    assert write_tuning(tmp_path)
    ours = tmp_path / TUNING_FILE
    assert "max_wal_size" in ours.read_text()
    assert conf.read_text().count(TUNING_FILE) == 1
    ours.write_text("shared_buffers = 64MB\n")  # the operator's edit
    assert not write_tuning(tmp_path)
    assert ours.read_text() == "shared_buffers = 64MB\n"
    assert conf.read_text().count(TUNING_FILE) == 1


async def test_a_new_cluster_runs_with_them() -> None:
    tmp = Path(tempfile.mkdtemp(prefix="engram-test-tuning-"))
    server = start_server(tmp / "pgdata", cleanup_mode="delete")
    try:
        expected = dict(
            line.split(" = ")
            for line in tuning(memory_bytes()).splitlines()
            if line and not line.startswith("#")
        )
        conn = await asyncpg.connect(server.get_uri())
        try:
            applied = await conn.fetch(
                "SELECT name FROM pg_settings WHERE sourcefile LIKE '%/' || $1::text", TUNING_FILE
            )
            buffers = await conn.fetchval(
                "SELECT setting::int8 * pg_size_bytes(unit) = pg_size_bytes($1)"
                " FROM pg_settings WHERE name = 'shared_buffers'",
                expected["shared_buffers"],
            )
        finally:
            await conn.close()
        assert {r["name"] for r in applied} == set(expected)
        assert buffers
        # A cluster without the file (made before it existed) gets it at a start that may
        # restart the server: not while another process holds it too.
        (tmp / "pgdata" / TUNING_FILE).unlink()
        holders = server.global_process_id_list
        holders.put([*holders.get(), 1])  # pid 1 stands for that other process
        assert start_server(tmp / "pgdata", cleanup_mode="delete") is server
        assert not (tmp / "pgdata" / TUNING_FILE).exists()
        holders.put([os.getpid()])
    finally:
        server.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)


# A child subreaper inherits orphans exactly as a container's PID 1 does: the stand-in for
# `engram serve` as PID 1 (pg_ctl daemonizes the postmaster, so it becomes ours).
_AS_PID_1 = """
import ctypes, os, sys
from pathlib import Path
from relay.store.embedded import start_server
PR_SET_CHILD_SUBREAPER = 36
assert ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
server = start_server(Path(sys.argv[1]), cleanup_mode="delete")
zombies = []
for stat in Path("/proc").glob("[0-9]*/stat"):
    try:
        fields = stat.read_text().rpartition(")")[2].split()
    except OSError:
        continue
    if fields[0] == "Z" and int(fields[1]) == os.getpid():
        zombies.append(stat.parent.name)
server.cleanup()
print(len(zombies))
"""


def test_a_relay_that_is_pid_1_leaves_no_zombie_postmaster() -> None:
    """The first start restarts the new cluster's server (its settings file); the stopped
    postmaster's exit status is collected, not left as a zombie `[postgres]`."""
    import subprocess
    import sys

    tmp = Path(tempfile.mkdtemp(prefix="engram-test-reap-"))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _AS_PID_1, str(tmp / "pgdata")],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.split()[-1] == "0", f"zombie postmasters: {done.stdout}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def test_a_lock_file_naming_a_live_process_that_is_no_postgres_is_dropped(
    tmp_path: Path, pg_server_url: str
) -> None:
    """After a server was killed (`podman kill`, then a new container on the volume), its
    postmaster.pid names a dead PID or some other live process: the wheel attached to a
    live one (every connection refused) or read the file back while the new server
    rewrote it. Such a file goes; one naming a PostgreSQL server stays."""
    pid_file = tmp_path / "postmaster.pid"
    pid_file.write_text(f"{os.getpid()}\n{tmp_path}\n1796500000\n5432\n")
    assert drop_stale_pid_file(tmp_path) and not pid_file.exists()
    dead = max(int(Path("/proc/sys/kernel/pid_max").read_text()) - 1, 2)
    pid_file.write_text(f"{dead}\n{tmp_path}\n")
    assert drop_stale_pid_file(tmp_path) and not pid_file.exists()
    postgres = next(  # the session's PostgreSQL (pg_server_url) runs here
        int(p.name) for p in Path("/proc").iterdir()
        if p.name.isdigit() and _comm(p) == "postgres"
    )  # fmt: skip
    pid_file.write_text(f"{postgres}\n{tmp_path}\n")
    assert not drop_stale_pid_file(tmp_path) and pid_file.exists()
    assert not drop_stale_pid_file(tmp_path / "absent")


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:  # gone meanwhile
        return ""
