"""uvicorn's websocket protocol with a direct, corked send path for the relay's frames.

Profiling the REQ phase showed a third of the relay's CPU in one `transport.write`
syscall per frame plus the ASGI await chain around it (a REQ answers with up to
`limit` + 1 frames). This protocol lets the transport hand it ready UTF-8 frames
synchronously; they are framed into the websocket buffer at once and written with one
syscall per event-loop iteration. The ASGI path stays for everything else (and is what
the transport falls back to whenever the socket is not writable, so ordering and
backpressure are unchanged). Plain ASGI servers work too: the transport only uses this
when the `engram.direct` scope extension is present.
"""

from __future__ import annotations

from typing import Any

from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol
from websockets.protocol import State

from relay.transport import DIRECT


class RelayWebSocketProtocol(WebSocketsSansIOProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flush_pending = False

    def handle_connect(self, event: Any) -> None:
        super().handle_connect(event)
        if getattr(self, "scope", None) is not None and self.response.status_code == 101:
            self.scope["extensions"][DIRECT] = self  # type: ignore[index]

    def can_send(self) -> bool:
        """The connection is open and its socket is taking data."""
        return (
            self.writable.is_set()
            and not self.close_sent
            and self.conn.state is State.OPEN
            and not self.transport.is_closing()
        )

    def send_text_now(self, payload: bytes) -> None:
        """Queue one text frame (UTF-8 bytes); written with the others at the end of this
        loop iteration. The caller checks `can_send()` first."""
        self.conn.send_text(payload)
        if not self._flush_pending:
            self._flush_pending = True
            self.loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        output = self.conn.data_to_send()
        if output and not self.transport.is_closing():
            self.transport.write(b"".join(output))
