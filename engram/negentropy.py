"""Negentropy protocol version 1 (NIP-77): range-based set reconciliation over
`(timestamp, id)`-ordered items.

Pure: bytes in, bytes out. `Items` is one side's sorted set; `Negentropy` is the
state machine of either participant (the initiator learns have/need ids, the responder
only answers); `Bridge` lets a client reconcile two responders (two relays) with each
other without holding either set, by relaying their answers (see its docstring).

Wire format (hoytech/negentropy, docs/negentropy-protocol-v1.md): a message is the
version byte 0x61 then ranges; a range is an upper bound, a mode (0 skip, 1 fingerprint,
2 id list) and its payload. Varints are base 128, most significant digit first; bounds
carry delta-encoded timestamps (0 = infinity) and the shortest id prefix that separates
two neighbouring items.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterable
from typing import NamedTuple

PROTOCOL_VERSION = 0x61
ID_SIZE = 32
FINGERPRINT_SIZE = 16
INFINITY = 2**64 - 1  # the reserved "infinity" timestamp
ITEM_BYTES = ID_SIZE + 8  # what one item of `Items` holds: its id and its 64-bit timestamp
BUCKETS = 16  # a differing range is split into this many fingerprinted buckets...
ID_LIST_BELOW = BUCKETS * 2  # ...unless it holds fewer items: then its ids are listed
MIN_FRAME_SIZE = 4096
_FRAME_SLACK = 200  # room kept under a frame size limit for the closing range
_MASK = 2**256 - 1

SKIP, FINGERPRINT, ID_LIST = 0, 1, 2
_LITTLE = sys.byteorder == "little"


class NegentropyError(ValueError):
    """A malformed or unsupported negentropy message; str() says what is wrong."""


# --- varints --------------------------------------------------------------------------


def encode_varint(n: int) -> bytes:
    """Base-128, most significant digit first, high bit set on all but the last byte."""
    if n < 0:
        raise ValueError("varints are unsigned")
    if n < 0x80:
        return bytes((n,))
    digits = [n & 0x7F]
    n >>= 7
    while n:
        digits.append(0x80 | (n & 0x7F))
        n >>= 7
    return bytes(reversed(digits))


def decode_varint(buf: bytes, pos: int) -> tuple[int, int]:
    """(value, position after it); NegentropyError if the buffer ends inside it."""
    n = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise NegentropyError("message ends inside a varint")
        if n >> 64:
            raise NegentropyError("varint too large")
        byte = buf[pos]
        pos += 1
        n = (n << 7) | (byte & 0x7F)
        if not byte & 0x80:
            return n, pos


# --- bounds and fingerprints ----------------------------------------------------------


class Bound(NamedTuple):
    """A position in (timestamp, id) order: the id prefix is padded with zero bytes."""

    timestamp: int
    prefix: bytes = b""

    @property
    def key(self) -> tuple[int, bytes]:
        return self.timestamp, self.prefix.ljust(ID_SIZE, b"\0")


ZERO = Bound(0)
END = Bound(INFINITY)


def minimal_bound(prev: tuple[int, bytes], curr: tuple[int, bytes]) -> Bound:
    """The shortest bound above item `prev` and at or below item `curr` (prev < curr)."""
    if curr[0] != prev[0]:
        return Bound(curr[0])
    a, b = prev[1], curr[1]
    shared = 0
    while shared < ID_SIZE and a[shared] == b[shared]:
        shared += 1
    return Bound(curr[0], b[: shared + 1])


def fingerprint_of(total: int, count: int) -> bytes:
    """SHA-256 over (sum of ids mod 2^256, little-endian) + varint(count), first 16 bytes."""
    data = (total & _MASK).to_bytes(ID_SIZE, "little") + encode_varint(count)
    return hashlib.sha256(data).digest()[:FINGERPRINT_SIZE]


def fingerprint(ids: Iterable[bytes]) -> bytes:
    """The fingerprint of a set of ids (each 32 bytes)."""
    total = count = 0
    for i in ids:
        total += int.from_bytes(i, "little")
        count += 1
    return fingerprint_of(total, count)


def id_sum(blob: bytes | memoryview) -> int:
    """Sum of the concatenated 32-byte ids in `blob` as little-endian integers (no mod).

    Summed as four columns of native 64-bit words (C-speed iteration), then recombined.
    """
    if not blob:
        return 0
    if not _LITTLE:  # pragma: no cover - every supported platform is little-endian
        return sum(
            int.from_bytes(blob[k : k + ID_SIZE], "little") for k in range(0, len(blob), ID_SIZE)
        )
    words = memoryview(blob).cast("Q")
    return (
        sum(words[0::4])
        + (sum(words[1::4]) << 64)
        + (sum(words[2::4]) << 128)
        + (sum(words[3::4]) << 192)
    )


# --- one side's items -----------------------------------------------------------------


class Items:
    """A sorted set of (timestamp, id): timestamps in an array, ids in one bytes blob.

    ITEM_BYTES (40) per item: the whole per-session state of a responder.
    """

    __slots__ = ("ids", "timestamps")

    def __init__(self, timestamps: array[int], ids: bytes) -> None:
        if len(ids) != len(timestamps) * ID_SIZE:
            raise ValueError("ids must hold 32 bytes per timestamp")
        self.timestamps = timestamps
        self.ids = ids

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[int, bytes]]) -> Items:
        """From unsorted (timestamp, 32-byte id) pairs; duplicates are dropped."""
        items = sorted(set(pairs))
        for ts, i in items:
            if not 0 <= ts < INFINITY or len(i) != ID_SIZE:
                raise ValueError("timestamps are 0..2^64-2 and ids 32 bytes")
        return cls(array("Q", (ts for ts, _ in items)), b"".join(i for _, i in items))

    @classmethod
    def from_sorted(cls, timestamps: Iterable[int], ids: bytes) -> Items:
        """From already (timestamp, id)-ordered columns, as the store returns them."""
        return cls(array("Q", timestamps), bytes(ids))

    def __len__(self) -> int:
        return len(self.timestamps)

    def item(self, i: int) -> tuple[int, bytes]:
        return self.timestamps[i], self.ids[i * ID_SIZE : (i + 1) * ID_SIZE]

    def id_at(self, i: int) -> bytes:
        return self.ids[i * ID_SIZE : (i + 1) * ID_SIZE]

    def id_blob(self, lower: int, upper: int) -> bytes:
        return self.ids[lower * ID_SIZE : upper * ID_SIZE]

    def fingerprint(self, lower: int, upper: int) -> bytes:
        view = memoryview(self.ids)[lower * ID_SIZE : upper * ID_SIZE]
        return fingerprint_of(id_sum(view), upper - lower)

    def lower_bound(self, lower: int, upper: int, bound: Bound) -> int:
        """The first index in [lower, upper) whose item is >= bound (or `upper`)."""
        if bound.timestamp == INFINITY:
            return upper
        ts = self.timestamps
        i = bisect_left(ts, bound.timestamp, lower, upper)
        if not bound.prefix or i == upper or ts[i] != bound.timestamp:
            return i
        j = bisect_right(ts, bound.timestamp, i, upper)
        target = bound.prefix.ljust(ID_SIZE, b"\0")
        while i < j:  # binary search over the ids sharing this timestamp
            mid = (i + j) // 2
            if self.id_at(mid) < target:
                i = mid + 1
            else:
                j = mid
        return i

    def nbytes(self) -> int:
        """Memory held by the two columns."""
        return sys.getsizeof(self.timestamps) + sys.getsizeof(self.ids)


# --- messages -------------------------------------------------------------------------


class Range(NamedTuple):
    """A decoded range: [lower, upper) and its payload (fingerprint, or the id blob)."""

    lower: Bound
    upper: Bound
    mode: int
    payload: bytes = b""


class _Writer:
    """Builds one message; timestamps are delta-encoded against the previous bound."""

    __slots__ = ("last", "parts", "size")

    def __init__(self) -> None:
        self.parts: list[bytes] = [bytes((PROTOCOL_VERSION,))]
        self.size = 1
        self.last = 0

    def bound(self, b: Bound) -> bytes:
        if b.timestamp == INFINITY:
            self.last = INFINITY
            head = b"\0"
        else:
            head = encode_varint(b.timestamp - self.last + 1)
            self.last = b.timestamp
        return head + encode_varint(len(b.prefix)) + b.prefix

    def add(self, *pieces: bytes) -> None:
        for p in pieces:
            self.parts.append(p)
            self.size += len(p)

    def range(self, b: Bound, mode: int, payload: bytes = b"") -> bytes:
        """One encoded range (not yet added)."""
        return self.bound(b) + encode_varint(mode) + payload

    def done(self) -> bytes:
        return b"".join(self.parts)


def id_list_payload(blob: bytes) -> bytes:
    return encode_varint(len(blob) // ID_SIZE) + blob


class _Reader:
    __slots__ = ("buf", "last", "pos")

    def __init__(self, buf: bytes) -> None:
        self.buf = buf
        self.pos = 0
        self.last = 0

    def varint(self) -> int:
        n, self.pos = decode_varint(self.buf, self.pos)
        return n

    def take(self, n: int) -> bytes:
        end = self.pos + n
        if end > len(self.buf):
            raise NegentropyError("message ends inside a range")
        out = self.buf[self.pos : end]
        self.pos = end
        return out

    def bound(self) -> Bound:
        ts = self.varint()
        ts = INFINITY if ts == 0 else ts - 1
        if self.last == INFINITY or ts == INFINITY or ts + self.last >= INFINITY:
            ts = INFINITY  # saturates, as in the reference implementation
        else:
            ts += self.last
        self.last = ts
        length = self.varint()
        if length > ID_SIZE:
            raise NegentropyError("bound id prefix longer than 32 bytes")
        return Bound(ts, self.take(length))


def check_version(msg: bytes) -> int:
    """The message's protocol version byte; NegentropyError if it is not one at all."""
    if not msg:
        raise NegentropyError("empty negentropy message")
    version = msg[0]
    if not 0x60 <= version <= 0x6F:
        raise NegentropyError("invalid negentropy protocol version byte")
    return version


