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
