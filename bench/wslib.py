"""The load generator's second client: the `websockets` library's asyncio client.

`bench load --client websockets` drives relays through this instead of bench.wsclient,
so the figures do not depend on one generator design: this one costs the generator more
CPU per message (a reader task, the library's frame parser and a random mask per frame),
as a typical Python client would. Same surface as `wsclient.WsConnection`: messages go
to a callback, `on_idle` runs after each one, `send_many` writes in order. Like the
built-in client it offers no compression and sends no pings of its own.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Callable

from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake

from bench.wsclient import WsError


def frame(payload: bytes | str) -> bytes:
    """What `send` takes: the message itself (the library frames and masks it)."""
    return payload.encode() if isinstance(payload, str) else payload


class WebsocketsConnection:
    """One client connection on the `websockets` library."""

    def __init__(
        self,
        ws: ClientConnection,
        on_message: Callable[[bytes], None],
        on_close: Callable[[str], None] | None,
        on_idle: Callable[[], None] | None,
    ) -> None:
        self.ws = ws
        self.on_message = on_message
        self.on_close = on_close
        self.on_idle = on_idle
        self.closed = False
        self.close_reason = ""
        self._out: collections.deque[bytes] = collections.deque()
        self._ready = asyncio.Event()
        self._reader = asyncio.create_task(self._read())
        self._writer = asyncio.create_task(self._write())

    async def _read(self) -> None:
        reason = "connection closed"
        try:
            while True:
                message = await self.ws.recv(decode=False)  # text frames as UTF-8 bytes
                self.on_message(message)  # type: ignore[arg-type]
                if self.on_idle is not None and not self.closed:
                    self.on_idle()
        except ConnectionClosed as exc:
            rcvd = exc.rcvd
            if rcvd is not None:
                reason = f"closed by relay ({rcvd.code} {rcvd.reason})".strip()
        except asyncio.CancelledError:
            return
        self._fail(reason)

    async def _write(self) -> None:
        with contextlib.suppress(ConnectionClosed, asyncio.CancelledError):
            while True:
                while self._out:
                    await self.ws.send(self._out.popleft(), text=True)
                self._ready.clear()
                await self._ready.wait()

    def _fail(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.close_reason = reason
        self._writer.cancel()
        if self.on_close is not None:
            self.on_close(reason)

    def send(self, message: bytes) -> None:
        """Queue one message (UTF-8 text); dropped once closed."""
        if not self.closed:
            self._out.append(message)
            self._ready.set()

    def send_many(self, messages: list[bytes]) -> None:
        if not self.closed:
            self._out.extend(messages)
            self._ready.set()

    def close(self) -> None:
        """Start the closing handshake and forget the connection."""
        if not self.closed:
            self._fail("closed by client")
            self._reader.cancel()
            task = asyncio.ensure_future(self.ws.close())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


async def connect(
    url: str,
    on_message: Callable[[bytes], None],
    on_close: Callable[[str], None] | None = None,
    on_idle: Callable[[], None] | None = None,
    timeout: float = 10.0,
) -> WebsocketsConnection:
    try:
        ws = await ws_connect(
            url,
            compression=None,
            max_size=None,
            ping_interval=None,
            open_timeout=timeout,
            proxy=None,
        )
    except (OSError, TimeoutError, InvalidHandshake) as exc:
        raise WsError(str(exc)) from exc
    return WebsocketsConnection(ws, on_message, on_close, on_idle)
