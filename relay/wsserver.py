"""uvicorn's websocket protocol for the upgrade, then a compact direct socket per connection.

Profiling the REQ and fan-out phases showed most of the relay's CPU in one
`transport.write` syscall per frame, the websockets library's frame objects, and the
ASGI await chain around each send; profiling a crowd of 10,000 idle subscribers showed
most of its memory (37 KB per connection) in what uvicorn keeps for a connection's whole
life: its protocol object (a 50-attribute dict, an ASGI queue, events), the ASGI task
with its chain of a dozen coroutine frames, the websockets library's state machine and
the request's headers three times over.

So uvicorn and the websockets library do the HTTP upgrade and the ASGI app decides as
usual (tenant, limits, accept); then the transport (relay.transport) calls `detach()`,
which moves the connection to a `DirectSocket`: a slotted asyncio protocol that owns the
socket from then on, parses client frames with `relay.wsframes`, hands each message to
the transport's callback synchronously, and takes ready UTF-8 frames synchronously (the
header is built here: server frames are unmasked and never fragmented); every connection
with output is written once per event-loop iteration, in one system call. The ASGI app
returns and its task ends, and the uvicorn protocol object is let go; keepalive pings of
every direct socket run on one timer (`Keepalive`), not one timer per connection.

A connection that negotiated an extension (permessage-deflate) is never detached: it
keeps the library's parser and the ASGI path for its whole life, as it would on a plain
ASGI server (the transport detaches only when the `engram.direct` scope extension is
present).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import os
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from relay import wsframes
from relay.transport import CLOSE_TIMEOUT, DIRECT
from relay.wsframes import text_frame_header

log = logging.getLogger("engram.transport")

# Bytes a connection may hold outside the relay's own accounted queue: frames corked
# (`DIRECT_MAX`, written at the end of the loop iteration, or sooner when a REQ's answer
# does not fit beside them: DirectSocket.send_events) plus the transport's buffer (its
# high-water mark, `DIRECT_MAX` too); past them frames wait in that queue
# (relay.sendqueue), whose bounds decide when a reader is too slow. It is part of the
# per-connection constant in the memory bound (docs/OPERATING.md "Operating it"):
# 256 KiB held 330 MiB beyond the budget with 1,000 stalled readers (bench stalled).
DIRECT_MAX = 32 * 1024
# seconds between two ticks of the keepalive wheel (at most): each tick pings a bucket of
# sockets (those that connected within one tick) while the loop waits, and their pongs come
# back together. With 1 s ticks a crowd that connected at ~1,000 a second put ~1,000 pings
# and pongs in one iteration each second, and another client's EVENT -> OK landing there
# waited for them (bench crowd's p99)
KEEPALIVE_TICK = 0.05
# the text frame headers of payloads under HEADERS_MAX bytes (most events: a REQ's answer
# takes each event's from here, not from a call; ~300 KB)
HEADERS_MAX = 8192
_HEADERS = [text_frame_header(n) for n in range(HEADERS_MAX)]


# helper threads that write with the loop's thread when many sockets have output at once
# (`_Corker`): one per core beyond the first, at most 3; and how many sockets make it
# worth waking them (128 writes are ~1.5 ms of kernel time, a hand-off ~0.05 ms)
WRITE_THREADS = min(3, len(os.sched_getaffinity(0)) - 1)
PARALLEL_MIN = 128


class _Corker:
    """Connections with pending output in this loop iteration, flushed together: by
    this thread alone, or, when many have output at once (a fan-out to a crowd) and the
    machine has more than one core, with `WRITE_THREADS` helper threads too. A write to
    a loopback or LAN socket is ~12 us of kernel time, two thirds of the relay's CPU in
    a fan-out to 10,000 (bench crowd); `os.write` releases the GIL around it, so the
    threads spread the kernel's share over the cores while this thread waits. Only a
    socket with nothing buffered in its transport is written directly (what a write
    leaves goes to the transport afterwards, in order), only plain TCP (no TLS), and
    only while the loop is blocked here: nothing else touches those sockets meanwhile."""

    def __init__(self) -> None:
        self.pending: list[DirectSocket] = []
        self.pool: Any = None  # the helper threads (a ThreadPoolExecutor), made when needed

    def add(self, sock: DirectSocket) -> None:
        """`sock` has output (DirectSocket.send_text adds itself the same way, inline)."""
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(sock)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        if WRITE_THREADS and len(pending) >= PARALLEL_MIN:
            self.flush_parallel(pending)
            return
        for sock in pending:
            try:
                sock.flush()
            except Exception:  # a bug: the other sockets' output still goes out
                log.exception("flushing a connection's output failed")

    def flush_parallel(self, pending: list[DirectSocket]) -> None:
        direct: list[tuple[DirectSocket, bytes]] = []
        for sock in pending:
            try:
                data = sock.take()
                if data is None:
                    continue
                if sock.fd >= 0 and not sock.transport.get_write_buffer_size():
                    direct.append((sock, data))
                else:
                    sock.transport.write(data)
            except Exception:
                log.exception("flushing a connection's output failed")
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(
                WRITE_THREADS, thread_name_prefix="engram-write"
            )
        # this thread takes a share too
        share = max(1, -(-len(direct) // (WRITE_THREADS + 1)))
        futures = [
            self.pool.submit(_write_raw, direct[i : i + share])
            for i in range(share, len(direct), share)
        ]
        left = _write_raw(direct[:share])
        for future in futures:
            left += future.result()
        for sock, data, sent in left:  # the socket took part of it, or nothing: the rest
            try:
                if not sock.transport.is_closing():
                    sock.transport.write(data[sent:])
            except Exception:
                log.exception("flushing a connection's output failed")
        for sock in pending:
            sock.wrote()


def _write_raw(items: list[tuple[DirectSocket, bytes]]) -> list[tuple[DirectSocket, bytes, int]]:
    """`os.write` of each socket's bytes (any thread): the (socket, bytes, sent) whose
    bytes did not all go, for the transport to finish (an error too: the transport's
    own write then meets it and closes the connection as it always does)."""
    left = []
    write = os.write
    for sock, data in items:
        try:
            sent = write(sock.fd, data)
        except OSError:
            sent = 0
        if sent < len(data):
            left.append((sock, data, sent))
    return left


_corker = _Corker()


class Keepalive:
    """Pings for every direct socket from one timer: a wheel of buckets one tick apart
    (`KEEPALIVE_TICK`, or the interval if shorter) that turns once per interval, one
    bucket pinged each tick; a socket whose pong has not come `timeout` seconds after its
    ping is closed (1011), as uvicorn's keepalive does. A timer per connection cost ~400
    bytes and a wake-up each. A socket joins the bucket of the tick it connected in, so a
    crowd that connected in a storm is pinged as it came, a tick's arrivals at a time (a
    client's first ping comes about one interval after it connected, as with uvicorn)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, interval: float, timeout: float | None
    ) -> None:
        self.loop = loop
        self.tick = min(KEEPALIVE_TICK, interval)
        self.slots = max(1, round(interval / self.tick))
        self.check = bool(timeout and timeout > 0)
        # ticks from a ping to its deadline (at most a turn: then it is checked just
        # before the next ping)
        self.lag = min(self.slots, max(1, math.ceil((timeout or 0) / self.tick)))
        self.buckets: list[set[DirectSocket]] = [set() for _ in range(self.slots)]
        self.cursor = 0
        self.size = 0
        self.timer: asyncio.TimerHandle | None = None

    def add(self, sock: DirectSocket) -> None:
        """The socket's first ping comes after about one interval."""
        index = self.cursor
        sock.bucket = index
        self.buckets[index].add(sock)
        self.size += 1
        if self.timer is None:
            self.timer = self.loop.call_later(self.tick, self.turn)

    def remove(self, sock: DirectSocket) -> None:
        bucket = self.buckets[sock.bucket]
        if sock in bucket:
            bucket.remove(sock)
            self.size -= 1

    def turn(self) -> None:
        self.timer = None
        self.cursor = cursor = (self.cursor + 1) % self.slots
        if self.check:  # the bucket pinged `lag` turns ago: its pongs are overdue
            for sock in [s for s in self.buckets[(cursor - self.lag) % self.slots] if s.pinged]:
                sock.ping_timeout()
        bucket = self.buckets[cursor]
        if bucket:
            payload = os.urandom(4)
            frame = wsframes.control_frame(wsframes.OP_PING, payload)
            for sock in bucket:
                sock.ping(frame, payload)
        if self.size:
            self.timer = self.loop.call_later(self.tick, self.turn)


