"""Recall beside a relay that sends junk (issue 46, item 2): every event a relay returns is
hostile input. A stand-in relay answers each REQ for the agent's heads with the honest
events it holds plus junk (an id that is not hex, an id that does not match the content,
a signature that does not verify, a negative and an absurd created_at, an oversize
content), beside one of our relays. Recall keeps working, run after run and call after
call, the junk is counted in the report, and none of it reaches the cache (so none of it
is offered to NIP-77 later).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from cli_support import Keys, engram_async, fake_relay, shared_relay
from relay_fixtures import RelayProcess
from websockets.asyncio.server import ServerConnection

from cli.memory.api import AgentMemory
from cli.memory.recall.cache import CacheFile
from cli.memory.recall.index import RecallIndex
from cli.nostr.identity import load_identity
from engram import Memory, build_event, d_tag
from engram.nip01 import Event, event_id, pubkey_of, sign_event
from engram.nip44 import PAYLOAD_MAX_CHARS, conversation_key

FACTS = {
    "prefs/editor-go": "The user writes Go in Neovim with gopls; VS Code only for notebooks.",
    "prefs/coffee": "Takes coffee black, no sugar, two cups before noon.",
    "projects/atlas": "Project Atlas ships the billing rewrite; deadline is 2025-03-14.",
}
ROSES = "The user grows climbing roses on the balcony."  # only the junk relay holds it


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("recall-hostile")))


def _signed(seckey: bytes, created_at: int, tags: list[list[str]], content: str) -> Event:
    return sign_event(seckey, created_at, 30174, tags, content, os.urandom(32))


def junk_events(keys: Keys, honest: Event) -> dict[str, Event]:
    """One event per way of being invalid, each shaped like one of the agent's heads."""
    agent = keys.agent
    tags = [["d", d_tag(conversation_key(keys.agent_sk, keys.owner), "mem/junk")]]
    tags.append(["p", keys.owner])
    now = int(time.time())
    stranger = os.urandom(32)
    content = honest.content
    good_id = event_id(agent, now, 30174, tags, content)
    return {
        "id not hex": Event(
            id="zz" * 32, pubkey=agent, created_at=now, kind=30174, tags=tags,
            content=content, sig="00" * 64,
        ),
        "id not the content's": Event(
            id=honest.id, pubkey=agent, created_at=honest.created_at, kind=30174,
            tags=honest.tags, content=content[:-8] + "AAAAAAA=", sig=honest.sig,
        ),
        "signature wrong": Event(
            id=good_id, pubkey=agent, created_at=now, kind=30174, tags=tags,
            content=content, sig="11" * 64,
        ),
        "negative created_at": _signed(stranger, -5, tags, content),
        "absurd created_at": _signed(stranger, 2**40, tags, content),
        "oversize": _signed(stranger, now, tags, "A" * (PAYLOAD_MAX_CHARS + 4)),
    }  # fmt: skip


class JunkRelay:
    """Answers every REQ naming kind 30174 with `honest` and `junk`, anything else with
    nothing (EOSE); publishes no NIP-11 document, so it is read with REQ."""

    def __init__(self, honest: list[Event], junk: list[Event]) -> None:
        self.honest = honest
        self.junk = junk
        self.reqs = 0

    async def __call__(self, ws: ServerConnection) -> None:
        async for raw in ws:
            msg = msgspec.json.decode(raw)
            if not isinstance(msg, list) or msg[:1] != ["REQ"]:
                continue
            sub, filters = msg[1], msg[2:]
            if any(30174 in f.get("kinds", []) and "ids" not in f for f in filters):
                self.reqs += 1
                for event in [*self.junk, *self.honest]:
                    await ws.send(msgspec.json.encode(["EVENT", sub, event]).decode())
            await ws.send(json.dumps(["EOSE", sub]))


def api(keys: Keys, urls: list[str], cache: Path) -> AgentMemory:
    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    return AgentMemory(ident, urls, timeout=60, recall_dir=cache)


def cached_ids(keys: Keys, cache: Path) -> tuple[set[str], dict[str, int]]:
    """What the cache file holds: the heads' event ids, and the seen events (id -> time)."""
    from cli.memory.recall.dense import load

    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    index = RecallIndex(load())
    file = CacheFile(cache, ident.agent, ident.owner, index.embedder.name, ident.conversation_key)
    payload = file.load(index)
    assert payload is not None
    blob = payload.seen_ids
    return set(payload.ids), {
        blob[32 * i : 32 * i + 32].hex(): at for i, at in enumerate(payload.seen_at)
    }


