"""The signature worker process (relay.verifyproc): every EVENT gets exactly one OK
whatever the worker does (killed mid-batch, silent past its deadline, the relay closing),
`error: …` for an event that was not checked and never `invalid:`, the in-flight count
back to zero, and the relay goes on checking with a new worker."""

from __future__ import annotations

import asyncio
import os
import signal
from collections import Counter

import msgspec
from test_ingest_failures import SK, Client, MakeEvent, answered_all, checked_as_usual, notes

from engram.nip01 import sign_event
from relay.config import Settings
from relay.pipeline import Relay
from relay.store.postgres import PostgresStore
from relay.verifier import CHECK_FAILED, SHUTTING_DOWN
from relay.verifyproc import BATCH_MAX, ProcessVerifier, check_packed


def test_check_packed_gives_one_verdict_per_record() -> None:
    good = [sign_event(SK, 1, 1, [], f"n{i}", bytes(32)) for i in range(3)]
    last = good[0].sig[-1]
    forged = msgspec.structs.replace(good[0], sig=good[0].sig[:-1] + ("1" if last != "1" else "2"))
    not_hex = msgspec.structs.replace(good[1], sig="zz" * 64)
    not_a_key = msgspec.structs.replace(good[2], pubkey="f" * 64)  # not on the curve
    records = [*good, forged, not_hex, not_a_key]
    data = "".join(e.pubkey + e.sig + e.id for e in records).encode()
    assert list(check_packed(data)) == [1, 1, 1, 0, 0, 0]
    assert check_packed(b"") == b""


def _worker_pid(relay: Relay) -> int:
    verifier = relay.ingest.verifier
    assert isinstance(verifier, ProcessVerifier) and verifier._proc is not None
    return verifier._proc.pid


def _started(
    store: PostgresStore, verifier: ProcessVerifier | None = None
) -> tuple[Relay, Client, int]:
    """A relay as the app starts it (its worker up), a connection, the worker's pid."""
    relay = Relay(Settings(), store, verifier=verifier)
    relay.start()
    return relay, Client(relay), _worker_pid(relay)


async def test_the_default_relay_checks_in_a_worker_process(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay, c, pid = _started(store)
    assert pid != os.getpid()
    await checked_as_usual(c, make_event, "good", 3 * BATCH_MAX)  # more than one batch
    relay.close()


async def test_a_killed_worker_answers_its_batches_error_and_is_replaced(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay, c, first = _started(store)
    os.kill(first, signal.SIGSTOP)  # the batches below wait in the worker
    held = notes(make_event, 30, "held")
    c.publish(*held)
    await asyncio.sleep(0.2)
    os.kill(first, signal.SIGKILL)
    await answered_all(c, held, (False, CHECK_FAILED))
    after = await checked_as_usual(c, make_event, "after")
    assert _worker_pid(relay) != first
    assert Counter(f[1] for f in c.frames if f[0] == "OK") == Counter(e.id for e in [*held, *after])
    relay.close()


async def test_a_silent_worker_misses_its_deadline_and_is_replaced(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay, c, first = _started(store, ProcessVerifier(deadline=0.5))
    os.kill(first, signal.SIGSTOP)  # alive, never answers
    held = notes(make_event, 10, "silent")
    c.publish(*held)
    await answered_all(c, held, (False, CHECK_FAILED))
    await checked_as_usual(c, make_event, "after the deadline")
    assert _worker_pid(relay) != first
    relay.close()


async def test_close_answers_every_event_not_yet_checked(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay, c, pid = _started(store)
    os.kill(pid, signal.SIGSTOP)
    in_worker = notes(make_event, 2 * BATCH_MAX, "in the worker")
    c.publish(*in_worker)
    await asyncio.sleep(0)  # two batches sent: these wait here
    waiting = notes(make_event, 5, "waiting")
    c.publish(*waiting)
    relay.close()
    await answered_all(c, [*in_worker, *waiting], (False, SHUTTING_DOWN))
    late = make_event(SK, content="after close")
    c.publish(late)
    await answered_all(c, [late], (False, SHUTTING_DOWN))
    assert Counter(f[1] for f in c.frames if f[0] == "OK") == Counter(
        e.id for e in [*in_worker, *waiting, late]
    )
    for _ in range(100):  # the stopped worker was killed, not left behind
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        if _is_zombie(pid):
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError("the worker outlived the relay")


def _is_zombie(pid: int) -> bool:
    """Exited and not yet reaped, or gone (reaped between the caller's check and here:
    reading /proc/PID then fails with ESRCH, not ENOENT)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True
