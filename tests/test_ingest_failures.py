"""Every EVENT gets exactly one OK, whatever fails on its way: the signature check in the
verify thread (it raises, or the relay shuts down under it) and the store writer's step
after a commit. A real `Relay` and `PostgresStore` on a real PostgreSQL; the failure is
injected where the code takes it as a parameter (the verifier's check, the store's
replica set), never by patching internals."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import msgspec
import pytest

from engram.nip01 import Event
from relay.config import Settings
from relay.pipeline import Relay
from relay.session import Session
from relay.store import SaveStatus
from relay.store.postgres import PostgresStore
from relay.store.replicas import ReplicaSet
from relay.verifier import CHECK_FAILED, SHUTTING_DOWN, BatchVerifier, verify_all

SK = bytes([7]) * 32
MakeEvent = Callable[..., Event]


class Client:
    """One connection as the transport presents it to the relay: a Session whose frames
    are collected here."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay
        self.frames: list[list[Any]] = []
        self._arrived = asyncio.Event()

        async def send_wait(frame: bytes) -> None:
            self._send(frame)

        def offer(frame: bytes) -> bool:
            self._send(frame)
            return True

        self.session = Session(
            "challenge", "localhost", self._send, send_wait, offer, relay.tenants.default
        )

    def _send(self, frame: bytes) -> None:
        self.frames.append(msgspec.json.decode(frame))
        self._arrived.set()

    def publish(self, *events: Event) -> None:
        """EVENT frames handled in one loop iteration (so verified as one batch)."""
        for e in events:
            assert self.relay.handle(self.session, msgspec.json.encode(["EVENT", e])) is None

    def oks(self) -> dict[str, list[Any]]:
        return {f[1]: f for f in self.frames if f[0] == "OK"}

    async def until_answered(self, events: list[Event]) -> dict[str, list[Any]]:
        ids = {e.id for e in events}
        while not ids <= self.oks().keys():
            self._arrived.clear()
            await asyncio.wait_for(self._arrived.wait(), 60)
        return {i: f for i, f in self.oks().items() if i in ids}


def notes(make_event: MakeEvent, n: int, content: str) -> list[Event]:
    return [make_event(SK, content=f"{content} {i}") for i in range(n)]


async def answered_all(c: Client, events: list[Event], verdict: tuple[bool, str]) -> None:
    """Every one of `events` answered `verdict` (OK's accepted flag and message), and the
    connection's in-flight count back to zero."""
    oks = await c.until_answered(events)
    assert {tuple(ok[2:]) for ok in oks.values()} == {verdict}
    assert c.session.in_flight == 0


async def checked_as_usual(
    c: Client, make_event: MakeEvent, label: str, n: int = 20
) -> list[Event]:
    """`n` notes and a forged one, published (after a failure): each checked, stored and
    answered as usual. Returns them all."""
    good = notes(make_event, n, label)
    forged = msgspec.structs.replace(make_event(SK, content=f"forged {label}"), sig="0" * 128)
    c.publish(*good, forged)
    oks = await c.until_answered([*good, forged])
    assert all(oks[e.id][2:] == [True, ""] for e in good)
    assert oks[forged.id][2:] == [False, "invalid: signature verification failed"]
    assert c.session.in_flight == 0
    return [*good, forged]


