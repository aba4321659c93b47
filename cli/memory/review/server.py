"""Serving the review app: loopback only, a free port, a fresh token, an idle timeout.

`serve()` binds 127.0.0.1 on a port the system picks, announces the URL (with its token)
and a maker of one-time launch links (`guard.Guard.launch_link`: for anything that puts
the link on a command line, such as a browser it starts) through `announce`, and runs
uvicorn until Ctrl-C / SIGTERM or until `idle_timeout` seconds pass without a request
that got through the door. Then the visit mark is saved.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import uvicorn

from cli.memory.api import AgentMemory
from cli.memory.review import visits
from cli.memory.review.app import Review
from cli.memory.review.guard import Guard, new_token
from relay.server import Server

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class Stopped:
    """Why the server stopped: "signal" (Ctrl-C, SIGTERM) or "idle"."""

    reason: str
    idle_seconds: float = 0.0


def bind_loopback() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((LOOPBACK, 0))
    sock.listen(64)
    sock.set_inheritable(True)
    return sock


async def serve(
    memory: AgentMemory,
    announce: Callable[[str, Callable[[], str]], None],
    idle_timeout: float | None,
    state_dir: Path | None = None,
) -> Stopped:
    sock = bind_loopback()
    port = sock.getsockname()[1]
    token = new_token()
    ident = memory.identity
    review = Review(memory, visits.mark_path(ident.agent, ident.owner, ident.as_owner, state_dir))
    guard = Guard(review.app(), token, f"{LOOPBACK}:{port}")
    config = uvicorn.Config(
        guard,
        log_level="warning",
        log_config=None,
        access_log=False,
        lifespan="off",
        server_header=False,
        date_header=False,
    )
    server = Server(config)
    stopped = Stopped("signal")

    async def watch_idle() -> None:
        nonlocal stopped
        assert idle_timeout is not None
        while not server.should_exit:
            idle = time.monotonic() - guard.last_request
            if idle >= idle_timeout:
                stopped = Stopped("idle", idle)
                server.should_exit = True
                return
            await asyncio.sleep(min(idle_timeout - idle, 1.0) + 0.01)

    announce(f"http://{LOOPBACK}:{port}/t/{token}/", guard.launch_link)
    watcher = asyncio.create_task(watch_idle()) if idle_timeout else None
    try:
        await server.serve(sockets=[sock])
    finally:
        if watcher is not None:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        sock.close()
        review.finish()
        await memory.close()  # the recall index's connections, and its cache if a change waits
    return stopped
