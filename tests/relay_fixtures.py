"""Pytest plugin: real relay processes (`engram serve`) on fresh real PostgreSQL databases."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest

from relay.store.embedded import ensure_database, with_database


async def until(check: Callable[[], object], what: str, timeout: float = 120.0) -> None:
    """Poll `check` (sync or async) until it is truthy; AssertionError naming `what` after
    `timeout` seconds (generous: every condition must hold on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting until {what}")
        await asyncio.sleep(0.1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def create_database(server_url: str) -> str:
    """A fresh, uniquely named database on the test server; returns its URL."""
    name = "t_" + uuid.uuid4().hex[:16]
    await ensure_database(server_url, name)
    return with_database(server_url, name)


def create_database_sync(server_url: str) -> str:
    """`create_database` from sync code, even inside a running event loop (own thread)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, create_database(server_url)).result()


@dataclass
class RelayProcess:
    proc: subprocess.Popen[bytes]
    port: int
    database_url: str
    scheme: str = "ws"
    log_path: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    @property
    def http_url(self) -> str:
        return f"{'https' if self.scheme == 'wss' else 'http'}://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        with open(self.log_path, errors="replace") as fh:
            return fh.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def _wait_ready(rp: RelayProcess, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if rp.proc.poll() is not None:
            raise RuntimeError(f"relay exited with {rp.proc.returncode}:\n{rp.log()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", rp.port), 0.2):
            if rp.scheme == "ws":
                with urllib.request.urlopen(rp.http_url + "/healthz", timeout=2) as r:
                    if r.status == 200:
                        return
            else:
                return
        time.sleep(0.1)
    raise RuntimeError(f"relay did not become ready:\n{rp.log()}")


def launch_relay(
    database_url: str,
    tmp_dir: str,
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
    scheme: str = "ws",
    port: int | None = None,
) -> RelayProcess:
    """Start `engram serve` and wait until it answers. A port picked here can be taken
    (by another test's outgoing connection) before the relay binds it: then a new one."""
    for _ in range(0 if port else 4):
        with contextlib.suppress(_PortTaken):
            return _launch(database_url, tmp_dir, env, args, scheme, free_port())
    return _launch(database_url, tmp_dir, env, args, scheme, port or free_port())


class _PortTaken(RuntimeError):
    pass


def _launch(
    database_url: str,
    tmp_dir: str,
    env: dict[str, str] | None,
    args: tuple[str, ...],
    scheme: str,
    port: int,
) -> RelayProcess:
    log_path = os.path.join(tmp_dir, f"relay-{port}.log")
    # "{port}" in a value: the port picked here (a relay's own URL in ENGRAM_PUBLIC_URLS)
    env = {k: v.replace("{port}", str(port)) for k, v in (env or {}).items()}
    full_env = {**os.environ, **env}
    full_env.pop("ENGRAM_CONFIG", None)
    cmd = [
        sys.executable,
        "-m",
        "cli.commands.main",
        "serve",
        "--port",
        str(port),
        "--database-url",
        database_url,
        *args,
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=full_env)
    rp = RelayProcess(proc, port, database_url, scheme, log_path, env or {})
    try:
        _wait_ready(rp)
    except BaseException as exc:
        rp.stop()
        if isinstance(exc, RuntimeError) and "address already in use" in str(exc).lower():
            raise _PortTaken(str(exc)) from exc
        raise
    return rp


@pytest.fixture
def start_relay(pg_server_url: str, tmp_path) -> Iterator[Callable[..., RelayProcess]]:
    """Factory: start_relay(env={...}, args=(...), database_url=None, port=None) -> RelayProcess.

    Passing a stopped relay's `database_url` and `port` restarts it at the same URL.
    `{port}` in an env value is the relay's port (`proxied_env` below uses it)."""
    started: list[RelayProcess] = []

    def start(
        env: dict[str, str] | None = None,
        args: tuple[str, ...] = (),
        database_url: str | None = None,
        scheme: str = "ws",
        port: int | None = None,
    ) -> RelayProcess:
        url = database_url or create_database_sync(pg_server_url)
        rp = launch_relay(url, str(tmp_path), env, args, scheme, port)
        started.append(rp)
        return rp

    yield start
    for rp in started:
        rp.stop()


def proxied_env(proxy_port: int) -> dict[str, str]:
    """A relay that a test's proxy on `proxy_port` fronts, as a proxy fronts a relay in
    production: its public URLs are its own and the proxy's (relay.identity), so a client
    may AUTH through either."""
    return {"ENGRAM_PUBLIC_URLS": f"ws://127.0.0.1:{{port}},ws://127.0.0.1:{proxy_port}"}


@pytest.fixture
def relay(start_relay: Callable[..., RelayProcess]) -> RelayProcess:
    """A relay process with default settings on a fresh database."""
    return start_relay()


@pytest.fixture
def relay_url(relay: RelayProcess) -> str:
    return relay.url
