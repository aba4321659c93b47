"""BIP-340 checks in a process beside the relay: the second core verifies signatures.

The event loop's share of an EVENT was ~40 % signature check (libsecp256k1, ~34 us
here). A thread cannot take it off the loop: the check releases the GIL, but the thread
needs it back after every event, and with clients that send one EVENT per websocket
write those hand-offs cost more than they freed (docs/OPERATING.md "Ingest tuning"). A
process has its own interpreter: the loop packs a batch's (pubkey, sig, id) hex into one
pipe write and reads one byte per event back, on the loop itself (`add_reader`, no
thread).

Two batches are in the worker at most (the next one waits in the pipe while it checks
one, so it never idles while the loop is busy); what arrives meanwhile waits here and
goes next, so batches grow with the load, and two writes never exceed the buffer of the
connection (`multiprocessing.Pipe`: a Unix socket pair, 208 KiB by default; the sizes
assume 64 KiB): the loop never blocks on a write, even to a worker that hangs.

Every submitted event gets exactly one verdict, whatever the worker does: True or False
when its signature was checked, else the `error: …` reason it was not (`CHECK_FAILED`
when the worker died or missed its deadline, which restarts it; `SHUTTING_DOWN` on
close).
"""

from __future__ import annotations

import asyncio
import binascii
import collections
import logging
import multiprocessing
import signal
from multiprocessing.connection import Connection
from typing import Any

from engram.nip01 import Event, signature_valid_hex, signature_valid_parts
from relay.verifier import CHECK_FAILED, SHUTTING_DOWN, Done, answer, deliver

log = logging.getLogger("engram.verifier")

_RECORD = 64 + 128 + 64  # pubkey, sig and id, as the event's hex
BATCH_MAX = 120  # 30,720 bytes a write: two fit in 64 KiB
_IN_WORKER_MAX = 2  # batches sent and not answered
DEADLINE_SECONDS = 10.0  # a batch not answered by then: the worker is restarted
_FAILURES_MAX = 3  # worker failures in a row before verifying inline


