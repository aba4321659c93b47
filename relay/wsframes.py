"""RFC 6455 client frames in, whole messages out: the relay's sans-I/O receive parser.

`relay.wsserver` feeds it the bytes a client sends after the HTTP upgrade, instead of
running them through the websockets library's generator parser, a Frame object per
frame, an ASGI message and Starlette's receive (profiled as a tenth of the relay's CPU
per EVENT). It unmasks with the websockets library's C routine when present, decodes
a text message's UTF-8 once, reassembles fragments, and refuses what RFC 6455 forbids
with the close code to send: 1002 (protocol error), 1007 (invalid UTF-8), 1009 (too
big). No extensions: connections that negotiated permessage-deflate keep the
library's parser.
"""

from __future__ import annotations

import struct
from typing import Final

try:
    from websockets.speedups import apply_mask as _c_apply_mask
except ImportError:  # pragma: no cover - the C extension is part of the wheels we use
    _c_apply_mask = None

OP_CONT: Final = 0x0
OP_TEXT: Final = 0x1
OP_BINARY: Final = 0x2
OP_CLOSE: Final = 0x8
OP_PING: Final = 0x9
OP_PONG: Final = 0xA

CLOSE_NORMAL: Final = 1000
CLOSE_NO_STATUS: Final = 1005  # a close frame without a status code
CLOSE_PROTOCOL_ERROR: Final = 1002
CLOSE_INVALID_DATA: Final = 1007
CLOSE_TOO_BIG: Final = 1009

_COMPACT_AT = 64 * 1024  # consumed bytes kept in the buffer before it is compacted
# Close codes a peer may send (RFC 6455 7.4, the IANA registry, and 3000-4999).
_VALID_CLOSE = frozenset((1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014))


def _py_apply_mask(data: bytes | bytearray | memoryview, mask: bytes) -> bytes:
    """XOR with the 4-byte mask as one big integer (no per-byte Python loop)."""
    n = len(data)
    if not n:
        return b""
    key = (mask * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "little") ^ int.from_bytes(key, "little")).to_bytes(n, "little")


apply_mask = _c_apply_mask or _py_apply_mask


class FrameError(Exception):
    """The client broke the protocol; close the connection with `code`."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


_MEDIUM = struct.Struct("!BBH").pack  # a header with a 16-bit length, in one call


def text_frame_header(size: int) -> bytes:
    """RFC 6455 header of an unmasked, final text frame carrying `size` bytes."""
    if size < 126:
        return bytes((0x81, size))
    if size < 65_536:
        return _MEDIUM(0x81, 126, size)
    return b"\x81\x7f" + size.to_bytes(8, "big")


def close_frame(code: int | None, reason: str = "") -> bytes:
    """An unmasked server close frame (`code` None: no status, an empty payload)."""
    payload = b"" if code is None else code.to_bytes(2, "big") + reason.encode()[:123]
    return bytes((0x80 | OP_CLOSE, len(payload))) + payload


def control_frame(opcode: int, payload: bytes) -> bytes:
    """An unmasked server ping/pong frame (payload at most 125 bytes)."""
    return bytes((0x80 | opcode, len(payload))) + payload


def parse_close(payload: bytes) -> tuple[int, str]:
    """(code, reason) of a close frame's payload; FrameError if it is malformed."""
    if not payload:
        return CLOSE_NO_STATUS, ""
    if len(payload) == 1:
        raise FrameError(CLOSE_PROTOCOL_ERROR, "close frame with a one-byte payload")
    code = int.from_bytes(payload[:2], "big")
    if code not in _VALID_CLOSE and not 3000 <= code <= 4999:
        raise FrameError(CLOSE_PROTOCOL_ERROR, f"invalid close code {code}")
    try:
        reason = payload[2:].decode()
    except UnicodeDecodeError as exc:
        raise FrameError(CLOSE_INVALID_DATA, "close reason is not valid UTF-8") from exc
    return code, reason


