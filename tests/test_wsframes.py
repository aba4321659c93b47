"""The relay's own client-frame parser (relay.wsframes) and the direct receive path built
on it (relay.wsserver): unit tests of the parser, then a real relay spoken to with
hand-made frames (fragments, interleaved control frames, masks, limits, close codes)."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import Iterator

import msgspec
import pytest
from cli_support import shared_relay
from relay_fixtures import RelayProcess

from engram.nip01 import sign_event
from relay import wsframes
from relay.wsframes import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_PONG,
    OP_TEXT,
    ClientFrameReader,
    FrameError,
)

SK = (0xF4A3E).to_bytes(32, "big")
AUX = bytes(32)


def frame(
    payload: bytes, opcode: int = OP_TEXT, fin: bool = True, mask: bytes | None = None, rsv=0
) -> bytes:
    """A client frame; masked with a random key unless `mask` is b"" (unmasked)."""
    n = len(payload)
    head = bytes(((0x80 if fin else 0) | rsv | opcode,))
    bit = 0 if mask == b"" else 0x80
    if n < 126:
        head += bytes((bit | n,))
    elif n < 65536:
        head += bytes((bit | 126,)) + n.to_bytes(2, "big")
    else:
        head += bytes((bit | 127,)) + n.to_bytes(8, "big")
    if mask == b"":
        return head + payload
    key = os.urandom(4) if mask is None else mask
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def drain(reader: ClientFrameReader) -> list[tuple[int, bytes | str]]:
    out = []
    while (item := reader.next()) is not None:
        out.append(item)
    return out


# --- the parser ----------------------------------------------------------------------


def test_masked_text_and_binary_messages():
    r = ClientFrameReader(1 << 20)
    r.feed(frame(b'["REQ","a",{}]') + frame(b"\x00\xff", OP_BINARY) + frame("é".encode()))
    assert drain(r) == [(OP_TEXT, '["REQ","a",{}]'), (OP_BINARY, b"\x00\xff"), (OP_TEXT, "é")]


@pytest.mark.parametrize("size", [0, 125, 126, 65535, 65536, 70000])
def test_every_length_encoding(size):
    payload = b"x" * size
    r = ClientFrameReader(1 << 20)
    r.feed(frame(payload))
    assert drain(r) == [(OP_TEXT, payload.decode())]


def test_byte_by_byte_delivery():
    """Every frame split at every byte: the small text frames (the reader's short path
    for frames under 126 bytes) as well as the longer encodings."""
    data = (
        frame(b"a" * 300)
        + frame(b"ping", OP_PING)
        + frame(b'["CLOSE","s"]')
        + frame(b"c" * 125)
        + frame(b"")
        + frame(b"b" * 70_000)
    )
    r = ClientFrameReader(1 << 20)
    got = []
    for i in range(len(data)):
        r.feed(data[i : i + 1])
        got.extend(drain(r))
    assert got == [
        (OP_TEXT, "a" * 300),
        (OP_PING, b"ping"),
        (OP_TEXT, '["CLOSE","s"]'),
        (OP_TEXT, "c" * 125),
        (OP_TEXT, ""),
        (OP_TEXT, "b" * 70_000),
    ]
    assert r.buffered() == 0


def test_fragments_with_interleaved_control_frames():
    r = ClientFrameReader(1 << 20)
    r.feed(
        frame(b'["EV', fin=False)
        + frame(b"p1", OP_PING)
        + frame(b'ENT"', OP_CONT, fin=False)
        + frame(b"p2", OP_PONG)
        + frame(b"]", OP_CONT)
    )
    assert drain(r) == [(OP_PING, b"p1"), (OP_PONG, b"p2"), (OP_TEXT, '["EVENT"]')]


def test_fragmented_utf8_split_inside_a_character():
    data = "ü".encode()
    r = ClientFrameReader(100)
    r.feed(frame(data[:1], fin=False) + frame(data[1:], OP_CONT))
    assert drain(r) == [(OP_TEXT, "ü")]


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(b"x", mask=b""), 1002),  # unmasked client frame
        (frame(b"x", rsv=0x40), 1002),  # RSV1 without an extension
        (frame(b"x", opcode=0x3), 1002),  # reserved data opcode
        (frame(b"x", opcode=0xB), 1002),  # reserved control opcode
        (frame(b"x", OP_CONT), 1002),  # continuation of nothing
        (frame(b"a", fin=False) + frame(b"b"), 1002),  # new message inside a fragmented one
        (frame(b"x", OP_PING, fin=False), 1002),  # fragmented control frame
        (frame(b"x" * 126, OP_PING), 1002),  # control frame over 125 bytes
        (frame(b"\xff\xfe"), 1007),  # invalid UTF-8 in a text message
        (frame(b"\xc3", fin=False) + frame(b"(", OP_CONT), 1007),  # ... across fragments
        (frame(b"x" * 101), 1009),  # over max_size
        (frame(b"x" * 60, fin=False) + frame(b"x" * 60, OP_CONT), 1009),  # over, in fragments
    ],
    # frames carry random masks: named ids keep a test's id the same in every run (so a
    # failure can be re-run by its id, and pytest-xdist workers collect the same tests)
    ids=[
        "unmasked",
        "rsv1",
        "reserved-data-opcode",
        "reserved-control-opcode",
        "orphan-continuation",
        "message-inside-fragmented",
        "fragmented-control",
        "long-control",
        "invalid-utf8",
        "invalid-utf8-across-fragments",
        "over-max-size",
        "over-max-size-in-fragments",
    ],
)
def test_protocol_violations_name_their_close_code(data, code):
    r = ClientFrameReader(100)
    r.feed(data)
    with pytest.raises(FrameError) as exc:
        drain(r)
    assert exc.value.code == code


def test_oversize_refused_from_the_header_alone():
    """A frame announcing 2**40 bytes is refused before any payload arrives."""
    r = ClientFrameReader(1 << 20)
    r.feed(bytes((0x81, 0xFF)) + (2**40).to_bytes(8, "big"))
    with pytest.raises(FrameError) as exc:
        r.next()
    assert exc.value.code == 1009


def test_close_payloads():
    assert wsframes.parse_close(b"") == (1005, "")
    assert wsframes.parse_close((1000).to_bytes(2, "big") + b"bye") == (1000, "bye")
    assert wsframes.parse_close((4000).to_bytes(2, "big")) == (4000, "")
    for bad, code in (
        (b"\x03", 1002),
        ((999).to_bytes(2, "big"), 1002),
        ((1005).to_bytes(2, "big"), 1002),
        ((1006).to_bytes(2, "big"), 1002),
        ((5000).to_bytes(2, "big"), 1002),
        ((1000).to_bytes(2, "big") + b"\xff", 1007),
    ):
        with pytest.raises(FrameError) as exc:
            wsframes.parse_close(bad)
        assert exc.value.code == code


def test_python_unmask_matches_the_c_one():
    data, key = os.urandom(1001), os.urandom(4)
    expected = bytes(b ^ key[i % 4] for i, b in enumerate(data))
    assert wsframes._py_apply_mask(data, key) == expected
    assert wsframes.apply_mask(data, key) == expected
    assert wsframes._py_apply_mask(b"", key) == b""


# --- a real relay, raw frames ----------------------------------------------------------


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    """One relay with default settings for the module's raw-frame tests: each test speaks on
    a connection of its own, and a protocol violation closes that connection only (each
    EVENT sent here is a different one)."""
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("wsframes-relay")))


class Raw:
    """A hand-driven websocket client: writes raw bytes, reads server frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, url: str) -> Raw:
        host, port = url.removeprefix("ws://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        key = base64.b64encode(os.urandom(16)).decode()
        writer.write(
            f"GET / HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
            f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
            "Sec-WebSocket-Version: 13\r\n\r\n".encode()
        )
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        assert b" 101 " in head.split(b"\r\n")[0]
        return cls(reader, writer)

    def send(self, data: bytes) -> None:
        self.writer.write(data)

    async def frame(self) -> tuple[int, bytes]:
        """The next server frame as (opcode, payload); (-1, b"") at end of stream."""
        try:
            b0, b1 = await asyncio.wait_for(self.reader.readexactly(2), 30)
        except asyncio.IncompleteReadError:
            return -1, b""
        assert not b1 & 0x80, "server frames are unmasked"
        n = b1 & 0x7F
        if n == 126:
            n = int.from_bytes(await self.reader.readexactly(2), "big")
        elif n == 127:
            n = int.from_bytes(await self.reader.readexactly(8), "big")
        return b0 & 0x0F, await self.reader.readexactly(n)

    async def until(self, opcode: int, skip_auth: bool = True) -> bytes:
        """Payload of the next frame with `opcode` (text frames: skipping the AUTH
        challenge); the end of the stream fails the test."""
        while True:
            op, payload = await self.frame()
            assert op != -1, "connection closed"
            if op == opcode and not (skip_auth and payload.startswith(b'["AUTH"')):
                return payload

    async def closed_with(self) -> int:
        """The close code the server sent (after any text frames), then end of stream."""
        while True:
            op, payload = await self.frame()
            assert op != -1, "connection ended without a close frame"
            if op == OP_CLOSE:
                assert await self.frame() == (-1, b"")  # then the server closes TCP
                return int.from_bytes(payload[:2], "big") if payload else 1005

    def close(self) -> None:
        self.writer.close()


def event_frame(content: str, created_at: int = 1_700_000_000) -> tuple[str, bytes]:
    ev = sign_event(SK, created_at, 1, [], content, AUX)
    return ev.id, msgspec.json.encode(["EVENT", ev])


async def test_fragmented_event_with_a_ping_between_its_fragments(relay):
    c = await Raw.open(relay.url)
    eid, msg = event_frame("fragmented")
    c.send(frame(msg[:10], fin=False) + frame(b"hello", OP_PING))
    c.send(frame(msg[10:40], OP_CONT, fin=False) + frame(msg[40:], OP_CONT))
    assert await c.until(OP_PONG) == b"hello"
    assert msgspec.json.decode(await c.until(OP_TEXT)) == ["OK", eid, True, ""]
    c.send(frame((1000).to_bytes(2, "big") + b"bye", OP_CLOSE))
    assert await c.closed_with() == 1000
    c.close()


async def test_binary_frames_and_many_messages_in_one_write(relay):
    c = await Raw.open(relay.url)
    frames, ids = [], []
    for i in range(600):  # more than in_flight_max (256): reading pauses, then resumes
        eid, msg = event_frame(f"burst {i}", 1_700_000_000 + i)
        ids.append(eid)
        frames.append(frame(msg, OP_BINARY if i % 2 else OP_TEXT))
    c.send(b"".join(frames))
    seen = set()
    while len(seen) < len(ids):
        reply = msgspec.json.decode(await c.until(OP_TEXT))
        assert reply[0] == "OK" and reply[2] is True, reply
        seen.add(reply[1])
    assert seen == set(ids)
    c.close()


@pytest.mark.parametrize(
    ("data", "code"),
    [
        (frame(b'["REQ","x",{}]', mask=b""), 1002),
        (frame(b"x", rsv=0x40), 1002),
        (frame(b"x", OP_CONT), 1002),
        (frame(b"x" * 200, OP_PING), 1002),
        (frame(b"\xff\xfe"), 1007),
        (frame((1000).to_bytes(2, "big") + b"\xff", OP_CLOSE), 1007),
        (frame((1004).to_bytes(2, "big"), OP_CLOSE), 1002),
        (frame(b"", OP_CLOSE), 1005),  # no status: the echo carries none either
        (frame((4321).to_bytes(2, "big"), OP_CLOSE), 4321),  # echoed
    ],
    ids=[  # random masks: named ids, as above
        "unmasked",
        "rsv1",
        "orphan-continuation",
        "long-ping",
        "invalid-utf8",
        "close-invalid-utf8-reason",
        "close-reserved-code",
        "close-without-status",
        "close-application-code",
    ],
)
async def test_bad_frames_and_close_codes(relay, data, code):
    c = await Raw.open(relay.url)
    c.send(data)
    assert await c.closed_with() == code
    c.close()


async def test_oversize_message_closes_with_1009(start_relay):
    rp = start_relay(env={"ENGRAM_LIMITS_MAX_MESSAGE_LENGTH": "1000"})  # frames up to 4000
    c = await Raw.open(rp.url)
    c.send(frame(b"[" + b" " * 3000 + b"]"))  # under the frame limit: answered by NOTICE
    notice = msgspec.json.decode(await c.until(OP_TEXT))
    assert notice[0] == "NOTICE" and notice[1].startswith("invalid: message too large")
    c.send(bytes((0x81, 0xFF)) + (10**9).to_bytes(8, "big") + os.urandom(4))
    assert await c.closed_with() == 1009
    c.close()


async def test_deflate_connections_keep_working(start_relay):
    """With compression enabled, a client that negotiates it uses the library's parser."""
    import websockets

    rp = start_relay(env={"ENGRAM_WS_PER_MESSAGE_DEFLATE": "true"})
    async with websockets.connect(rp.url, compression="deflate") as ws:
        assert ws.protocol.extensions, "permessage-deflate was negotiated"
        eid, msg = event_frame("compressed")
        await ws.send(msg.decode())
        while True:
            reply = msgspec.json.decode(await asyncio.wait_for(ws.recv(), 30))
            if reply[0] == "OK":
                assert reply == ["OK", eid, True, ""]
                break
