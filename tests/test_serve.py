"""`engram serve` as a newcomer runs it: no database URL, so an embedded PostgreSQL in
its data directory (the default one, created on the first run, or one the operator made),
which stops again with the relay; a mistyped `--data-dir` starts nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request

import psutil
import pytest
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


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    return {**env, **extra}


@pytest.mark.parametrize("where", ["default", "made"])
async def test_serve_on_embedded_postgres_and_stop_cleanly(tmp_path, where):
    """`default`: no --data-dir, the user's data directory not there yet (a first run
    after installing); `made`: --data-dir naming a directory the operator created."""
    port = free_port()
    if where == "default":  # platformdirs: $XDG_DATA_HOME/engram-relay
        data_dir = str(tmp_path / "xdg" / "engram-relay")
        env = _clean_env(XDG_DATA_HOME=str(tmp_path / "xdg"))
        args: list[str] = []
    else:
        data_dir = str(tmp_path / "engram-data")
        os.mkdir(data_dir)
        env = _clean_env()
        args = ["--data-dir", data_dir]
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.commands.main", "serve", "--port", str(port), *args],
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


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["tenant", "ls"], ["migrate"]])
def test_a_mistyped_data_dir_is_refused_and_nothing_is_created(tmp_path, command):
    """A --data-dir (or ENGRAM_DATA_DIR) that does not exist is refused before anything
    starts, saying how to create it; no directory and no database appear."""
    (tmp_path / "engram-data").mkdir()  # the real one; the operator types it wrong
    typo = tmp_path / "engram-dta"
    for how in (["--data-dir", str(typo)], []):
        env = _clean_env() if how else _clean_env(ENGRAM_DATA_DIR=str(typo))
        done = subprocess.run(
            [sys.executable, "-m", "cli.commands.main", *command, *how],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        assert done.returncode == 2, done.stderr
        assert f"data directory {typo} does not exist" in done.stderr
        assert f"mkdir -p {typo}" in done.stderr
        assert not typo.exists() and not _postgres_of(str(typo))
    assert list((tmp_path / "engram-data").iterdir()) == []
