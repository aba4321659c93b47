"""The fetch hook's three outcomes, each proven against a real relay or a real socket:
core present -> Profile; relay empty -> Nudge; anything that is not a successful read
(down, hanging, corrupt core, refused AUTH or read) -> Nothing, within the timeout."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import msgspec
import pytest
from cli_support import (
    Keys,
    closed_port,
    corrupt_core,
    fake_relay,
    listening_never_accepting,
    publish,
    shared_relay,
    silent_relay,
)
from relay_fixtures import RelayProcess

from cli.memory.hook import HEADER, NUDGE, Nothing, Nudge, Profile, fetch_core
from cli.nostr.identity import load_identity
from engram import Core, build_event

# Outer bounds for a loaded machine: they catch a hang; which deadline ended a read is
# asserted from its reason, never from how fast it ran.
BOUND = 30.0
LONG = 60.0


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("hook-relay")))


def identity(keys: Keys):  # type: ignore[no-untyped-def]
    return load_identity(
        None,
        None,
        None,
        env={
            "ENGRAM_PRIVATE_KEY": keys.agent_sk.hex(),
            "ENGRAM_OWNER": keys.owner,
        },
    )


async def test_core_present_gives_the_profile(relay: RelayProcess) -> None:
    keys = Keys.fresh()
    profile = "I am the test agent; my user is Ada. See [[mem/projects]]."
    event = build_event(
        keys.agent_sk, keys.owner, Core(profile), int(time.time()), os.urandom(32), os.urandom(32)
    )
    await publish(relay.url, event)
    result = await fetch_core(identity(keys), relay.url)
    assert result == Profile(profile)
    assert result.text is not None
    assert result.text.startswith(HEADER + "\n\n" + profile)


async def test_relay_empty_gives_the_nudge(relay: RelayProcess) -> None:
    result = await fetch_core(identity(Keys.fresh()), relay.url)
    assert isinstance(result, Nudge)
    assert result.text == NUDGE
    assert 'engram mem set core "' in NUDGE and "ask your user" in NUDGE


async def test_corrupt_core_gives_nothing(relay: RelayProcess) -> None:
    keys = Keys.fresh()
    await publish(relay.url, corrupt_core(keys))
    result = await fetch_core(identity(keys), relay.url)
    assert isinstance(result, Nothing), result
    assert result.text is None
    assert "failed validation" in result.reason


async def test_relay_down_gives_nothing_quickly() -> None:
    # A refused connection answers at once: with a long deadline, returning well inside it
    # shows the hook did not wait for the deadline (the margin absorbs a loaded machine).
    start = time.monotonic()
    url = f"ws://127.0.0.1:{closed_port()}"
    result = await fetch_core(identity(Keys.fresh()), url, timeout=LONG)
    assert isinstance(result, Nothing) and result.text is None
    assert "within" not in result.reason, result.reason
    assert time.monotonic() - start < LONG / 2


@pytest.mark.parametrize("timeout", [0.5, 3.0])
async def test_relay_hanging_gives_nothing_at_the_deadline(timeout: float) -> None:
    with listening_never_accepting() as url:
        start = time.monotonic()
        result = await fetch_core(identity(Keys.fresh()), url, timeout=timeout)
        elapsed = time.monotonic() - start
    assert isinstance(result, Nothing)
    assert f"within {timeout:g} s" in result.reason  # it was this deadline that ended it
    assert timeout - 0.05 <= elapsed  # not before the deadline...
    assert elapsed < BOUND  # ...and not hanging (an outer bound, not a speed claim)


async def test_relay_silent_after_handshake_gives_nothing() -> None:
    async with fake_relay(silent_relay) as url:
        start = time.monotonic()
        result = await fetch_core(identity(Keys.fresh()), url, timeout=0.5)
        assert time.monotonic() - start < BOUND
    assert isinstance(result, Nothing)
    assert "within 0.5 s" in result.reason, result.reason  # the deadline ended it


async def _refuse_auth(ws) -> None:  # type: ignore[no-untyped-def]
    await ws.send('["AUTH","challenge"]')
    async for raw in ws:
        msg = msgspec.json.decode(raw)
        if msg[0] == "AUTH":
            await ws.send(msgspec.json.encode(["OK", msg[1]["id"], False, "restricted: no"]))


async def _close_every_req(ws) -> None:  # type: ignore[no-untyped-def]
    await ws.send('["AUTH","challenge"]')
    async for raw in ws:
        msg = msgspec.json.decode(raw)
        if msg[0] == "AUTH":
            await ws.send(msgspec.json.encode(["OK", msg[1]["id"], True, ""]))
        elif msg[0] == "REQ":
            await ws.send(msgspec.json.encode(["CLOSED", msg[1], "auth-required: who?"]))


@pytest.mark.parametrize("handler", [_refuse_auth, _close_every_req])
async def test_refused_reads_give_nothing_not_the_nudge(handler) -> None:  # type: ignore[no-untyped-def]
    async with fake_relay(handler) as url:
        result = await fetch_core(identity(Keys.fresh()), url, timeout=2.0)
    assert isinstance(result, Nothing), result
