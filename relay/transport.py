"""Starlette websocket transport: moves frames between a socket and the pipeline.

The only module that touches Starlette's websocket. After the upgrade, a connection on
the relay's own server moves to its direct socket (relay.wsserver) and is served by
callbacks, with no task of its own (`Direct`); elsewhere (permessage-deflate, a plain
ASGI server) a task reads it and a writer task drains its queue (`serve_asgi`). Either
way each connection has a send queue (relay.sendqueue) for what its socket does not take
at once; a reader that stops is disconnected once its queue has not shrunk for
`slow_consumer_seconds`, and byte caps per connection and per relay bound memory
whatever readers do. REQ/COUNT frames run as tasks (bounded per connection) so one slow
database round trip does not stall the connection's other messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from starlette.requests import HTTPConnection
from starlette.responses import PlainTextResponse
from starlette.websockets import WebSocket

from relay import metrics, wire
from relay.memtrim import trimmer
from relay.pipeline import Relay
from relay.sendqueue import OutputBudget, OutputQueue, budget_for
from relay.session import Session, offer_each
from relay.tenants import Tenant
from relay.wire import Reason

log = logging.getLogger("engram.transport")

DIRECT = "engram.direct"  # scope extension: the server can detach the connection (wsserver)
SLOW_CONSUMER_CLOSE = 4000  # websocket close code used when a reader falls behind
CLOSE_TIMEOUT = 2.0  # seconds a close we start may wait for the socket (a stuck reader)


class Connection(OutputQueue):
    """A websocket's outgoing side: straight to the direct socket while it takes data,
    else queued (relay.sendqueue: byte caps, stall detection) and drained as it does;
    without a direct socket (the ASGI path) a writer task drains the queue."""

    __slots__ = ("direct", "dropped_callback", "gone", "ws")

    def __init__(self, ws: WebSocket, budget: OutputBudget, max_bytes: int) -> None:
        super().__init__(budget, max_bytes)
        self.ws = ws  # the ASGI websocket (None once the connection is detached)
        self.direct: Any = None  # relay.wsserver.DirectSocket once detached
        self.gone: asyncio.Event | None = None  # the ASGI path: set when dropped
        self.dropped_callback: Callable[[], None] | None = None  # the direct path's

    def send(self, frame: bytes) -> None:
        """Non-blocking: to the socket, else queued; a reader past its cap is dropped."""
        if self.dropped is not None:
            return
        direct = self.direct
        if direct is not None and not self.frames and direct.send_text(frame):
            return
        self.push(frame)
        if direct is not None:
            direct.waiting = True

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
        go in one call to the direct socket."""
        direct = self._bypass()
        i = start if direct is None else direct.send_texts_now(frames, start)
        return offer_each(self.offer, frames, i)

    def offer_events(self, prefix: bytes, raws: list[bytes], last: bytes) -> bool:
        """A REQ's stored events and EOSE straight to the direct socket, all or none
        (relay.wsserver.DirectSocket.send_events); False: nothing was taken."""
        direct = self._bypass()
        return direct is not None and direct.send_events(prefix, raws, last)

    def _bypass(self) -> Any:
        """The direct socket when output may skip the queue now (nothing queued before
        it, the connection not dropped), else None."""
        direct = self.direct
        return direct if direct is not None and not self.frames and self.dropped is None else None

    async def send_wait(self, frame: bytes) -> None:
        """Queue a frame, waiting for room: stored REQ results use backpressure, not drops."""
        while not self.offer(frame):
            await self.wait_room(self.cost(frame))

    def drain(self) -> None:
        """The direct socket takes data again: queued frames go to it, in order (each
        frame sent is progress for stall detection)."""
        direct = self.direct
        while self.frames and direct.can_send():
            direct.send_text(self.pop())
        direct.waiting = bool(self.frames)

    def dropped_hook(self) -> None:
        if self.dropped_callback is not None:
            self.dropped_callback()
        elif self.gone is not None:
            self.gone.set()

    async def writer(self) -> None:
        """The ASGI path: drain the queue to the socket."""
        send = self.ws.send
        while True:
            await self.wait_frames()
            if self.dropped is not None:
                return
            await send({"type": "websocket.send", "text": self.pop().decode()})

    async def goodbye(self) -> bool:
        """The ASGI path, after a drop: a NOTICE and a close frame if the socket takes
        them in time (a reader that stopped would never take them); False if not."""
        notice = wire.notice(Reason.ERROR(self.notice())).decode()

        async def farewell() -> None:
            await self.ws.send({"type": "websocket.send", "text": notice})
            await self.ws.close(SLOW_CONSUMER_CLOSE, "slow consumer")

        with contextlib.suppress(Exception):
            await asyncio.wait_for(farewell(), CLOSE_TIMEOUT)
            return True
        return False


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
    """One client connection: admitted (the address's connection cap), accepted, its
    session and send queue made; then either handed to the server's direct socket
    (`Direct`, no task: this returns at once) or, on the ASGI path, served by this task
    until the client leaves (`serve_asgi`)."""
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
        None,
        ws.headers.get("host", ""),
        conn.send,
        conn.send_wait,
        conn.offer,
        tenant,
        ip,
        allowance,
        offer_all=conn.offer_all,
        local=local_address(ws),
        offer_events=conn.offer_events,
    )
    if not allowance.exempt:
        allowance.address.sessions.add(session)
    metrics.connection_opened(tenant.key)
    trimmer.opened()
    server = ws.scope.get("extensions", {}).get(DIRECT)
    socket = server.detach() if server is not None else None
    if socket is not None:
        Direct(relay, conn, session, socket)
        return
    await serve_asgi(ws, relay, conn, session, server)