_keepalives: dict[tuple[float, float | None], Keepalive] = {}


def keepalive_for(interval: float | None, timeout: float | None) -> Keepalive | None:
    """The running loop's wheel for these settings (None: no keepalive pings)."""
    if not interval or interval <= 0:
        return None
    loop = asyncio.get_running_loop()
    wheel = _keepalives.get((interval, timeout))
    if wheel is None or wheel.loop is not loop:
        wheel = _keepalives[interval, timeout] = Keepalive(loop, interval, timeout)
    return wheel


class _HandedOver:
    """What a detached uvicorn protocol sees as its transport: the socket is another
    protocol's now, so whatever uvicorn still does with it (closing it as the ASGI task
    ends) does nothing."""

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return True

    def write(self, data: bytes) -> None:
        pass


_HANDED_OVER = _HandedOver()


class DirectSocket(asyncio.Protocol):
    """One websocket connection after `RelayWebSocketProtocol.detach`.

    Receiving: each client message goes to `on_message` as it is parsed; when it returns
    False (too many EVENTs or tasks in flight) reading pauses until `resume_receiving`.
    `on_gone` runs once when the connection is closed, whoever closed it.
    Sending: `send_text` takes a frame while the socket takes data; otherwise (False) the
    transport queues the frame and sets `waiting`, and `on_writable` runs once the socket
    takes data again.
    """

    __slots__ = (
        "_out",
        "_out_bytes",
        "bucket",
        "close_sent",
        "closed",
        "connections",
        "fd",
        "keepalive",
        "on_gone",
        "on_message",
        "on_writable",
        "pinged",
        "reading_paused",
        "rx",
        "rx_paused",
        "rx_scheduled",
        "transport",
        "waiting",
        "writing_paused",
    )

    def __init__(
        self,
        transport: asyncio.Transport,
        rx: wsframes.ClientFrameReader,
        connections: set[Any],
        keepalive: Keepalive | None,
    ) -> None:
        self.transport = transport
        self.rx = rx
        self.connections = connections  # uvicorn's: shut down with the server
        self.keepalive = keepalive
        # the socket's descriptor when the corker may write to it directly (plain TCP)
        raw = transport.get_extra_info("socket")
        plain = raw is not None and transport.get_extra_info("sslcontext") is None
        self.fd: int = raw.fileno() if plain else -1
        self.bucket = 0
        self.pinged: bytes | None = None  # the payload of the ping awaiting its pong
        self._out: list[bytes] = []
        self._out_bytes = 0
        self.on_message: Callable[[str | bytes], bool] | None = None
        self.on_gone: Callable[[], None] | None = None
        self.on_writable: Callable[[], None] | None = None
        self.waiting = False  # frames wait in the transport's queue for `on_writable`
        self.close_sent = False
        self.closed = False
        self.rx_paused = False  # the receiver is busy: frames wait in `rx`
        self.rx_scheduled = False
        self.reading_paused = False
        self.writing_paused = False

    def start(
        self,
        on_message: Callable[[str | bytes], bool],
        on_gone: Callable[[], None],
        on_writable: Callable[[], None],
    ) -> None:
        """Messages to `on_message` from now on (those already buffered first)."""
        self.on_message = on_message
        self.on_gone = on_gone
        self.on_writable = on_writable
        self.connections.add(self)
        if self.keepalive is not None:
            self.keepalive.add(self)
        if self.rx.buffered():
            self._schedule()

    # -- receiving --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        rx = self.rx
        rx.feed(data)
        if self.on_message is not None and not self.rx_paused:
            self._drain()
        elif rx.buffered() > rx.max_size:  # nobody reading: stop taking more
            self._pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the transport closes itself; connection_lost follows

    def resume_receiving(self) -> None:
        """The receiver has room again: go on with buffered frames, then the socket."""
        if self.rx_paused:
            self.rx_paused = False
            self._schedule()

    def _schedule(self) -> None:
        if not self.rx_scheduled:
            self.rx_scheduled = True
            asyncio.get_running_loop().call_soon(self._resume)

    def _resume(self) -> None:
        self.rx_scheduled = False
        if not self.rx_paused and self.on_message is not None:
            self._drain()

    def _drain(self) -> None:
        """Messages to the receiver until the buffer is empty or the receiver is busy."""
        rx = self.rx
        on_message = self.on_message
        assert on_message is not None
        binary = wsframes.OP_BINARY
        try:
            while True:
                item = rx.next()
                if item is None:
                    break
                opcode, payload = item
                if opcode <= binary:
                    if self.close_sent:
                        continue  # we are closing: discard, keep reading for the echo
                    if not on_message(payload):
                        self.rx_paused = True
                        self._pause_reading()
                        return
                elif opcode == wsframes.OP_PING:
                    self._control(wsframes.control_frame(wsframes.OP_PONG, payload))  # type: ignore[arg-type]
                elif opcode == wsframes.OP_PONG:
                    if payload == self.pinged:
                        self.pinged = None
                else:
                    self._closed_by_peer(wsframes.parse_close(payload)[0])  # type: ignore[arg-type]
                    return
                if self.on_message is None:  # the receiver is gone (a close on its side)
                    return
        except wsframes.FrameError as exc:
            self.close(exc.code, exc.reason)
            return
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self.reading_paused:
            self.reading_paused = True
            self.transport.pause_reading()

    def _writable(self) -> bool:
        """Nothing stops a write: no close sent, and the transport is not closing (it
        closes itself on EOF or a failed write, before connection_lost comes, and a
        write to it then raises)."""
        if self.close_sent or self.closed:
            return False
        if self.transport.is_closing():
            self.closed = True
            return False
        return True

    def _control(self, frame: bytes) -> None:
        self.flush()  # whatever is corked goes first
        if self._writable():
            self.transport.write(frame)

    def _closed_by_peer(self, code: int) -> None:
        if not self.close_sent:
            self.flush()
            echo = None if code == wsframes.CLOSE_NO_STATUS else code
            if self._writable():
                self.transport.write(wsframes.close_frame(echo))
            self.close_sent = True
        self.transport.close()
        self._gone()

    def close(self, code: int, reason: str = "", last: bytes = b"") -> None:
        """Close with `code` (after a last text message, e.g. a NOTICE): the connection
        is gone for the relay at once; the socket is cut if it has not flushed within
        CLOSE_TIMEOUT (a reader that stopped would never take the bytes)."""
        self.flush()
        if self._writable():
            before = text_frame_header(len(last)) + last if last else b""
            self.transport.write(before + wsframes.close_frame(code, reason))
            self.close_sent = True
            self.transport.close()
            asyncio.get_running_loop().call_later(CLOSE_TIMEOUT, self.transport.abort)
        self._gone()

    def shutdown(self) -> None:
        """The server is stopping (uvicorn calls this on every connection)."""
        self.close(1012)

    def _gone(self) -> None:
        if self.keepalive is not None:
            self.keepalive.remove(self)
        self.connections.discard(self)
        on_gone = self.on_gone
        self.on_gone = self.on_message = self.on_writable = None
        if on_gone is not None:
            on_gone()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._out, self._out_bytes = [], 0
        self._gone()

    # -- keepalive --------------------------------------------------------------------

    def ping(self, frame: bytes, payload: bytes) -> None:
        self.flush()
        if self._writable():
            self.pinged = payload
            self.transport.write(frame)

    def ping_timeout(self) -> None:
        self.close(1011, "keepalive ping timeout")

    # -- sending ----------------------------------------------------------------------

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        if self.waiting and self.on_writable is not None:
            self.on_writable()

    def can_send(self) -> bool:
        """The connection is open, its socket is taking data and this iteration's
        output is under DIRECT_MAX."""
        return not (self.writing_paused or self.close_sent or self.closed) and (
            self._out_bytes < DIRECT_MAX
        )

    def send_text(self, payload: bytes) -> bool:
        """One text frame (UTF-8 bytes), written with the others at the end of this loop
        iteration, if `can_send()`; False: not taken (the caller queues it). The fan-out
        path: one call per delivery."""
        if self.writing_paused or self.close_sent or self.closed or self._out_bytes >= DIRECT_MAX:
            return False
        out = self._out
        if not out:
            pending = _corker.pending
            if not pending:
                asyncio.get_running_loop().call_soon(_corker.flush)
            pending.append(self)
        size = len(payload)
        out.append(_HEADERS[size] if size < HEADERS_MAX else text_frame_header(size))
        out.append(payload)
        self._out_bytes += size
        return True

    def send_texts_now(self, payloads: list[bytes], start: int) -> int:
        """`send_text` for `payloads[start:]` as far as it would take them one
        by one: returns the index of the first one left to the caller. A REQ's stored
        results in one call."""
        end = len(payloads)
        if start >= end or not self.can_send():
            return start
        room = DIRECT_MAX - self._out_bytes
        out = self._out
        if not out:
            _corker.add(self)
        i = start
        written = 0
        while i < end and written < room:
            payload = payloads[i]
            size = len(payload)
            out.append(_HEADERS[size] if size < HEADERS_MAX else text_frame_header(size))
            out.append(payload)
            written += size
            i += 1
        self._out_bytes += written
        return i

    def send_events(self, prefix: bytes, raws: list[bytes], last: bytes) -> bool:
        """A REQ's stored events, each the text frame `prefix + raw + "]"`
        (relay.wire.event_frame, never built apart: the parts go to the cork as they
        are), then `last` (its EOSE): all of them, or none (False: the caller sends them
        one by one, through the queue for what the socket does not take). When they do
        not fit beside what this iteration already corked (`DIRECT_MAX`), that goes to
        the socket first, now, and they are corked after it: several REQs read in one
        iteration (a client with 8 in flight) cost a write each of up to DIRECT_MAX
        rather than a trip of their frames through the queue."""
        if self.writing_paused or self.close_sent or self.closed:
            return False
        more = len(prefix) + 1
        size = len(last) + more * len(raws) + sum(map(len, raws))
        if self._out_bytes + size > DIRECT_MAX:
            if size > DIRECT_MAX or not self._out:
                return False
            self.flush()  # `_corker` finds the cork empty, or this answer in it
            if self.writing_paused or self.close_sent or self.closed:
                return False
        out = self._out
        if not out:
            _corker.add(self)
        headers = _HEADERS
        for raw in raws:
            n = more + len(raw)
            out += (headers[n] if n < HEADERS_MAX else text_frame_header(n), prefix, raw, b"]")
        n = len(last)
        out += (headers[n] if n < HEADERS_MAX else text_frame_header(n), last)
        self._out_bytes += size
        return True

    def take(self) -> bytes | None:
        """This iteration's output as one buffer (the cork emptied), None when there is
        none or it can no longer be written."""
        out = self._out
        if not out:
            return None
        data = b"".join(out)
        out.clear()
        self._out_bytes = 0
        if self.close_sent or self.closed:  # `_writable`, inline: once per socket
            return None
        if self.transport.is_closing():
            self.closed = True
            return None
        return data

    def flush(self) -> None:
        data = self.take()
        if data is not None:
            self.transport.write(data)
        self.wrote()

    def wrote(self) -> None:
        """After a flush: the transport's queue goes on while the socket takes data."""
        if self.waiting and not self.writing_paused and self.on_writable is not None:
            self.on_writable()


