"""The uvicorn server behind `engram serve`."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

import uvicorn


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