async def test_a_check_that_raises_answers_error_never_invalid(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    def check(events: list[Event]) -> list[bool]:
        if any(e.content.startswith("boom") for e in events):
            raise RuntimeError("the verification library failed")
        return verify_all(events)

    relay = Relay(Settings(), store, verifier=BatchVerifier(1, check))
    c = Client(relay)
    boom = notes(make_event, 20, "boom")
    c.publish(*boom)
    await answered_all(c, boom, (False, CHECK_FAILED))
    assert CHECK_FAILED.startswith("error: ")
    # the verifier goes on: the next batch is checked, stored and answered
    after = await checked_as_usual(c, make_event, "good")
    assert Counter(f[1] for f in c.frames if f[0] == "OK") == Counter(e.id for e in [*boom, *after])
    relay.close()


async def test_shutdown_answers_every_event_not_yet_checked(
    store: PostgresStore, make_event: MakeEvent
) -> None:
    entered, release = threading.Event(), threading.Event()

    def check(events: list[Event]) -> list[bool]:
        entered.set()
        release.wait(60)  # the first batch holds the only verify thread
        return verify_all(events)

    others = set(threading.enumerate())
    relay = Relay(Settings(), store, verifier=BatchVerifier(1, check))
    c = Client(relay)
    in_thread = notes(make_event, 5, "in the thread")
    c.publish(*in_thread)
    assert await asyncio.to_thread(entered.wait, 60)
    queued = notes(make_event, 5, "queued for the thread")
    c.publish(*queued)
    await asyncio.sleep(0)  # handed to the pool (behind the batch it runs)
    not_flushed = notes(make_event, 3, "not handed over yet")
    c.publish(*not_flushed)
    relay.close()
    everything = [*in_thread, *queued, *not_flushed]
    oks = await c.until_answered(everything)
    assert {tuple(ok[2:]) for ok in oks.values()} == {(False, SHUTTING_DOWN)}
    assert SHUTTING_DOWN.startswith("error: ")
    assert c.session.in_flight == 0
    late = make_event(SK, content="after close")
    c.publish(late)
    assert (await c.until_answered([late]))[late.id][2:] == [False, SHUTTING_DOWN]
    # the thread's late result for its batch is dropped: still exactly one OK each
    release.set()
    for t in set(threading.enumerate()) - others:  # the relay's verify thread ends
        if t.name.startswith("engram-verify"):
            await asyncio.to_thread(t.join, 60)
            assert not t.is_alive()
    for _ in range(3):
        await asyncio.sleep(0)
    assert Counter(f[1] for f in c.frames if f[0] == "OK") == Counter(
        e.id for e in [*everything, late]
    )
    assert c.session.in_flight == 0


# --- the store writer's replica position call ---------------------------------------


class BrokenPosition(ReplicaSet):
    """Read replicas (none here) whose position call, made by the store writer after
    every commit, fails as `fail` does."""

    def __init__(self, fail: Callable[[], Awaitable[None]]) -> None:
        super().__init__([], Settings(), primary=None)  # type: ignore[arg-type]
        self.fail = fail

    async def note_position(self) -> None:
        await self.fail()


def raw(e: Event) -> bytes:
    return msgspec.json.encode(e)


async def stored_count(database_url: str) -> int:
    conn = await asyncpg.connect(database_url)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM events"))
    finally:
        await conn.close()


async def test_a_failing_position_call_still_answers_every_event(
    database_url: str, make_event: MakeEvent
) -> None:
    async def fail() -> None:
        raise RuntimeError("the position read failed")

    store = await PostgresStore.open(database_url, Settings(write_batch_max=5))
    try:
        store.replicas = BrokenPosition(fail)
        events = notes(make_event, 20, "position fails")
        saves = asyncio.gather(*(store.save(e, raw(e)) for e in events))
        results = await asyncio.wait_for(saves, 60)
        # committed before the call failed: stored, and answered so
        assert {r.status for r in results} == {SaveStatus.STORED}
        assert await stored_count(database_url) == 20
        # the writer lives on
        more = make_event(SK, content="after the failure")
        assert (await asyncio.wait_for(store.save(more, raw(more)), 60)).status is (
            SaveStatus.STORED
        )
    finally:
        await store.close()


async def test_cancelled_in_the_position_call_still_answers_every_event(
    database_url: str, make_event: MakeEvent
) -> None:
    entered = asyncio.Event()

    async def hang() -> None:
        entered.set()
        await asyncio.Event().wait()  # until cancelled

    store = await PostgresStore.open(database_url, Settings(write_batch_max=5, write_concurrency=1))
    store.replicas = BrokenPosition(hang)
    events = notes(make_event, 20, "cancelled")
    saves = asyncio.gather(*(store.save(e, raw(e)) for e in events))
    await asyncio.wait_for(entered.wait(), 60)  # the first batch committed, then the call
    closing = asyncio.create_task(store.close())  # waits for the writer...
    await asyncio.sleep(0)
    closing.cancel()  # ...and is cancelled: so is the writer, inside the call
    with pytest.raises(asyncio.CancelledError):
        await closing
    results = await asyncio.wait_for(saves, 60)
    statuses = [r.status for r in results]
    assert statuses == [SaveStatus.STORED] * 5 + [SaveStatus.ERROR] * 15
    assert {r.message for r in results[5:]} == {"error: the store is closed"}
    assert await stored_count(database_url) == 5
    await store.close()  # the writer is gone: closing completes
