"""A minimal Nostr websocket client for tests (the product's own client lives in cli/)."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import Any

import msgspec
import websockets

from engram.nip01 import Event, pubkey_of, sign_event

# How long to wait for a message that should come: an outer bound generous enough for a
# loaded 2-core machine (checks that nothing arrives wait for a probe: `until_probe`).
TIMEOUT = 30.0
OPEN_TIMEOUT = 60.0  # websockets' default (10 s) is too short for 100 handshakes under load


class Client:
    """A NIP-42 challenge is remembered whenever it comes (on connect, or with the first
    `auth-required:` answer: the relay's `auth_challenge`); AUTH frames are not returned."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.challenge: str | None = None
        self.challenges = 0  # AUTH frames received
        self.backlog: list[list[Any]] = []

    @classmethod
    async def connect(cls, url: str, **kw: Any) -> Client:
        kw.setdefault("open_timeout", OPEN_TIMEOUT)
        ws = await websockets.connect(url, max_size=None, **kw)
        return cls(ws)

    async def get_challenge(self) -> str:
        """The relay's challenge. Not sent yet (`when-needed`): an AUTH before it is refused
        `auth-required:` and answered with it, as any auth-required answer is."""
        if self.challenge is None:
            probe = sign_event(bytes(31) + b"\x01", 0, 22242, [], "", bytes(32))
            await self.send(["AUTH", probe])
            ok = await self.expect("OK")
            assert ok[1] == probe.id and ok[3].startswith("auth-required:"), ok
        assert self.challenge is not None, "the relay did not send its challenge"
        return self.challenge

    async def close(self) -> None:
        await self.ws.close()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send_raw(self, data: str | bytes) -> None:
        await self.ws.send(data if isinstance(data, str) else data.decode())

    async def send(self, msg: list[Any]) -> None:
        await self.ws.send(msgspec.json.encode(msg).decode())

    async def _next(self, timeout: float = TIMEOUT) -> list[Any]:
        while True:
            msg = msgspec.json.decode(await asyncio.wait_for(self.ws.recv(), timeout))
            if msg and msg[0] == "AUTH" and len(msg) > 1 and isinstance(msg[1], str):
                self.challenge = msg[1]
                self.challenges += 1
                continue
            return msg

    async def recv(self, timeout: float = TIMEOUT) -> list[Any]:
        """The next message: kept-aside ones first, then the socket."""
        if self.backlog:
            return self.backlog.pop(0)
        return await self._next(timeout)

    async def expect(self, verb: str, timeout: float = TIMEOUT) -> list[Any]:
        """The next message of this type; others are kept for later `recv` calls."""
        skipped = []
        try:
            while True:
                msg = await self._next(timeout)
                if msg[0] == verb:
                    return msg
                skipped.append(msg)
        finally:
            self.backlog.extend(skipped)

    async def until_probe(self, probe_id: str, timeout: float = TIMEOUT) -> list[list[Any]]:
        """Every message received before the EVENT carrying `probe_id`, which must come.

        "Nothing arrives" is asserted against this positive marker: publish a probe
        event after the thing that must not be delivered, then check what came before
        the probe. A late delivery cannot slip past it, as it could past a short sleep.
        """
        before: list[list[Any]] = []
        while True:
            msg = await self.recv(timeout)
            if msg[0] == "EVENT" and len(msg) > 2 and msg[2].get("id") == probe_id:
                return before
            before.append(msg)

    async def publish(self, event: Event) -> list[Any]:
        await self.send(["EVENT", event])
        while True:
            msg = await self.expect("OK")
            if msg[1] == event.id:
                return msg

    async def publish_many(self, events: list[Event]) -> dict[str, list[Any]]:
        """Send every EVENT at once (pipelined), then collect the OKs by id."""
        for e in events:
            await self.send(["EVENT", e])
        want = {e.id for e in events}
        oks: dict[str, list[Any]] = {}
        while want - oks.keys():
            msg = await self.expect("OK")
            if msg[1] in want:
                oks[msg[1]] = msg
        return oks

    async def auth(self, seckey: bytes, relay_url: str, now: int) -> list[Any]:
        challenge = await self.get_challenge()
        ev = sign_event(
            seckey,
            now,
            22242,
            [["relay", relay_url], ["challenge", challenge]],
            "",
            bytes(32),
        )
        await self.send(["AUTH", ev])
        msg = await self.expect("OK")
        assert msg[1] == ev.id
        return msg

    async def req(self, sub_id: str, *filters: dict[str, Any]) -> tuple[list[dict], list[Any]]:
        """Send a REQ; returns (stored events, terminating message: EOSE or CLOSED)."""
        await self.send(["REQ", sub_id, *filters])
        events: list[dict] = []
        while True:
            msg = await self._next()
            if msg[0] == "EVENT" and msg[1] == sub_id:
                events.append(msg[2])
            elif msg[0] in ("EOSE", "CLOSED") and msg[1] == sub_id:
                return events, msg
            else:
                self.backlog.append(msg)
                if len(self.backlog) > 10_000:
                    raise AssertionError("runaway backlog")

    async def query(self, *filters: dict[str, Any]) -> list[dict]:
        events, end = await self.req("q", *filters)
        assert end[0] == "EOSE", end
        await self.send(["CLOSE", "q"])
        return events


def pub(seckey: bytes) -> str:
    return pubkey_of(seckey)


def raw_ws(port: int, rcvbuf: int = 4096) -> socket.socket:
    """A websocket client on a bare socket with a small receive window, that reads only
    when told to: the honest model of a subscriber that stopped reading."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    assert head.startswith(b"HTTP/1.1 101"), head
    return sock


def raw_ws_send(sock: socket.socket, text: str) -> None:
    data = text.encode()
    mask = os.urandom(4)
    n = len(data)
    header = bytes([0x81]) + (
        bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    )
    sock.sendall(header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))