def check_packed(data: bytes) -> bytes:
    """In the worker: one byte per `_RECORD`-byte record, 1 when its signature is valid."""
    out = bytearray(len(data) // _RECORD)
    for i in range(len(out)):
        j = i * _RECORD
        try:
            sig = binascii.unhexlify(data[j + 64 : j + 192])
            msg = binascii.unhexlify(data[j + 192 : j + _RECORD])
            out[i] = signature_valid_parts(data[j : j + 64].decode("ascii"), sig, msg)
        except (ValueError, UnicodeDecodeError):
            pass  # 0: not valid
    return bytes(out)


def _serve(conn: Connection) -> None:
    """The worker's loop: a batch in, its verdicts out, until the relay closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the relay, which closes it
    while True:
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError):
            return
        conn.send_bytes(check_packed(data))


class ProcessVerifier:
    """`submit(event, done)`: `done(verdict)` runs on the loop, exactly once per event.

    The worker starts with the relay (`start`) or else on the first EVENT. If it cannot
    start, events are verified inline, and that is logged.
    """

    def __init__(self, deadline: float = DEADLINE_SECONDS) -> None:
        self._deadline_seconds = deadline
        self._pending: list[tuple[Event, Done]] = []
        self._sent: collections.deque[list[tuple[Event, Done]]] = collections.deque()
        self._conn: Connection | None = None
        self._proc: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._scheduled = False
        self._inline = False  # no worker (could not start, or kept failing): on the loop
        self._failures = 0  # in a row
        self._closed = False

    def start(self) -> None:
        """Start the worker now (the relay's startup), not on the first EVENT: its first
        start takes a few hundred milliseconds (the fork server imports this module)."""
        if self._conn is None and not self._inline and not self._closed:
            self._loop = asyncio.get_running_loop()
            self._start()

    def submit(self, event: Event, done: Done) -> None:
        if self._closed:
            done(SHUTTING_DOWN)
            return
        self._pending.append((event, done))
        if len(self._sent) < _IN_WORKER_MAX and not self._scheduled:
            # after this loop iteration: the rest of the read's EVENTs join the batch
            self._scheduled = True
            loop = self._loop
            if loop is None:
                loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._send)

    def _send(self) -> None:
        self._scheduled = False
        while len(self._sent) < _IN_WORKER_MAX and self._pending and not self._closed:
            batch = self._pending[:BATCH_MAX]
            del self._pending[:BATCH_MAX]
            conn = self._conn
            if conn is None and not self._inline:
                conn = self._start()
            if conn is None:  # no worker: checked here, still every one
                deliver(batch, [signature_valid_hex(e) for e, _ in batch])
                continue
            payload = "".join([e.pubkey + e.sig + e.id for e, _ in batch]).encode("ascii")
            try:
                conn.send_bytes(payload)
            except OSError as exc:
                self._failed(f"unreachable ({exc})")
                answer(batch, CHECK_FAILED)
                continue
            self._sent.append(batch)
            if self._deadline is None:
                self._arm_deadline()

    def _start(self) -> Connection | None:
        """Start the worker (forkserver: a fork of a clean server process, never of the
        relay with its threads and sockets); None when that fails."""
        try:
            ctx = multiprocessing.get_context("forkserver")
            ctx.set_forkserver_preload(["relay.verifyproc"])
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs,), name="engram-verify", daemon=True)
            proc.start()
            theirs.close()
            assert self._loop is not None
            self._loop.add_reader(ours.fileno(), self._readable)
        except Exception as exc:  # no worker: still every event is checked, inline
            log.warning("signature worker could not start (%s); verifying inline", exc)
            self._inline = True
            return None
        self._conn, self._proc = ours, proc
        return ours

    def _failed(self, why: str) -> None:
        """The worker failed: stop it (its batch is answered CHECK_FAILED); the next
        batch starts another, unless it failed `_FAILURES_MAX` times in a row."""
        self._failures += 1
        if self._failures >= _FAILURES_MAX:
            log.error(
                "signature worker %s, %d times in a row; verifying inline", why, self._failures
            )
            self._inline = True
        else:
            log.error("signature worker %s; restarting it", why)
        self._stop_worker()

    def _readable(self) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            data = conn.recv_bytes()
        except (EOFError, OSError) as exc:
            self._failed(f"stopped ({exc!r})")
            return self._send()
        batch = self._sent.popleft() if self._sent else []
        if len(data) != len(batch):
            self._sent.appendleft(batch)
            self._failed(f"answered {len(data)} verdicts for {len(batch)} events")
            return self._send()
        self._failures = 0
        if self._deadline is not None:  # the deadline runs for the oldest batch sent
            self._deadline.cancel()
            self._deadline = None
        if self._sent:
            self._arm_deadline()
        deliver(batch, [b == 1 for b in data])
        self._send()

    def _arm_deadline(self) -> None:
        """The deadline of the oldest batch in the worker, from now."""
        assert self._loop is not None
        self._deadline = self._loop.call_later(self._deadline_seconds, self._missed_deadline)

    def _missed_deadline(self) -> None:
        self._deadline = None
        self._failed(f"silent for {self._deadline_seconds:g} s")
        self._send()

    def _stop_worker(self) -> None:
        """Drop the worker (killed: it may hang) and answer the batches it holds
        CHECK_FAILED: those events were not checked."""
        sent, self._sent = list(self._sent), collections.deque()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            if self._loop is not None:
                self._loop.remove_reader(conn.fileno())
            conn.close()
        if proc is not None and proc.is_alive():
            proc.kill()
        for batch in sent:
            answer(batch, CHECK_FAILED)

    def close(self) -> None:
        """Shutting down: every event not verified yet is answered `SHUTTING_DOWN`, and
        later submits at once; the worker is stopped."""
        self._closed = True
        sent, self._sent = list(self._sent), collections.deque()
        waiting, self._pending = self._pending, []
        self._stop_worker()
        for batch in [*sent, waiting]:
            answer(batch, SHUTTING_DOWN)
