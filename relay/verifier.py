"""BIP-340 checks beside the event loop: EVENTs of one loop iteration verified as a batch
in a small thread pool, while the loop goes on parsing and answering.

libsecp256k1's Schnorr verification runs in a C call that releases the GIL (cffi), so a
thread verifying a batch overlaps with the loop's Python; the Python around each call
(hex decoding, the key cache) still takes the GIL. `verify_threads` (default 1; 0 verifies
inline): measured, the event loop's own CPU per EVENT halved and the relay's total
fell slightly, so the loop is no longer the bottleneck where a core is free.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from engram.nip01 import Event, signature_valid_hex


def _verify_all(events: list[Event]) -> list[bool]:
    return [signature_valid_hex(e) for e in events]


class BatchVerifier:
    """`submit(event, done)`: `done(valid)` runs on the loop once the batch is verified."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="engram-verify")
        self._pending: list[tuple[Event, Callable[[bool], None]]] = []

    def submit(self, event: Event, done: Callable[[bool], None]) -> None:
        if not self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        self._pending.append((event, done))

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        loop = asyncio.get_running_loop()
        step = -(-len(batch) // self._threads)
        for i in range(0, len(batch), step):
            part = batch[i : i + step]
            future = loop.run_in_executor(self._pool, _verify_all, [e for e, _ in part])
            future.add_done_callback(lambda f, part=part: _deliver(part, f))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _deliver(part: list[tuple[Event, Callable[[bool], None]]], future: asyncio.Future) -> None:
    results = future.result() if not future.cancelled() else [False] * len(part)
    for (_, done), ok in zip(part, results, strict=True):
        done(ok)