async def test_junk_from_one_relay_is_skipped_counted_and_never_cached(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = Keys.fresh()
    writer = api(keys, [relay.url], tmp_path / "writer")
    for slug, value in FACTS.items():
        await writer.set(slug, value)
    roses = build_event(
        keys.agent_sk, keys.owner, Memory(slug="mem/garden/roses", value=ROSES),
        int(time.time()), os.urandom(32), os.urandom(32),
    )  # fmt: skip
    junk = junk_events(keys, roses)
    stand_in = JunkRelay([roses], list(junk.values()))
    data = tmp_path / "data"
    async with fake_relay(stand_in) as junk_url:
        env = keys.agent_env(f"{relay.url},{junk_url}", XDG_DATA_HOME=str(data))
        # positive: every run answers, with the honest relay's memories and the junk
        # relay's honest one; negative twin: nothing of the junk is ranked
        for run in range(3):
            out = await engram_async(
                "mem", "recall", "which flowers does the user grow?", "--json", env=env
            )
            assert out.returncode == 0, (run, out.stderr.decode())
            rows = json.loads(out.stdout)
            assert rows[0]["slug"] == "mem/garden/roses" and rows[0]["event_id"] == roses.id
            assert {r["slug"] for r in rows} == {"mem/garden/roses", *(f"mem/{s}" for s in FACTS)}
            report = json.loads(out.stderr.decode().strip().splitlines()[-1])["report"]
            assert sum(report["skipped"].values()) >= len(junk) - 1, report
            assert {"bad id", "bad created_at", "oversize", "bad signature"} <= set(
                report["skipped"]
            ), report
        assert stand_in.reqs >= 3
        # the cache holds only honest events: no junk id, no time out of range
        heads, seen = cached_ids(keys, data / "engram-relay" / "recall")
        junk_ids = {e.id for name, e in junk.items() if name != "id not the content's"}
        assert not (heads | set(seen)) & junk_ids
        assert roses.id in heads
        assert all(0 <= at <= time.time() + 86_400 for at in seen.values())
        # a long-running owner (the API object, as MCP holds it): call after call
        mem = api(keys, [relay.url, junk_url], tmp_path / "api")
        for _ in range(3):
            found = await mem.recall("how does the user take coffee?", limit=2)
            assert found.hits[0].slug == "mem/prefs/coffee"
            assert found.report.skipped_total >= len(junk) - 1  # a tampered copy of a
            # head already taken is the same event again: nothing is taken from it
        assert stand_in.reqs >= 6
        await mem.close()
    # the honest relay alone, after: the cache the junk run left still works
    alone = await engram_async(
        "mem", "recall", "coffee", "--json", env=keys.agent_env(relay.url, XDG_DATA_HOME=str(data))
    )
    assert alone.returncode == 0, alone.stderr.decode()
    assert json.loads(alone.stdout)[0]["slug"] == "mem/prefs/coffee"


def test_the_junk_is_what_it_claims() -> None:
    """Control: each junk event fails exactly the check it is named for (and the honest
    one passes), so the test above exercises every rule."""
    from engram.nip01 import id_matches, is_hex, verify_event

    keys = Keys.fresh()
    honest = build_event(
        keys.agent_sk, keys.owner, Memory(slug="mem/garden/roses", value=ROSES),
        int(time.time()), os.urandom(32), os.urandom(32),
    )  # fmt: skip
    assert verify_event(honest)
    junk = junk_events(keys, honest)
    assert not is_hex(junk["id not hex"].id, 64)
    assert not id_matches(junk["id not the content's"])
    assert id_matches(junk["signature wrong"]) and not verify_event(junk["signature wrong"])
    for name in ("negative created_at", "absurd created_at", "oversize"):
        assert verify_event(junk[name]), name
    assert junk["negative created_at"].created_at < 0
    assert junk["absurd created_at"].created_at > time.time() + 10 * 365 * 86_400
    assert len(junk["oversize"].content) > PAYLOAD_MAX_CHARS
    assert pubkey_of(keys.agent_sk) == honest.pubkey
