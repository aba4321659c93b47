"""Starlette websocket transport: moves frames between a socket and the pipeline.

The only module that touches Starlette's websocket. Each connection has a bounded send
queue drained by one writer task; a consumer that falls too far behind is disconnected
instead of growing memory. EVENT and REQ frames run as tasks (bounded per connection)
so one slow database round trip does not stall the connection's other messages.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import secrets
from collections.abc import Coroutine
from typing import Any

from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket

from relay import metrics, wire
from relay.pipeline import Relay
from relay.session import Session
from relay.tenants import Tenant
from relay.wire import Reason

log = logging.getLogger("engram.transport")

DIRECT = "engram.direct"  # scope extension: relay.wsserver's synchronous send path
SLOW_CONSUMER_CLOSE = 4000  # websocket close code used when a reader falls behind
CLOSE_TIMEOUT = 2.0  # seconds to try a close handshake with a reader that is stuck


class Connection:
    """A websocket plus its outgoing queue, bounded in frames and in bytes."""

    def __init__(self, ws: WebSocket, max_frames: int, max_bytes: int) -> None:
        self.ws = ws
        # the server's direct send path (relay.wsserver), when it offers one
        self.direct: Any = ws.scope.get("extensions", {}).get(DIRECT)
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self.frames: collections.deque[bytes] = collections.deque()
        self.queued_bytes = 0
        self.overflowed = False
        self._ready = asyncio.Event()  # frames to write, or the overflow to act on
        self._room = asyncio.Event()  # space freed for send_wait
        self._room.set()

    def _full(self, size: int) -> bool:
        # an empty queue always takes one frame, however large: it must be deliverable
        return bool(self.frames) and (
            len(self.frames) >= self.max_frames or self.queued_bytes + size > self.max_bytes
        )

    def _push(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.queued_bytes += len(frame)
        self._ready.set()

    def _send_direct(self, frame: bytes) -> bool:
        """Hand the frame to the socket now, if nothing is queued ahead of it and the
        socket is taking data; otherwise the queue keeps order and applies backpressure."""
        direct = self.direct
        if direct is not None and not self.frames and direct.can_send():
            direct.send_text_now(frame)
            return True
        return False

    def send(self, frame: bytes) -> None:
        """Non-blocking; a full queue means the reader fell behind: drop the connection."""
        if self.overflowed or self._send_direct(frame):
            return
        if self._full(len(frame)):
            self.overflowed = True
            metrics.slow_consumer(len(self.frames))
            log.warning("slow consumer disconnected (send queue full)")
            self.frames.clear()
            self.queued_bytes = 0
            self._push(wire.notice(Reason.ERROR("too slow reading; disconnecting")))
            self._room.set()
            return
        self._push(frame)

    async def send_wait(self, frame: bytes) -> None:
        """Queue a frame, waiting for room: stored REQ results use backpressure, not drops."""
        while not self.overflowed and self._full(len(frame)):
            self._room.clear()
            await self._room.wait()
        if not self.overflowed and not self._send_direct(frame):
            self._push(frame)

    async def writer(self) -> None:
        """Drain the queue to the socket; after an overflow, say goodbye (briefly) and stop."""
        send = self.ws.send
        while True:
            if not self.frames:
                if self.overflowed:
                    # a reader that stopped reading may never take the close frame either
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(
                            self.ws.close(SLOW_CONSUMER_CLOSE, "slow consumer"), CLOSE_TIMEOUT
                        )
                    return
                self._ready.clear()
                await self._ready.wait()
                continue
            frame = self.frames.popleft()
            self.queued_bytes -= len(frame)
            self._room.set()
            await send({"type": "websocket.send", "text": frame.decode()})


def client_ip(ws: WebSocket, trust_forwarded_for: bool) -> str:
    """The peer address; behind a trusted proxy, the first X-Forwarded-For entry."""
    if trust_forwarded_for:
        forwarded = ws.headers.get("x-forwarded-for", "")
        if forwarded:
            return forwarded.split(",")[0].strip()
    return ws.client.host if ws.client else ""


async def serve_websocket(ws: WebSocket, relay: Relay, tenant: Tenant) -> None:
    ip = client_ip(ws, relay.settings.rate.trust_forwarded_for)
    allowance = relay.connect(tenant, ip)
    if allowance is None:
        await ws.send_denial_response(
            PlainTextResponse(
                "rate-limited: too many connections from your address\n", status_code=429
            )
        )
        return
    await ws.accept()
    conn = Connection(ws, relay.settings.send_queue_max, relay.settings.send_queue_bytes)
    session = Session(
        secrets.token_hex(16),
        ws.headers.get("host", ""),
        conn.send,
        conn.send_wait,
        tenant,
        ip,
        allowance,
    )
    allowance.address.sessions.add(session)
    writer = asyncio.create_task(conn.writer())
    tasks: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(relay.settings.in_flight_max)

    async def run(work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception:  # one frame's bug must not take the connection down
            log.exception("unhandled error in frame handler")
            session.send(wire.notice(Reason.ERROR("internal error")))
        finally:
            slots.release()

    async def read() -> None:
        """Frames in order; REQ/COUNT run as tasks, EVENTs complete by callback. Both are
        bounded by `in_flight_max`, beyond which the socket is simply not read."""
        limit = relay.settings.in_flight_max
        room = asyncio.Event()
        session.on_event_done = room.set
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            frame = message.get("text")
            if frame is None:
                frame = message.get("bytes") or b""
            while session.in_flight >= limit:  # EVENTs waiting for their commit
                room.clear()
                await room.wait()
            try:
                work = relay.handle(session, frame)
            except Exception:
                log.exception("unhandled error in frame handler")
                session.send(wire.notice(Reason.ERROR("internal error")))
                continue
            if work is not None:
                await slots.acquire()
                task = asyncio.create_task(run(work))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

    async def guarded(work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except Exception:  # one frame's bug must not take the connection down
            log.exception("unhandled error in frame handler")
            session.send(wire.notice(Reason.ERROR("internal error")))

    def receive_direct() -> asyncio.Future[None] | None:
        """The server's direct receive path (relay.wsserver), when it offers one: each
        message is handled synchronously in the protocol's data_received; past
        `in_flight_max` EVENTs or tasks in flight the socket is not read."""
        direct = conn.direct
        if direct is None or not hasattr(direct, "receive_direct"):
            return None
        limit = relay.settings.in_flight_max
        handle = relay.handle
        gone: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        paused = False

        def wake(_: object = None) -> None:
            nonlocal paused
            if paused and session.in_flight < limit and len(tasks) < limit:
                paused = False
                direct.resume_receiving()

        def done(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if paused:
                wake()

        def on_message(frame: str | bytes) -> bool:
            nonlocal paused
            try:
                work = handle(session, frame)
            except Exception:
                log.exception("unhandled error in frame handler")
                session.send(wire.notice(Reason.ERROR("internal error")))
                work = None
            if work is not None:
                task = asyncio.ensure_future(guarded(work))
                tasks.add(task)
                task.add_done_callback(done)
            if session.in_flight < limit and len(tasks) < limit:
                return True
            paused = True
            return False

        def on_gone() -> None:
            if not gone.done():
                gone.set_result(None)

        session.on_event_done = wake
        if not direct.receive_direct(on_message, on_gone):
            session.on_event_done = None
            return None
        return gone

    session.send(wire.auth_challenge(session.challenge))
    reader: asyncio.Future[None] = receive_direct() or asyncio.create_task(read())
    metrics.connection_opened(tenant.key)
    try:
        # whichever ends first ends the connection: the client leaving, or the writer
        # giving up on a reader that fell too far behind
        await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not isinstance(reader, asyncio.Task):  # the direct path: no more messages
            conn.direct.stop_receiving()
        metrics.connection_closed(tenant.key)
        relay.disconnect(session)
        for task in (reader, writer, *tasks):
            task.cancel()
