"""REQs over real websockets (relay.reads): a REQ is registered as its frame is read, so a
CLOSE right behind it ends it, whether its stored part comes from the store's memory or
from a statement; and what a REQ answered from memory hides stays hidden."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from typing import Any

from nostr_client import Client, raw_ws

from engram.nip01 import pubkey_of, sign_event

SK = [bytes([0x60 + i]) * 32 for i in range(3)]
PK = [pubkey_of(k) for k in SK]


def frame(msg: list[Any]) -> bytes:
    """One masked client text frame."""
    data = json.dumps(msg).encode()
    mask = os.urandom(4)
    n = len(data)
    header = bytes([0x81]) + (
        bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    )
    return header + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def read_message(sock: socket.socket, buf: bytearray) -> list[Any]:
    """The next server message (unmasked text frames) from a blocking socket."""
    return json.loads(read_payload(sock, buf))  # type: ignore[no-any-return]


def read_payload(sock: socket.socket, buf: bytearray) -> bytes:
    """The next server text frame's payload, as sent."""

    def need(n: int) -> None:
        while len(buf) < n:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed")
            buf.extend(chunk)

    need(2)
    length, head = buf[1] & 0x7F, 2
    if length == 126:
        need(4)
        length, head = int.from_bytes(buf[2:4], "big"), 4
    elif length == 127:
        need(10)
        length, head = int.from_bytes(buf[2:10], "big"), 10
    need(head + length)
    payload = bytes(buf[head : head + length])
    del buf[: head + length]
    return payload


def until_eose(sock: socket.socket, buf: bytearray, sub_id: str) -> list[list[Any]]:
    """Every message up to the EOSE of `sub_id`."""
    seen = []
    while True:
        msg = read_message(sock, buf)
        seen.append(msg)
        if msg[0] in ("EOSE", "CLOSED") and msg[1] == sub_id:
            return seen


async def test_a_close_right_behind_its_req_ends_it(relay: Any) -> None:
    """REQ and CLOSE in one write: the REQ was registered before the CLOSE was read, so
    no live event reaches it afterwards (before: the REQ's task registered it after the
    CLOSE, and it stayed open). Both ways: the first REQ reads the store, the second is
    answered from memory, in line (its stored part and EOSE come before the CLOSE)."""
    old = sign_event(SK[0], int(time.time()) - 10, 1, [], "stored", bytes(32))
    async with await Client.connect(relay.url) as pub:
        assert (await pub.publish(old))[2] is True
        flt = {"authors": [PK[0]], "limit": 5}
        sock = await asyncio.to_thread(raw_ws, relay.port, 1 << 20)
        buf = bytearray()
        published = [old]

        async def req_until_eose(sub: str, f: dict[str, Any]) -> list[list[Any]]:
            await asyncio.to_thread(sock.sendall, frame(["REQ", sub, f]))
            return await asyncio.to_thread(until_eose, sock, buf, sub)

        try:
            for n in (1, 2):
                sub = f"s{n}"
                if n == 2:
                    await req_until_eose("fill", flt)  # the author's rows, in memory now
                    await asyncio.to_thread(sock.sendall, frame(["CLOSE", "fill"]))
                await asyncio.to_thread(
                    sock.sendall, frame(["REQ", sub, flt]) + frame(["CLOSE", sub])
                )
                seen = await req_until_eose(f"probe{n}", {"ids": ["0" * 64]})
                if n == 2:  # the stored part and EOSE came before the CLOSE was read
                    stored = [m[2]["id"] for m in seen if m[:2] == ["EVENT", sub]]
                    assert stored == [e.id for e in reversed(published)], seen
                    assert ["EOSE", sub] in seen
                live = sign_event(SK[0], int(time.time()), 1, [], f"live {n}", bytes(32))
                assert (await pub.publish(live))[2] is True
                published.append(live)
                seen = await req_until_eose(f"after{n}", {"ids": ["0" * 64]})
                assert not [m for m in seen if m[0] == "EVENT" and m[1] == sub], seen
            # the positive twin: an open subscription gets the next live event
            await req_until_eose("open", flt)
            live = sign_event(SK[0], int(time.time()), 1, [], "to the open one", bytes(32))
            assert (await pub.publish(live))[2] is True
            msg = await asyncio.to_thread(read_message, sock, buf)
            assert msg[:2] == ["EVENT", "open"] and msg[2]["id"] == live.id
        finally:
            sock.close()


async def test_deleted_event_not_served_again(relay: Any) -> None:
    """A REQ answered again (from memory) after a NIP-09 deletion no longer has it; the
    author's other event still comes."""
    now = int(time.time())
    gone = sign_event(SK[1], now - 20, 1, [], "to delete", bytes(32))
    kept = sign_event(SK[1], now - 10, 1, [], "kept", bytes(32))
    flt = {"authors": [PK[1]], "limit": 10}
    async with await Client.connect(relay.url) as c:
        for ev in (gone, kept):
            assert (await c.publish(ev))[2] is True
        for _ in range(2):
            assert [e["id"] for e in await c.query(flt)] == [kept.id, gone.id]
        request = sign_event(SK[1], now, 5, [["e", gone.id]], "", bytes(32))
        assert (await c.publish(request))[2] is True
        for _ in range(2):
            assert [e["id"] for e in await c.query(flt)] == [request.id, kept.id]


async def test_stored_answer_whole_or_frame_by_frame(relay: Any) -> None:
    """A REQ's stored events and EOSE, byte for byte `["EVENT",<sub>,<event as stored>]`
    and newest first, whether the answer fits in the connection's output of one loop
    iteration (sent in one call, relay.wsserver.DirectSocket.send_events) or not (over
    32 KiB: frame by frame, through the queue), read from the store or from memory."""
    now = int(time.time())
    sk = bytes([0x70]) * 32
    events = [
        sign_event(sk, now - 100 + i, 1, [], f"{i:03d} " + "x" * 1200, bytes(32)) for i in range(40)
    ]
    async with await Client.connect(relay.url) as pub:
        for ev in events:
            assert (await pub.publish(ev))[2] is True
    newest = [e.id for e in reversed(events)]
    sock = await asyncio.to_thread(raw_ws, relay.port, 1 << 20)
    buf = bytearray()

    def payloads(sub: str) -> list[bytes]:
        """Raw payloads of the server's text frames up to `sub`'s EOSE."""
        eose = json.dumps(["EOSE", sub], separators=(",", ":")).encode()
        out = [read_payload(sock, buf)]
        while out[-1] != eose:
            out.append(read_payload(sock, buf))
        return out

    try:
        for limit in (5, 40, 5, 40):  # the first of each: the store; then memory
            sub = f"s{limit}"
            f = {"authors": [pubkey_of(sk)], "limit": limit}
            await asyncio.to_thread(sock.sendall, frame(["REQ", sub, f]))
            got = await asyncio.to_thread(payloads, sub)
            prefix = b'["EVENT","' + sub.encode() + b'",'
            assert len(got) == limit + 1
            assert all(p.startswith(prefix) and p.endswith(b"]") for p in got[:-1])
            assert [json.loads(p)[2]["id"] for p in got[:-1]] == newest[:limit]
            assert [json.loads(p[len(prefix) : -1]) for p in got[:-1]] == [
                json.loads(p)[2] for p in got[:-1]
            ]
            await asyncio.to_thread(sock.sendall, frame(["CLOSE", sub]))
    finally:
        sock.close()
