"""Wire compatibility: the NIP-AE reference events, published to our relay, read by our CLI.

The vector events were produced by another implementation (block/buzz); if `engram mem`
reads them exactly, our reads interoperate with it.
"""

from __future__ import annotations

import asyncio
import json

from ae_vectors import AE, ae_events
from cli_support import clean_env, engram
from nostr_client import Client

VECTORS = AE


async def publish_vector_events(url: str) -> None:
    async with await Client.connect(url) as c:
        for v in ae_events():
            ok = await c.publish(v)
            assert ok[2] is True, ok


def test_cli_reads_the_nip_ae_vectors(relay_url: str) -> None:
    asyncio.run(publish_vector_events(relay_url))
    inputs, derived = VECTORS["inputs"], VECTORS["derived"]
    env = clean_env(
        ENGRAM_PRIVATE_KEY=inputs["seckey_a"],
        ENGRAM_OWNER=derived["pubkey_o"],
        ENGRAM_RELAY=relay_url,
    )

    note = engram("mem", "get", "mem/notes/2026-05-12", env=env)
    assert (note.returncode, note.stdout) == (0, b"meeting note: [[mem/example]]")

    tombstoned = engram("mem", "get", "mem/example", env=env)
    assert tombstoned.returncode == 1
    assert b"not found" in tombstoned.stderr

    core = engram("mem", "get", "core", env=env)
    expected_profile = VECTORS["expected_state_after_all_events"]["core_profile"]
    assert (core.returncode, core.stdout) == (0, expected_profile.encode())

    listing = engram("mem", "ls", env=env)
    [entry] = VECTORS["expected_state_after_all_events"]["listing"]
    assert listing.returncode == 0
    # plain NIP-AE heads: no trust recorded, no validity (issue 39's columns show "-")
    assert (
        listing.stdout.decode()
        == f"{entry['slug']}\t{entry['event_id']}\t{entry['created_at']}\t-\t-\n"
    )
    [row] = json.loads(engram("mem", "ls", "--json", env=env).stdout)
    assert {k: row[k] for k in entry} == entry
    assert (row["trust"], row["role"], row["ended"]) == (None, "agent", False)

    refs = engram("mem", "refs", "--json", env=env)
    assert refs.returncode == 0
    report = json.loads(refs.stdout)
    assert report["reachable"] == ["mem/notes/2026-05-12"]
    assert report["orphans"] == []
    assert {d["to"] for d in report["dangling"]} == {"mem/example"}
    text = engram("mem", "refs", env=env).stdout.decode()
    assert "dangling\tmem/example" in text

    # the owner (seckey …02) reads the same memory with --agent
    owner_env = clean_env(ENGRAM_PRIVATE_KEY=inputs["seckey_o"], ENGRAM_RELAY=relay_url)
    as_owner = engram("mem", "get", "core", "--agent", derived["pubkey_a"], env=owner_env)
    assert (as_owner.returncode, as_owner.stdout) == (0, expected_profile.encode())