class ClientFrameReader:
    """Client frames from a byte stream; `next()` gives one message or control frame.

    Text messages come out as `str` (UTF-8 checked once), binary ones as `bytes`,
    control frames as their raw payload. A message larger than `max_size` bytes, or a
    frame announcing one, is refused before its payload is buffered.
    """

    __slots__ = ("_buf", "_frag_op", "_frag_size", "_frags", "_pos", "max_size")

    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._buf = bytearray()
        self._pos = 0
        self._frags: list[bytes] = []
        self._frag_op = 0  # opcode of the fragmented message being reassembled (0: none)
        self._frag_size = 0

    def feed(self, data: bytes | bytearray) -> None:
        self._buf += data

    def buffered(self) -> int:
        """Bytes received and not yet returned as a message."""
        return len(self._buf) - self._pos + self._frag_size

    def next(self) -> tuple[int, bytes | str] | None:
        """The next (opcode, payload), None until more bytes arrive; raises FrameError."""
        buf = self._buf
        n = len(buf)
        while True:
            pos = self._pos
            if n - pos < 2:
                break
            b0 = buf[pos]
            b1 = buf[pos + 1]
            if b0 == 0x81 and 0x80 <= b1 < 0xFE and not self._frag_op:
                # the commonest frame (a REQ, a CLOSE, a small EVENT): a whole, masked
                # text message under 126 bytes, not inside a fragmented one; what the
                # general path below does with it, with fewer steps (a copy of so few
                # bytes is cheaper than a memoryview)
                if b1 - 0x80 > self.max_size:
                    raise FrameError(CLOSE_TOO_BIG, f"message over {self.max_size} bytes")
                end = pos + 6 + (b1 & 0x7F)
                if end > n:
                    break
                payload = apply_mask(buf[pos + 6 : end], buf[pos + 2 : pos + 6])
                self._pos = end
                return OP_TEXT, _text(payload)
            length = b1 & 0x7F
            start = pos + 6  # 2-byte header + 4-byte masking key
            if length == 126:
                if n - pos < 4:
                    break
                length = (buf[pos + 2] << 8) | buf[pos + 3]
                start = pos + 8
            elif length == 127:
                if n - pos < 10:
                    break
                length = int.from_bytes(buf[pos + 2 : pos + 10], "big")
                start = pos + 14
            opcode = b0 & 0x0F
            fin = b0 & 0x80
            if b0 & 0x70:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "reserved bits must be 0")
            if not b1 & 0x80:
                raise FrameError(CLOSE_PROTOCOL_ERROR, "client frames must be masked")
            if opcode >= OP_CLOSE:
                if opcode > OP_PONG:
                    raise FrameError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
                if not fin:
                    raise FrameError(CLOSE_PROTOCOL_ERROR, "fragmented control frame")
                if length > 125:
                    raise FrameError(CLOSE_PROTOCOL_ERROR, "control frame too long")
            elif opcode > OP_BINARY:
                raise FrameError(CLOSE_PROTOCOL_ERROR, f"unknown opcode {opcode:#x}")
            elif length + self._frag_size > self.max_size:
                raise FrameError(
                    CLOSE_TOO_BIG, f"message over {self.max_size} bytes"
                )  # before buffering any of it
            end = start + length
            if end > n:
                break
            view = memoryview(buf)
            try:
                payload = apply_mask(view[start:end], view[start - 4 : start])
            finally:
                view.release()
            self._pos = end
            if opcode != OP_CONT and opcode <= OP_BINARY:  # a text or binary frame
                if self._frag_op:
                    raise FrameError(CLOSE_PROTOCOL_ERROR, "new message inside a fragmented one")
                if not fin:
                    self._frag_op = opcode
                    self._frags = [payload]
                    self._frag_size = length
                    continue
                return opcode, (_text(payload) if opcode == OP_TEXT else payload)
            if opcode == OP_CONT:
                if not self._frag_op:
                    raise FrameError(CLOSE_PROTOCOL_ERROR, "continuation without a message")
                self._frags.append(payload)
                self._frag_size += length
                if not fin:
                    continue
                whole = b"".join(self._frags)
                op = self._frag_op
                self._frags, self._frag_op, self._frag_size = [], 0, 0
                return op, (_text(whole) if op == OP_TEXT else whole)
            return opcode, payload  # close, ping, pong (interleaving fragments is allowed)
        self._compact()
        return None

    def _compact(self) -> None:
        pos = self._pos
        if pos and (pos == len(self._buf) or pos >= _COMPACT_AT):
            del self._buf[:pos]
            self._pos = 0


def _text(payload: bytes) -> str:
    try:
        return payload.decode()
    except UnicodeDecodeError as exc:
        raise FrameError(CLOSE_INVALID_DATA, "text message is not valid UTF-8") from exc
