"""Issue 46 item 8: a relay set that names one deployment twice (two `engram serve`
processes on one database, or one relay under two URLs). The second node answers a head
it already holds `OK true "duplicate: already have this event"`: that is the write
arriving twice, not a lost race (`engram.replace.is_superseded` tells the two apart), so
the write succeeds. A real lost race stays a conflict (test_cli_mem's barrier proxy)."""

from __future__ import annotations

import json
from typing import Any

from cli_support import Keys, engram_async
from relay_fixtures import RelayProcess


async def mem(keys: Keys, relays: list[str], *args: str) -> Any:
    return await engram_async(
        "mem", *args, "--timeout", "120", env=keys.agent_env(",".join(relays))
    )


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stderr.decode()
    return str(result.stdout.decode())


async def writes_succeed(relays: list[str]) -> None:
    keys = Keys.fresh()
    first = ok(await mem(keys, relays, "set", "notes/x", "one")).strip()
    second = ok(await mem(keys, relays, "set", "notes/x", "two")).strip()
    ok(await mem(keys, relays, "rm", "notes/x", "--reason", "gone"))
    third = ok(await mem(keys, relays, "set", "notes/x", "three")).strip()
    assert ok(await mem(keys, relays, "get", "notes/x")) == "three"
    log = json.loads(ok(await mem(keys, relays, "log", "notes/x", "--json")))
    assert log[0]["id"] == third and len(log) == 4  # three values and the removal
    assert {first, second} <= {v["id"] for v in log}


async def test_two_nodes_of_one_database_are_one_relay_to_a_writer(
    start_relay: Any,
) -> None:
    first: RelayProcess = start_relay()
    second: RelayProcess = start_relay(database_url=first.database_url)
    await writes_succeed([first.url, second.url])


async def test_one_relay_under_two_urls(relay: RelayProcess) -> None:
    await writes_succeed([relay.url, f"ws://localhost:{relay.port}"])
