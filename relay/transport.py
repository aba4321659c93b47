"""Starlette websocket transport: moves frames between a socket and the pipeline.

The only module that touches Starlette's websocket. Each connection has a bounded send
queue drained by one writer task; a consumer that falls too far behind is disconnected
instead of growing memory. EVENT and REQ frames run as tasks (bounded per connection)
so one slow database round trip does not stall the connection's other messages.
"""

from __future__ import annotations

import asyncio
import logging
import secrets

from starlette.websockets import WebSocket, WebSocketDisconnect

from relay import wire
from relay.pipeline import Relay
from relay.session import Session
from relay.wire import Reason

log = logging.getLogger("engram.transport")

IN_FLIGHT_MAX = 256  # concurrently handled frames per connection (backpressure beyond)
SLOW_CONSUMER_CLOSE = 4000  # websocket close code used when a reader falls behind


class Connection:
    """A websocket plus its bounded outgoing queue."""

    def __init__(self, ws: WebSocket, queue_max: int) -> None:
        self.ws = ws
        self.queue: asyncio.Queue[bytes | None] = asyncio.Queue(queue_max)
        self.overflowed = False

    def send(self, frame: bytes) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(frame)
        except asyncio.QueueFull:
            self.overflowed = True
            log.warning("slow consumer disconnected (send queue full)")
            self._drop_oldest_for(wire.notice(Reason.ERROR("too slow reading; disconnecting")))
            self.queue.put_nowait(None)

    def _drop_oldest_for(self, frame: bytes) -> None:
        """Make room for the farewell NOTICE and the close marker."""
        for _ in range(2):
            try:
                self.queue.get_nowait()
            except asyncio.QueueEmpty:
                break
        self.queue.put_nowait(frame)

    async def writer(self) -> None:
        send = self.ws.send
        while True:
            frame = await self.queue.get()
            if frame is None:
                await self.ws.close(SLOW_CONSUMER_CLOSE, "slow consumer")
                return
            await send({"type": "websocket.send", "text": frame.decode()})


async def serve_websocket(ws: WebSocket, relay: Relay) -> None:
    await ws.accept()
    conn = Connection(ws, relay.settings.send_queue_max)
    session = Session(secrets.token_hex(16), ws.headers.get("host", ""), conn.send)
    writer = asyncio.create_task(conn.writer())
    tasks: set[asyncio.Task[None]] = set()
    slots = asyncio.Semaphore(IN_FLIGHT_MAX)

    async def run(frame: bytes | str) -> None:
        try:
            await relay.handle(session, frame)
        except Exception:  # one frame's bug must not take the connection down
            log.exception("unhandled error in frame handler")
            session.send(wire.notice(Reason.ERROR("internal error")))
        finally:
            slots.release()

    session.send(wire.auth_challenge(session.challenge))
    try:
        while not writer.done():
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                break
            frame = message.get("text")
            if frame is None:
                frame = message.get("bytes") or b""
            await slots.acquire()
            task = asyncio.create_task(run(frame))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    except WebSocketDisconnect:
        pass
    finally:
        relay.disconnect(session)
        for task in tasks:
            task.cancel()
        writer.cancel()
