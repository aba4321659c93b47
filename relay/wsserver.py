"""uvicorn's websocket protocol with direct, synchronous receive and send paths.

Profiling the REQ and fan-out phases showed most of the relay's CPU in one
`transport.write` syscall per frame, the websockets library's frame objects, and the
ASGI await chain around each send. This protocol lets the transport hand it ready UTF-8
frames synchronously: the frame header is built here (server frames are unmasked and
never fragmented), and every connection with output is written once per event-loop
iteration. The ASGI path stays for everything else (and is what the transport falls
back to whenever the socket is not writable, so ordering and backpressure are kept).
Plain ASGI servers work too: the transport uses this only when the `engram.direct`
scope extension is present.

Receiving: once the transport calls `receive_direct`, client frames bypass the websockets
library's parser, the ASGI message and Starlette's receive: `relay.wsframes` parses them
and each message goes to the transport's callback synchronously; when the callback says
it is busy (too many EVENTs waiting for their commit), reading pauses until
`resume_receiving`. The HTTP upgrade, keepalive pings and closes we initiate stay with
uvicorn and the websockets library; a connection that negotiated an extension
(permessage-deflate) keeps the library's parser for its whole life.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State

from relay import wsframes
from relay.transport import DIRECT

_OPEN = State.OPEN
# Bytes a connection may hold outside the relay's own accounted queue (corked frames plus
# the transport's buffer); past it frames wait in that queue (relay.sendqueue), whose
# bounds decide when a reader is too slow. It is part of the per-connection constant in
# the memory bound (docs/OPERATING.md "Operating it"), hence the transport's own
# high-water mark: 256 KiB held 330 MiB beyond the budget with 1,000 stalled readers
# (bench stalled).
DIRECT_MAX = 64 * 1024


def text_frame_header(size: int) -> bytes:
    """RFC 6455 header of an unmasked, final text frame carrying `size` bytes."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65_536:
        return b"\x81\x7e" + size.to_bytes(2, "big")
    return b"\x81\x7f" + size.to_bytes(8, "big")


class _Corker:
    """Connections with pending output in this loop iteration, flushed together."""

    def __init__(self) -> None:
        self.pending: list[RelayWebSocketProtocol] = []

    def add(self, proto: RelayWebSocketProtocol) -> None:
        if not self.pending:
            asyncio.get_running_loop().call_soon(self.flush)
        self.pending.append(proto)

    def flush(self) -> None:
        pending, self.pending = self.pending, []
        for proto in pending:
            proto.flush()


_corker = _Corker()


class RelayWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._out: list[bytes] = []
        self._out_bytes = 0
        # direct receive: bytes after the upgrade request go to `_rx` instead of the library
        self._head = bytearray()  # the upgrade request, until its end is seen
        self._rx: wsframes.ClientFrameReader | None = None
        self._on_message: Callable[[str | bytes], bool] | None = None
        self._on_gone: Callable[[], None] | None = None
        self._rx_paused = False  # the receiver is busy: frames wait in `_rx`
        self._rx_scheduled = False
        self._reading_paused = False

    # -- receiving --------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        rx = self._rx
        if rx is not None:
            rx.feed(data)
            if self._on_message is not None and not self._rx_paused:
                self._drain()
            elif rx.buffered() > rx.max_size:  # nobody reading: stop taking more
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
            self._give_back()

    def _give_back(self) -> None:
        """Leave every frame to the library's parser (buffered bytes included)."""
        rx, self._rx = self._rx, None
        if rx is not None and rx.buffered():
            rest = bytes(rx._buf[rx._pos :])
            super().data_received(rest)

    def receive_direct(
        self, on_message: Callable[[str | bytes], bool], on_gone: Callable[[], None]
    ) -> bool:
        """Hand every further client message to `on_message` (False: pause reading until
        `resume_receiving`); `on_gone` runs once the connection is closed. Returns False
        when this connection cannot (the transport then uses the ASGI receive)."""
        if self._rx is None or self.close_sent or self.disconnected or not self.queue.empty():
            return False
        self._on_message = on_message
        self._on_gone = on_gone
        if self._rx.buffered():
            self._schedule()
        return True

    def stop_receiving(self) -> None:
        """The receiver is gone: messages stay buffered (reading pauses when full)."""
        self._on_message = None
        self._on_gone = None

    def resume_receiving(self) -> None:
        """The receiver has room again: go on with buffered frames, then the socket."""
        if self._rx_paused:
            self._rx_paused = False
            self._schedule()

    def _schedule(self) -> None:
        if not self._rx_scheduled:
            self._rx_scheduled = True
            self.loop.call_soon(self._resume)

    def _resume(self) -> None:
        self._rx_scheduled = False
        if self._rx_paused or self._rx is None or self._on_message is None:
            return
        self._drain()

    def _drain(self) -> None:
        """Messages to the receiver until the buffer is empty or the receiver is busy."""
        rx = self._rx
        on_message = self._on_message
        assert rx is not None and on_message is not None
        try:
            while True:
                item = rx.next()
                if item is None:
                    break
                opcode, payload = item
                if opcode <= wsframes.OP_BINARY:
                    if self.close_sent:
                        continue  # the app is closing: discard, keep reading for the echo
                    if not on_message(payload):
                        self._rx_paused = True
                        self._pause_reading()
                        return
                elif opcode == wsframes.OP_PING:
                    self._control(wsframes.control_frame(wsframes.OP_PONG, payload))  # type: ignore[arg-type]
                elif opcode == wsframes.OP_PONG:
                    self.handle_pong(Frame(Opcode.PONG, payload))  # type: ignore[arg-type]
                else:
                    self._closed_by_peer(*wsframes.parse_close(payload))  # type: ignore[arg-type]
                    return
        except wsframes.FrameError as exc:
            self._fail(exc.code, exc.reason)
            return
        if self._reading_paused:
            self._reading_paused = False
            self.transport.resume_reading()

    def _pause_reading(self) -> None:
        if not self._reading_paused:
            self._reading_paused = True
            self.transport.pause_reading()

    async def receive(self) -> Any:
        """The ASGI receive, for an app that does not take the direct path: the library's
        parser gets the frames (nothing of them was parsed yet)."""
        if self._rx is not None and self._on_message is None and self.queue.empty():
            self._give_back()
            if self._reading_paused:
                self._reading_paused = False
                self.transport.resume_reading()
        return await super().receive()

    def _control(self, frame: bytes) -> None:
        if not self.close_sent and not self.transport.is_closing():
            self.flush()  # whatever is corked goes first
            self.transport.write(frame)

    def _closed_by_peer(self, code: int, reason: str) -> None:
        self._rx = None
        if self.close_sent:  # the peer answered our close: the handshake is complete
            if self.close_timer is not None:
                self.close_timer.cancel()
                self.close_timer = None
            self.transport.close()
            return
        if not self.transport.is_closing():
            self.flush()
            echo = None if code == wsframes.CLOSE_NO_STATUS else code
            self.transport.write(wsframes.close_frame(echo))
            self.close_sent = True
            self.transport.close()
        self._gone()

    def _fail(self, code: int, reason: str) -> None:
        """Close the connection for a protocol violation (RFC 6455 7.1.7)."""
        self._rx = None
        if not self.close_sent and not self.transport.is_closing():
            self.flush()
            self.transport.write(wsframes.close_frame(code, reason))
        self.close_sent = True
        self.transport.close()
        self._gone()

    def _gone(self) -> None:
        on_gone, self._on_gone = self._on_gone, None
        self._on_message = None
        if on_gone is not None:
            on_gone()

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        self._rx = None
        self._gone()

    # -- sending ----------------------------------------------------------------------

    def can_send(self) -> bool:
        """The connection is open and its socket is taking data."""
        return (
            self.writable.is_set()
            and not self.close_sent
            and self.conn.state is _OPEN
            and not self.transport.is_closing()
            and self._out_bytes + self.transport.get_write_buffer_size() < DIRECT_MAX
        )

    def send_text_now(self, payload: bytes) -> None:
        """One text frame (UTF-8 bytes), written with the others at the end of this loop
        iteration. The caller checks `can_send()` first."""
        out = self._out
        if not out:
            _corker.add(self)
        out.append(text_frame_header(len(payload)))
        out.append(payload)
        self._out_bytes += len(payload)

    def send_texts_now(self, payloads: list[bytes], start: int) -> int:
        """`send_text_now` for `payloads[start:]` as far as `can_send` would take them one
        by one (each while this iteration's output stays under DIRECT_MAX): returns the
        index of the first one left to the caller. A REQ's stored results in one call."""
        end = len(payloads)
        if start >= end or not self.can_send():
            return start
        room = DIRECT_MAX - self._out_bytes - self.transport.get_write_buffer_size()
        out = self._out
        if not out:
            _corker.add(self)
        i = start
        written = 0
        while i < end and written < room:
            payload = payloads[i]
            out.append(text_frame_header(len(payload)))
            out.append(payload)
            written += len(payload)
            i += 1
        self._out_bytes += written
        return i

    def abort(self) -> None:
        """Cut the connection now, discarding unsent output (a reader that stopped)."""
        self._out, self._out_bytes = [], 0
        self.transport.abort()

    def flush(self) -> None:
        out, self._out = self._out, []
        self._out_bytes = 0
        pending = self.conn.data_to_send()  # pings/pongs the library queued meanwhile
        if pending:
            out = [*pending, *out]
        if out and not self.transport.is_closing():
            if self.close_sent:  # nothing may follow a close frame
                out = pending or []
            if out:
                self.transport.write(b"".join(out))
