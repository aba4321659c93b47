"""The live bus on PostgreSQL: LISTEN for wake-ups, then tail committed rows.

Stored events: after each committed batch the writer sends one NOTIFY (a wake-up whose
payload names the writing node; payloads cap at 8000 bytes). Woken by another node, or
every `poll` seconds regardless, a node reads the rows other nodes stored in
transactions that finished since it last looked (see migration 0004). The LISTEN
connection is dedicated and direct (never through a transaction-pooling proxy); when it
drops, the node reconnects and catches up from its last position.

Ephemeral events (never stored) travel in the NOTIFY payload itself when they fit
(origin, tenant and event under 8000 bytes); larger ones reach only the node's own
subscribers. That is the documented trade-off: no table, no cleanup, no extra write.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import asyncpg

from relay import metrics
from relay.bus import Deliver
from relay.store import StoreError
from relay.store.postgres import DB_ERRORS, PostgresStore
from relay.store.sql import BUS_CHANNEL

log = logging.getLogger("relay.bus")

EPHEMERAL_CHANNEL = "engram_ephemeral"
NOTIFY_PAYLOAD_MAX = 7_999  # PostgreSQL refuses 8000 bytes and more
_RECONNECT_MAX = 5.0
_HELD_RETRY = 0.02  # first re-read after a held-back one (s); doubles up to the poll


def _retry_after(last: float | None, poll: float) -> float:
    """The wait before re-reading a tail that a running transaction held back.

    Its end sends no NOTIFY, and any transaction in the cluster that began before a
    commit holds that commit back (a busy neighbour's short writes often do): without a
    re-read, a held event would wait for the next poll. Backs off to `poll`.
    """
    return min(_HELD_RETRY if last is None else last * 2, poll)


class PostgresBus:
    def __init__(self, dsn: str, store: PostgresStore, poll: float = 1.0) -> None:
        self.dsn = dsn
        self.store = store
        self.poll = poll
        self._wake = asyncio.Event()
        self.connected = asyncio.Event()  # the LISTEN connection is up (tests, /readyz)
        self.held_since: float | None = None  # monotonic time the tail was first held back
        self._start: str | None = None  # the position `prepare` took
        metrics.watch_tail(self)

    def delay(self) -> float:
        """Seconds the tail has been held back by a running transaction (0: current).

        Rows committed after a transaction that is still open are not read until it ends
        (the snapshot's xmin stays put), so a long transaction delays live delivery
        across nodes; never loses it. `/metrics` and `/readyz` show this number.
        """
        since = self.held_since
        return 0.0 if since is None else time.monotonic() - since

    def _note_held(self, held: bool) -> None:
        if not held:
            self.held_since = None
        elif self.held_since is None:
            self.held_since = time.monotonic()

    async def prepare(self) -> None:
        """Take the starting position now, before the node accepts subscribers: an event
        committed between a subscription and the tail's first read is then still read."""
        self._start = await self._position()

    async def run(self, deliver: Deliver) -> None:
        position = self._start if self._start is not None else await self._position()
        listener = asyncio.create_task(self._listen(deliver))
        retry: float | None = None  # set while reads are held back
        try:
            while True:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), retry or self.poll)
                self._wake.clear()
                try:
                    position, rows = await self.store.bus_read(position)
                    held = self.store.bus_held_back
                    self._note_held(held)
                    retry = _retry_after(retry, self.poll) if held else None
                except StoreError as exc:
                    log.warning("bus read failed (will retry): %s", exc)
                    await asyncio.sleep(self.poll)
                    continue
                for tenant, raw in rows:
                    deliver(tenant, raw)
        finally:
            listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await listener

    async def _position(self) -> str:
        while True:
            try:
                return await self.store.bus_position()
            except StoreError as exc:
                log.warning("bus start waiting for the database: %s", exc)
                await asyncio.sleep(self.poll)

    async def _listen(self, deliver: Deliver) -> None:
        """Keep one LISTEN connection up; every (re)connect triggers a catch-up read."""
        delay = 0.1
        origin = self.store.node_id

        def on_stored(_c: Any, _pid: int, _channel: str, payload: str) -> None:
            if payload != origin:  # this node's own batches were delivered when stored
                self._wake.set()

        def on_ephemeral(_c: Any, _pid: int, _channel: str, payload: str) -> None:
            sender, _, rest = payload.partition("\n")
            tenant, _, raw = rest.partition("\n")
            if sender != origin and raw:
                deliver(tenant, raw.encode())

        while True:
            conn: asyncpg.Connection | None = None
            try:
                conn = await asyncpg.connect(self.dsn, timeout=10)
                lost = asyncio.Event()
                conn.add_termination_listener(lambda _c, lost=lost: lost.set())
                await conn.add_listener(BUS_CHANNEL, on_stored)
                await conn.add_listener(EPHEMERAL_CHANNEL, on_ephemeral)
                self.connected.set()
                self._wake.set()  # catch up on whatever committed while we were away
                delay = 0.1
                while not lost.is_set():  # asyncpg notices a dead socket on use
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(lost.wait(), 5)
                    if not lost.is_set():
                        await conn.execute("SELECT 1", timeout=5)
            except DB_ERRORS as exc:
                log.warning("bus listener lost (%s); reconnecting", type(exc).__name__)
            finally:
                self.connected.clear()
                if conn is not None and not conn.is_closed():
                    conn.terminate()
            await asyncio.sleep(delay)
            delay = min(delay * 2, _RECONNECT_MAX)

    async def publish_ephemeral(self, tenant: str, raw: bytes) -> None:
        payload = f"{self.store.node_id}\n{tenant}\n{raw.decode()}"
        if len(payload.encode()) > NOTIFY_PAYLOAD_MAX:
            return  # too big for a NOTIFY: local subscribers only (see module docstring)
        await self.store.notify(EPHEMERAL_CHANNEL, payload)
