"""A minimal websocket client on asyncio.Protocol, built so the load generator is cheap.

Why not the `websockets` client: it costs tens of microseconds per message (a task hop,
a frame object, masking), and on a 2-core box the generator shares the CPU with the relay
under test. Here frames are encoded once, before the clock starts (`client_frame`), with
an all-zero masking key (valid per RFC 6455 section 5.3; servers only unmask), so sending
is one `transport.write`; received frames are handed to a plain callback without a task.
No permessage-deflate is offered, so no relay pays for compression either.
"""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Callable
from urllib.parse import urlsplit

_ZERO_MASK = b"\x00\x00\x00\x00"
OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def client_frame(payload: bytes | str, opcode: int = OP_TEXT) -> bytes:
    """One complete, masked (zero key) client frame: ready to write as is."""
    if isinstance(payload, str):
        payload = payload.encode()
    n = len(payload)
    if n < 126:
        header = bytes((0x80 | opcode, 0x80 | n))
    elif n < 65536:
        header = bytes((0x80 | opcode, 0x80 | 126)) + n.to_bytes(2, "big")
    else:
        header = bytes((0x80 | opcode, 0x80 | 127)) + n.to_bytes(8, "big")
    return header + _ZERO_MASK + payload


class WsError(ConnectionError):
    """The handshake failed or the connection broke."""


class WsConnection(asyncio.Protocol):
    """One client connection. `on_message(payload)` runs for each text/binary message,
    `on_close(reason)` once when the connection is gone (either side)."""

    def __init__(
        self,
        host: str,
        path: str,
        on_message: Callable[[bytes], None],
        on_close: Callable[[str], None] | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self._host = host
        self._path = path or "/"
        self.on_message = on_message
        self.on_close = on_close
        self.on_idle = on_idle  # after each read's messages: lets a caller batch its writes
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.closed = False
        self.close_reason = ""
        self._buf = bytearray()
        self._handshaken = False
        self._fragments: list[bytes] = []

    # -- asyncio.Protocol ---------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is no subclass
        key = base64.b64encode(os.urandom(16)).decode()
        transport.write(
            (
                f"GET {self._path} HTTP/1.1\r\nHost: {self._host}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        if not self._handshaken:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            status = bytes(buf[: buf.find(b"\r\n")])
            if b" 101 " not in status + b" ":
                self._fail(f"handshake refused: {status.decode(errors='replace')}")
                return
            self._handshaken = True
            del buf[: end + 4]
            if not self.opened.done():
                self.opened.set_result(None)
        self._parse()
        if self.on_idle is not None and not self.closed:
            self.on_idle()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(f"connection lost: {exc}" if exc else "connection closed")

    # -- frames -------------------------------------------------------------------------

    def _parse(self) -> None:
        buf = self._buf
        n = len(buf)
        pos = 0
        while n - pos >= 2:
            b0, b1 = buf[pos], buf[pos + 1]
            length = b1 & 0x7F
            hdr = 2
            if length == 126:
                if n - pos < 4:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 4], "big")
                hdr = 4
            elif length == 127:
                if n - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                hdr = 10
            mask = b""
            if b1 & 0x80:  # servers must not mask, but unmask if one does
                if n - pos < hdr + 4:
                    break
                mask = bytes(buf[pos + hdr : pos + hdr + 4])
                hdr += 4
            end = pos + hdr + length
            if end > n:
                break
            payload = bytes(buf[pos + hdr : end])
            pos = end
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            self._frame(b0 & 0x80, b0 & 0x0F, payload)
            if self.closed:
                return
        if pos:
            del buf[:pos]

    def _frame(self, fin: int, opcode: int, payload: bytes) -> None:
        if opcode in (OP_TEXT, OP_BINARY):
            if fin:
                self.on_message(payload)
            else:
                self._fragments = [payload]
        elif opcode == OP_CONT:
            self._fragments.append(payload)
            if fin:
                message, self._fragments = b"".join(self._fragments), []
                self.on_message(message)
        elif opcode == OP_PING:
            self.send(client_frame(payload, OP_PONG))
        elif opcode == OP_CLOSE:
            code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else 1005
            reason = payload[2:].decode(errors="replace")
            self.send(client_frame(payload[:2], OP_CLOSE))
            self._fail(f"closed by relay ({code} {reason})".strip())

    def _fail(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        if not self.opened.done():
            self.opened.set_exception(WsError(reason))
        if self.transport is not None:
            self.transport.close()
        if self.on_close is not None:
            self.on_close(reason)

    # -- API ----------------------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        """Write pre-encoded frame(s) (see `client_frame`); dropped once closed."""
        if not self.closed and self.transport is not None:
            self.transport.write(frame)

    def send_many(self, frames: list[bytes]) -> None:
        """Several pre-encoded frames in one write."""
        self.send(b"".join(frames))

    def close(self) -> None:
        """Send a close frame and drop the connection without waiting for the echo."""
        if not self.closed:
            self.send(client_frame((1000).to_bytes(2, "big"), OP_CLOSE))
            self._fail("closed by client")


async def connect(
    url: str,
    on_message: Callable[[bytes], None],
    on_close: Callable[[str], None] | None = None,
    on_idle: Callable[[], None] | None = None,
    timeout: float = 10.0,
    source: str | None = None,
) -> WsConnection:
    """Open a ws:// connection (loopback benchmarking only: no TLS), from the local
    address `source` when given (e.g. 127.0.0.2: another client as the relay sees it)."""
    parts = urlsplit(url)
    if parts.scheme != "ws":
        raise WsError(f"only ws:// URLs are supported, not {url!r}")
    host = parts.hostname or "127.0.0.1"
    port = parts.port or 80
    loop = asyncio.get_running_loop()
    _, proto = await asyncio.wait_for(
        loop.create_connection(
            lambda: WsConnection(parts.netloc, parts.path, on_message, on_close, on_idle),
            host,
            port,
            local_addr=(source, 0) if source else None,
        ),
        timeout,
    )
    await asyncio.wait_for(asyncio.shield(proto.opened), timeout)
    return proto
