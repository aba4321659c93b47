"""REQs one at a time: the filter each `bench scale` shape sends, and a connection that
sends one REQ (or COUNT), waits for its EOSE, COUNT or CLOSED, and times it.

`bench scale` times every shape with it; `bench flood`'s victim is one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import msgspec

from bench import wsclient

ANSWER_TIMEOUT = 60.0  # a REQ unanswered this long is reported, not waited for

_frame = msgspec.json.Decoder(list[msgspec.Raw])
_str = msgspec.json.Decoder(str)


def request(shape: str, value: Any) -> tuple[str, dict[str, Any]]:
    """(verb, filter) of one run of `shape` with `value`."""
    if shape == "COUNT":
        return "COUNT", {"kinds": [7], "#e": [value]}
    if shape == "ids":
        return "REQ", {"ids": [value]}
    if shape == "authors":
        return "REQ", {"authors": [value], "limit": 10}
    if shape == "kinds":
        return "REQ", {"kinds": value, "limit": 20}
    if shape == "feed 20":
        return "REQ", {"authors": value, "kinds": [1], "limit": 50}
    what = shape.split(" ", 1)[0]
    if what == "search":
        return "REQ", {"search": value, "limit": 20}
    return "REQ", {what: [value], "limit": 20}


class Asker:
    """One websocket connection sending one REQ/COUNT at a time (from `source`, a local
    address, when given: another client as the relay sees it)."""

    def __init__(self, timeout: float = ANSWER_TIMEOUT, source: str | None = None) -> None:
        self.conn: wsclient.WsConnection | None = None
        self.sub = ""
        self.answer: asyncio.Future[str] | None = None
        self.returned = 0
        self.timeout = timeout
        self.source = source

    async def open(self, url: str) -> None:
        self.conn = await wsclient.connect(url, self.on_message, self.on_close, source=self.source)

    def on_message(self, payload: bytes) -> None:
        items = _frame.decode(payload)
        verb = bytes(items[0]) if items else b""
        if verb == b'"EVENT"':
            self.returned += 1
        elif verb in (b'"EOSE"', b'"COUNT"', b'"CLOSED"') and len(items) >= 2:
            if _str.decode(items[1]) != self.sub or self.answer is None or self.answer.done():
                return
            why = _str.decode(items[2]) if verb == b'"CLOSED"' and len(items) > 2 else ""
            self.answer.set_result(verb.decode().strip('"') + (f" {why}" if why else ""))

    def on_close(self, reason: str) -> None:
        if self.answer is not None and not self.answer.done():
            self.answer.set_result(f"connection closed: {reason}")

    async def ask(self, sub: str, frame: bytes, close: bytes | None) -> tuple[float, str]:
        assert self.conn is not None
        self.sub = sub
        self.answer = asyncio.get_running_loop().create_future()
        t0 = time.perf_counter()
        self.conn.send(frame)
        try:
            outcome = await asyncio.wait_for(asyncio.shield(self.answer), self.timeout)
        except TimeoutError:
            outcome = f"no answer within {self.timeout:.0f} s"
        elapsed = time.perf_counter() - t0
        if close is not None:
            self.conn.send(close)
        return elapsed, outcome
