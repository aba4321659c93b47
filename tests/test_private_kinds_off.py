"""What the docs tell an operator whose users' clients never answer NIP-42 (issue 46): by
default a direct message is served to no connection that has not AUTHed, only `CLOSED
auth-required:`; `ENGRAM_LIMITS_PRIVATE_KINDS=` (set and empty) or `private_kinds = []`
under `[limits]` in the TOML file turns the private kinds off, and DMs are then served to
anyone, while agent memory (kind 30174) stays gated whatever the setting says."""

from __future__ import annotations

import time

import pytest
from nostr_client import Client

from engram.nip01 import pubkey_of, sign_event

SENDER, RECIPIENT = (0x46D0_0000 + 1).to_bytes(32, "big"), (0x46D0_0000 + 2).to_bytes(32, "big")


async def dm_read_without_auth(url: str) -> tuple[list[dict], list]:
    """Publish a kind-4 DM, then ask for it by id as a client that never AUTHs."""
    dm = sign_event(SENDER, int(time.time()), 4, [["p", pubkey_of(RECIPIENT)]], "x?iv=y", bytes(32))
    async with await Client.connect(url) as c:
        assert (await c.publish(dm))[2] is True  # publishing is never restricted
        events, end = await c.req("dm", {"kinds": [4], "ids": [dm.id]})
        assert [e["id"] for e in events] in ([], [dm.id])
        return events, end


async def test_a_client_without_nip42_gets_auth_required_by_default(start_relay) -> None:
    events, end = await dm_read_without_auth(start_relay().url)
    assert events == [] and end[0] == "CLOSED" and end[2].startswith("auth-required:"), end


@pytest.mark.parametrize("how", ["env", "toml"])
async def test_private_kinds_off_serves_dms_to_anyone(start_relay, tmp_path, how: str) -> None:
    if how == "env":
        relay = start_relay(env={"ENGRAM_LIMITS_PRIVATE_KINDS": ""})
    else:
        conf = tmp_path / "relay.toml"
        conf.write_text("[limits]\nprivate_kinds = []\n")
        relay = start_relay(args=("--config", str(conf)))
    events, end = await dm_read_without_auth(relay.url)
    assert len(events) == 1 and end[0] == "EOSE", end
    async with await Client.connect(relay.url) as c:  # engrams are not a private kind
        _, end = await c.req("m", {"kinds": [30174]})
        assert end[0] == "CLOSED" and end[2].startswith("auth-required:"), end
