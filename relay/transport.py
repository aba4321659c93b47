"""Starlette websocket transport: moves frames between a socket and the pipeline.

The only module that touches Starlette's websocket. Each connection has a send queue
(relay.sendqueue) drained by one writer task; a reader that stops is disconnected once
its queue has not shrunk for `slow_consumer_seconds`, and byte caps per connection and
per relay bound memory whatever readers do. EVENT and REQ frames run as tasks (bounded
per connection) so one slow database round trip does not stall the connection's other
messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import Coroutine
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket

from relay import metrics, wire
from relay.pipeline import Relay
from relay.sendqueue import OutputBudget, OutputQueue, budget_for
from relay.session import Session, offer_each
from relay.tenants import Tenant
from relay.wire import Reason

log = logging.getLogger("engram.transport")

DIRECT = "engram.direct"  # scope extension: relay.wsserver's synchronous send path
SLOW_CONSUMER_CLOSE = 4000  # websocket close code used when a reader falls behind
CLOSE_TIMEOUT = 2.0  # seconds to try a close handshake with a reader that is stuck


class Connection(OutputQueue):
    """A websocket plus its outgoing queue (relay.sendqueue: byte caps, stall detection)."""

    def __init__(self, ws: WebSocket, budget: OutputBudget, max_bytes: int) -> None:
        super().__init__(budget, max_bytes)
        self.ws = ws
        # the server's direct send path (relay.wsserver), when it offers one
        self.direct: Any = ws.scope.get("extensions", {}).get(DIRECT)
        self.sending = False  # the writer holds a frame it has not handed over yet

    def _send_direct(self, frame: bytes) -> bool:
        """Hand the frame to the socket now, if nothing is queued ahead of it and the
        socket is taking data; otherwise the queue keeps order and applies backpressure."""
        direct = self.direct
        if direct is not None and not self.frames and not self.sending and direct.can_send():
            direct.send_text_now(frame)
            return True
        return False

    def send(self, frame: bytes) -> None:
        """Non-blocking: to the socket, else queued; a reader past its cap is dropped."""
        if self.dropped is None and not self._send_direct(frame):
            self.push(frame)

    def offer(self, frame: bytes) -> bool:
        """Send or queue a frame if the queue has room for bulk output now; False: the
        caller awaits `send_wait` (a REQ's stored results skip two awaits per event)."""
        if not self.has_room(self.cost(frame)):
            return False
        self.send(frame)
        return True

    def offer_all(self, frames: list[bytes], start: int = 0) -> int:
        """`offer` for `frames[start:]`: the index of the first one not taken (the caller
        awaits `send_wait` for it), len(frames) once all are. Frames the socket takes now
        go in one call to the server's direct path."""
        direct = self.direct
        i = start
        if direct is not None and not self.frames and not self.sending and self.dropped is None:
            i = direct.send_texts_now(frames, i)
        return offer_each(self.offer, frames, i)

    async def send_wait(self, frame: bytes) -> None:
        """Queue a frame, waiting for room: stored REQ results use backpressure, not drops."""
        while not self.offer(frame):
            await self.wait_room(self.cost(frame))

    async def writer(self) -> None:
        """Drain the queue to the socket (each frame sent is progress for stall detection)."""
        send = self.ws.send
        while True:
            await self.wait_frames()
            if self.dropped is not None:
                return
            self.sending = True  # later frames queue behind this one (order)
            await send({"type": "websocket.send", "text": self.pop().decode()})
            self.sending = False

    async def goodbye(self) -> None:
        """After a drop: a NOTICE and a close frame if the socket takes them in time, then
        the connection is cut (a reader that stopped would never take them)."""
        notice = wire.notice(Reason.ERROR(self.notice())).decode()

        async def farewell() -> None:
            await self.ws.send({"type": "websocket.send", "text": notice})
            await self.ws.close(SLOW_CONSUMER_CLOSE, "slow consumer")

        with contextlib.suppress(Exception):
            await asyncio.wait_for(farewell(), CLOSE_TIMEOUT)
            return
        if self.direct is not None:
            self.direct.abort()


def client_ip(ws: HTTPConnection, trust_forwarded_for: bool) -> str:
    """The peer address; behind a trusted proxy, the last X-Forwarded-For entry: the one
    the proxy appended (earlier entries come from the client and could be anything)."""
    if trust_forwarded_for:
        forwarded = ws.headers.get("x-forwarded-for", "")
        if forwarded:
            return forwarded.rsplit(",", 1)[-1].strip()
    return ws.client.host if ws.client else ""


def local_address(ws: HTTPConnection) -> tuple[str, int] | None:
    """The relay's own address and port that the connection reached (ASGI `server`)."""
    server = ws.scope.get("server")
    if not server or server[1] is None:
        return None
    return str(server[0]), int(server[1])


INTERNAL_ERROR = wire.notice(Reason.ERROR("internal error"))


def frame_failed(session: Session) -> None:
    """A frame's handler raised (a bug): logged, and the client told with a NOTICE; one
    frame's bug must not take the connection down. Called from the `except` block."""
    log.exception("unhandled error in frame handler")
    session.send(INTERNAL_ERROR)


async def serve_websocket(ws: WebSocket, relay: Relay, tenant: Tenant) -> None:
    """One client connection, from the upgrade to the close: admitted (the address's
    connection cap), its session and send queue made, frames read (`receive_direct` or
    `read_frames`) until the client leaves, the writer fails or the reader is dropped
    as a slow consumer; then everything of it is released."""
    ip = client_ip(ws, relay.settings.rate.trust_forwarded_for)
    allowance = relay.connect(tenant, ip)
    if allowance is None:
        await ws.send_denial_response(
            PlainTextResponse(
                Reason.RATE_LIMITED("too many connections from your address") + "\n",
                status_code=429,
            )
        )
        return
    await ws.accept()
    settings = relay.settings
    budget = budget_for(relay, settings.send_queue_budget_bytes, settings.slow_consumer_seconds)
    conn = Connection(ws, budget, settings.send_queue_bytes)
    session = Session(
        secrets.token_hex(16),
        ws.headers.get("host", ""),
        conn.send,
        conn.send_wait,
        conn.offer,
        tenant,
        ip,
        allowance,
        offer_all=conn.offer_all,
        local=local_address(ws),
    )
    allowance.address.sessions.add(session)
    writer = asyncio.create_task(conn.writer())
    gone = asyncio.create_task(conn.gone.wait())
    tasks: set[asyncio.Task[None]] = set()  # the connection's REQ/COUNT/... in flight
    if tenant.auth_challenge == "on-connect":
        session.send_challenge()
    reader: asyncio.Future[None] = receive_direct(relay, conn, session, tasks) or (
        asyncio.create_task(read_frames(ws, relay, session, tasks))
    )
    metrics.connection_opened(tenant.key)
    try:
        # whichever ends first ends the connection: the client leaving, the writer
        # failing, or the reader being dropped as a slow consumer
        await asyncio.wait({reader, writer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not isinstance(reader, asyncio.Task):  # the direct path: no more messages
            conn.direct.stop_receiving()
        metrics.connection_closed(tenant.key)
        relay.disconnect(session)
        for task in (reader, writer, gone, *tasks):
            task.cancel()
        conn.close()
    if conn.dropped is not None:
        await conn.goodbye()


def receive_direct(
    relay: Relay, conn: Connection, session: Session, tasks: set[asyncio.Task[None]]
) -> asyncio.Future[None] | None:
    """Frames from the server's direct receive path (relay.wsserver), when it offers one:
    each message is handled synchronously in the protocol's data_received; past
    `in_flight_max` EVENTs or tasks in flight the socket is not read. The future ends
    when the client is gone; None: no direct path (read_frames instead)."""
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
            frame_failed(session)
            work = None
        if work is not None:
            task = asyncio.ensure_future(guarded(work, session))
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


async def read_frames(
    ws: WebSocket, relay: Relay, session: Session, tasks: set[asyncio.Task[None]]
) -> None:
    """Frames in order from the ASGI websocket (no direct path: permessage-deflate, a
    plain ASGI server); REQ/COUNT run as tasks, EVENTs complete by callback. Both are
    bounded by `in_flight_max`, beyond which the socket is simply not read."""
    limit = relay.settings.in_flight_max
    slots = asyncio.Semaphore(limit)
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
            frame_failed(session)
            continue
        if work is not None:
            await slots.acquire()
            task = asyncio.create_task(bounded(work, session, slots))
            tasks.add(task)
            task.add_done_callback(tasks.discard)


async def guarded(work: Coroutine[Any, Any, None], session: Session) -> None:
    """A frame's task (a REQ, a COUNT, a NEG-OPEN, an ephemeral EVENT's hand-off), its
    failure told (`frame_failed`)."""
    try:
        await work
    except Exception:
        frame_failed(session)


async def bounded(
    work: Coroutine[Any, Any, None], session: Session, slots: asyncio.Semaphore
) -> None:
    """`guarded`, holding one of read_frames's `in_flight_max` slots until it ends."""
    try:
        await guarded(work, session)
    finally:
        slots.release()
