"""uvicorn's websocket protocol with a direct, corked send path for the relay's frames.

Profiling the REQ and fan-out phases showed most of the relay's CPU in one
`transport.write` syscall per frame, the websockets library's frame objects, and the
ASGI await chain around each send. This protocol lets the transport hand it ready UTF-8
frames synchronously: the frame header is built here (server frames are unmasked and
never fragmented), and every connection with output is written once per event-loop
iteration. The ASGI path stays for everything else (and is what the transport falls
back to whenever the socket is not writable, so ordering and backpressure are kept).
Plain ASGI servers work too: the transport uses this only when the `engram.direct`
scope extension is present.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from relay.transport import DIRECT

_OPEN = State.OPEN
# Bytes a connection may hold outside the relay's own accounted queue (corked frames plus
# the transport's buffer); past it frames wait in that queue (relay.sendqueue), whose
# bounds decide when a reader is too slow. It is part of the per-connection constant in
# the memory bound (README "Operating it"), hence the transport's own high-water mark:
# 256 KiB held 330 MiB beyond the budget with 1,000 stalled readers (bench stalled).
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

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        if getattr(self, "scope", None) is not None and self.response.status_code == 101:
            self.scope["extensions"][DIRECT] = self  # type: ignore[index]

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
