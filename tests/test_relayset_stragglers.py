"""A relay that hangs inside a set costs part of the deadline, not every step's answer."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cli_support import Keys, listening_never_accepting, shared_relay
from relay_fixtures import RelayProcess

from cli.memory.api import AgentMemory
from cli.nostr.identity import load_identity


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("straggler-relay")))


async def test_a_hanging_relay_in_the_set_is_named_and_the_others_answer(
    relay: RelayProcess,
) -> None:
    keys = Keys.fresh()
    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    with listening_never_accepting() as hanging:
        # 6 s: far more than the good relay needs even on a loaded machine (it is waited
        # for up to the deadline in any case); the hanging relay is given half of each
        # step's remaining time, then dropped, so each of the four operations takes ~3 s.
        mem = AgentMemory(ident, [relay.url, hanging], timeout=6)
        written = await mem.set("notes/x", "still written")
        assert written.accepted == (relay.url,)
        assert hanging in written.report.failed or hanging in written.refused
        entry = await mem.get("notes/x")
        assert entry.value == "still written"
        assert entry.report.answered == (relay.url,)
        assert entry.report.failed[hanging] == "timed out"
        listing = await mem.ls()
        assert [e.slug for e in listing.entries] == ["mem/notes/x"]
        assert (await mem.core()).status != "profile"
