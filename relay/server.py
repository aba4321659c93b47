"""The uvicorn server behind `engram serve`: its listening socket, its options, one
process or N workers, and its start-up line."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import signal
import socket
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

if TYPE_CHECKING:
    from relay.config import Settings

log = logging.getLogger("engram")


class BindError(OSError):
    """The relay cannot listen where it was asked to; str() says where and why."""


def bind_listener(host: str, port: int) -> socket.socket:
    """The relay's listening socket, bound (as uvicorn binds it: SO_REUSEADDR), before
    anything is said to be served; BindError naming the address and port otherwise."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        why = (exc.strerror or str(exc)).lower()
        hint = {
            errno.EADDRINUSE: ": another process (another relay?) listens on port"
            f" {port}; stop it or choose another --port",
            errno.EACCES: f": port {port} needs privileges; choose a port above 1023",
            errno.EADDRNOTAVAIL: f": {host} is not an address of this machine (--host)",
        }.get(exc.errno or 0, "")
        raise BindError(exc.errno or 0, f"cannot listen on {where}: {why}{hint}") from exc
    sock.set_inheritable(True)
    return sock


class Server(uvicorn.Server):
    """uvicorn.Server serving a socket bound beforehand (`bind_listener`), that says
    `serving …` once it really serves (the lifespan done, the socket listening), and that
    does not re-raise SIGTERM/SIGINT after its clean shutdown.

    uvicorn re-raises the signal so the process dies of it; returning instead lets
    `engram serve` exit 0 (as a container's PID 1 should) and lets the embedded
    PostgreSQL's exit hook stop the database with the relay.
    """

    def __init__(self, config: uvicorn.Config, serving: str = "") -> None:
        super().__init__(config)
        self.serving = serving

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.started and self.serving:
            log.info("%s", self.serving)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def uvicorn_options(settings: Settings, port: int) -> dict[str, Any]:
    """uvicorn's settings for the relay on `port` (the one bound): uvloop, the relay's own
    websocket protocol (relay.wsserver), frame and ping limits, TLS, and logging through
    relay.logs."""
    return dict(
        host=settings.host,
        port=port,
        loop="uvloop",
        ws_max_size=settings.limits.max_message_length * 4,
        ws_per_message_deflate=settings.ws_per_message_deflate,
        ssl_certfile=settings.tls_cert,
        ssl_keyfile=settings.tls_key,
        ws_ping_interval=settings.ping_interval_seconds,
        ws_ping_timeout=settings.ping_timeout_seconds,
        log_level="warning",
        log_config=None,  # uvicorn logs through setup_logging's handler
        access_log=False,
        lifespan="on",
        ws="relay.wsserver:RelayWebSocketProtocol",
    )


def run_one(
    settings: Settings,
    database_url: str,
    options: dict[str, Any],
    sock: socket.socket,
    serving: str,
) -> bool:
    """The relay in this process on `sock`, until SIGINT/SIGTERM; False when it never
    started (its lifespan failed: the database, migrations)."""
    from relay.app import create_app

    server = Server(uvicorn.Config(create_app(settings, database_url), **options), serving)
    server.run(sockets=[sock])
    return server.started


def run_workers(workers: int, options: dict[str, Any], sock: socket.socket, serving: str) -> None:
    """`workers` relay processes on one port, each building its settings from the
    environment (`relay.app.create_app_from_env`); /metrics sums every worker
    (prometheus_client's multiprocess mode, relay.metrics). uvicorn binds the port again
    for them: `sock` proved it can be had, and is let go just before."""
    own_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="engram-metrics-")
    sock.close()
    log.info("%s (%d workers)", serving, workers)
    try:
        uvicorn.run("relay.app:create_app_from_env", factory=True, workers=workers, **options)
    finally:
        if own_dir:
            shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
