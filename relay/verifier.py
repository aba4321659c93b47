"""BIP-340 checks beside the event loop: EVENTs of one loop iteration verified as a batch
in a small thread pool, while the loop goes on parsing and answering.

libsecp256k1's Schnorr verification runs in a C call that releases the GIL (cffi), so a
thread verifying a batch overlaps with the loop's Python; the Python around each call
(hex decoding, the key cache) still takes the GIL, once per event. Used only with
`verify_process` off and `verify_threads` above 0: with one EVENT per websocket read, the
GIL hand-offs cost the relay more CPU per EVENT than the thread took off the loop, and
it ingested less (docs/OPERATING.md "Ingest tuning"); the default is the worker process of
`relay.verifyproc`.

Every submitted event gets exactly one verdict, whatever the thread does: True or False
when its signature was checked, else the `error: …` reason it was not (the check raised,
or the relay is shutting down), so that an event never checked is never called invalid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from engram.nip01 import Event, signature_valid_hex
from relay.wire import Reason

log = logging.getLogger("engram.verifier")

# A verdict: True/False (checked), or the `error: …` reason the signature was not checked.
Verdict = bool | str
Done = Callable[[Verdict], None]
CHECK_FAILED = Reason.ERROR("the signature could not be checked; try again")
SHUTTING_DOWN = Reason.ERROR("the relay is shutting down; try again")


class Verifier(Protocol):
    """Where the relay hands EVENTs for their signature check: this module's threads, or
    the worker process of `relay.verifyproc` (the default)."""

    def start(self) -> None: ...

    def submit(self, event: Event, done: Done) -> None: ...

    def close(self) -> None: ...


def verify_all(events: list[Event]) -> list[bool]:
    """The default check of a batch (runs in a verify thread)."""
    return [signature_valid_hex(e) for e in events]


class BatchVerifier:
    """`submit(event, done)`: `done(verdict)` runs on the loop, exactly once per event.

    `check` verifies a batch in a thread (default `verify_all`); what it raises answers
    its batch `CHECK_FAILED`, and `close` answers everything not yet verified.
    """

    def __init__(
        self, threads: int, check: Callable[[list[Event]], list[bool]] = verify_all
    ) -> None:
        self._threads = max(1, threads)
        self._check = check
        self._pool = ThreadPoolExecutor(self._threads, thread_name_prefix="engram-verify")
        self._pending: list[tuple[Event, Done]] = []
        self._running: set[asyncio.Future[list[bool]]] = set()
        self._closed = False

    def start(self) -> None:
        """The threads start with their first batch."""

    def submit(self, event: Event, done: Done) -> None:
        if self._closed:
            done(SHUTTING_DOWN)
            return
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((event, done))

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        if not batch:
            return
        loop = asyncio.get_running_loop()
        step = -(-len(batch) // self._threads)
        for i in range(0, len(batch), step):
            part = batch[i : i + step]
            try:
                future = loop.run_in_executor(self._pool, self._check, [e for e, _ in part])
            except RuntimeError:  # the pool is shut down
                answer(part, SHUTTING_DOWN)
                continue
            self._running.add(future)
            future.add_done_callback(lambda f, part=part: self._deliver(part, f))

    def _deliver(self, part: list[tuple[Event, Done]], future: asyncio.Future[list[bool]]) -> None:
        self._running.discard(future)
        if future.cancelled():
            answer(part, SHUTTING_DOWN)
            return
        exc = future.exception()
        results = None if exc is not None else future.result()
        if results is None or len(results) != len(part):
            log.error("signature check of %d events failed: %r", len(part), exc or results)
            answer(part, CHECK_FAILED)
            return
        deliver(part, results)

    def close(self) -> None:
        """Shutting down: every event not verified yet is answered `SHUTTING_DOWN` (those
        in a thread now too: its late result is dropped), and later submits at once."""
        self._closed = True
        waiting, self._pending = self._pending, []
        for future in list(self._running):
            future.cancel()  # its _deliver answers SHUTTING_DOWN
        self._pool.shutdown(wait=False, cancel_futures=True)
        answer(waiting, SHUTTING_DOWN)


def deliver(part: list[tuple[Event, Done]], verdicts: list[bool]) -> None:
    """Each event of `part` its verdict (the threads' and the worker process's)."""
    for (_, done), ok in zip(part, verdicts, strict=True):
        _call(done, ok)


def answer(part: list[tuple[Event, Done]], verdict: str) -> None:
    """Every event of `part` the same `error: …` reason: not checked."""
    for _, done in part:
        _call(done, verdict)


def _call(done: Done, verdict: Verdict) -> None:
    try:
        done(verdict)
    except Exception:  # one answer's failure must not leave the others unanswered
        log.exception("verdict callback failed")