def decode_message(msg: bytes) -> list[Range]:
    """The ranges of a version-1 message, with absolute bounds."""
    if check_version(msg) != PROTOCOL_VERSION:
        raise NegentropyError(f"unsupported negentropy protocol version 0x{msg[0]:02x}")
    r = _Reader(msg)
    r.pos = 1
    out: list[Range] = []
    lower = ZERO
    while r.pos < len(msg):
        upper = r.bound()
        if upper.key < lower.key:
            raise NegentropyError("ranges out of order")
        mode = r.varint()
        if mode == SKIP:
            payload = b""
        elif mode == FINGERPRINT:
            payload = r.take(FINGERPRINT_SIZE)
        elif mode == ID_LIST:
            n = r.varint()
            if n > (len(msg) - r.pos) // ID_SIZE:
                raise NegentropyError("id list longer than the message")
            payload = r.take(n * ID_SIZE)
        else:
            raise NegentropyError(f"unknown range mode {mode}")
        out.append(Range(lower, upper, mode, payload))
        lower = upper
    return out


def encode_message(ranges: Iterable[tuple[Bound, int, bytes]]) -> bytes:
    """A message from (upper bound, mode, payload) ranges; an id list payload is the
    blob of ids (its count is added here). Trailing skips are dropped."""
    w = _Writer()
    pending: list[tuple[Bound, int, bytes]] = []
    for upper, mode, payload in ranges:
        if mode == SKIP:
            if pending and pending[-1][1] == SKIP:
                pending[-1] = (upper, SKIP, b"")
            else:
                pending.append((upper, SKIP, b""))
            continue
        pending.append((upper, mode, payload))
    while pending and pending[-1][1] == SKIP:
        pending.pop()
    for upper, mode, payload in pending:
        w.add(w.range(upper, mode, id_list_payload(payload) if mode == ID_LIST else payload))
    return w.done()


