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
from test_ingest_failures import SK, Client, MakeEvent, notes

from engram.nip01 import sign_event
from relay.config import Settings
from relay.pipeline import Relay
from relay.store.postgres import PostgresStore
from relay.verifier import CHECK_FAILED, SHUTTING_DOWN
from relay.verifyproc import BATCH_MAX, ProcessVerifier, check_packed

FORGED = "invalid: signature verification failed"


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


async def test_the_default_relay_checks_in_a_worker_process(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay = Relay(Settings(), store)
    relay.start()
    assert _worker_pid(relay) != os.getpid()
    c = Client(relay)
    good = notes(make_event, 3 * BATCH_MAX, "good")  # more than one batch
    forged = msgspec.structs.replace(make_event(SK, content="forged"), sig="0" * 128)
    c.publish(*good, forged)
    oks = await c.until_answered([*good, forged])
    assert all(oks[e.id][2:] == [True, ""] for e in good)
    assert oks[forged.id][2:] == [False, FORGED]
    assert c.session.in_flight == 0
    relay.close()


async def test_a_killed_worker_answers_its_batches_error_and_is_replaced(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay = Relay(Settings(), store)
    relay.start()
    c = Client(relay)
    first = _worker_pid(relay)
    os.kill(first, signal.SIGSTOP)  # the batches below wait in the worker
    held = notes(make_event, 30, "held")
    c.publish(*held)
    await asyncio.sleep(0.2)
    os.kill(first, signal.SIGKILL)
    oks = await c.until_answered(held)
    assert {tuple(ok[2:]) for ok in oks.values()} == {(False, CHECK_FAILED)}
    assert CHECK_FAILED.startswith("error: ")
    assert c.session.in_flight == 0
    after = notes(make_event, 30, "after")
    forged = msgspec.structs.replace(make_event(SK, content="forged after"), sig="0" * 128)
    c.publish(*after, forged)
    oks = await c.until_answered([*after, forged])
    assert all(oks[e.id][2:] == [True, ""] for e in after)
    assert oks[forged.id][2:] == [False, FORGED]
    assert _worker_pid(relay) != first
    assert Counter(f[1] for f in c.frames if f[0] == "OK") == Counter(
        e.id for e in [*held, *after, forged]
    )
    assert c.session.in_flight == 0
    relay.close()


async def test_a_silent_worker_misses_its_deadline_and_is_replaced(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay = Relay(Settings(), store, verifier=ProcessVerifier(deadline=0.5))
    relay.start()
    c = Client(relay)
    first = _worker_pid(relay)
    os.kill(first, signal.SIGSTOP)  # alive, never answers
    held = notes(make_event, 10, "silent")
    c.publish(*held)
    oks = await c.until_answered(held)
    assert {tuple(ok[2:]) for ok in oks.values()} == {(False, CHECK_FAILED)}
    after = notes(make_event, 10, "after the deadline")
    c.publish(*after)
    oks = await c.until_answered(after)
    assert all(oks[e.id][2:] == [True, ""] for e in after)
    assert _worker_pid(relay) != first
    assert c.session.in_flight == 0
    relay.close()


async def test_close_answers_every_event_not_yet_checked(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    relay = Relay(Settings(), store)
    relay.start()
    c = Client(relay)
    pid = _worker_pid(relay)
    os.kill(pid, signal.SIGSTOP)
    in_worker = notes(make_event, 2 * BATCH_MAX, "in the worker")
    c.publish(*in_worker)
    await asyncio.sleep(0)  # two batches sent: these wait here
    waiting = notes(make_event, 5, "waiting")
    c.publish(*waiting)
    relay.close()
    oks = await c.until_answered([*in_worker, *waiting])
    assert {tuple(ok[2:]) for ok in oks.values()} == {(False, SHUTTING_DOWN)}
    late = make_event(SK, content="after close")
    c.publish(late)
    assert (await c.until_answered([late]))[late.id][2:] == [False, SHUTTING_DOWN]
    assert c.session.in_flight == 0
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
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True
