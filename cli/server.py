"""The uvicorn server behind `engram serve`: its options, one process or N workers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import uvicorn

if TYPE_CHECKING:
    from relay.config import Settings


class Server(uvicorn.Server):
    """uvicorn.Server that does not re-raise SIGTERM/SIGINT after its clean shutdown.

    uvicorn re-raises the signal so the process dies of it; returning instead lets
    `engram serve` exit 0 (as a container's PID 1 should) and lets the embedded
    PostgreSQL's exit hook stop the database with the relay.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        handled = (signal.SIGINT, signal.SIGTERM)
        originals = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in originals.items():
                signal.signal(sig, handler)


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's settings for the relay: uvloop, the relay's own websocket protocol
    (relay.wsserver), frame and ping limits, TLS, and logging through relay.logs."""
    return dict(
        host=settings.host,
        port=settings.port,
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


def run_one(settings: Settings, database_url: str, options: dict[str, Any]) -> None:
    """The relay in this process, until SIGINT/SIGTERM."""
    from relay.app import create_app

    Server(uvicorn.Config(create_app(settings, database_url), **options)).run()


def run_workers(workers: int, options: dict[str, Any]) -> None:
    """`workers` relay processes on one port, each building its settings from the
    environment (`relay.app.create_app_from_env`); /metrics sums every worker
    (prometheus_client's multiprocess mode, relay.metrics)."""
    own_dir = not os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if own_dir:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="engram-metrics-")
    try:
        uvicorn.run("relay.app:create_app_from_env", factory=True, workers=workers, **options)
    finally:
        if own_dir:
            shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)
