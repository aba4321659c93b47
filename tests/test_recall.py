"""Recall (`engram mem recall`, `AgentMemory.recall`, MCP `memory_recall`, `engram acp
--recall`, `set`'s hints) on a real relay of ours: what must come back, what must not
(tombstoned, rewritten, another pair's cache), and the cache's refusals.

One relay for the module; every test has its own agent/owner pair and cache directory.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from cli_support import Keys, engram, shared_relay
from relay_fixtures import RelayProcess

from cli.identity import load_identity
from cli.memory.api import AgentMemory
from cli.memory.recall.cache import CacheFile

FACTS = {
    "prefs/editor-go": "The user writes Go in Neovim with gopls; VS Code only for notebooks.",
    "prefs/coffee": "Takes coffee black, no sugar, two cups before noon.",
    "people/dana": "Dana Okafor leads the payments team and reviews every schema migration.",
    "projects/atlas": "Project Atlas ships the billing rewrite; deadline is 2025-03-14.",
    "home/city": "The user moved from Lisbon to Rotterdam in June 2024.",
}


@pytest.fixture(scope="module")
def relay(pg_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RelayProcess]:
    yield from shared_relay(pg_server_url, str(tmp_path_factory.mktemp("recall-relay")))


def api(keys: Keys, url: str, cache: Path) -> AgentMemory:
    ident = load_identity(None, keys.owner, None, env={"ENGRAM_PRIVATE_KEY": keys.agent_sk.hex()})
    return AgentMemory(ident, [url], timeout=60, recall_dir=cache)


def cli_env(keys: Keys, url: str, data_home: Path) -> dict[str, str]:
    return keys.agent_env(url, XDG_DATA_HOME=str(data_home))


def recall_json(keys: Keys, url: str, data_home: Path, query: str) -> list[dict]:
    out = engram("mem", "recall", query, "--json", env=cli_env(keys, url, data_home))
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout)


async def seeded(keys: Keys, url: str, cache: Path) -> AgentMemory:
    mem = api(keys, url, cache)
    for slug, value in FACTS.items():
        await mem.set(slug, value)
    return mem


async def test_recall_answers_a_paraphrase_and_follows_every_change(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = Keys.fresh()
    data_home = tmp_path / "data"
    cache = data_home / "engram-relay" / "recall"  # where the CLI's platformdirs puts it
    mem = await seeded(keys, relay.url, cache)
    # positive: a question that quotes none of the memory's sentences
    found = await mem.recall("which editor does the user prefer for Go?", limit=3)
    assert found.hits[0].slug == "mem/prefs/editor-go"
    assert found.hits[0].value == FACTS["prefs/editor-go"]
    assert [h.score for h in found.hits] == sorted((h.score for h in found.hits), reverse=True)
    # a tombstone and a rewrite leave the results at the next call in this process
    await mem.rm("prefs/coffee")
    await mem.set("home/city", "The user lives in Utrecht since May 2025.")
    found = await mem.recall("how does the user take coffee?", limit=10)
    assert "mem/prefs/coffee" not in [h.slug for h in found.hits]
    found = await mem.recall("where does the user live now?", limit=10)
    city = [h for h in found.hits if h.slug == "mem/home/city"]
    assert city and city[0].value.startswith("The user lives in Utrecht")
    assert not any("Rotterdam" in h.value for h in found.hits)
    # another writer (another process) adds a memory: it appears at the next call here
    other = engram(
        "mem",
        "set",
        "pets/cat",
        "The user's cat is called Miso and hates the vacuum.",
        env=cli_env(keys, relay.url, tmp_path / "elsewhere"),
    )
    assert other.returncode == 0, other.stderr.decode()
    found = await mem.recall("what is the name of the user's pet?", limit=3)
    assert found.hits[0].slug == "mem/pets/cat"
    # ... and removes one: gone at the next call here
    gone = engram("mem", "rm", "people/dana", env=cli_env(keys, relay.url, tmp_path / "elsewhere"))
    assert gone.returncode == 0, gone.stderr.decode()
    found = await mem.recall("who reviews schema migrations?", limit=10)
    assert "mem/people/dana" not in [h.slug for h in found.hits]
    # a new process, reading the cache this one wrote, agrees
    rows = recall_json(keys, relay.url, data_home, "who reviews schema migrations?")
    slugs = [r["slug"] for r in rows]
    assert "mem/people/dana" not in slugs and "mem/prefs/coffee" not in slugs
    assert "mem/pets/cat" in slugs
    assert {r["slug"]: r["value"] for r in rows}["mem/home/city"].startswith("The user lives in")
    # a tombstone written by another process is seen by a new process using the cache
    assert (
        engram("mem", "rm", "pets/cat", env=cli_env(keys, relay.url, tmp_path / "x")).returncode
        == 0
    )
    rows = recall_json(keys, relay.url, data_home, "what is the name of the user's pet?")
    assert "mem/pets/cat" not in [r["slug"] for r in rows]


async def test_json_output_is_stable_and_documented(relay: RelayProcess, tmp_path: Path) -> None:
    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "data" / "engram-relay" / "recall")
    env = cli_env(keys, relay.url, tmp_path / "data")
    first = engram("mem", "recall", "billing deadline", "--json", "--limit", "4", env=env)
    second = engram("mem", "recall", "billing deadline", "--json", "--limit", "4", env=env)
    assert first.returncode == 0, first.stderr.decode()
    assert first.stdout == second.stdout
    rows = json.loads(first.stdout)
    assert len(rows) == 4
    members = ["slug", "value", "snippet", "score", "created_at", "event_id"]
    members += ["trust", "role", "valid_from", "valid_until", "ended"]  # issue 39
    assert all(list(r) == members for r in rows)
    assert rows[0]["slug"] == "mem/projects/atlas"
    assert isinstance(rows[0]["created_at"], int) and len(rows[0]["event_id"]) == 64
    plain = engram("mem", "recall", "billing deadline", "--limit", "1", env=env)
    slug, score, created_at, snippet, trust, validity = (
        plain.stdout.decode().rstrip("\n").split("\t")
    )
    assert slug == "mem/projects/atlas" and float(score) > 0 and "deadline" in snippet
    assert (trust, validity) == (rows[0]["trust"] or "-", "-")
    assert created_at == str(rows[0]["created_at"])


async def test_a_corrupt_or_foreign_cache_is_rebuilt_never_trusted(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys, other = Keys.fresh(), Keys.fresh()
    cache = tmp_path / "cache"
    mem = await seeded(keys, relay.url, cache)
    await mem.recall("coffee", limit=1)
    (path,) = cache.glob("*.bin")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    raw = path.read_bytes()
    assert b"Neovim" not in raw and b"prefs" not in raw  # nothing decrypted in the clear
    # a flipped byte: refused, rebuilt from the relay, results unchanged
    tampered = bytearray(raw)
    tampered[-40] ^= 1
    path.write_bytes(bytes(tampered))
    fresh = api(keys, relay.url, cache)
    found = await fresh.recall("which editor for Go?", limit=1)
    assert fresh.recaller().rebuilt is False  # rebuilt and saved by the call
    assert found.hits[0].slug == "mem/prefs/editor-go"
    assert path.read_bytes() != bytes(tampered)
    # another pair's cache put in this pair's place: never read
    theirs = await seeded(other, relay.url, tmp_path / "theirs")
    await theirs.set("secret/plan", "Their plan: move everything to Rotterdam.")
    await theirs.recall("plan", limit=1)
    (their_file,) = (tmp_path / "theirs").glob("*.bin")
    path.write_bytes(their_file.read_bytes())
    probe = api(keys, relay.url, cache)
    index = probe.recaller()._open()
    assert probe.recaller().rebuilt and len(index) == 0  # refused before anything was read
    found = await probe.recall("their plan to move", limit=10)
    assert "mem/secret/plan" not in [h.slug for h in found.hits]
    # a file sealed under another key but carrying this pair's header: refused as well
    ident = probe.identity
    forged = CacheFile(cache, ident.agent, ident.owner, "wordllama-256", os.urandom(32))
    forged.save(theirs.recaller().index, {}, 0.0)  # type: ignore[arg-type]
    again = api(keys, relay.url, cache)
    assert len(again.recaller()._open()) == 0 and again.recaller().rebuilt


async def test_set_names_similar_memories_without_refusing(
    relay: RelayProcess, tmp_path: Path
) -> None:
    keys = Keys.fresh()
    mem = await seeded(keys, relay.url, tmp_path / "cache")
    result = await mem.set(
        "prefs/go-editor", "The user writes Go in Neovim with gopls; VS Code only for notebooks!"
    )
    assert result.event_id and [s.slug for s in result.similar] == ["mem/prefs/editor-go"]
    assert result.similar[0].score >= 0.8
    unrelated = await mem.set("prefs/tea", "Green tea after lunch, never in the evening.")
    assert unrelated.event_id and "mem/prefs/editor-go" not in [s.slug for s in unrelated.similar]
    out = engram(
        "mem",
        "set",
        "prefs/go-ide",
        "The user writes Go in Neovim with gopls, VS Code for notebooks.",
        env=cli_env(keys, relay.url, tmp_path / "data"),
    )
    assert out.returncode == 0 and len(out.stdout.decode().strip()) == 64
    assert "similar memory: mem/prefs/editor-go" in out.stderr.decode()


async def test_mcp_memory_recall_through_the_sdk_client(
    relay: RelayProcess, tmp_path: Path
) -> None:
    from test_mcp import stdio_server

    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "data" / "engram-relay" / "recall")
    env = cli_env(keys, relay.url, tmp_path / "data")
    async with stdio_server(env, log_dir=tmp_path) as server:
        assert "memory_recall" in await server.tool_names()
        result = await server.call("memory_recall", query="when is the billing project due?")
        assert not result.is_error, result
        rows = result.structured_content["memories"]  # type: ignore[index]
        assert rows[0]["slug"] == "mem/projects/atlas" and len(rows) == len(FACTS)
        assert rows[0]["value"] == FACTS["projects/atlas"]
        # a tombstone written through the same server leaves its next answer
        gone = await server.call("memory_delete", slug="projects/atlas")
        assert not gone.is_error, gone
        again = await server.call("memory_recall", query="when is the billing project due?")
        slugs = [r["slug"] for r in again.structured_content["memories"]]  # type: ignore[index]
        assert "mem/projects/atlas" not in slugs and slugs
        # memory_set answers with the close memories it found
        near = await server.call(
            "memory_set", slug="prefs/coffee-2", value="Takes coffee black, no sugar, two cups."
        )
        assert not near.is_error, near
        similar = near.structured_content["similar"]  # type: ignore[index]
        assert similar[0]["slug"] == "mem/prefs/coffee"


async def test_acp_recall_injects_relevant_memories_and_nothing_when_the_relay_is_silent(
    relay: RelayProcess, tmp_path: Path
) -> None:
    from acp import text_block
    from cli_support import listening_never_accepting
    from test_acp_proxy import proxied, user_block

    from cli.memory.hook import RECALL_HEADER

    keys = Keys.fresh()
    await seeded(keys, relay.url, tmp_path / "data" / "engram-relay" / "recall")
    env = cli_env(keys, relay.url, tmp_path / "data")
    question = "Which editor should I set up for the user's Go work?"
    async with proxied(tmp_path, env, "--recall", "2", "--timeout", "60") as (conn, run):
        session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        await conn.prompt(session_id=session.session_id, prompt=[text_block(question)])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("coffee?")])
    first, second = run.received("session/prompt")
    injected = first["prompt"][-2]["text"]
    assert injected.startswith(RECALL_HEADER) and first["prompt"][-1] == user_block(question)
    assert "[[mem/prefs/editor-go]]" in injected.splitlines()[2]  # the best one first
    assert len([x for x in injected.splitlines() if x.startswith("- [[")]) == 2
    assert "[[mem/prefs/coffee]]" in second["prompt"][-2]["text"]  # every prompt gets its own
    # a relay that never answers: the prompt goes through untouched, nothing injected
    with listening_never_accepting() as hanging:
        silent = keys.agent_env(hanging, XDG_DATA_HOME=str(tmp_path / "silent"))
        async with proxied(tmp_path, silent, "--recall", "3", "--timeout", "1") as (conn, run):
            session = await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
            await conn.prompt(session_id=session.session_id, prompt=[text_block(question)])
    [prompt] = run.received("session/prompt")
    assert prompt["prompt"] == [user_block(question)]
    assert "recall not injected" in run.diagnostics()
