"""The Python API (`cli.memory.api.AgentMemory`) on real relays of ours."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_support import Keys, shared_relay
from relay_fixtures import RelayProcess

from cli.memory.api import (
    AgentMemory,
    AuthError,
    ConflictError,
    NotFoundError,
    RelayError,
    sha256_hex,
)
from cli.nostr.errors import BadInputError
from cli.nostr.identity import load_identity


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("api-relay")))


def agent(keys: Keys, relays: list[str]) -> AgentMemory:
    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    return AgentMemory(ident, relays, timeout=30)


def owner(keys: Keys, relays: list[str]) -> AgentMemory:
    ident = load_identity(None, None, keys.agent, env={"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()})
    return AgentMemory(ident, relays, timeout=30)


async def test_api_lifecycle_on_one_relay(relay: RelayProcess) -> None:
    keys = Keys.fresh()
    mem = agent(keys, [relay.url])
    written = await mem.set("notes/x", "one\ntwo\n")
    assert written.accepted == (relay.url,) and written.sha256 == sha256_hex("one\ntwo\n")
    entry = await mem.get("mem/notes/x")
    assert (entry.value, entry.event_id) == ("one\ntwo\n", written.event_id)
    assert await mem.hash("notes/x") == entry.sha256
    diff = "--- a\n+++ b\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
    with pytest.raises(ConflictError) as conflict:
        await mem.patch("notes/x", diff, sha256_hex("stale"))
    assert (conflict.value.code, conflict.value.exit_code) == ("conflict", 5)
    patched = await mem.patch("notes/x", diff, entry.sha256)
    assert (await mem.get("notes/x")).value == "one\nTWO\n"
    assert patched.created_at > entry.created_at
    await mem.set("core", "I am a test agent. See [[mem/notes/x]].")
    listing = await mem.ls()
    assert [e.slug for e in listing.entries] == ["mem/notes/x"]
    refs = await mem.refs()
    assert refs.has_core and refs.reachable == ["mem/notes/x"] and refs.orphans == []
    core = await mem.core()
    assert core.status == "profile" and core.profile is not None
    await mem.rm("notes/x")
    with pytest.raises(NotFoundError) as missing:
        await mem.get("notes/x")
    assert (missing.value.code, missing.value.exit_code) == ("not_found", 1)
    reader = owner(keys, [relay.url])
    assert reader.role == "owner"  # writes owner verdicts only (issue 39)
    assert (await reader.get("core")).value.startswith("I am a test agent")
    with pytest.raises(BadInputError):
        await reader.rm("core")  # the owner denies; it never removes
    assert (await agent(Keys.fresh(), [relay.url]).core()).status == "absent"


def test_one_exception_class_per_exit_code() -> None:
    from cli.nostr import errors

    table = {
        errors.BadInputError: ("bad_input", 1),
        errors.NotFoundError: ("not_found", 1),
        errors.RelayError: ("relay", 2),
        errors.AuthError: ("auth", 3),
        errors.AgentMemoryError: ("error", 4),
        errors.ConflictError: ("conflict", 5),
    }
    for cls, (code, exit_code) in table.items():
        assert issubclass(cls, errors.AgentMemoryError)
        assert (cls.code, cls.exit_code) == (code, exit_code)


async def test_api_errors_carry_codes_and_no_secrets() -> None:
    from cli_support import closed_port, fake_relay

    keys = Keys.fresh()
    with pytest.raises(RelayError) as down:
        await agent(keys, [f"ws://127.0.0.1:{closed_port()}"]).get("x")
    assert (down.value.code, down.value.exit_code) == ("relay", 2)

    async def refuse(ws) -> None:  # type: ignore[no-untyped-def]
        await ws.send('["AUTH","c"]')
        async for raw in ws:
            if raw.startswith('["AUTH"'):
                eid = raw.split('"id":"')[1][:64]
                await ws.send(f'["OK","{eid}",false,"restricted: not you"]')

    async with fake_relay(refuse) as url:
        with pytest.raises(AuthError) as refused:
            await agent(keys, [url]).set("x", "secret value")
    assert (refused.value.code, refused.value.exit_code) == ("auth", 3)
    for exc in (down.value, refused.value):
        assert keys.agent_sk.hex() not in str(exc) and "secret value" not in str(exc)
    with pytest.raises(BadInputError) as bad:
        await agent(keys, ["ws://127.0.0.1:1"]).get("Not A Slug")
    assert (bad.value.code, bad.value.exit_code) == ("bad_input", 1)
    with pytest.raises(BadInputError):
        AgentMemory(agent(keys, ["ws://x:1"]).identity, "http://not-a-relay")