class Direct:
    """A connection on the server's direct socket (relay.wsserver.DirectSocket): every
    message is handled synchronously as it is parsed, past `in_flight_max` EVENTs or
    tasks in flight the socket is not read, queued output drains when the socket takes
    data again, and whatever ends the connection (the client, a protocol error, the
    keepalive, a slow-consumer drop) releases it here. No task of its own: a crowd of
    idle subscribers costs memory only."""

    __slots__ = ("conn", "limit", "paused", "relay", "session", "socket", "tasks")

    def __init__(self, relay: Relay, conn: Connection, session: Session, socket: Any) -> None:
        self.relay = relay
        self.conn = conn
        self.session = session
        self.socket = socket
        self.limit = relay.settings.in_flight_max
        self.paused = False
        self.tasks: set[asyncio.Task[None]] | None = None  # REQ/COUNT/... in flight
        conn.ws = None  # the ASGI websocket is done with
        conn.direct = socket
        conn.dropped_callback = self.dropped
        session.on_event_done = self.wake
        socket.start(self.on_message, self.gone, conn.drain)
        if session.tenant.auth_challenge == "on-connect":
            session.send_challenge()

    def busy(self) -> bool:
        tasks = self.tasks
        limit = self.limit
        return self.session.in_flight >= limit or (tasks is not None and len(tasks) >= limit)

    def on_message(self, frame: str | bytes) -> bool:
        """One client message; False: stop reading until `wake`."""
        session = self.session
        try:
            work = self.relay.handle(session, frame)
        except Exception:
            frame_failed(session)
            work = None
        if work is not None:
            task = asyncio.ensure_future(guarded(work, session))
            if self.tasks is None:
                self.tasks = set()
            self.tasks.add(task)
            task.add_done_callback(self.task_done)
        if self.busy():
            self.paused = True
            return False
        return True

    def task_done(self, task: asyncio.Task[None]) -> None:
        tasks = self.tasks
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                self.tasks = None
        if self.paused:
            self.wake()

    def wake(self) -> None:
        """An EVENT or a task finished: read again if there is room now."""
        if self.paused and not self.busy():
            self.paused = False
            self.socket.resume_receiving()

    def gone(self) -> None:
        """The connection is closed: everything of it is released."""
        session = self.session
        if session.closed:
            return
        metrics.connection_closed(session.tenant.key)
        trimmer.closed()
        self.relay.disconnect(session)
        session.on_event_done = None
        tasks, self.tasks = self.tasks, None
        for task in tasks or ():
            task.cancel()
        self.conn.close()
        self.conn.dropped_callback = None

    def dropped(self) -> None:
        """The reader was dropped as a slow consumer: a NOTICE and a close frame, after
        whatever the socket already holds, and the connection is released."""
        notice = wire.notice(Reason.ERROR(self.conn.notice()))
        asyncio.get_running_loop().call_soon(
            self.socket.close, SLOW_CONSUMER_CLOSE, "slow consumer", notice
        )


async def serve_asgi(
    ws: WebSocket, relay: Relay, conn: Connection, session: Session, server: Any
) -> None:
    """The ASGI path (permessage-deflate, a plain ASGI server): frames read by this task
    (`read_frames`) and written by a writer task until the client leaves, the writer
    fails or the reader is dropped as a slow consumer; then everything is released (a
    dropped reader's socket is cut when our server can: `server`, relay.wsserver)."""
    conn.gone = asyncio.Event()
    writer = asyncio.create_task(conn.writer())
    gone = asyncio.create_task(conn.gone.wait())
    tasks: set[asyncio.Task[None]] = set()  # the connection's REQ/COUNT/... in flight
    if session.tenant.auth_challenge == "on-connect":
        session.send_challenge()
    reader = asyncio.create_task(read_frames(ws, relay, session, tasks))
    try:
        # whichever ends first ends the connection
        await asyncio.wait({reader, writer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        metrics.connection_closed(session.tenant.key)
        trimmer.closed()
        relay.disconnect(session)
        for task in (reader, writer, gone, *tasks):
            task.cancel()
        conn.close()
    if conn.dropped is not None and not await conn.goodbye() and server is not None:
        server.abort()


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
