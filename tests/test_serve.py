"""`engram serve` as a newcomer runs it: no database URL, so an embedded PostgreSQL in
its data directory, which stops again with the relay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
from nostr_client import Client
from relay_fixtures import free_port

from engram.nip01 import sign_event


def _postgres_of(data_dir: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if proc.info["name"] == "postgres" and data_dir in cmdline:
            found.append(proc)
    return found


async def test_serve_on_embedded_postgres_and_stop_cleanly(tmp_path):
    data_dir = str(tmp_path / "engram-data")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "cli.commands.main",
            "serve",
            "--port",
            str(port),
            "--data-dir",
            data_dir,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 90
        while True:
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                    break
            except OSError:
                assert time.monotonic() < deadline, "engram serve did not come up"
                time.sleep(0.2)
        assert _postgres_of(data_dir), "no embedded PostgreSQL in the data directory"
        async with await Client.connect(f"ws://127.0.0.1:{port}") as c:
            e = sign_event(b"\x01" * 32, int(time.time()), 1, [], "hello", bytes(32))
            assert (await c.publish(e)) == ["OK", e.id, True, ""]
        assert f"serving ws://127.0.0.1:{port}" in (tmp_path / "serve.log").read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 0  # outer bounds: PostgreSQL's shutdown is slow under load
        deadline = time.monotonic() + 60
        while _postgres_of(data_dir):
            assert time.monotonic() < deadline, "the embedded PostgreSQL outlived the relay"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        for pg in _postgres_of(data_dir):
            pg.kill()