# --- the state machine ----------------------------------------------------------------


def _diff_ids(ours: bytes, theirs: bytes, have: list[bytes], need: list[bytes]) -> None:
    """The initiator's side of an id list: ids only we have go to `have`, ids only the
    other side has to `need` (both blobs of concatenated 32-byte ids)."""
    theirs_set = {theirs[k : k + ID_SIZE] for k in range(0, len(theirs), ID_SIZE)}
    for k in range(0, len(ours), ID_SIZE):
        i = ours[k : k + ID_SIZE]
        if i in theirs_set:
            theirs_set.discard(i)
        else:
            have.append(i)
    need.extend(theirs_set)


class Negentropy:
    """One participant over `items`. The initiator calls `initiate()` then
    `reconcile_initiator(reply)` until it returns None for the next message; the
    responder answers each message with `reconcile(msg)`.

    `frame_size_limit` (0 = none, else >= 4096) bounds every message this side builds.
    """

    def __init__(self, items: Items, frame_size_limit: int = 0) -> None:
        if frame_size_limit and frame_size_limit < MIN_FRAME_SIZE:
            raise ValueError(f"frame_size_limit must be 0 or at least {MIN_FRAME_SIZE}")
        self.items = items
        self.frame_size_limit = frame_size_limit
        self.is_initiator = False

    def initiate(self) -> bytes:
        if self.is_initiator:
            raise NegentropyError("already initiated")
        self.is_initiator = True
        w = _Writer()
        self._split(w, 0, len(self.items), END)
        return w.done()

    def reconcile(self, msg: bytes) -> bytes:
        """The responder's answer (a lone version byte to a version it does not speak)."""
        if self.is_initiator:
            raise NegentropyError("the initiator reconciles with reconcile_initiator")
        return self._reconcile(msg, [], [])

    def reconcile_initiator(self, msg: bytes) -> tuple[bytes | None, list[bytes], list[bytes]]:
        """(next message or None when done, ids only we have, ids only they have)."""
        if not self.is_initiator:
            raise NegentropyError("initiate() first")
        have: list[bytes] = []
        need: list[bytes] = []
        out = self._reconcile(msg, have, need)
        return (None if len(out) == 1 else out), have, need

    def _exceeded(self, size: int) -> bool:
        return bool(self.frame_size_limit) and size > self.frame_size_limit - _FRAME_SLACK

    def _reconcile(self, msg: bytes, have: list[bytes], need: list[bytes]) -> bytes:
        version = check_version(msg)
        if version != PROTOCOL_VERSION:
            if self.is_initiator:
                raise NegentropyError(f"the other side speaks negentropy 0x{version:02x} only")
            return bytes((PROTOCOL_VERSION,))
        items = self.items
        size = len(items)
        r = _Reader(msg)
        r.pos = 1
        w = _Writer()
        prev_index = 0
        prev_bound = ZERO
        skip = False
        end = len(msg)
        while r.pos < end:
            pieces: list[bytes] = []

            curr = r.bound()
            if curr.key < prev_bound.key:
                raise NegentropyError("ranges out of order")
            mode = r.varint()
            lower = prev_index
            upper = items.lower_bound(prev_index, size, curr)
            if mode == SKIP:
                skip = True
            elif mode == FINGERPRINT:
                theirs = r.take(FINGERPRINT_SIZE)
                if theirs != items.fingerprint(lower, upper):
                    if skip:
                        skip = False
                        pieces.append(w.range(prev_bound, SKIP))
                    self._split_into(pieces, w, lower, upper, curr)
                else:
                    skip = True
            elif mode == ID_LIST:
                n = r.varint()
                if n > (end - r.pos) // ID_SIZE:
                    raise NegentropyError("id list longer than the message")
                blob = r.take(n * ID_SIZE)
                if self.is_initiator:
                    _diff_ids(items.id_blob(lower, upper), blob, have, need)
                    skip = True
                else:
                    if skip:
                        skip = False
                        pieces.append(w.range(prev_bound, SKIP))
                    w.add(*pieces)
                    pieces.clear()
                    upper = self._reply_ids(w, lower, upper, curr)
            else:
                raise NegentropyError(f"unknown range mode {mode}")
            if self._exceeded(w.size + sum(map(len, pieces))):
                # out of room: one fingerprint for everything from here on
                w.add(w.range(END, FINGERPRINT, items.fingerprint(upper, size)))
                break
            w.add(*pieces)
            prev_index = upper
            prev_bound = curr
        return w.done()

    def _reply_ids(self, w: _Writer, lower: int, upper: int, bound: Bound) -> int:
        """Answer a range with our ids in it, as many as the frame has room for (the
        range then ends at the first id left out); returns where the answer ended."""
        items = self.items
        end_bound = bound
        if self.frame_size_limit:
            room = self.frame_size_limit - _FRAME_SLACK - w.size
            fits = room // ID_SIZE + 1 if room >= 0 else 0
            if fits < upper - lower:
                upper = lower + fits
                ts, i = items.item(upper)
                end_bound = Bound(ts, i)
        w.add(w.range(end_bound, ID_LIST, id_list_payload(items.id_blob(lower, upper))))
        return upper

    def _split(self, w: _Writer, lower: int, upper: int, upper_bound: Bound) -> None:
        pieces: list[bytes] = []
        self._split_into(pieces, w, lower, upper, upper_bound)
        w.add(*pieces)

    def _split_into(
        self, pieces: list[bytes], w: _Writer, lower: int, upper: int, upper_bound: Bound
    ) -> None:
        """Ranges for [lower, upper): its ids if few, else 16 fingerprinted buckets."""
        items = self.items
        n = upper - lower
        if n < ID_LIST_BELOW:
            pieces.append(
                w.range(upper_bound, ID_LIST, id_list_payload(items.id_blob(lower, upper)))
            )
            return
        per, extra = divmod(n, BUCKETS)
        curr = lower
        for b in range(BUCKETS):
            start = curr
            curr += per + (1 if b < extra else 0)
            fp = items.fingerprint(start, curr)
            nxt = (
                upper_bound
                if curr == upper
                else minimal_bound(items.item(curr - 1), items.item(curr))
            )
            pieces.append(w.range(nxt, FINGERPRINT, fp))


