"""Test helpers for NIP-77: fixed signed events, a nostr-sdk LocalRelay process, and a
negentropy exchange driven by our own codec over the tests' websocket client."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from nostr_client import Client

from engram.negentropy import Items, Negentropy
from engram.nip01 import Event, sign_event

KEY_A = bytes.fromhex("11" * 32)
KEY_B = bytes.fromhex("22" * 32)
KEY_THIRD = bytes.fromhex("33" * 32)
BASE = 1_700_000_000

_LOCAL_RELAY = """
import asyncio, sys
from nostr_sdk import LocalRelayBuilder, RateLimit

async def main():
    limit = RateLimit(max_reqs=1000, notes_per_minute=100_000_000)
    relay = LocalRelayBuilder().addr("127.0.0.1").port(int(sys.argv[1])).rate_limit(limit).build()
    await relay.run()
    print("serving", flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def event(n: int, created_at: int, key: bytes = KEY_A, kind: int = 1) -> Event:
    """A deterministic signed event (fixed key, time, content and BIP-340 aux)."""
    return sign_event(key, created_at, kind, [], f"negentropy test {n}", aux=bytes(32))


def same_second_pair(created_at: int) -> tuple[Event, Event]:
    """Two events at one timestamp: they differ only in their id."""
    return event(10_001, created_at), event(10_002, created_at)


def items_of(events: list[Event]) -> Items:
    return Items.from_pairs((e.created_at, bytes.fromhex(e.id)) for e in events)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def local_relay() -> Iterator[str]:
    """nostr-sdk's LocalRelay (in memory, its rate limit lifted) in its own process."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", _LOCAL_RELAY, str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"LocalRelay exited: {proc.stdout.read()!r}")  # type: ignore[union-attr]
            try:
                with socket.create_connection(("127.0.0.1", port), 0.5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield f"ws://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def neg_reply(c: Client, sub_id: str, timeout: float = 30.0) -> list[Any]:
    """The next NEG-MSG / NEG-ERR / NOTICE / CLOSED for `sub_id` (others kept aside)."""
    while True:
        msg = await c.recv(timeout)
        if msg[0] == "NOTICE" or (msg[0] in ("NEG-MSG", "NEG-ERR") and msg[1] == sub_id):
            return msg
        c.backlog.append(msg)


async def reconcile(
    c: Client, items: Items, flt: dict[str, Any], sub_id: str = "neg"
) -> tuple[set[str], set[str], int]:
    """Our initiator against the relay: (have, need, rounds) as hex id sets."""
    neg = Negentropy(items, 0)
    await c.send(["NEG-OPEN", sub_id, flt, neg.initiate().hex()])
    have: set[str] = set()
    need: set[str] = set()
    rounds = 0
    while True:
        msg = await neg_reply(c, sub_id)
        assert msg[0] == "NEG-MSG", msg
        rounds += 1
        nxt, h, n = neg.reconcile_initiator(bytes.fromhex(msg[2]))
        have.update(i.hex() for i in h)
        need.update(i.hex() for i in n)
        if nxt is None:
            await c.send(["NEG-CLOSE", sub_id])
            return have, need, rounds
        await c.send(["NEG-MSG", sub_id, nxt.hex()])