class RelayWebSocketProtocol(WebSocketsSansIOProtocol):
    """uvicorn's websocket protocol until the transport detaches the connection."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # bytes after the upgrade request go to `_rx` instead of the library's parser
        self._head = bytearray()  # the upgrade request, until its end is seen
        self._rx: wsframes.ClientFrameReader | None = None
        self._reading_paused = False

    def data_received(self, data: bytes) -> None:
        rx = self._rx
        if rx is not None:  # the upgrade is done: held for the direct socket
            rx.feed(data)
            if rx.buffered() > rx.max_size:  # nobody reading yet: stop taking more
                self._pause_reading()
            return
        if self.handshake_initiated:
            super().data_received(data)
            return
        # Before the upgrade: hand the library the request and nothing after it (a GET
        # has no body), so its frame parser never sees a byte if `_rx` takes over.
        head = self._head
        seen = len(head)
        head += data
        end = head.find(b"\r\n\r\n", max(0, seen - 3))
        if end < 0:
            super().data_received(data)
            return
        cut = end + 4 - seen
        self._head = bytearray()
        self._rx = wsframes.ClientFrameReader(self.config.ws_max_size)
        super().data_received(data[:cut])
        if self._rx is not None:
            self._rx.feed(data[cut:])
        elif cut < len(data) and not self.close_sent:  # the library keeps this connection
            super().data_received(data[cut:])

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        if getattr(self, "scope", None) is not None and self.response.status_code == 101:
            self.scope["extensions"][DIRECT] = self  # type: ignore[index]
        if self.conn.extensions or self.response.status_code != 101:
            self._give_back()  # never detached (`detach` says None)

    def _give_back(self) -> None:
        """Leave every frame to the library's parser (buffered bytes included)."""
        rx, self._rx = self._rx, None
        if rx is not None and rx.buffered():
            rest = bytes(rx._buf[rx._pos :])
            super().data_received(rest)

    def detach(self) -> DirectSocket | None:
        """After the ASGI app accepted: the connection moves to a `DirectSocket` (the
        caller starts it), this object lets go of the socket, and the app may return
        without the connection being closed. None when it cannot (the client is gone,
        a close was sent, or the app already read through ASGI)."""
        rx = self._rx
        transport = self.transport
        if (
            rx is None
            or not self.handshake_complete
            or self.close_sent
            or self.disconnected
            or not self.queue.empty()
            or transport.is_closing()
        ):
            return None
        self.stop_keepalive()
        pending = self.conn.data_to_send()
        sock = DirectSocket(
            transport, rx, self.connections, keepalive_for(self.ping_interval, self.ping_timeout)
        )
        sock.reading_paused = self._reading_paused
        sock.writing_paused = not self.writable.is_set()
        transport.set_write_buffer_limits(high=DIRECT_MAX)
        transport.set_protocol(sock)
        if pending:
            transport.write(b"".join(pending))
        self.connections.discard(self)
        # let go of everything: the ASGI task ends with the app, and nothing is left
        # referring to this object (the scope and the library's parser hold it in cycles)
        self._rx = None
        self.transport = _HANDED_OVER  # type: ignore[assignment]
        self.scope["extensions"].pop(DIRECT, None)  # type: ignore[union-attr]
        self.conn.parser = None  # type: ignore[assignment]
        return sock

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    def abort(self) -> None:
        """Cut a connection that is not detached (a reader that stopped, on the ASGI
        path), discarding what its socket holds."""
        self.transport.abort()

    async def receive(self) -> Any:
        """The ASGI receive, for an app that does not detach: the library's parser gets
        the frames (nothing of them was parsed yet)."""
        if self._rx is not None and self.queue.empty():
            self._give_back()
            if self._reading_paused:
                self._reading_paused = False
                self.transport.resume_reading()
        return await super().receive()