# --- reconciling two responders -------------------------------------------------------

_NEVER = b"\0" * FINGERPRINT_SIZE  # a fingerprint no real set has (2^-128 odds)


class Bridge:
    """Reconcile two responders (A and B, e.g. two relays) through a client holding
    neither set: each side's answer is forwarded to the other as its next message.

    A responder answers a fingerprint it does not share by splitting the range over its
    own items, and an id list with its own ids over exactly the same range. So when a
    side answers with an id list for the range of an id list just forwarded to it, both
    sides' ids of that range are known: the difference is recorded and the range is
    skipped from then on. The first message (to A) carries a fingerprint nothing
    matches, so A splits its whole set. `limit_a`/`limit_b` bound the messages sent to
    each side: an oversized message is cut and its remainder sent as an unmatched
    fingerprint, which the receiver splits again (more rounds, same result).
    """

    def __init__(self, limit_a: int = 0, limit_b: int = 0) -> None:
        self.limits = {"a": limit_a, "b": limit_b}
        self.only_a: list[bytes] = []
        self.only_b: list[bytes] = []
        self._sent: dict[tuple[tuple[int, bytes], tuple[int, bytes]], bytes] = {}
        self.rounds = 0

    def initial(self) -> bytes:
        """The first message, for A."""
        return encode_message([(END, FINGERPRINT, _NEVER)])

    def forward(self, msg: bytes, sender: str) -> bytes | None:
        """`sender` ("a" or "b") answered `msg`: the message for the other side, or None
        when nothing is left to reconcile."""
        self.rounds += 1
        ranges = decode_message(msg)
        answered, self._sent = self._sent, {}
        out: list[tuple[Bound, int, bytes]] = []
        for rg in ranges:
            if rg.mode == ID_LIST:
                key = (rg.lower.key, rg.upper.key)
                other = answered.get(key)
                if other is not None:
                    self._diff(rg.payload, other, sender)
                    out.append((rg.upper, SKIP, b""))
                    continue
            out.append((rg.upper, rg.mode, rg.payload))
        if all(mode == SKIP for _, mode, _ in out):
            return None
        receiver = "b" if sender == "a" else "a"
        return self._encode_for(out, self.limits[receiver])

    def _diff(self, mine: bytes, theirs: bytes, sender: str) -> None:
        a = {mine[k : k + ID_SIZE] for k in range(0, len(mine), ID_SIZE)}
        b = {theirs[k : k + ID_SIZE] for k in range(0, len(theirs), ID_SIZE)}
        first, second = (self.only_a, self.only_b) if sender == "a" else (self.only_b, self.only_a)
        first.extend(sorted(a - b))
        second.extend(sorted(b - a))

    def _encode_for(self, ranges: list[tuple[Bound, int, bytes]], limit: int) -> bytes:
        """Encode, cut to `limit`, and remember the id lists actually sent."""
        kept: list[tuple[Bound, int, bytes]] = []
        size = 1
        lower = ZERO
        for upper, mode, payload in ranges:
            cost = 2 * 11 + len(upper.prefix) + len(payload) + 10
            if limit and size + cost > limit - _FRAME_SLACK and mode != SKIP:
                kept.append((END, FINGERPRINT, _NEVER))
                break
            kept.append((upper, mode, payload))
            size += cost
            if mode == ID_LIST:
                self._sent[(lower.key, upper.key)] = payload
            lower = upper
        return encode_message(kept)
