"""A long-running recall owner's background work stays off its callers' path (issue 49):
a call made while the cache is being saved does not wait for the save. The save is held
on an event (nothing is timed): the call completes, with the change it brought, while the
save is still held; released, the save notices the index changed while it read it and
saves again, so the file ends up holding everything."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_support import Keys, shared_relay
from relay_fixtures import RelayProcess

from cli.memory.api import AgentMemory
from cli.memory.recall import Recall, RecallSettings
from cli.memory.recall.cache import CacheFile
from cli.memory.recall.index import RecallIndex
from cli.nostr.identity import load_identity

HELD = 30.0  # how long a held save waits for its release at most (the old code: on the
# event loop, the whole process waits that long, and the test fails on the order)


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("recall-background")))


class HeldCache(CacheFile):
    """The real cache file, whose saves first wait for `release` (and say they started)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.started = threading.Event()
        self.release = threading.Event()
        self.saved: list[bool] = []

    def save(self, *args: Any, **kwargs: Any) -> bool:
        self.started.set()
        self.release.wait(HELD)
        done = super().save(*args, **kwargs)
        self.saved.append(bool(done))
        return bool(done)


async def test_a_call_during_a_background_save_does_not_wait_for_it(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = Keys.fresh()
    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    writer = AgentMemory(ident, [relay.url], timeout=60, recall_dir=tmp_path / "writer")
    await writer.set("prefs/coffee", "Takes coffee black, no sugar, two cups before noon.")
    cache_dir = tmp_path / "cache"
    recall = Recall(
        ident, [relay.url], 60, cache_dir=cache_dir, settings=RecallSettings(save_delay=0)
    )
    await recall.recall("coffee", 3)  # the first build, saved by that call
    index = recall.index
    assert index is not None
    held = HeldCache(
        cache_dir, ident.agent, ident.owner, index.embedder.name, ident.conversation_key
    )
    recall.cache = held
    order: list[str] = []

    # a change: the call takes it and leaves a save to the background, which is held
    await writer.set("pets/cat", "The user's cat is called Miso and hates the vacuum.")
    found = await recall.recall("what is the user's cat called?", 3)
    assert found.hits[0].slug == "mem/pets/cat"
    assert await asyncio.to_thread(held.started.wait, HELD)
    order.append("save started")

    # while the save is held: another change, and a call that takes it and answers
    await writer.set("prefs/tea", "Green tea after lunch, never in the evening.")
    found = await recall.recall("which tea does the user drink?", 3)
    order.append("call answered" if not held.release.is_set() and not held.saved else "late")
    assert found.hits[0].slug == "mem/prefs/tea"
    assert order == ["save started", "call answered"]

    # released: the save read an index that changed meanwhile, so it is not renamed in;
    # the next one holds both changes
    held.release.set()
    assert recall._save_task is not None
    await recall._save_task
    assert held.saved == [False, True]
    await recall.close()
    await writer.close()
    again = RecallIndex(index.embedder)
    assert held.load(again) is not None
    assert {"mem/pets/cat", "mem/prefs/tea", "mem/prefs/coffee"} <= set(again.heads)
