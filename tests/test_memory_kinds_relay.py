"""Our relay treats the history kinds (revisions 4174, owner verdicts 4175) exactly as it
treats engrams (30174), whatever `private_kinds` says: the ingest envelope check, the
private read gate (REQ, COUNT, NIP-77, live fan-out), served to author and `p` only.

The relay runs with `private_kinds = [7]` (none of the defaults): the memory kinds stay
private, while kind 4 (a direct message by default) becomes public. No test waits for
silence: a public marker published after a private event shows a live subscription is
past it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from cli_support import Keys, shared_relay
from negentropy_support import neg_reply, reconcile
from nostr_client import Client
from relay_fixtures import RelayProcess

from cli.memory.api import AgentMemory
from cli.nostr.identity import load_identity
from engram import KIND_REVISION, KIND_VERDICT
from engram.negentropy import Items, Negentropy
from engram.nip01 import Event, pubkey_of, sign_event

EMPTY = Negentropy(Items.from_pairs([])).initiate().hex()


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    env = {"ENGRAM_LIMITS_PRIVATE_KINDS": "7"}
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("kinds-relay")), env)


def ev(sk: bytes, kind: int, tags: list[list[str]], content: str = "") -> Event:
    return sign_event(sk, int(time.time()), kind, tags, content, os.urandom(32))


async def client(url: str, key: bytes | None = None) -> Client:
    c = await Client.connect(url)
    if key is not None:
        assert (await c.auth(key, url, int(time.time())))[2] is True
    return c


def ids(events: list[dict[str, Any]]) -> set[str]:
    return {e["id"] for e in events}


async def count(c: Client, flt: dict[str, Any]) -> list[Any]:
    await c.send(["COUNT", "n", flt])
    while True:
        msg = await c.recv()
        if msg[0] in ("COUNT", "CLOSED") and msg[1] == "n":
            return msg
        c.backlog.append(msg)


async def next_event(c: Client, sub_id: str) -> dict[str, Any]:
    while True:
        msg = await c.recv()
        if msg[0] == "EVENT" and msg[1] == sub_id:
            return dict(msg[2])


async def test_history_kinds_are_private_like_engrams(relay: RelayProcess) -> None:
    keys = Keys.fresh()
    third = os.urandom(32)
    env_a = {"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()}
    env_o = {"ENGRAM_PRIVATE_KEY": keys.owner_sk.hex()}
    agent = AgentMemory(load_identity(None, keys.owner, None, env=env_a), relay.url)
    owner = AgentMemory(load_identity(None, None, keys.agent, env=env_o), relay.url)
    await agent.set("notes/x", "a private value")
    verdict = (await owner.confirm("notes/x")).event_id
    a, o = keys.agent, keys.owner
    anon, stranger = await client(relay.url), await client(relay.url, third)
    mine, theirs = await client(relay.url, keys.agent_sk), await client(relay.url, keys.owner_sk)
    try:
        revisions = ids(await mine.query({"kinds": [KIND_REVISION], "authors": [a]}))
        assert len(revisions) == 1
        memory = revisions | {verdict}
        # named: refused without AUTH, restricted for a third key; COUNT and NIP-77 alike
        for flt in ({"kinds": [KIND_REVISION]}, {"kinds": [KIND_VERDICT], "#p": [a]}):
            _, end = await anon.req("p", flt)
            assert end[0] == "CLOSED" and end[2].startswith("auth-required:"), end
            assert (await count(anon, flt))[2].startswith("auth-required:")
            await anon.send(["NEG-OPEN", "g", flt, EMPTY])
            err = await neg_reply(anon, "g")
            assert err[0] == "NEG-ERR" and err[2].startswith("auth-required:")
            _, end = await stranger.req("p", flt)
            assert end[0] == "CLOSED" and end[2].startswith("restricted:"), end
        # not named: never served to anyone else
        for c in (anon, stranger):
            for flt in ({}, {"ids": sorted(memory)}, {"authors": [a, o]}, {"#p": [a, o]}):
                assert not memory & ids(await c.query(flt)), flt
            assert await count(c, {"ids": sorted(memory)}) == ["COUNT", "n", {"count": 0}]
            _, need, _ = await reconcile(c, Items.from_pairs([]), {"authors": [a, o]})
            assert not need & memory
        # the twins: the author and the `p` read them, by REQ, COUNT and NIP-77
        assert ids(await mine.query({"kinds": [KIND_REVISION], "authors": [a]})) == revisions
        assert ids(await mine.query({"kinds": [KIND_VERDICT], "#p": [a]})) == {verdict}
        assert ids(await theirs.query({"kinds": [KIND_REVISION], "#p": [o]})) == revisions
        assert ids(await theirs.query({"kinds": [KIND_VERDICT], "authors": [o]})) == {verdict}
        both = {"kinds": [KIND_REVISION, KIND_VERDICT], "ids": sorted(memory)}
        assert (await count(mine, {**both, "authors": [a]}))[2] == {"count": 1}
        _, need, _ = await reconcile(theirs, Items.from_pairs([]), {"#p": [o]})
        assert revisions <= need
        # live: a stranger's `{}` gets the public marker published after, never the revision
        _, end = await stranger.req("live", {})
        assert end[0] == "EOSE"
        await agent.set("notes/x", "another private value", force=True)  # over the verdict
        dm = ev(third, 4, [["p", a]], "kind 4 is public on this relay")
        assert (await anon.publish(dm))[2] is True
        assert (await next_event(stranger, "live"))["id"] == dm.id
    finally:
        for c in (anon, stranger, mine, theirs):
            await c.close()


async def test_history_kinds_must_look_like_engrams(relay: RelayProcess) -> None:
    sk = os.urandom(32)
    owner = pubkey_of(os.urandom(32))
    d = "ab" * 32
    async with await Client.connect(relay.url) as c:
        for kind in (KIND_REVISION, KIND_VERDICT):
            for tags, content, why in (
                ([["p", owner]], "A" * 132, "no 'd' tag"),
                ([["d", d]], "A" * 132, "no 'p' tag"),
                ([["d", d], ["p", owner]], "plain text", "not padded base64"),
            ):
                ok = await c.publish(ev(sk, kind, tags, content))
                assert ok[2] is False and ok[3].startswith("invalid: agent-engram"), (kind, ok)
                assert why.split("'")[0] in ok[3] or why in ok[3], ok
